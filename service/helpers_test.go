package service_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// repo is the repository root, from this package's directory.
const repo = ".."

func sha(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, path))
	if err != nil {
		t.Fatal(err)
	}
	return stages.SHA256(b)
}

// writeManifest writes a manifest in a temp dir whose paths point into the
// repository.
func writeManifest(t testing.TB, body string) string {
	t.Helper()
	abs, err := filepath.Abs(repo)
	if err != nil {
		t.Fatal(err)
	}
	body = strings.ReplaceAll(body, "@REPO@", abs)
	for _, m := range []string{"examples/wasm/mlp/stage/mlp.wasm", "examples/wasm/cstage/cstage.wasm", "stages/testdata/hostile/good_stage.wasm",
		"deploy/testdata/init_trap.wasm", "deploy/testdata/init_loop.wasm"} {
		body = strings.ReplaceAll(body, "@SHA:"+m+"@", sha(t, m))
	}
	path := filepath.Join(t.TempDir(), "m.toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func open(t testing.TB, body string) *deploy.Deployment {
	t.Helper()
	m, err := manifest.Load(writeManifest(t, body))
	if err != nil {
		t.Fatal(err)
	}
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(context.Background()) })
	return d
}

// twoSessions is deploy_test.go's manifest of the same name.
const twoSessions = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device]]
name = "gpu1"
backend = "sim"
engine = "gpu"
[[device.sim.fault]]
kind = "fail_completion"
count = 1
session = "flaky"
[[device]]
name = "npu0"
backend = "sim"
engine = "npu"
[[module]]
name = "good"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[session]]
name = "steady"
stage = "good"
device = "gpu0"
programs = ["noop"]
[[session]]
name = "flaky"
stage = "good"
device = "gpu1"
programs = ["noop"]
[[resident]]
name = "pp"
gpu = "gpu0"
npu = "npu0"
rounds = 8
`
