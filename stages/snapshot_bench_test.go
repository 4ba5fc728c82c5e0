package stages

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// sessionGuests are the guests the session benchmarks make sessions of: a
// compiled Go guest (the minimal example and the MLP) and a WAT guest.
var sessionGuests = []struct {
	name, path string
	wasi       bool
}{
	{"go-minimal", "../examples/wasm/minimal/minimal.wasm", true},
	{"go-mlp", "../examples/wasm/mlp/stage/mlp.wasm", true},
	{"wat", "testdata/hostile/good_stage.wasm", false},
}

func loadGuest(b testing.TB, eng *Engine, path string, wasi, snapshot bool) (*Module, []byte) {
	b.Helper()
	bin, err := os.ReadFile(filepath.FromSlash(path))
	if err != nil {
		b.Fatal(err)
	}
	cfg := NewLoadConfig().WithName(filepath.Base(path)).WithSnapshot(snapshot)
	if wasi {
		cfg = cfg.WithWASI(GrantGoRuntime)
	}
	m, err := eng.Load(context.Background(), bin, SHA256(bin), cfg)
	if err != nil {
		b.Fatal(err)
	}
	if ok, why := m.Snapshot(); ok != snapshot {
		b.Fatalf("%s: snapshot = %v (%s), want %v", path, ok, why, snapshot)
	}
	return m, bin
}

// reportP50 reports the median of ds as p50-µs, and the 99th percentile
// as p99-µs.
func reportP50(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(ds[len(ds)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// BenchmarkNewSession makes a session (one sim stream, one program) and
// closes it, in a loop, side by side: from the module's snapshot (what
// the host does), from the snapshot with a warm spare ready for each
// creation (sessions made no faster than the spares refill; the wait is
// not timed), with every instance initialising itself (snapshots off),
// and raw wazero instantiating the module as given, with _initialize
// for a Go guest, in the same engine. ns/op is create plus close (for
// "spare", without the wait); p50-µs and p99-µs are of the creation
// alone.
//
// Targets (issue 9): a Go guest's new session p50 ≤ 100 µs and ≥ 20×
// faster than raw wazero's instantiate plus _initialize; a WAT guest's
// ≤ 15 µs; create and close within 2× of raw wazero.
func BenchmarkNewSession(b *testing.B) {
	ctx := context.Background()
	eng, err := NewEngine(ctx, NewEngineConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close(ctx)
	f := newWasmFixture(b)
	for _, g := range sessionGuests {
		for _, mode := range []string{"snapshot", "spare", "init", "raw"} {
			b.Run(g.name+"/"+mode, func(b *testing.B) {
				m, bin := loadGuest(b, eng, g.path, g.wasi, mode == "snapshot" || mode == "spare")
				var ds []time.Duration
				if mode == "raw" {
					raw, err := eng.runtime.CompileModule(ctx, bin)
					if err != nil {
						b.Fatal(err)
					}
					mc := wazero.NewModuleConfig().WithName("")
					if g.wasi {
						mc = mc.WithStartFunctions("_initialize")
					}
					b.ReportAllocs()
					for b.Loop() {
						t0 := time.Now()
						mod, err := eng.runtime.InstantiateModule(ctx, raw, mc)
						if err != nil {
							b.Fatal(err)
						}
						ds = append(ds, time.Since(t0))
						_ = mod.Close(ctx)
					}
					reportP50(b, ds)
					return
				}
				cfg := NewSessionConfig("bench", f.gpu).WithStreams("s0").WithPrograms("noop")
				if warm, err := eng.NewSession(ctx, f.rt, m, cfg); err == nil { // starts the spares
					_ = warm.Close(ctx)
				}
				b.ReportAllocs()
				for b.Loop() {
					if mode == "spare" {
						// Sessions made no faster than the spares are
						// refilled: each creation finds one ready.
						b.StopTimer()
						for len(m.spares.ready) < cap(m.spares.ready) {
							runtime.Gosched()
						}
						b.StartTimer()
					}
					t0 := time.Now()
					s, err := eng.NewSession(ctx, f.rt, m, cfg)
					if err != nil {
						b.Fatal(err)
					}
					ds = append(ds, time.Since(t0))
					if err := s.Close(ctx); err != nil {
						b.Fatal(err)
					}
				}
				reportP50(b, ds)
			})
		}
	}
}

// BenchmarkResetPerCall calls a session of the minimal Go guest with and
// without [SessionConfig.WithResetPerCall], side by side; the difference
// in ns/op is what strict isolation between calls costs. Target (issue
// 9): ≤ 50 µs a call.
func BenchmarkResetPerCall(b *testing.B) {
	ctx := context.Background()
	eng, err := NewEngine(ctx, NewEngineConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close(ctx)
	f := newWasmFixture(b)
	m, _ := loadGuest(b, eng, "../examples/wasm/minimal/minimal.wasm", true, true)
	for _, reset := range []bool{false, true} {
		name := "keep"
		if reset {
			name = "reset"
		}
		b.Run(name, func(b *testing.B) {
			s, err := eng.NewSession(ctx, f.rt, m, NewSessionConfig("bench", f.gpu).WithStreams("s0").WithResetPerCall(reset))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(ctx)
			in := []byte("hello, world")
			var out []byte
			b.ReportAllocs()
			for b.Loop() {
				if out, err = s.Run(ctx, in, out[:0]); err != nil {
					b.Fatal(err)
				}
			}
			if reset && s.Resets() < b.N {
				b.Fatalf("%d resets in %d calls", s.Resets(), b.N)
			}
		})
	}
}

// rssBytes is this process's resident set size.
func rssBytes(tb testing.TB) int64 {
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		tb.Skip("no /proc/self/statm")
	}
	var size, rss int64
	if _, err := fmt.Sscan(string(statm), &size, &rss); err != nil {
		tb.Fatal(err)
	}
	return rss * int64(os.Getpagesize())
}

func heapBytes() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// benchChildEnv selects the measurement a child process of the test
// binary makes (see inChild).
const benchChildEnv = "STAGEHOST_BENCH_CHILD"

// inChild runs the measurement named what in a new process of this test
// binary and reports the metrics it prints ("METRIC unit value" lines).
// A fresh process measures what sessions cost in resident memory; in the
// benchmark's own process, memory freed by earlier benchmarks would be
// reused and hide it.
func inChild(b *testing.B, what string) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchChild$", "-test.v")
	cmd.Env = append(os.Environ(), benchChildEnv+"="+what)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("%s: %v\n%s", what, err, out)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		var unit string
		var v float64
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "METRIC %s %g", &unit, &v); err == nil {
			b.ReportMetric(v, unit)
			n++
		}
	}
	if n == 0 {
		b.Fatalf("%s reported nothing:\n%s", what, out)
	}
}

// TestBenchChild is the child process of inChild; it is skipped
// otherwise.
func TestBenchChild(t *testing.T) {
	what := os.Getenv(benchChildEnv)
	if what == "" {
		t.Skip("run by BenchmarkIdleSessions and BenchmarkTenThousandSessions")
	}
	metrics := map[string]float64{}
	switch what {
	case "idle-snapshot", "idle-init":
		idleSessions(t, what == "idle-snapshot", metrics)
	case "tenk-1", "tenk-16":
		tenThousandSessions(t, map[string]int{"tenk-1": 1, "tenk-16": 16}[what], metrics)
	default:
		t.Fatalf("unknown measurement %q", what)
	}
	for unit, v := range metrics {
		fmt.Printf("METRIC %s %g\n", unit, v)
	}
}

// BenchmarkIdleSessions makes 1000 sessions of the minimal Go guest, calls
// each once, and reports what an idle session then holds: RSS and Go
// heap per session, from snapshots and with every instance initialising
// itself, side by side, each measured in a new process. Run it with
// -benchtime=1x. Target (issue 9): ≤ 1 MiB of RSS per idle Go-guest
// session.
func BenchmarkIdleSessions(b *testing.B) {
	for _, mode := range []string{"snapshot", "init"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				inChild(b, "idle-"+mode)
			}
		})
	}
}

func idleSessions(t *testing.T, snapshot bool, metrics map[string]float64) {
	ctx := context.Background()
	const n = 1000
	eng, err := NewEngine(ctx, NewEngineConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	f := newWasmFixture(t)
	m, _ := loadGuest(t, eng, "../examples/wasm/minimal/minimal.wasm", true, snapshot)
	cfg := NewSessionConfig("idle", f.gpu).WithStreams("s0")
	// Once first, so the spares and one-time costs are not counted.
	warm, err := eng.NewSession(ctx, f.rt, m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = warm.Close(ctx)
	heap0, rss0 := heapBytes(), rssBytes(t)
	ss := make([]*Session, n)
	for i := range ss {
		if ss[i], err = eng.NewSession(ctx, f.rt, m, cfg); err != nil {
			t.Fatal(err)
		}
		if _, err := ss[i].Run(ctx, []byte("idle"), nil); err != nil {
			t.Fatal(err)
		}
	}
	heap1, rss1 := heapBytes(), rssBytes(t)
	metrics["RSS-KiB/session"] = float64(rss1-rss0) / n / 1024
	metrics["heap-KiB/session"] = float64(heap1-heap0) / n / 1024
	for _, s := range ss {
		_ = s.Close(ctx)
	}
}

// BenchmarkTenThousandSessions makes 10,000 sessions of the minimal Go
// guest on one runtime, each in a new process, and reports their
// creation time (p50, p99), the Go heap and RSS they hold, and then the
// latency of 20,000 calls from 64 goroutines, each calling its own
// sessions (p50, p99): with every session on one sim device (whose one
// compute lane every call holds, so the calls queue behind each other)
// and spread over 16 devices. Run it with -benchtime=1x. Target (issue
// 9): fits a 24 GiB machine with ≤ 1 GiB of Go heap.
func BenchmarkTenThousandSessions(b *testing.B) {
	for _, devices := range []int{1, 16} {
		b.Run(fmt.Sprintf("devices=%d", devices), func(b *testing.B) {
			for b.Loop() {
				inChild(b, fmt.Sprintf("tenk-%d", devices))
			}
		})
	}
}

func tenThousandSessions(t *testing.T, devices int, metrics map[string]float64) {
	ctx := context.Background()
	const n, workers, calls = 10_000, 64, 20_000
	eng, err := NewEngine(ctx, NewEngineConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	rt, err := host.NewRuntime(host.NewConfig().WithCapacity(64))
	if err != nil {
		t.Fatal(err)
	}
	p := sim.New()
	defer p.Close()
	devs := make([]hw.Device, devices)
	for i := range devs {
		if devs[i], err = p.AddDevice(fmt.Sprintf("gpu%d", i), hw.EngineGPU, sim.NewDeviceConfig()); err != nil {
			t.Fatal(err)
		}
	}
	m, _ := loadGuest(t, eng, "../examples/wasm/minimal/minimal.wasm", true, true)
	heap0, rss0 := heapBytes(), rssBytes(t)
	ss := make([]*Session, n)
	create := make([]time.Duration, n)
	for i := range ss {
		cfg := NewSessionConfig(fmt.Sprint("s", i), devs[i%devices]).WithStreams("s0")
		t0 := time.Now()
		if ss[i], err = eng.NewSession(ctx, rt, m, cfg); err != nil {
			t.Fatal(err)
		}
		create[i] = time.Since(t0)
	}
	heap1, rss1 := heapBytes(), rssBytes(t)
	slices.Sort(create)
	metrics["create-p50-µs"] = float64(create[n/2].Microseconds())
	metrics["create-p99-µs"] = float64(create[n*99/100].Microseconds())
	metrics["heap-MiB"] = float64(heap1-heap0) / (1 << 20)
	metrics["RSS-MiB"] = float64(rss1-rss0) / (1 << 20)
	lat := make([][]time.Duration, workers)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out []byte
			for i := range calls / workers {
				s := ss[(w+i*workers)%n]
				t0 := time.Now()
				var err error
				if out, err = s.Run(ctx, []byte("hammer"), out[:0]); err != nil {
					failed.Add(1)
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d calls failed", failed.Load(), calls)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	metrics["call-p50-µs"] = float64(all[len(all)/2].Microseconds())
	metrics["call-p99-µs"] = float64(all[len(all)*99/100].Microseconds())
	for _, s := range ss {
		_ = s.Close(ctx)
	}
}
