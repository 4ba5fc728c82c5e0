package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRequiresSetAndShow: set writes the TOML as the module's section
// (replacing an earlier one), show prints it back; a module without the
// section shows "none"; a bad key is exit 65 naming it; bad usage 64.
func TestRequiresSetAndShow(t *testing.T) {
	dir := t.TempDir()
	echo := "../../stages/testdata/hostile/echo.wasm"
	req := filepath.Join(dir, "requires.toml")
	if err := os.WriteFile(req, []byte("programs = [\"fill\", \"matmul\"]\nweights = [\"digits\"]\n[[inputs]]\nname = \"input0\"\ndatatype = \"FP32\"\nshape = [-1, 4]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.wasm")
	if code, o, e := runCLI(t, "requires", "set", echo, req, "-o", out); code != exitOK || !strings.Contains(o, "sha256 ") {
		t.Fatalf("set: exit %d\n%s%s", code, o, e)
	}
	// Again, over its own output: the section is replaced, not added.
	if err := os.WriteFile(req, []byte("streams = [\"s1\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, o, e := runCLI(t, "requires", "set", out, req, "-o", out); code != exitOK {
		t.Fatalf("set again: exit %d\n%s%s", code, o, e)
	}
	code, o, e := runCLI(t, "requires", "show", out)
	if code != exitOK || !strings.Contains(o, `"s1"`) || strings.Contains(o, "matmul") {
		t.Fatalf("show: exit %d\n%s%s", code, o, e)
	}
	if code, o, _ := runCLI(t, "requires", "show", echo); code != exitOK || !strings.HasPrefix(o, "none: ") {
		t.Fatalf("show of a module without the section: exit %d\n%s", code, o)
	}
	if err := os.WriteFile(req, []byte("program = [\"fill\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, e := runCLI(t, "requires", "set", echo, req, "-o", out); code != exitInvalid || !strings.Contains(e, `unknown key "program"`) {
		t.Fatalf("a bad key: exit %d\n%s", code, e)
	}
	if code, _, _ := runCLI(t, "requires", "set", echo, req); code != exitUsage {
		t.Fatalf("set without -o: exit %d", code)
	}
}
