package stages

import (
	"bytes"
	"context"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
)

// TestCorruptCacheEntriesAreDeletedAndRecompiled truncates every entry of
// a compilation cache, then loads the module again through a new engine
// on that cache: the load must succeed, warn, and leave a good entry.
func TestCorruptCacheEntriesAreDeletedAndRecompiled(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bin := hostile(t, "good_stage")
	load := func(logger *slog.Logger) error {
		e, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(dir).WithLogger(logger))
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close(ctx)
		_, err = e.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithName("good"))
		return err
	}
	if err := load(slog.Default()); err != nil {
		t.Fatal(err)
	}
	entries := cacheEntries(t, dir)
	if len(entries) == 0 {
		t.Fatal("the first load left no cache entry")
	}
	for _, p := range entries {
		if err := os.Truncate(p, 3); err != nil {
			t.Fatal(err)
		}
	}
	var log bytes.Buffer
	if err := load(slog.New(slog.NewTextHandler(&log, nil))); err != nil {
		t.Fatalf("load over a corrupt cache entry: %v", err)
	}
	if !strings.Contains(log.String(), "unreadable compilation cache entry") {
		t.Errorf("no warning logged; log:\n%s", log.String())
	}
	for _, p := range cacheEntries(t, dir) {
		if fi, err := os.Stat(p); err != nil || fi.Size() <= 3 {
			t.Errorf("cache entry %s was not rewritten (%v)", p, err)
		}
	}
	// And a third start reads the healed entry without complaint.
	log.Reset()
	if err := load(slog.New(slog.NewTextHandler(&log, nil))); err != nil || log.Len() != 0 {
		t.Fatalf("load after healing: %v; log: %s", err, log.String())
	}
}

func cacheEntries(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// unwritableCacheDir returns a cache directory wazero opens but cannot
// write into, even as root: its versioned subdirectory is a link to
// /proc/self, where no file can be created.
func unwritableCacheDir(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	probe := t.TempDir()
	e, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(probe))
	if err != nil {
		t.Fatal(err)
	}
	e.Close(ctx)
	ents, err := os.ReadDir(probe)
	if err != nil || len(ents) != 1 {
		t.Fatalf("the cache's versioned subdirectory: %v %v", ents, err)
	}
	dir := t.TempDir()
	if err := os.Symlink("/proc/self", filepath.Join(dir, ents[0].Name())); err != nil {
		t.Skipf("symlink: %v", err)
	}
	if f, err := os.CreateTemp(filepath.Join(dir, ents[0].Name()), "x"); err == nil {
		f.Close()
		os.Remove(f.Name())
		t.Skip("/proc/self is writable here")
	}
	return dir
}

// TestUnwritableCacheCompilesWithoutIt: a cache directory that opens but
// whose writes fail (a full disk, a read-only directory) is a warning:
// the module compiles without the cache, and its sessions run.
func TestUnwritableCacheCompilesWithoutIt(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	dir := unwritableCacheDir(t)
	var log bytes.Buffer
	e, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(dir).WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	f := newWasmFixture(t)
	f.eng = e
	for _, name := range []string{"good_stage", "good_stage"} { // the second load is the process's cache
		s := f.session(t, f.mustLoad(t, name), f.defaultConfig("good"))
		if out, err := s.Run(ctx, nil, nil); err != nil || string(out) != "ok" {
			t.Fatalf("a session of a module compiled without the cache: %q %v", out, err)
		}
		s.Close(ctx)
	}
	if !strings.Contains(log.String(), "the compilation cache cannot be used") {
		t.Errorf("no warning logged; log:\n%s", log.String())
	}
	// A module that does not compile is still refused, with its own error.
	if _, err := e.Load(ctx, []byte("\x00asm\x01\x00\x00\x00\x01"), SHA256([]byte("\x00asm\x01\x00\x00\x00\x01")), NewLoadConfig().WithName("broken")); err == nil {
		t.Error("a broken module loaded")
	}
}
