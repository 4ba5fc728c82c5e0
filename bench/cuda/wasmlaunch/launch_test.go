// Package wasmlaunch benchmarks a noop kernel launch issued from a Wasm
// stage through the ABI (stream_submit and stream_submit_batch on stream
// "s0"), through a stages.Session on cuda0, for comparison with
// bench/cuda/launch.c (C) and hw/cuda's BenchmarkLaunchNoop (Go calling
// the driver). The module is ../noop_launch.wat. On a machine without a
// GPU the CUDA benchmarks skip (STAGEHOST_REQUIRE_GPU=1 fails instead);
// the module is also checked on the sim backend, everywhere.
//
// BenchmarkWasmGemm (gemm_test.go) launches gemm at 4096³ from a Wasm
// stage (../gemm_launch.wat) in the fast tier (cuBLAS) and the exact
// tier, for comparison with hw/cuda's BenchmarkGPUOps (Go) and
// bench/cuda/gemm_cublas.c (cuBLAS from C).
package wasmlaunch

import (
	"context"
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/stages"
)

func requireCUDA(t testing.TB) *cuda.Platform {
	t.Helper()
	p, err := cuda.Open(cuda.NewConfig())
	testutil.GPU(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// session runs noop_launch.wasm on dev with stream "s0" and program noop.
func session(t testing.TB, dev hw.Device) *stages.Session {
	t.Helper()
	ctx := context.Background()
	bin, err := os.ReadFile("../noop_launch.wasm")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(ctx) })
	m, err := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("noop_launch"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := host.NewRuntime(host.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	s, err := eng.NewSession(ctx, rt, m, stages.NewSessionConfig("launch", dev).
		WithStreams("s0").WithPrograms("noop").WithDeadline(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(ctx) })
	return s
}

func input(count, batch uint32) []byte {
	in := binary.LittleEndian.AppendUint32(nil, count)
	return binary.LittleEndian.AppendUint32(in, batch)
}

// TestModuleOnSim runs both modes on the sim backend.
func TestModuleOnSim(t *testing.T) {
	p := sim.New()
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s := session(t, gpu)
	for _, in := range [][]byte{input(100, 0), input(128, 64), input(3, 1)} {
		if out, err := s.Run(context.Background(), in, nil); err != nil || len(out) != 0 {
			t.Fatalf("input %x: %q, %v", in, out, err)
		}
	}
	if stream := s.Owner().Streams()[0].(*sim.Stream); stream.Submitted() != 100+128+3 {
		t.Fatalf("%d commands submitted, want %d", stream.Submitted(), 100+128+3)
	}
}

// benchLaunch: each stage call submits count noops (in batches of batch,
// or one by one for 0); the built-in fence drains the stream after each
// call. ns/launch (ns/kernel for batches) is the whole time per kernel.
func benchLaunch(b *testing.B, count, batch uint32, unit string) {
	p := requireCUDA(b)
	dev, err := p.Device("cuda0")
	if err != nil {
		b.Fatal(err)
	}
	s := session(b, dev)
	in := input(count, batch)
	ctx := context.Background()
	for range 3 {
		if _, err := s.Run(ctx, in, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := s.Run(ctx, in, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(count), unit)
}

// BenchmarkWasmLaunchNoop: 1000 stream_submit calls per stage call.
func BenchmarkWasmLaunchNoop(b *testing.B) { benchLaunch(b, 1000, 0, "ns/launch") }

// BenchmarkWasmBatchNoop64: 16 stream_submit_batch calls of 64 noops per
// stage call (the backend replays each repeated batch from a cached CUDA
// graph).
func BenchmarkWasmBatchNoop64(b *testing.B) { benchLaunch(b, 1024, 64, "ns/kernel") }
