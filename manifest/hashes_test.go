package manifest_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stagehost/stagehost/manifest"
)

// ExampleModuleHashes: the hash to accept after a rebuild, whatever the
// manifest declares (here an empty sha256, which Load refuses).
func ExampleModuleHashes() {
	hashes, err := manifest.ModuleHashes("testdata/bad/sha256_mismatch.toml")
	if err != nil {
		fmt.Println(err)
		return
	}
	h := hashes[3]
	fmt.Printf("%s (line %d) = %q, matches: %v\n", h.Key, h.Line, h.SHA256, h.Matches())
	// Output: module[3].sha256 (line 28) = "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b", matches: false
}

// TestModuleHashes: every module with a readable file gets its actual
// hash, in order, whatever its declared one; a module without a file is
// an error that still returns the others.
func TestModuleHashes(t *testing.T) {
	hashes, err := manifest.ModuleHashes("testdata/bad/sha256_mismatch.toml")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name, sum string
		matches   bool
	}{
		{"mlp", "fa1d882b944185aeb8cac0bb41eb64e0a22e6eafeb013b3bafefcaeb9bf33498", false},
		{"short", "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b", false},
		{"upper", "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b", true},
		{"empty", "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b", false},
	}
	if len(hashes) != len(want) {
		t.Fatalf("got %d hashes, want %d: %+v", len(hashes), len(want), hashes)
	}
	for i, w := range want {
		h := hashes[i]
		if h.Name != w.name || h.SHA256 != w.sum || h.Matches() != w.matches || h.Key != fmt.Sprintf("module[%d].sha256", i) {
			t.Errorf("hash %d: %+v, want %+v", i, h, w)
		}
	}

	dir := t.TempDir()
	mod, err := os.ReadFile("testdata/modules/good_stage.wasm")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a.wasm"), mod, 0o644); err != nil {
		t.Fatal(err)
	}
	src := "version = 1\n[[module]]\nname = \"a\"\npath = \"a.wasm\"\n[[module]]\nname = \"b\"\npath = \"b.wasm\"\nsha256 = \"\"\n"
	if err := os.WriteFile(filepath.Join(dir, "m.toml"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	hashes, err = manifest.ModuleHashes(filepath.Join(dir, "m.toml"))
	var errs *manifest.Errors
	if !errors.As(err, &errs) || len(hashes) != 1 || hashes[0].Name != "a" || hashes[0].Declared != "" {
		t.Fatalf("a module without a file: %v, %+v", err, hashes)
	}
}
