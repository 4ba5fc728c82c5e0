package stages

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
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

func loadGuest(b *testing.B, eng *Engine, path string, wasi, snapshot bool) (*Module, []byte) {
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
// the host does), with every instance initialising itself (snapshots
// off), and raw wazero instantiating the module as given, with
// _initialize for a Go guest, in the same engine. ns/op is create plus
// close; p50-µs and p99-µs are of the creation alone.
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
		for _, mode := range []string{"snapshot", "init", "raw"} {
			b.Run(g.name+"/"+mode, func(b *testing.B) {
				m, bin := loadGuest(b, eng, g.path, g.wasi, mode == "snapshot")
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
				b.ReportAllocs()
				for b.Loop() {
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
