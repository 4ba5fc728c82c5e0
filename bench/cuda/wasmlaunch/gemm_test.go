package wasmlaunch

import (
	"context"
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/stages"
)

// gemmPrograms are the programs BenchmarkWasmGemm measures: the fast tier
// (cuBLAS on CUDA) in float32 and bfloat16 storage, and the exact tier.
var gemmPrograms = []struct {
	name string
	size uint32 // bytes per value
}{{"gemm.fast", 4}, {"gemm.bf16.fast", 2}, {"gemm", 4}}

// gemmSession runs gemm_launch.wasm on dev with stream "s0", the gemm
// programs and a budget for three 4096² matrices of 4-byte values and three
// of 2-byte ones (the named buffers of both sizes stay live).
func gemmSession(t testing.TB, dev hw.Device) *stages.Session {
	t.Helper()
	ctx := context.Background()
	bin, err := os.ReadFile("../gemm_launch.wasm")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(ctx) })
	m, err := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("gemm_launch"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := host.NewRuntime(host.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(gemmPrograms))
	for i, g := range gemmPrograms {
		names[i] = g.name
	}
	s, err := eng.NewSession(ctx, rt, m, stages.NewSessionConfig("gemm", dev).
		WithStreams("s0").WithPrograms(names...).WithBudget(3*(4+2)*4096*4096+(1<<20)).WithDeadline(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(ctx) })
	return s
}

func gemmInput(n, reps, size uint32, prog string) []byte {
	in := binary.LittleEndian.AppendUint32(nil, n)
	in = binary.LittleEndian.AppendUint32(in, reps)
	in = binary.LittleEndian.AppendUint32(in, size)
	return append(in, prog...)
}

// TestGemmModuleOnSim runs the gemm module on the sim backend (small
// matrices), for every program.
func TestGemmModuleOnSim(t *testing.T) {
	p := sim.New()
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s := gemmSession(t, gpu)
	for _, g := range gemmPrograms {
		for range 2 { // the second call finds the named buffers
			if out, err := s.Run(context.Background(), gemmInput(16, 3, g.size, g.name), nil); err != nil || len(out) != 0 {
				t.Fatalf("%s: %q, %v", g.name, out, err)
			}
		}
	}
	if stream := s.Owner().Streams()[0].(*sim.Stream); stream.Submitted() < 3*2*3 {
		t.Fatalf("%d commands submitted, want at least %d", stream.Submitted(), 3*2*3)
	}
}

// BenchmarkWasmGemm: gemm at 4096³ launched from a Wasm stage through
// stream_submit on cuda0, 10 launches and one stream_sync per stage call;
// GFLOP/s over the whole call (compare with hw/cuda's BenchmarkGPUOps,
// from Go, and bench/cuda/gemm_cublas.c, cuBLAS from C).
func BenchmarkWasmGemm(b *testing.B) {
	p := requireCUDA(b)
	dev, err := p.Device("cuda0")
	if err != nil {
		b.Fatal(err)
	}
	s := gemmSession(b, dev)
	ctx := context.Background()
	const n, reps = 4096, 10
	for _, g := range gemmPrograms {
		b.Run(g.name, func(b *testing.B) {
			in := gemmInput(n, reps, g.size, g.name)
			if _, err := s.Run(ctx, in, nil); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if _, err := s.Run(ctx, in, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(2*n*n*n*reps*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
