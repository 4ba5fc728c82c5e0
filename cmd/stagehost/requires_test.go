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

// TestCheckRequirements: check prints a module's declared requirements,
// and refuses (exit 65, at the session's stage key, every missing item
// in one line) a session that lacks some.
func TestCheckRequirements(t *testing.T) {
	dir := t.TempDir()
	req := filepath.Join(dir, "requires.toml")
	mod := filepath.Join(dir, "echo.wasm")
	write := func(toml string) string {
		t.Helper()
		if err := os.WriteFile(req, []byte(toml), 0o644); err != nil {
			t.Fatal(err)
		}
		code, o, e := runCLI(t, "requires", "set", "../../stages/testdata/hostile/echo.wasm", req, "-o", mod)
		if code != exitOK {
			t.Fatalf("set: %d %s%s", code, o, e)
		}
		sum := strings.Fields(o[strings.Index(o, "sha256 "):])[1]
		m := filepath.Join(dir, "m.toml")
		manifest := "version = 1\n[runtime]\ncache_dir = \"off\"\n[[device]]\nname = \"gpu0\"\nbackend = \"sim\"\nengine = \"gpu\"\n" +
			"[[module]]\nname = \"echo\"\npath = \"echo.wasm\"\nsha256 = \"" + sum + "\"\n" +
			"[[session]]\nname = \"fill\"\nstage = \"echo\"\ndevice = \"gpu0\"\nprograms = [\"fill\", \"saxpy\"]\n"
		if err := os.WriteFile(m, []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := write("programs = [\"fill\"]\n[[inputs]]\nname = \"x\"\ndatatype = \"FP32\"\nshape = [-1, 4]\n")
	if code, o, e := runCLI(t, "check", m); code != exitOK || !strings.Contains(o, "    requires programs fill; inputs x FP32 [-1 4]\n") {
		t.Fatalf("check of a module that fits: exit %d\n%s%s", code, o, e)
	}
	m = write("programs = [\"fill\", \"matmul\", \"softmax\"]\nweights = [\"digits\"]\n")
	code, o, e := runCLI(t, "check", m)
	want := `m.toml:14: session[0].stage: module "echo" needs programs "matmul", "softmax" not listed by session "fill"; weights "digits": session "fill" lists no weights`
	if code != exitInvalid || !strings.Contains(e, want) {
		t.Fatalf("check of a module that does not fit: exit %d\n%s%s\nwant %s", code, o, e, want)
	}
}
