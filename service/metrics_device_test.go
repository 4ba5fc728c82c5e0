package service_test

import (
	"context"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/service"
)

// scrape serves GET /metrics in process and returns every sample by its
// series, as the text format writes it (name{labels}).
func scrape(t *testing.T, srv *service.Server) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	out := map[string]float64{}
	sample := regexp.MustCompile(`^(\w+(?:\{[^}]*\})?) (\S+)$`)
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if m := sample.FindStringSubmatch(l); m != nil {
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			out[m[1]] = v
		}
	}
	return out
}

// The lane metrics are per device: two sessions on two GPUs are two
// compute series, and a device nothing ran on yet is reported with
// zeros. A resident's runs are counted: started, and by state.
func TestMetricsArePerDeviceAndCountResidentRuns(t *testing.T) {
	d := open(t, twoSessions) // steady on gpu0; flaky on gpu1, its first command fails; resident pp on gpu0 and npu0
	srv := service.NewServer(d, nil)
	m := scrape(t, srv)
	for _, dev := range []string{"gpu0", "gpu1", "npu0"} {
		for _, lane := range []string{"compute", "upload", "download", "npu"} {
			k := `stagehost_lane_occupancies_total{device="` + dev + `",lane="` + lane + `"}`
			if v, ok := m[k]; !ok || v != 0 {
				t.Errorf("before any call: %s = %v (present %v), want 0", k, v, ok)
			}
		}
	}
	if v := m[`stagehost_resident_runs_started_total{resident="pp"}`]; v != 0 {
		t.Errorf("runs started before any run: %v", v)
	}

	ctx := context.Background()
	for range 3 {
		if _, err := d.Pool("steady").Run(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Pool("flaky").Run(ctx, nil); err == nil {
		t.Fatal("flaky's first call succeeded")
	}
	for range 2 {
		if _, err := d.Resident("pp").Run(ctx); err != nil {
			t.Fatal(err)
		}
	}
	m = scrape(t, srv)
	compute := func(dev string) float64 {
		return m[`stagehost_lane_occupancies_total{device="`+dev+`",lane="compute"}`]
	}
	if compute("gpu0") < 3 || compute("gpu1") < 1 || compute("gpu1") >= compute("gpu0") {
		t.Errorf("compute occupancies gpu0 %v (3 steady calls), gpu1 %v (1 flaky call)", compute("gpu0"), compute("gpu1"))
	}
	if v := m[`stagehost_lane_occupancies_total{device="npu0",lane="compute"}`]; v != 0 {
		t.Errorf("npu0's compute lane: %v occupancies, no stage ran there", v)
	}
	for k, want := range map[string]float64{
		`stagehost_resident_runs_started_total{resident="pp"}`:        2,
		`stagehost_resident_runs{resident="pp",state="verified"}`:     2,
		`stagehost_resident_runs{resident="pp",state="running"}`:      0,
		`stagehost_resident_runs{resident="pp",state="failed"}`:       0,
		`stagehost_resident_runs{resident="pp",state="quarantined"}`:  0,
		`stagehost_session_runs_total{outcome="ok",session="steady"}`: 3,
	} {
		if v, ok := m[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
	// No series without a device when every op names its device.
	for k := range m {
		if strings.HasPrefix(k, "stagehost_lane_") && !strings.Contains(k, `device="`) {
			t.Errorf("a lane series without a device: %s", k)
		}
	}
}
