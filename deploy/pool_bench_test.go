package deploy_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// poolBench is a manifest of four sim GPUs with a latency (@LAT@) and
// the good stage (a noop submitted and synced, then the built-in fence)
// three ways: one instance on one device, four instances on one device,
// four instances on four devices.
const poolBench = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[device.sim]
latency = "@LAT@"
[[device]]
name = "gpu1"
backend = "sim"
engine = "gpu"
[device.sim]
latency = "@LAT@"
[[device]]
name = "gpu2"
backend = "sim"
engine = "gpu"
[device.sim]
latency = "@LAT@"
[[device]]
name = "gpu3"
backend = "sim"
engine = "gpu"
[device.sim]
latency = "@LAT@"
[[module]]
name = "good"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[session]]
name = "1on1"
stage = "good"
device = "gpu0"
programs = ["noop"]
[[session]]
name = "4on1"
stage = "good"
devices = ["gpu0"]
instances = 4
programs = ["noop"]
[[session]]
name = "4on4"
stage = "good"
devices = ["gpu0", "gpu1", "gpu2", "gpu3"]
programs = ["noop"]
`

// BenchmarkPoolThroughput measures a pooled session's calls per second
// with 8 callers (more than its instances, so its queue is never empty)
// through Session.Run, on sim devices whose commands take a latency:
// one instance on one device, four instances sharing one device (they
// serialise on its compute lane, which a stage holds exclusively), and
// four instances on four devices. x-vs-1on1 is the sub-benchmark's rate
// over the median of 1on1's runs at the same latency (-count runs each
// sub-benchmark count times in a row, 1on1 first).
//
// The sim holds a latency below 2ms by spinning a CPU per busy stream,
// so on a machine with fewer CPUs than devices busy at once the 200us
// case measures the CPUs, not the pool; the 5ms case spins for 1ms of
// each command.
func BenchmarkPoolThroughput(b *testing.B) {
	for _, lat := range []string{"200us", "5ms"} {
		d := open(b, strings.ReplaceAll(poolBench, "@LAT@", lat))
		var base []float64 // 1on1's rates
		for _, name := range []string{"1on1", "4on1", "4on4"} {
			b.Run("latency="+lat+"/"+name, func(b *testing.B) {
				s := d.Pool(name)
				ctx := context.Background()
				if _, err := s.Run(ctx, nil); err != nil { // warm
					b.Fatal(err)
				}
				const callers = 8
				var next atomic.Int64
				var failed atomic.Value
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= int64(b.N) {
							if _, err := s.Run(ctx, nil); err != nil {
								failed.Store(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				if err, _ := failed.Load().(error); err != nil {
					b.Fatal(err)
				}
				rate := float64(b.N) / elapsed.Seconds()
				b.ReportMetric(rate, "req/s")
				if name == "1on1" {
					base = append(base, rate)
				} else if len(base) > 0 {
					sorted := slices.Sorted(slices.Values(base))
					b.ReportMetric(rate/sorted[len(sorted)/2], "x-vs-1on1")
				}
			})
		}
	}
}
