package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cstageManifest writes a manifest with the small C stage (it compiles in
// milliseconds) and returns its path. extra goes into [runtime].
func cstageManifest(t *testing.T, runtime string) string {
	t.Helper()
	wasm, err := filepath.Abs("../../examples/wasm/cstage/cstage.wasm")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.toml")
	src := fmt.Sprintf(`version = 1
[runtime]
%s
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device]]
name = "npu0"
backend = "sim"
engine = "npu"
[[module]]
name = "cstage"
path = %q
sha256 = "544bf699f00f0499fee66fd0b67c947176b6edc524da4b0f892460a519821ef6"
[[session]]
name = "fill"
stage = "cstage"
device = "gpu0"
programs = ["fill"]
budget = "64KiB"
output_format = "f32"
[[resident]]
name = "pingpong"
gpu = "gpu0"
npu = "npu0"
rounds = 1
`, runtime, wasm)
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVersion(t *testing.T) {
	code, out, errs := runCLI(t, "version")
	if code != exitOK || errs != "" {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	want := regexp.MustCompile(`^stagehost ` + regexp.QuoteMeta(version) + `\nABI v1\nwazero (v\d+\.\d+\.\d+\S*|unknown)\n$`)
	if !want.MatchString(out) {
		t.Fatalf("version output %q does not match %s", out, want)
	}
	if code, _, errs := runCLI(t, "version", "extra"); code != exitUsage || !strings.Contains(errs, "takes no arguments") {
		t.Fatalf("version extra: exit %d\n%s", code, errs)
	}
	for _, tc := range []struct {
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{nil, false, "unknown"},
		{&debug.BuildInfo{}, true, "unknown"},
		{&debug.BuildInfo{Deps: []*debug.Module{{Path: "example.com/x", Version: "v9.9.9"}, {Path: "github.com/tetratelabs/wazero", Version: "v1.12.0"}}}, true, "v1.12.0"},
		{&debug.BuildInfo{Deps: []*debug.Module{{Path: "github.com/tetratelabs/wazero", Version: "v1.12.0", Replace: &debug.Module{Path: "../wazero", Version: "v1.13.0-fork"}}}}, true, "v1.13.0-fork"},
	} {
		if got := wazeroVersion(tc.bi, tc.ok); got != tc.want {
			t.Errorf("wazeroVersion(%v, %v) = %q, want %q", tc.bi, tc.ok, got, tc.want)
		}
	}
}

// TestHelp: --help and -h on every command exit 0 and print, on stdout,
// the command's usage with every flag spelt --flag.
func TestHelp(t *testing.T) {
	flags := map[string][]string{
		"check": {"--print-sha256"}, "trace": nil, "version": nil, "new": nil,
		"run":   {"--session NAME", "--input FILE", "--trace out.json", "--quiet"},
		"serve": {"--addr address", "--grace duration", "--quiet"},
		"admin": {"--addr URL", "--token-file FILE", "--sha256 SHA256", "--json"},
	}
	goStyle := regexp.MustCompile(`(^|\s)-[a-z]{2,}`) // -session, not --session
	for cmd, want := range flags {
		for _, h := range []string{"--help", "-h"} {
			code, out, errs := runCLI(t, cmd, h)
			if code != exitOK || errs != "" {
				t.Errorf("%s %s: exit %d, stderr %q", cmd, h, code, errs)
			}
			if !strings.HasPrefix(out, "Usage: stagehost "+cmd) || !strings.Contains(out, "--help, -h") {
				t.Errorf("%s %s: no usage:\n%s", cmd, h, out)
			}
			for _, f := range want {
				if !strings.Contains(out, "  "+f+" ") {
					t.Errorf("%s %s: usage lacks %q:\n%s", cmd, h, f, out)
				}
			}
			if m := goStyle.FindString(out); m != "" {
				t.Errorf("%s %s: usage has a Go-style flag %q:\n%s", cmd, h, m, out)
			}
		}
		// "help COMMAND" is the same as "COMMAND --help".
		code, out, _ := runCLI(t, "help", cmd)
		if code != exitOK || !strings.HasPrefix(out, "Usage: stagehost "+cmd) {
			t.Errorf("help %s: exit %d\n%s", cmd, code, out)
		}
	}
	for _, h := range []string{"--help", "-h", "help"} {
		code, out, errs := runCLI(t, h)
		if code != exitOK || errs != "" || !strings.Contains(out, "stagehost version") || !strings.Contains(out, "--quiet") {
			t.Errorf("%s: exit %d\n%s%s", h, code, out, errs)
		}
	}
	// Bad usage is still 64, with the usage on stderr.
	code, out, errs := runCLI(t, "run", "--session")
	if code != exitUsage || out != "" || !strings.Contains(errs, "flag needs an argument") || !strings.Contains(errs, "--session NAME") {
		t.Errorf("run --session: exit %d\n%s%s", code, out, errs)
	}
	for _, args := range [][]string{{"new"}, {"new", "go"}, {"new", "fortran", "x"}, {"new", "go", "x", "y"}, {"new", "go", "Bad"}, {"new", "--force", "go", "x"}} {
		code, out, errs := runCLI(t, args...)
		if code != exitUsage || out != "" || !strings.Contains(errs, "Usage: stagehost new go|c|rust NAME") {
			t.Errorf("%q: exit %d\n%s%s", args, code, out, errs)
		}
	}
}

// TestQuiet: --quiet drops the progress on stderr, not results or errors.
func TestQuiet(t *testing.T) {
	m := cstageManifest(t, "")
	code, out, errs := runCLI(t, "run", m)
	if code != exitOK || !strings.Contains(errs, "loading module cstage") || !strings.Contains(errs, "module cstage ") {
		t.Fatalf("without --quiet: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = runCLI(t, "run", m, "--quiet")
	if code != exitOK || errs != "" || !strings.Contains(out, "session fill: ok") || !strings.Contains(out, "output: [40]") {
		t.Fatalf("run --quiet: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
	code, _, errs = runCLI(t, "run", m, "--quiet", "--session", "fill", "--input", "/dev/zero")
	if code != exitInvalid || !strings.Contains(errs, "not a regular file") || strings.Contains(errs, "loading module") {
		t.Fatalf("run --quiet with a bad input: exit %d\n%s", code, errs)
	}
}

func TestServeQuiet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	cmd, stdout, stderr := startBinary(t, "serve", cstageManifest(t, ""), "--addr", "127.0.0.1:0", "--quiet")
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || !strings.Contains(lines.Text(), "(1 session, 1 resident session)") {
		t.Fatalf("serving line %q; stderr:\n%s", lines.Text(), stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var rest strings.Builder
	for lines.Scan() {
		rest.WriteString(lines.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil || !strings.Contains(rest.String(), "stopped: 0 requests accepted") {
		t.Fatalf("serve: %v\n%s", err, rest.String())
	}
	if stderr.Len() != 0 {
		t.Fatalf("serve --quiet printed on stderr:\n%s", stderr.String())
	}
}

// TestCacheHitsAreReported: the first start compiles a module into the
// file cache; the next reads it from there and says so.
func TestCacheHitsAreReported(t *testing.T) {
	m := cstageManifest(t, fmt.Sprintf("cache_dir = %q", t.TempDir()))
	for i, want := range []string{
		"module cstage compiled in",
		"module cstage read from the compilation cache in",
		"module cstage read from the compilation cache in",
	} {
		code, out, errs := runCLI(t, "run", m, "--session", "fill")
		if code != exitOK || !strings.Contains(errs, want) {
			t.Fatalf("start %d: exit %d, stderr lacks %q:\n%s%s", i+1, code, want, out, errs)
		}
		if strings.Count("\n"+errs, "\nmodule cstage") != 1 {
			t.Fatalf("start %d: one report per module expected:\n%s", i+1, errs)
		}
	}
	m = cstageManifest(t, `cache_dir = "off"`)
	if code, _, errs := runCLI(t, "run", m, "--session", "fill"); code != exitOK || !strings.Contains(errs, "module cstage compiled in") || !strings.Contains(errs, "cache is off") {
		t.Fatalf("cache off: exit %d\n%s", code, errs)
	}
}

// TestRunOneSessionLoadsOnlyWhatItNeeds: a resident needs no module, a
// session its own.
func TestRunOneSessionLoadsOnlyWhatItNeeds(t *testing.T) {
	code, out, errs := runCLI(t, "run", "../../host.toml", "--session", "pingpong")
	if code != exitOK || !strings.Contains(out, "resident pingpong: 64 rounds exchanged") || strings.Contains(out, "session ") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if strings.Contains(errs, "module") {
		t.Fatalf("--session pingpong loaded modules:\n%s", errs)
	}
	start := time.Now()
	code, out, errs = runCLI(t, "run", "../../host.toml", "--session", "fill")
	if code != exitOK || !strings.Contains(out, "session fill: ok") || strings.Contains(out, "classify") || strings.Contains(out, "pingpong") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if !strings.Contains(errs, "loading module cstage") || strings.Contains(errs, "mlp") {
		t.Fatalf("--session fill loaded other modules, or not its own (in %v):\n%s", time.Since(start), errs)
	}
}

func TestPlurals(t *testing.T) {
	for _, tc := range []struct {
		n          int
		noun, want string
	}{
		{0, "device", "0 devices"}, {1, "device", "1 device"}, {2, "device", "2 devices"},
		{1, "resident session", "1 resident session"}, {3, "resident session", "3 resident sessions"},
		{1, "lane occupancy|lane occupancies", "1 lane occupancy"}, {2, "lane occupancy|lane occupancies", "2 lane occupancies"},
	} {
		if got := plural(tc.n, tc.noun); got != tc.want {
			t.Errorf("plural(%d, %q) = %q, want %q", tc.n, tc.noun, got, tc.want)
		}
	}
	m := cstageManifest(t, "")
	code, out, errs := runCLI(t, "check", m)
	if code != exitOK || !strings.Contains(out, "ok: 2 devices, 1 module, 1 session, 1 resident session\n") {
		t.Fatalf("check: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = runCLI(t, "run", m, "--quiet")
	if code != exitOK || !strings.Contains(out, "resident pingpong: 1 round exchanged") || !strings.Contains(out, "0 bytes in, 4 bytes out") {
		t.Fatalf("run: exit %d\n%s%s", code, out, errs)
	}
}
