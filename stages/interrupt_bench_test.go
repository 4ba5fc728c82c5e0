package stages

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// The benchmarks in this file measure what interruption costs: each runs
// the same module side by side, plain on a raw wazero runtime with no
// interruption at all, and as the host runs it (instrumented).

// loopModules are the loop-heavy guests: their compute export, its
// argument, and the expected result.
var loopModules = []struct {
	name, export string
	arg          uint64
}{
	{"matmul", "matmul", 4},       // four 64×64 float matrix products, C at -O2
	{"muladd", "muladd", 1 << 20}, // 2^20 iterations of the tightest loop
}

func benchBytes(tb testing.TB, name string) []byte {
	tb.Helper()
	bin, err := os.ReadFile(filepath.Join("testdata", "bench", name+".wasm"))
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// stubHostModule instantiates module stagehost_v1 on r with every
// function returning OK, so a plain module links on a raw runtime.
func stubHostModule(tb testing.TB, r wazero.Runtime) {
	tb.Helper()
	ctx := context.Background()
	b := r.NewHostModuleBuilder(abi.ImportModule)
	for name, sig := range abi.Functions {
		b.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) { stack[0] = 0 }), sig.Params, sig.Results).
			Export(name)
	}
	if _, err := b.Instantiate(ctx); err != nil {
		tb.Fatal(err)
	}
}

// rawCall returns the module's export on a raw wazero runtime: compiler,
// no close-on-context-done, the plain bytes.
func rawCall(tb testing.TB, bin []byte, export string) (api.Function, func()) {
	tb.Helper()
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	stubHostModule(tb, r)
	mod, err := r.InstantiateWithConfig(ctx, bin, wazero.NewModuleConfig().WithName(""))
	if err != nil {
		tb.Fatal(err)
	}
	return mod.ExportedFunction(export), func() { _ = r.Close(ctx) }
}

// hostCall returns the module's export as the host compiles and
// instantiates it (instrumented), with a call context armed the way the
// guarded path arms it.
func hostCall(tb testing.TB, f *wasmFixture, bin []byte, name, export string) (api.Function, *callContext) {
	tb.Helper()
	ctx := context.Background()
	m, err := f.eng.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithName(name))
	if err != nil {
		tb.Fatal(err)
	}
	s := f.session(tb, m, NewSessionConfig(name, f.gpu))
	mod, err := f.eng.runtime.InstantiateModule(ctx, m.compiled, wazero.NewModuleConfig().WithName(""))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = mod.Close(ctx) })
	c := &callContext{st: &s.native.state}
	return mod.ExportedFunction(export), c
}

// BenchmarkInterruptLoops runs each loop-heavy export plain on raw wazero
// and instrumented as the host runs it, in one run: the ratio of the two
// is what interruption costs. Target ≤ 1.1×.
func BenchmarkInterruptLoops(b *testing.B) {
	for _, lm := range loopModules {
		bin := benchBytes(b, lm.name)
		b.Run(lm.name+"/raw", func(b *testing.B) {
			fn, done := rawCall(b, bin, lm.export)
			defer done()
			stack := []uint64{lm.arg}
			ctx := context.Background()
			for b.Loop() {
				stack[0] = lm.arg
				if err := fn.CallWithStack(ctx, stack); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(lm.name+"/host", func(b *testing.B) {
			f := newWasmFixture(b)
			fn, c := hostCall(b, f, bin, lm.name, lm.export)
			stack := []uint64{lm.arg}
			for b.Loop() {
				c.ArmWithCancel(context.Background(), time.Now().Add(time.Minute))
				stack[0] = lm.arg
				if err := fn.CallWithStack(c, stack); err != nil {
					b.Fatal(err)
				}
				c.Disarm()
			}
		})
	}
}

// TestInstrumentedLoopsComputeWhatPlainOnesDo runs each loop export plain
// and as the host runs it, and compares the results bit for bit.
func TestInstrumentedLoopsComputeWhatPlainOnesDo(t *testing.T) {
	for _, lm := range loopModules {
		bin := benchBytes(t, lm.name)
		raw, done := rawCall(t, bin, lm.export)
		defer done()
		f := newWasmFixture(t)
		inst, c := hostCall(t, f, bin, lm.name, lm.export)
		want := []uint64{lm.arg}
		if err := raw.CallWithStack(context.Background(), want); err != nil {
			t.Fatal(err)
		}
		got := []uint64{lm.arg}
		c.ArmWithCancel(context.Background(), time.Now().Add(time.Minute))
		err := inst.CallWithStack(c, got)
		c.Disarm()
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != want[0] {
			t.Errorf("%s: instrumented result %#x, plain %#x", lm.name, got[0], want[0])
		}
	}
}

// BenchmarkInterruptMLP is one classification by the MLP Go guest on sim,
// through the full host path, on an engine that cannot interrupt guests
// (raw wazero's behaviour) and on the host's own.
func BenchmarkInterruptMLP(b *testing.B) {
	bin, err := os.ReadFile(filepath.Join("..", "examples", "wasm", "mlp", "stage", "mlp.wasm"))
	if err != nil {
		b.Fatal(err)
	}
	in := model.EncodeInput(model.TestInputs(1)[0])
	for _, mode := range []struct {
		name  string
		plain bool
	}{{"raw", true}, {"host", false}} {
		b.Run(mode.name, func(b *testing.B) {
			cfg := NewEngineConfig().WithCacheDir("")
			cfg.uninterruptible = mode.plain
			eng, err := NewEngine(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer eng.Close(context.Background())
			f := newWasmFixture(b)
			m, err := eng.Load(context.Background(), bin, SHA256(bin), NewLoadConfig().WithName("mlp").WithWASI(GrantGoRuntime))
			if err != nil {
				b.Fatal(err)
			}
			s, err := eng.NewSession(context.Background(), f.rt, m, NewSessionConfig("mlp", f.gpu).WithStreams("s0").WithPrograms("matmul", "bias", "relu", "argmax"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			var out []byte
			for b.Loop() {
				if out, err = s.Run(context.Background(), in, out[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// spinInput makes muladd loop for about 2^31 iterations: seconds, far past
// any deadline used here.
func spinInput() []byte { return binary.LittleEndian.AppendUint32(nil, 1<<31) }

// BenchmarkInterruptDeadlineToReturn measures how late a spinning stage
// returns after its deadline: eight sessions on eight devices spin at
// once on the two CPUs, each with a 5 ms deadline. Reported: p50 and p99
// of (return − deadline). Target p99 ≤ 2 ms.
func BenchmarkInterruptDeadlineToReturn(b *testing.B) {
	const sessions = 8
	const deadline = 5 * time.Millisecond
	f := newWasmFixture(b)
	bin := benchBytes(b, "muladd")
	m, err := f.eng.Load(context.Background(), bin, SHA256(bin), NewLoadConfig().WithName("muladd"))
	if err != nil {
		b.Fatal(err)
	}
	ss := make([]*Session, sessions)
	for i := range ss {
		dev, err := f.p.AddDevice("spin"+string(rune('a'+i)), hw.EngineGPU, sim.NewDeviceConfig())
		if err != nil {
			b.Fatal(err)
		}
		ss[i] = f.session(b, m, NewSessionConfig("spin", dev).WithDeadline(deadline))
	}
	var (
		mu   sync.Mutex
		late []time.Duration
	)
	in := spinInput()
	for b.Loop() {
		var wg sync.WaitGroup
		for _, s := range ss {
			wg.Go(func() {
				start := time.Now()
				_, err := s.Run(context.Background(), in, nil)
				d := time.Since(start) - deadline
				if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
					b.Errorf("Run = %v, want DeadlineExceeded", err)
				}
				mu.Lock()
				late = append(late, d)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	slices.Sort(late)
	b.ReportMetric(float64(late[len(late)/2].Microseconds()), "p50-µs-late")
	b.ReportMetric(float64(late[len(late)*99/100].Microseconds()), "p99-µs-late")
}

// BenchmarkInterruptGCWhileSpinning measures a full GC cycle while a guest
// spins in a loop that makes no host calls. Without interruption the
// collector waits until the guest leaves Wasm; instrumented, the guest
// reaches a safe point at every check. Target ≤ 20 ms.
func BenchmarkInterruptGCWhileSpinning(b *testing.B) {
	f := newWasmFixture(b)
	bin := benchBytes(b, "muladd")
	m, err := f.eng.Load(context.Background(), bin, SHA256(bin), NewLoadConfig().WithName("muladd"))
	if err != nil {
		b.Fatal(err)
	}
	s := f.session(b, m, NewSessionConfig("spin", f.gpu).WithDeadline(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		close(started)
		_, _ = s.Run(ctx, spinInput(), nil)
	}()
	<-started
	time.Sleep(20 * time.Millisecond) // let the guest get into its loop
	var worst time.Duration
	for b.Loop() {
		t0 := time.Now()
		runtime.GC()
		worst = max(worst, time.Since(t0))
	}
	cancel()
	<-done
	b.ReportMetric(float64(worst.Microseconds()), "worst-µs")
}
