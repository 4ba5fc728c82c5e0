package host_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
)

func ExampleNewRuntime() {
	rt, err := host.NewRuntime(host.NewConfig().WithCapacity(16))
	if err != nil {
		panic(err)
	}
	fmt.Println(rt.Capacity())
	// Output: 16
}

func ExampleRuntime_Submit() {
	rt, _ := host.NewRuntime(host.NewConfig())
	err := rt.Submit(context.Background(), host.Op{Lane: host.LaneUpload, Owner: "loader", Device: "gpu0"},
		func(ctx context.Context) error {
			// Enqueue device work here and wait for its completion.
			return nil
		})
	fmt.Println(err, rt.Tracer().Summary()[host.LaneUpload].Count)
	// Output: <nil> 1
}

func ExampleRuntime_AcquireCompute() {
	rt, _ := host.NewRuntime(host.NewConfig())
	var lease host.Lease // keep one per session and reuse it
	if err := rt.AcquireCompute(context.Background(), host.Op{Owner: "stage"}, &lease); err != nil {
		panic(err)
	}
	// A nested stage through the lease's context is refused, not deadlocked.
	var nested host.Lease
	err := rt.AcquireCompute(lease.Context(), host.Op{Owner: "nested"}, &nested)
	fmt.Println(err)
	lease.Release(false)
	// Output: recursive native stage for "nested" in the same runtime
}

func ExampleTracer_WriteChromeTrace() {
	rt, _ := host.NewRuntime(host.NewConfig())
	_ = rt.Submit(context.Background(), host.Op{Lane: host.LaneCompute, Owner: "k"}, func(context.Context) error { return nil })
	f, _ := os.CreateTemp("", "trace-*.json")
	defer os.Remove(f.Name())
	fmt.Println(rt.Tracer().WriteChromeTrace(f))
	// Output: <nil>
}

// A request with a Timeout gives up waiting for its lane when it passes:
// here another lease holds the device's compute lane.
func ExampleOp_timeout() {
	rt, _ := host.NewRuntime(host.NewConfig())
	var holder, bounded host.Lease
	_ = rt.AcquireCompute(context.Background(), host.Op{Owner: "holder", Device: "gpu0"}, &holder)
	err := rt.AcquireCompute(context.Background(), host.Op{Owner: "bounded", Device: "gpu0", Timeout: 10 * time.Millisecond}, &bounded)
	fmt.Println(errors.Is(err, errdefs.ErrDeadlineExceeded), bounded.Held())
	holder.Release(false)
	// Output: true false
}
