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
stagehost_lane_failures_total{lane="compute"} 0
stagehost_lane_failures_total{lane="download"} 0
stagehost_lane_failures_total{lane="npu"} 0
stagehost_lane_failures_total{lane="upload"} 1
# HELP stagehost_lane_occupancies_total Lane occupancies (stages and coordinated submissions) since start.
# TYPE stagehost_lane_occupancies_total counter
stagehost_lane_occupancies_total{lane="compute"} 0
stagehost_lane_occupancies_total{lane="download"} 0
stagehost_lane_occupancies_total{lane="npu"} 0
stagehost_lane_occupancies_total{lane="upload"} 2
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
