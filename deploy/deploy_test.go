package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/service"
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

func TestServerMapsErrorsToStatuses(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{&stages.ClientError{Code: 3}, http.StatusUnprocessableEntity},
		{errdefs.Errorf(errdefs.ErrInvalidArgument, "x"), http.StatusBadRequest},
		{errdefs.Errorf(errdefs.ErrNotFound, "x"), http.StatusNotFound},
		{errdefs.Errorf(errdefs.ErrOutOfBudget, "x"), http.StatusRequestEntityTooLarge},
		{errdefs.Errorf(errdefs.ErrBusy, "x"), http.StatusTooManyRequests},
		{errdefs.Errorf(errdefs.ErrDeadlineExceeded, "x"), http.StatusGatewayTimeout},
		{errdefs.Errorf(errdefs.ErrDeviceLost, "x"), http.StatusServiceUnavailable},
		{errdefs.Errorf(errdefs.ErrFault, "x"), http.StatusInternalServerError},
	} {
		if got := service.HTTPStatus(tc.err); got != tc.code {
			t.Errorf("%v: %d, want %d", tc.err, got, tc.code)
		}
	}
}

func TestServerRoutes(t *testing.T) {
	d := open(t, twoSessions)
	srv := httptest.NewServer(service.NewServer(d, nil).Handler())
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		code         int
		want         string
	}{
		{"POST", "/v1/sessions/steady/run", 200, "ok"},
		{"POST", "/v1/sessions/nope/run", 404, `"class": "not_found"`},
		{"GET", "/v1/sessions/steady", 200, `"state": "ready"`},
		{"GET", "/v1/sessions", 200, `"name": "flaky"`},
		{"GET", "/v1/residents/nope", 404, "no resident"},
		{"POST", "/v1/residents/pp/start", 202, `"id": 1`},
		{"GET", "/healthz", 200, "ok"},
		{"GET", "/debug/trace", 200, "traceEvents"},
		{"GET", "/metrics", 200, "stagehost_lane_occupancies_total"},
		{"DELETE", "/v1/sessions/steady/run", 405, `"class": "method_not_allowed"`},
		{"GET", "/nowhere", 404, `"class": "not_found"`},
		{"GET", "/livez", 200, `"live": true`},
		{"GET", "/readyz", 200, `"status": "ready"`},
		{"GET", "/v1/sessions/steady/ready", 200, `"ready": true`},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !bytes.Contains(body, []byte(tc.want)) {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, resp.StatusCode, body)
		}
	}
}

const mlpManifest = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "mlp"
path = "@REPO@/examples/wasm/mlp/stage/mlp.wasm"
sha256 = "@SHA:examples/wasm/mlp/stage/mlp.wasm@"
wasi = ["go-runtime"]
[[session]]
name = "classify"
stage = "mlp"
device = "gpu0"
programs = ["matmul", "bias", "relu", "argmax", "mlp_forward"]
budget = "1MiB"
`

// BenchmarkHTTPRunMLP8Clients measures `POST /v1/sessions/classify/run`
// for the MLP stage with 8 concurrent clients over loopback TCP. It
// reports requests per second and the p99 latency.
func BenchmarkHTTPRunMLP8Clients(b *testing.B) {
	d := open(b, mlpManifest)
	srv := httptest.NewServer(service.NewServer(d, nil).Handler())
	defer srv.Close()
	in := model.EncodeInput(model.TestInputs(1)[0])
	want, _ := model.Predict(in)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(8 / max(1, min(8, runtimeProcs())))
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			resp, err := client.Post(srv.URL+"/v1/sessions/classify/run", "application/octet-stream", bytes.NewReader(in))
			if err != nil {
				b.Error(err)
				return
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !bytes.Equal(out, want) {
				b.Errorf("%d %x", resp.StatusCode, out)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "req/s")
		b.ReportMetric(float64(lat[(len(lat)*99+99)/100-1].Microseconds()), "p99-µs")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
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
