package stages

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stagehost/stagehost/hw/sim"
)

func benchModule(b *testing.B, f *wasmFixture, name string) *Module {
	b.Helper()
	bin, err := os.ReadFile(filepath.Join("testdata", "bench", name+".wasm"))
	if err != nil {
		b.Fatal(err)
	}
	m, err := f.eng.Load(context.Background(), bin, SHA256(bin), NewLoadConfig().WithName(name))
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkWasmStageEmpty is the full host path around an empty stage:
// re-entrancy guard, admission, compute lease, the call with its deadline,
// the built-in fence over one idle stream, the idle check and the trace
// record. Target ≤ 2 µs.
func BenchmarkWasmStageEmpty(b *testing.B) {
	f := newWasmFixture(b)
	s := f.session(b, benchModule(b, f, "empty"), NewSessionConfig("bench", f.gpu).WithStreams("s0"))
	ctx := context.Background()
	var out []byte
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if out, err = s.Run(ctx, nil, out[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWasmGuestSubmit is one guest→host stream_submit on a sim
// stream, measured as a stage that submits 256 noops (the fence drains
// them). The ns/submit metric is the whole stage divided by 256, an upper
// bound on one ABI call. Target ≤ 150 ns and 0 host allocations per call.
func BenchmarkWasmGuestSubmit(b *testing.B) {
	f := newWasmFixture(b)
	s := f.session(b, benchModule(b, f, "submit_loop"), NewSessionConfig("bench", f.gpu).WithStreams("s0").WithPrograms("noop"))
	ctx := context.Background()
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if _, err := s.Run(ctx, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/256, "ns/submit")
}

// BenchmarkWasmIO1MiB passes 1 MiB in and 1 MiB out through a stage.
// Target ≥ 1 GB/s (of input).
func BenchmarkWasmIO1MiB(b *testing.B) {
	f := newWasmFixture(b)
	s := f.session(b, benchModule(b, f, "echo"), NewSessionConfig("bench", f.gpu))
	ctx := context.Background()
	in := make([]byte, 1<<20)
	for i := range in {
		in[i] = byte(i)
	}
	out := make([]byte, 0, 1<<20)
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if out, err = s.Run(ctx, in, out[:0]); err != nil {
			b.Fatal(err)
		}
	}
	if len(out) != len(in) || out[12345] != in[12345] {
		b.Fatal("echo mismatch")
	}
}

// BenchmarkWasmGuestSubmitCall isolates the ABI call: the stage's export
// is called directly (no lease or fence) while the stream is held, so the
// sim worker does not compete for the CPU; the queue is drained outside
// the timer. ns/submit is one stream_submit from the guest, through
// handle resolution and argument checks, into the sim stream's ring.
func BenchmarkWasmGuestSubmitCall(b *testing.B) {
	f := newWasmFixture(b)
	s := f.session(b, benchModule(b, f, "submit_loop"), NewSessionConfig("bench", f.gpu).WithStreams("s0").WithPrograms("noop"))
	ctx := context.Background()
	stream := s.Owner().Streams()[0].(*sim.Stream)
	cctx := &callContext{st: &s.native.state}
	cctx.Arm(ctx, time.Now().Add(time.Hour))
	defer cctx.Disarm()
	stack := make([]uint64, 1)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		release := stream.Inject(sim.Fault{Kind: sim.Hang})
		b.StartTimer()
		if err := s.inst.entry.CallWithStack(cctx, stack); err != nil || stack[0] != 0 {
			b.Fatal(err, stack[0])
		}
		b.StopTimer()
		release()
		if err := stream.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/256, "ns/submit")
}

// BenchmarkInstantiateGoGuest creates and closes a session of the minimal
// Go guest (instantiate, _initialize, one stream), side by side with data
// segments merged at load (what the host does) and as the Go linker
// emitted them. Target ≤ 3 ms.
func BenchmarkInstantiateGoGuest(b *testing.B) {
	bin, err := os.ReadFile(filepath.Join("..", "examples", "wasm", "minimal", "minimal.wasm"))
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		gap  int
	}{{"merged", 4096}, {"as-linked", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			cfg := NewEngineConfig().WithCacheDir("")
			cfg.mergeGap = tc.gap
			eng, err := NewEngine(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer eng.Close(ctx)
			m, err := eng.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithWASI(GrantGoRuntime))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(m.segments[1]), "segments")
			f := newWasmFixture(b)
			b.ReportAllocs()
			for b.Loop() {
				s, err := eng.NewSession(ctx, f.rt, m, NewSessionConfig("bench", f.gpu).WithStreams("s0"))
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Close(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGuestClockAndRandom is a call of snap_clock, which reads the
// monotonic and wall clocks and 16 random bytes, then the monotonic
// clock n more times, on the host's clocks and CSPRNG (host, what every
// instance reads) and on wazero's deterministic defaults (fixed, what
// instances read before). ns/read is the call's time above n = 0,
// divided by n.
func BenchmarkGuestClockAndRandom(b *testing.B) {
	ctx := context.Background()
	for _, fixed := range []bool{false, true} {
		name := "host"
		if fixed {
			name = "fixed"
		}
		cfg := NewEngineConfig().WithCacheDir("")
		cfg.fixedGuestSources = fixed
		eng, err := NewEngine(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer eng.Close(ctx)
		f := newWasmFixture(b)
		f.eng = eng
		s := f.session(b, snapModule(b, eng, "snap_clock", true), NewSessionConfig("bench", f.gpu).WithStreams("s0"))
		defer s.Close(ctx)
		for _, n := range []uint32{0, 1000} {
			b.Run(fmt.Sprintf("%s/reads=%d", name, n), func(b *testing.B) {
				in := binary.LittleEndian.AppendUint32(nil, n)
				var out []byte
				b.ReportAllocs()
				for b.Loop() {
					if out, err = s.Run(ctx, in, out[:0]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
