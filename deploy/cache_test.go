package deploy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/stages"
)

// TestCacheThatCannotBeUsedIsAWarning: an explicitly set cache_dir that
// cannot be created, one that is read-only, or one whose writes fail
// never stops the deployment: its modules compile without the cache and
// its sessions run.
func TestCacheThatCannotBeUsedIsAWarning(t *testing.T) {
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{
		"cannot be created": filepath.Join(blocker, "below-a-file"),
		"writes fail":       writesFailDir(t),
	}
	if os.Geteuid() != 0 { // root writes into a read-only directory
		ro := t.TempDir()
		if err := os.Chmod(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(ro, 0o700) })
		dirs["read-only"] = ro
	}
	for what, dir := range dirs {
		if dir == "" {
			continue
		}
		t.Run(strings.ReplaceAll(what, " ", "_"), func(t *testing.T) {
			body := strings.Replace(twoSessions, "[runtime]\ncache_dir = \"off\"\n", fmt.Sprintf("[runtime]\ncache_dir = %q\n", dir), 1)
			if body == twoSessions {
				t.Fatal("the manifest has no cache_dir to replace")
			}
			d := open(t, body)
			if out, err := d.Pool("steady").Run(context.Background(), nil); err != nil || string(out) != "ok" {
				t.Fatalf("%q %v", out, err)
			}
		})
	}
}

// writesFailDir returns a cache directory wazero opens but cannot write
// into, even as root (its versioned subdirectory links to /proc/self), or
// "" where that cannot be made.
func writesFailDir(t *testing.T) string {
	ctx := context.Background()
	probe := t.TempDir()
	e, err := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(probe))
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
		return ""
	}
	if f, err := os.CreateTemp(filepath.Join(dir, ents[0].Name()), "x"); err == nil {
		f.Close()
		os.Remove(f.Name())
		return ""
	}
	return dir
}
