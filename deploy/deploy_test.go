package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

func TestSessionsRunAndFaultsApplyToTheirSessionOnly(t *testing.T) {
	d := open(t, twoSessions)
	ctx := context.Background()
	out, err := d.Pool("steady").Run(ctx, nil)
	if err != nil || string(out) != "ok" {
		t.Fatalf("steady: %q %v", out, err)
	}
	// The injected failed completion surfaces in flaky's stream_sync as a
	// client error; the session is not quarantined (the work retired).
	_, err = d.Pool("flaky").Run(ctx, nil)
	var ce *stages.ClientError
	if !errors.As(err, &ce) || ce.Code != 103 {
		t.Fatalf("flaky: %v", err)
	}
	if out, err := d.Pool("flaky").Run(ctx, nil); err != nil || string(out) != "ok" {
		t.Fatalf("flaky's second call: %q %v", out, err)
	}
	st := d.Statuses()
	if len(st) != 2 || st[0].Name != "flaky" || st[0].Calls != 2 || st[0].Failures != 1 || st[0].State != "ready" || st[1].Calls != 1 {
		t.Fatalf("statuses %+v", st)
	}
	if !slices.Equal(d.SessionNames(), []string{"steady", "flaky"}) || !slices.Equal(d.ResidentNames(), []string{"pp"}) {
		t.Fatal("names")
	}
}

func TestConcurrentCallersOfOneSessionWaitTheirTurn(t *testing.T) {
	d := open(t, twoSessions)
	s := d.Pool("steady")
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := s.Run(context.Background(), nil); err != nil || string(out) != "ok" {
				errs <- fmt.Errorf("%q %v", out, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err) // a Busy here would mean callers were not serialised
	}
	if st := s.Status(); st.Calls != 16 || st.Failures != 0 {
		t.Fatalf("%+v", st)
	}
}

func TestResidentRunsAreVerifiedAndListed(t *testing.T) {
	d := open(t, twoSessions)
	r := d.Resident("pp")
	for i := 1; i <= 3; i++ {
		run, err := r.Run(context.Background())
		if err != nil || !run.Verified || run.State != "verified" || run.ID != i {
			t.Fatalf("run %d: %+v %v", i, run, err)
		}
	}
	if runs := r.Runs(); len(runs) != 3 {
		t.Fatalf("%d runs", len(runs))
	}
	if st := d.Runtime.Stats(); len(st.Quarantined) != 0 {
		t.Fatalf("quarantines %v", st.Quarantined)
	}
}

func TestUnwritableDefaultCacheFallsBackToCompiling(t *testing.T) {
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CACHE_HOME", filepath.Join(blocker, "below-a-file")) // cannot be created
	body := strings.Replace(twoSessions, "[runtime]\ncache_dir = \"off\"\n", "", 1)
	d := open(t, body)
	if out, err := d.Pool("steady").Run(context.Background(), nil); err != nil || string(out) != "ok" {
		t.Fatalf("%q %v", out, err)
	}
}
