package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/stages"
)

// TestRunLeavesTheWeightsHashToTheUpload: run loads the manifest without
// hashing the weights (manifest.LoadConfig.WithWeightsHashAtUpload), so a
// file that does not match its well-formed sha256 is refused by the
// upload when the deployment opens (exit 3, both sums named), and so does
// serve; check, and serve --supervise, whose supervisor uploads nothing,
// refuse it when they read the manifest (exit 65).
func TestRunLeavesTheWeightsHashToTheUpload(t *testing.T) {
	abs, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	const wrong = "f6b869dc7189a64b15672fe534ce31573ba9fe8a12e218b99215c921dca39a7b" // tiny.safetensors' with its last digit changed
	mod := filepath.Join(abs, "stages/testdata/abi/weights.wasm")
	bin, err := os.ReadFile(mod)
	if err != nil {
		t.Fatal(err)
	}
	m := filepath.Join(t.TempDir(), "m.toml")
	body := `version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "weights"
path = "` + mod + `"
sha256 = "` + stages.SHA256(bin) + `"
[[weights]]
name = "digits"
path = "` + filepath.Join(abs, "manifest/testdata/weights/tiny.safetensors") + `"
sha256 = "` + wrong + `"
[[session]]
name = "classify"
stage = "weights"
device = "gpu0"
programs = ["copy"]
weights = ["digits"]
`
	if err := os.WriteFile(m, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "check", m)
	if code != exitInvalid || !strings.Contains(errs, "weights[0].sha256: does not match") {
		t.Errorf("check: exit %d (want %d):\n%s%s", code, exitInvalid, out, errs)
	}
	code, out, errs = runCLI(t, "serve", "--supervise", "--addr", "127.0.0.1:0", m)
	if code != exitInvalid || !strings.Contains(errs, "weights[0].sha256: does not match") {
		t.Errorf("serve --supervise: exit %d (want %d):\n%s%s", code, exitInvalid, out, errs)
	}
	for _, args := range [][]string{{"run", "--quiet", m}, {"serve", "--quiet", "--addr", "127.0.0.1:0", m}} {
		code, out, errs = runCLI(t, args...)
		if code != exitStartup || !strings.Contains(errs, "hash to f6b869dc7189a64b15672fe534ce31573ba9fe8a12e218b99215c921dca39a7a, not the declared sha256 "+wrong) {
			t.Errorf("%s: exit %d (want %d):\n%s%s", args[0], code, exitStartup, out, errs)
		}
	}
}
