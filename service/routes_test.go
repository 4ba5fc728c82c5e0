package service_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	"github.com/stagehost/stagehost/service"
	"github.com/stagehost/stagehost/stages"
)

// The service's routes over a deployment, and its request path's
// benchmark (moved here from package deploy's tests with the service).
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
	b.SetParallelism(8 / max(1, min(8, runtime.GOMAXPROCS(0))))
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
