package host

import (
	"context"
	"runtime"
	"testing"
)

func testingProcs() int { return runtime.GOMAXPROCS(0) }

// BenchmarkLeaseUncontended is one native lease: admission, lease,
// release and trace record.
func BenchmarkLeaseUncontended(b *testing.B) {
	rt := newTestRuntime(b, 64)
	ctx := context.Background()
	var l Lease
	b.ReportAllocs()
	for b.Loop() {
		if err := rt.AcquireCompute(ctx, Op{Owner: "bench"}, &l); err != nil {
			b.Fatal(err)
		}
		l.Release(false)
	}
}

// BenchmarkLeaseContended64 has 64 goroutines taking native compute
// leases; ns/op is the lease throughput of the whole runtime.
func BenchmarkLeaseContended64(b *testing.B) {
	rt := newTestRuntime(b, 64)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(64 / max(1, testingProcs()))
	b.RunParallel(func(pb *testing.PB) {
		var l Lease
		for pb.Next() {
			if err := rt.AcquireCompute(ctx, Op{Owner: "bench"}, &l); err != nil {
				b.Fatal(err)
			}
			l.Release(false)
		}
	})
}

// BenchmarkSubmitContended64 has 64 goroutines making coordinated
// submissions spread over the four lanes, capacity 8.
func BenchmarkSubmitContended64(b *testing.B) {
	rt := newTestRuntime(b, 8)
	ctx := context.Background()
	fn := func(context.Context) error { return nil }
	b.ReportAllocs()
	b.SetParallelism(64 / max(1, testingProcs()))
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			if err := rt.Submit(ctx, Op{Lane: Lane(i % NumLanes), Owner: "bench"}, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
}
