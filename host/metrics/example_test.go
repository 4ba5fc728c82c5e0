package metrics_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/host/metrics"
)

func ExampleNewCollector() {
	rt, _ := host.NewRuntime(host.NewConfig().WithCapacity(8))
	_ = rt.Submit(context.Background(), host.Op{Lane: host.LaneUpload}, func(context.Context) error { return nil })
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(rt))
	err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP stagehost_capacity_units Bounded submission capacity.
# TYPE stagehost_capacity_units gauge
stagehost_capacity_units 8
`), "stagehost_capacity_units")
	fmt.Println(err)
	// Output: <nil>
}
