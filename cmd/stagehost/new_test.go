package main

import (
	"bytes"
	"go/format"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNewRefusesToOverwrite: NAME may not exist or be an empty directory;
// anything else is refused with 73, naming the path, and nothing is
// written.
func TestNewRefusesToOverwrite(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	file := filepath.Join(dir, "file")
	if err := os.MkdirAll(full, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(full, "keep.txt"), file} {
		if err := os.WriteFile(p, []byte("mine\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ path, want string }{
		{full, full + " already exists and is not empty"},
		{file, file + " already exists and is not a directory"},
	} {
		code, out, errs := runCLI(t, "new", "go", tc.path)
		if code != exitCantCreate || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("new go %s: exit %d, stderr %q; want %d and %q", tc.path, code, errs, exitCantCreate, tc.want)
		}
	}
	if entries, _ := os.ReadDir(full); len(entries) != 1 {
		t.Errorf("new wrote into %s: %d entries", full, len(entries))
	}

	// An empty directory is used, and a missing one is made with its parents.
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{empty, filepath.Join(dir, "a", "b", "deep")} {
		code, out, errs := runCLI(t, "new", "c", p)
		if code != exitOK || !strings.Contains(out, "created "+p) {
			t.Fatalf("new c %s: exit %d\n%s%s", p, code, out, errs)
		}
		if _, err := os.Stat(filepath.Join(p, "include", "stagehost.h")); err != nil {
			t.Error(err)
		}
	}
}

// TestNewWritesTheWholeSDK: the SDK a Go project gets is the repository's
// guest-sdk, every file a build needs (all but tests and docs), byte for
// byte. It fails when guest-sdk grows a file or folder that the embed in
// guest-sdk/sources.go does not list.
func TestNewWritesTheWholeSDK(t *testing.T) {
	files, err := newProject("go", "hello")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	for _, f := range files {
		if p, ok := strings.CutPrefix(f.path, sdkDir+"/"); ok {
			got[p] = f.data
		}
	}
	want := 0
	err = filepath.WalkDir("../../guest-sdk", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel("../../guest-sdk", p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		// The Rust SDK goes into Rust projects: TestNewWritesTheWholeRustSDK.
		if strings.HasSuffix(rel, "_test.go") || rel == "sources.go" || strings.HasSuffix(rel, ".md") || strings.Contains(rel, "testdata/") || strings.HasPrefix(rel, "rust/") {
			return nil
		}
		want++
		disk, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if b, ok := got[rel]; !ok {
			t.Errorf("guest-sdk/%s is not written into new Go projects: add it to the embed in guest-sdk/sources.go", rel)
		} else if !bytes.Equal(b, disk) {
			t.Errorf("%s/%s differs from guest-sdk/%s", sdkDir, rel, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != want {
		t.Errorf("new Go projects get %d SDK files, guest-sdk has %d", len(got), want)
	}
}

// TestNewWritesTheWholeRustSDK: a Rust project's stagehost-sdk/ is the
// crate guest-sdk/rust (its Cargo.toml and src/), byte for byte.
func TestNewWritesTheWholeRustSDK(t *testing.T) {
	files, err := newProject("rust", "hello")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	for _, f := range files {
		if p, ok := strings.CutPrefix(f.path, sdkDir+"/"); ok {
			got[p] = f.data
		}
	}
	want := 0
	for _, root := range []string{"Cargo.toml", "src"} {
		err = filepath.WalkDir(filepath.Join("../../guest-sdk/rust", root), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel("../../guest-sdk/rust", p)
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			want++
			disk, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if b, ok := got[rel]; !ok {
				t.Errorf("guest-sdk/rust/%s is not written into new Rust projects: add it to RustSources in guest-sdk/sources.go", rel)
			} else if !bytes.Equal(b, disk) {
				t.Errorf("%s/%s differs from guest-sdk/rust/%s", sdkDir, rel, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != want || want < 9 {
		t.Errorf("new Rust projects get %d SDK files, guest-sdk/rust has %d", len(got), want)
	}
}

// TestNewGoFilesAreFormatted: the Go files of a new project are as gofmt
// writes them.
func TestNewGoFilesAreFormatted(t *testing.T) {
	files, err := newProject("go", "hello")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f.path, ".go") || strings.HasPrefix(f.path, sdkDir+"/") {
			continue
		}
		got, err := format.Source(f.data)
		if err != nil {
			t.Errorf("%s: %v", f.path, err)
		} else if !bytes.Equal(got, f.data) {
			t.Errorf("%s is not gofmt'ed: fix its template in scaffold/go", f.path)
		}
	}
}

// TestNewGoProject is the plugin author's path for Go, from an empty
// directory outside the repository: stagehost new, the emulator test, the
// build, stagehost run on the simulated backend. The project must build
// with no network access and no workspace.
func TestNewGoProject(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and a Go guest")
	}
	t.Parallel()
	dir := newProjectDir(t, "go", "hello")
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
	runIn(t, dir, env, "go", "test", "./...")
	runIn(t, dir, env, "./build.sh")
	runManifest(t, dir, "hello")
}

// TestNewCProject is the same for C: the build and stagehost run.
func TestNewCProject(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and a C guest")
	}
	var missing []string
	for _, tool := range []string{"clang", "wasm-ld"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		t.Skipf("%s not on PATH (Debian: apt-get install -y clang lld)", strings.Join(missing, " and "))
	}
	t.Parallel()
	dir := newProjectDir(t, "c", "cstage")
	if _, err := exec.LookPath("cc"); err == nil {
		if out := runIn(t, dir, os.Environ(), "./test.sh"); strings.TrimSpace(out) != "ok" {
			t.Errorf("./test.sh (the stage on emu.c): %s", out)
		}
	} else {
		t.Log("cc not on PATH: test.sh (the stage on the C emulator) not run")
	}
	runIn(t, dir, os.Environ(), "./build.sh")
	runManifest(t, dir, "cstage")
}

// rustToolchain returns the rustc that build.sh uses (Debian's
// /usr/bin/rustc when present, else rustc on PATH), or why the Rust
// project's test must skip: no rustc or cargo, or no standard library for
// wasm32-unknown-unknown.
func rustToolchain() (string, string) {
	rustc := "/usr/bin/rustc"
	if _, err := os.Stat(rustc); err != nil {
		if rustc, err = exec.LookPath("rustc"); err != nil {
			return "", "no rustc (Debian: apt-get install -y rustc cargo libstd-rust-dev-wasm32)"
		}
	}
	if _, err := os.Stat("/usr/bin/cargo"); err != nil {
		if _, err := exec.LookPath("cargo"); err != nil {
			return "", "no cargo (Debian: apt-get install -y cargo)"
		}
	}
	out, err := exec.Command(rustc, "--print", "sysroot").Output()
	if err != nil {
		return "", rustc + " --print sysroot: " + err.Error()
	}
	lib := filepath.Join(strings.TrimSpace(string(out)), "lib", "rustlib", "wasm32-unknown-unknown", "lib")
	if _, err := os.Stat(lib); err != nil {
		return "", rustc + " has no standard library for wasm32-unknown-unknown (Debian: apt-get install -y libstd-rust-dev-wasm32)"
	}
	return rustc, ""
}

// TestNewRustProject is the same for Rust: the emulator tests (cargo
// test), the build and stagehost run, offline, from an empty directory.
func TestNewRustProject(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and a Rust guest")
	}
	if _, why := rustToolchain(); why != "" {
		t.Skip(why)
	}
	t.Parallel()
	dir := newProjectDir(t, "rust", "rstage")
	env := append(os.Environ(), "CARGO_NET_OFFLINE=true", "CARGO_HOME="+t.TempDir())
	runIn(t, dir, env, "./test.sh")
	runIn(t, dir, env, "./build.sh")
	runManifest(t, dir, "rstage")
}

// newProjectDir runs the built binary's "new lang name" in an empty
// temporary directory and returns the project's directory.
func newProjectDir(t *testing.T, lang, name string) string {
	t.Helper()
	parent := t.TempDir()
	runIn(t, parent, os.Environ(), stagehostBinary(t), "new", lang, name)
	return filepath.Join(parent, name)
}

// runManifest runs host.toml in dir (after build.sh wrote the module's
// sha256 into it) and checks the session's output: 2x + 1 for input.bin's
// 1, 2, 3, 4.
func runManifest(t *testing.T, dir, name string) {
	t.Helper()
	out := runIn(t, dir, os.Environ(), stagehostBinary(t), "run", "host.toml", "--quiet")
	for _, want := range []string{"session " + name + ": ok", "16 bytes in, 16 bytes out", "output: [3 5 7 9]"} {
		if !strings.Contains(out, want) {
			t.Errorf("stagehost run host.toml: output lacks %q:\n%s", want, out)
		}
	}
}

// runIn runs name with args in dir and returns its stdout; it fails the
// test, with everything the command printed, if the command fails.
func runIn(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s in %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), dir, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}
