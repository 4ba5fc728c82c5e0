package service_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/service"
)

// residents is a deployment with resident "pp" only; @GPU@, @NPU@,
// @RUNTIME@ and @RESIDENT@ add keys to the gpu device, the npu device,
// [runtime] and the resident (whose join_deadline is 20ms unless given).
const residents = `
version = 1
[runtime]
cache_dir = "off"
@RUNTIME@
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
@GPU@
[[device]]
name = "npu0"
backend = "sim"
engine = "npu"
@NPU@
[[resident]]
name = "pp"
gpu = "gpu0"
npu = "npu0"
@RESIDENT@
`

func residentManifest(runtime, gpu, npu, resident string) string {
	if !strings.Contains(resident, "join_deadline") {
		resident += "join_deadline = \"20ms\"\n"
	}
	return strings.NewReplacer("@RUNTIME@", runtime, "@GPU@", gpu, "@NPU@", npu, "@RESIDENT@", resident).Replace(residents)
}

// npuHangs makes every run quarantine: its NPU participant never runs,
// so its GPU participant never retires.
const npuHangs = "[[device.sim.fault]]\nkind = \"hang\"\n"

// TestResidentQuarantineCap: quarantined runs are counted, reported in
// the resident's status and metrics, and past max_quarantined a start is
// refused with 503 device_lost, naming the count and the cap.
func TestResidentQuarantineCap(t *testing.T) {
	d := open(t, residentManifest("", "", npuHangs, "max_quarantined = 2\n"))
	r := d.Resident("pp")
	for i := 1; i <= 2; i++ {
		run, err := r.Run(context.Background())
		if err == nil || run.State != "quarantined" {
			t.Fatalf("run %d: %+v, %v; want quarantined", i, run, err)
		}
	}
	if q := r.Quarantined(); len(q) != 2 || q[0] != 1 || q[1] != 2 {
		t.Fatalf("Quarantined() = %v, want [1 2]", q)
	}
	_, err := r.Start(context.Background())
	if !errors.Is(err, errdefs.ErrDeviceLost) || !strings.Contains(err.Error(), "2 quarantined runs keep their resources; the cap is 2") {
		t.Fatalf("start past the cap: %v", err)
	}
	s := &served{t: t, srv: service.NewServer(d, slog.New(slog.DiscardHandler)), d: d}
	rec := s.do("POST", "/v1/residents/pp/start", nil)
	if e := errorBody(t, rec); rec.Code != 503 || e.Class != "device_lost" || !strings.Contains(e.Error, "the cap is 2") {
		t.Errorf("HTTP start past the cap: %d %+v", rec.Code, e)
	}
	rec = s.do("GET", "/v1/residents/pp", nil)
	if body := rec.Body.String(); rec.Code != 200 || !strings.Contains(body, `"quarantined": [`) || !strings.Contains(body, `"max_quarantined": 2`) {
		t.Errorf("status: %d %s", rec.Code, body)
	}
	rec = s.do("GET", "/metrics", nil)
	if body := rec.Body.String(); !strings.Contains(body, `stagehost_resident_quarantined_runs{resident="pp"} 2`) ||
		!strings.Contains(body, `stagehost_resident_parked{device="gpu0"} 2`) {
		t.Errorf("metrics lack the quarantined runs or parked participants:\n%s", grepLines(body, "stagehost_resident"))
	}
	if st := d.Runtime.Stats(); st.CapacityUsed != 0 {
		t.Errorf("quarantined runs hold %d capacity units; they release theirs when they end", st.CapacityUsed)
	}
}

// TestResidentMaxParked: a quarantined run whose GPU participant never
// retired keeps its parked slot; past the device's max_parked a start is
// refused busy (429), naming the device; a healthy run gives its slot back.
func TestResidentMaxParked(t *testing.T) {
	d := open(t, residentManifest("", "max_parked = 1\n", npuHangs, ""))
	r := d.Resident("pp")
	if run, err := r.Run(context.Background()); err == nil || run.State != "quarantined" {
		t.Fatalf("run: %+v, %v; want quarantined", run, err)
	}
	_, err := r.Start(context.Background())
	if !errors.Is(err, errdefs.ErrBusy) || !strings.Contains(err.Error(), `parked on "gpu0", its max_parked`) {
		t.Fatalf("start past max_parked: %v", err)
	}
	s := &served{t: t, srv: service.NewServer(d, slog.New(slog.DiscardHandler)), d: d}
	rec := s.do("POST", "/v1/residents/pp/start", nil)
	if e := errorBody(t, rec); rec.Code != 429 || e.Class != "busy" {
		t.Errorf("HTTP start past max_parked: %d %+v", rec.Code, e)
	}

	// Healthy runs, one after another, never exceed a bound of one (with
	// a join deadline that a loaded machine meets: 20ms is for the runs
	// that must quarantine).
	d = open(t, residentManifest("", "max_parked = 1\n", "", "join_deadline = \"10s\"\n"))
	for i := 1; i <= 5; i++ {
		if _, err := d.Resident("pp").Run(context.Background()); err != nil {
			t.Fatalf("healthy run %d with max_parked = 1: %v", i, err)
		}
	}
}

// TestResidentAdmission: a run holds one unit of the runtime's capacity
// while it lives; a start that cannot get it within its startup deadline
// is refused busy (429) and leaves nothing behind.
func TestResidentAdmission(t *testing.T) {
	d := open(t, residentManifest("capacity = 1\n", "", "", "startup_deadline = \"30ms\"\njoin_deadline = \"5s\"\n"))
	r := d.Resident("pp")
	hold, err := d.Runtime.Reserve(context.Background(), host.Op{Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Start(context.Background())
	if !errors.Is(err, errdefs.ErrBusy) || !strings.Contains(err.Error(), "not admitted within its startup deadline 30ms") {
		t.Fatalf("start with no capacity: %v", err)
	}
	s := &served{t: t, srv: service.NewServer(d, slog.New(slog.DiscardHandler)), d: d}
	rec := s.do("POST", "/v1/residents/pp/start", nil)
	if e := errorBody(t, rec); rec.Code != 429 || e.Class != "busy" {
		t.Errorf("HTTP start with no capacity: %d %+v", rec.Code, e)
	}
	if n := r.Running(); n != 0 {
		t.Errorf("%d runs running after refusals", n)
	}
	hold.Release()
	if _, err := r.Run(context.Background()); err != nil {
		t.Fatalf("run once capacity is free: %v", err)
	}
	if st := d.Runtime.Stats(); st.CapacityUsed != 0 {
		t.Errorf("capacity used %d after the run ended", st.CapacityUsed)
	}

	// A live run holds its unit: with the npu hung, the run lives until its
	// join deadline, and a stage-like submission waits behind it.
	d = open(t, residentManifest("capacity = 1\n", "", npuHangs, "join_deadline = \"1s\"\n"))
	run, err := d.Resident("pp").Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st := d.Runtime.Stats(); st.CapacityUsed != 1 {
		t.Errorf("capacity used %d while run %d lives, want 1", st.CapacityUsed, run.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20e6)
	defer cancel()
	err = d.Runtime.Submit(ctx, host.Op{Lane: host.LaneUpload, Owner: "stage"}, func(context.Context) error { return nil })
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("a submission while the run holds the capacity: %v, want ErrDeadlineExceeded", err)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
