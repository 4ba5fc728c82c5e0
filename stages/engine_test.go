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
