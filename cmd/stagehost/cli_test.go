package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/internal/testutil"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestRunTheExampleManifestWithGoGuests(t *testing.T) {
	testutil.GoGuests(t)
	trace := filepath.Join(t.TempDir(), "trace.json")
	code, out, errs := runCLI(t, "run", "../../host.toml", "--trace", trace)
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{
		"session classify: ok", "output: class 0, scores [0.5234833 -2.4306183 -0.27392578 -0.48095703]",
		"session fill: ok", "output: [40]",
		"resident pingpong: 64 rounds exchanged and verified",
		"lane summary:", "compute", "npu",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errs, "loading module mlp") {
		t.Errorf("no compile progress on stderr:\n%s", errs)
	}
	code, out, _ = runCLI(t, "trace", trace)
	if code != exitOK || !strings.Contains(out, "gpu0/compute/classify") || !strings.Contains(out, "npu0/npu/pingpong#1") {
		t.Fatalf("trace summary: %d\n%s", code, out)
	}
}

func TestRunOneGoGuestSessionWithAnInputFile(t *testing.T) {
	testutil.GoGuests(t)
	code, out, errs := runCLI(t, "run", "../../host.toml", "--session", "classify", "--input", "../../examples/inputs/mlp-sample.bin")
	if code != exitOK || !strings.Contains(out, "session classify: ok") || strings.Contains(out, "fill") || strings.Contains(out, "pingpong") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	// --session loads only what the session needs: its stage and its
	// fence module.
	if !strings.Contains(errs, "loading module mlp ") || !strings.Contains(errs, "loading module mlp-fence") || strings.Contains(errs, "cstage") {
		t.Fatalf("--session classify loaded other modules, or not its own:\n%s", errs)
	}
}

func TestExitCodes(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("version = 1\n[runtime]\ncapacity = \"lots\"\nturbo = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cuda := filepath.Join(t.TempDir(), "cuda.toml")
	if err := os.WriteFile(cuda, []byte("version = 1\n[[device]]\nname = \"g\"\nbackend = \"cuda\"\nengine = \"gpu\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "Usage"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"check"}, exitUsage, "exactly one FILE"},
		{[]string{"check", "a.toml", "b.toml"}, exitUsage, "exactly one FILE"},
		{[]string{"run", "--turbo", "../../host.toml"}, exitUsage, "flag provided but not defined: -turbo"},
		{[]string{"serve", "--grace", "soon", "../../host.toml"}, exitUsage, `invalid value "soon"`},
		{[]string{"check", "-h"}, exitOK, "Usage: stagehost check FILE"},
		{[]string{"check", bad}, exitInvalid, "bad.toml:3: runtime.capacity"},
		{[]string{"check", bad}, exitInvalid, "bad.toml:4: runtime.turbo: unknown key"},
		{[]string{"check", filepath.Join(t.TempDir(), "nope.toml")}, exitInvalid, `nope.toml" does not exist`},
		{[]string{"check", "../../manifest/testdata/bad/file_kinds.toml"}, exitInvalid, `"/dev/zero" is not a regular file: it is a character device`},
		{[]string{"check", "../../manifest/testdata/bad/file_sizes.toml"}, exitInvalid, "larger than the module size limit of 16B (set by module[3].max_size)"},
		{[]string{"check", "../../manifest/testdata/bad/unknown_programs.toml"}, exitInvalid, `session[0].programs[1]: no program "saxpi" on backend sim (did you mean "saxpy"?)`},
		{[]string{"check", "../../manifest/testdata/bad/resident_payload.toml"}, exitInvalid, "resident[0].payload: the sim resident participants exchange exactly 192B"},
		{[]string{"check", "../../manifest/testdata/bad/wasi_command.toml"}, exitInvalid, "build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared"},
		{[]string{"check", "../../host.toml"}, exitOK, "ok: 2 devices, 3 modules, 2 sessions, 1 resident session"},
		{[]string{"check", "../../manifest/testdata/bad/sha256_mismatch.toml"}, exitInvalid, `module[3].sha256: must be 64 hexadecimal digits, got "" (the file's sha256 is 376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b)`},
		{[]string{"check", "--print-sha256", "../../manifest/testdata/bad/sha256_mismatch.toml"}, exitOK, `sha256 = "fa1d882b944185aeb8cac0bb41eb64e0a22e6eafeb013b3bafefcaeb9bf33498" # module[0] mlp: ../modules/no_marker.wasm (line 13: differs)`},
		{[]string{"check", "--print-sha256", "../../manifest/testdata/bad/sha256_mismatch.toml"}, exitOK, `# module[3] empty: ../modules/good_stage.wasm (line 28: empty or missing)`},
		{[]string{"check", "--print-sha256", "../../manifest/testdata/bad/missing_files.toml"}, exitInvalid, "does not exist"},
		{[]string{"check", "--print-sha256", filepath.Join(t.TempDir(), "nope.toml")}, exitInvalid, `nope.toml" does not exist`},
		{[]string{"run", "../../host.toml", "--session", "nope"}, exitUsage, `no session or resident session "nope"`},
		{[]string{"run", "../../host.toml", "--input", "x"}, exitUsage, "--input needs --session"},
		{[]string{"run", "../../host.toml", "--session", "classify", "--input", "/dev/zero"}, exitInvalid, "not a regular file"},
		{[]string{"trace", "../../host.toml"}, exitInvalid, "not a stagehost trace"},
		{[]string{"trace", "/dev/zero"}, exitInvalid, "not a regular file"},
		{[]string{"help"}, exitOK, "2   stagehost crashed"},
	} {
		code, out, errs := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(out+errs, tc.want) {
			t.Errorf("%v: exit %d (want %d), output lacks %q:\n%s%s", tc.args, code, tc.code, tc.want, out, errs)
		}
	}
	// Without a CUDA driver, a cuda device cannot start: exit 3. With one
	// (the GPU machine), the manifest has no sessions and runs cleanly.
	code, out, errs := runCLI(t, "run", cuda)
	if code != exitStartup && code != exitOK {
		t.Fatalf("cuda manifest: exit %d\n%s%s", code, out, errs)
	}
	if code == exitStartup && !strings.Contains(errs, "libcuda") {
		t.Fatalf("cuda failure does not say why:\n%s", errs)
	}
}

// TestNoExitCodeIsACrash: the Go runtime exits with 2 after an unrecovered
// panic or a fatal error (out of memory), so none of stagehost's own exit
// codes may be 2, and they must all differ.
func TestNoExitCodeIsACrash(t *testing.T) {
	codes := map[string]int{"ok": exitOK, "failed": exitFailed, "startup": exitStartup, "usage": exitUsage, "invalid": exitInvalid}
	seen := map[int]string{}
	for name, code := range codes {
		if code == exitCrash {
			t.Errorf("exit code %s is %d, the Go runtime's crash status", name, code)
		}
		if other, ok := seen[code]; ok {
			t.Errorf("exit codes %s and %s are both %d", name, other, code)
		}
		seen[code] = name
	}
	if exitUsage != 64 || exitInvalid != 65 {
		t.Errorf("usage %d, invalid %d: want the sysexits values 64 and 65", exitUsage, exitInvalid)
	}
}
