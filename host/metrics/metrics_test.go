package metrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/host/metrics"
)

func TestCollectorReportsLanesCapacityAndQuarantines(t *testing.T) {
	rt, _ := host.NewRuntime(host.NewConfig().WithCapacity(7))
	ctx := context.Background()
	_ = rt.Submit(ctx, host.Op{Lane: host.LaneUpload}, func(context.Context) error { return nil })
	_ = rt.Submit(ctx, host.Op{Lane: host.LaneUpload}, func(context.Context) error { return errors.New("x") })
	rt.NoteQuarantine("bad", 4096)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(rt))
	want := `
# HELP stagehost_capacity_units Bounded submission capacity.
# TYPE stagehost_capacity_units gauge
stagehost_capacity_units 7
# HELP stagehost_lane_failures_total Lane occupancies that failed.
# TYPE stagehost_lane_failures_total counter
stagehost_lane_failures_total{device="",lane="compute"} 0
stagehost_lane_failures_total{device="",lane="download"} 0
stagehost_lane_failures_total{device="",lane="npu"} 0
stagehost_lane_failures_total{device="",lane="upload"} 1
# HELP stagehost_lane_occupancies_total Lane occupancies (stages and coordinated submissions) since start.
# TYPE stagehost_lane_occupancies_total counter
stagehost_lane_occupancies_total{device="",lane="compute"} 0
stagehost_lane_occupancies_total{device="",lane="download"} 0
stagehost_lane_occupancies_total{device="",lane="npu"} 0
stagehost_lane_occupancies_total{device="",lane="upload"} 2
# HELP stagehost_quarantined_bytes Memory kept charged by quarantined owners.
# TYPE stagehost_quarantined_bytes gauge
stagehost_quarantined_bytes 4096
# HELP stagehost_quarantined_owners Owners quarantined because their fence could not be proven.
# TYPE stagehost_quarantined_owners gauge
stagehost_quarantined_owners 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"stagehost_capacity_units", "stagehost_lane_failures_total", "stagehost_lane_occupancies_total",
		"stagehost_quarantined_bytes", "stagehost_quarantined_owners"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 4*7+4 {
		t.Fatalf("%d metrics, %v", n, err)
	}
}

// Two devices' compute lanes are two series: occupancies, failures and
// holders are counted per device, and a declared device is reported with
// zeros before its first occupancy.
func TestCollectorLabelsLanesByDevice(t *testing.T) {
	rt, _ := host.NewRuntime(host.NewConfig().WithCapacity(8))
	ctx := context.Background()
	ok := func(context.Context) error { return nil }
	for range 3 {
		_ = rt.Submit(ctx, host.Op{Device: "gpu0", Lane: host.LaneCompute}, ok)
	}
	_ = rt.Submit(ctx, host.Op{Device: "gpu1", Lane: host.LaneCompute}, func(context.Context) error { return errors.New("x") })
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(rt, "gpu0", "gpu1", "gpu2"))
	inside, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- rt.Submit(ctx, host.Op{Device: "gpu1", Lane: host.LaneUpload}, func(context.Context) error {
			close(inside)
			<-release
			return nil
		})
	}()
	<-inside
	want := `
# HELP stagehost_lane_active_submissions Coordinated submissions occupying the lane now.
# TYPE stagehost_lane_active_submissions gauge
stagehost_lane_active_submissions{device="gpu0",lane="compute"} 0
stagehost_lane_active_submissions{device="gpu0",lane="download"} 0
stagehost_lane_active_submissions{device="gpu0",lane="npu"} 0
stagehost_lane_active_submissions{device="gpu0",lane="upload"} 0
stagehost_lane_active_submissions{device="gpu1",lane="compute"} 0
stagehost_lane_active_submissions{device="gpu1",lane="download"} 0
stagehost_lane_active_submissions{device="gpu1",lane="npu"} 0
stagehost_lane_active_submissions{device="gpu1",lane="upload"} 1
stagehost_lane_active_submissions{device="gpu2",lane="compute"} 0
stagehost_lane_active_submissions{device="gpu2",lane="download"} 0
stagehost_lane_active_submissions{device="gpu2",lane="npu"} 0
stagehost_lane_active_submissions{device="gpu2",lane="upload"} 0
# HELP stagehost_lane_failures_total Lane occupancies that failed.
# TYPE stagehost_lane_failures_total counter
stagehost_lane_failures_total{device="gpu0",lane="compute"} 0
stagehost_lane_failures_total{device="gpu0",lane="download"} 0
stagehost_lane_failures_total{device="gpu0",lane="npu"} 0
stagehost_lane_failures_total{device="gpu0",lane="upload"} 0
stagehost_lane_failures_total{device="gpu1",lane="compute"} 1
stagehost_lane_failures_total{device="gpu1",lane="download"} 0
stagehost_lane_failures_total{device="gpu1",lane="npu"} 0
stagehost_lane_failures_total{device="gpu1",lane="upload"} 0
stagehost_lane_failures_total{device="gpu2",lane="compute"} 0
stagehost_lane_failures_total{device="gpu2",lane="download"} 0
stagehost_lane_failures_total{device="gpu2",lane="npu"} 0
stagehost_lane_failures_total{device="gpu2",lane="upload"} 0
# HELP stagehost_lane_occupancies_total Lane occupancies (stages and coordinated submissions) since start.
# TYPE stagehost_lane_occupancies_total counter
stagehost_lane_occupancies_total{device="gpu0",lane="compute"} 3
stagehost_lane_occupancies_total{device="gpu0",lane="download"} 0
stagehost_lane_occupancies_total{device="gpu0",lane="npu"} 0
stagehost_lane_occupancies_total{device="gpu0",lane="upload"} 0
stagehost_lane_occupancies_total{device="gpu1",lane="compute"} 1
stagehost_lane_occupancies_total{device="gpu1",lane="download"} 0
stagehost_lane_occupancies_total{device="gpu1",lane="npu"} 0
stagehost_lane_occupancies_total{device="gpu1",lane="upload"} 0
stagehost_lane_occupancies_total{device="gpu2",lane="compute"} 0
stagehost_lane_occupancies_total{device="gpu2",lane="download"} 0
stagehost_lane_occupancies_total{device="gpu2",lane="npu"} 0
stagehost_lane_occupancies_total{device="gpu2",lane="upload"} 0
`
	err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"stagehost_lane_active_submissions", "stagehost_lane_failures_total", "stagehost_lane_occupancies_total")
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The per-device totals sum to the per-lane ones.
	var sum [host.NumLanes]uint64
	for _, s := range rt.Tracer().DeviceSummary() {
		sum[s.Lane] += s.Count
	}
	for _, s := range rt.Tracer().Summary() {
		if sum[s.Lane] != s.Count {
			t.Errorf("lane %v: devices sum to %d, the lane counted %d", s.Lane, sum[s.Lane], s.Count)
		}
	}
}
