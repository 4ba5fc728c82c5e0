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
	"github.com/stagehost/stagehost/stages"
)

// The vendor-kernel launch benchmark: ../vendor_launch.wat launches the
// vendor kernel "double" (hw/cuda/testdata/vendor/double.ptx on cuda,
// stages/testdata/kernels/double.wasm on sim) with stream_launch, for
// comparison with ../vendor_launch.c, the same PTX launched from C
// (../vendor.sh runs both).

var doubleInfo = hw.KernelInfo{Name: "double", Doc: "y = 2x", Args: []hw.KernelArg{
	hw.KernelBuffer("x", "f32", "in", ""), hw.KernelBuffer("y", "f32", "out", ""), hw.KernelScalar("n", "u32")}}

const vendorN = 1024 // floats per launch

func vendorSession(t testing.TB, dev hw.Device, cfg func(stages.SessionConfig, *stages.Engine) stages.SessionConfig) *stages.Session {
	t.Helper()
	ctx := context.Background()
	bin, err := os.ReadFile("../vendor_launch.wasm")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(ctx) })
	m, err := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("vendor_launch"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := host.NewRuntime(host.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := stages.NewSessionConfig("vendor", dev).WithStreams("s0").WithPrograms("double").
		WithBuffer("x", 4*vendorN).WithBuffer("y", 4*vendorN).WithDeadline(10 * time.Second)
	s, err := eng.NewSession(ctx, rt, m, cfg(c, eng))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(ctx) })
	return s
}

func vendorInput(count uint32) []byte {
	return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, count), vendorN)
}

// TestVendorModuleOnSim runs the module on sim with the Wasm kernel.
func TestVendorModuleOnSim(t *testing.T) {
	p := sim.New()
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	kbin, err := os.ReadFile("../../../stages/testdata/kernels/double.wasm")
	if err != nil {
		t.Fatal(err)
	}
	s := vendorSession(t, gpu, func(c stages.SessionConfig, eng *stages.Engine) stages.SessionConfig {
		spec := stages.KernelSpec{Name: "double", Entry: "double", Args: doubleInfo.Args}
		k, err := eng.LoadKernel(context.Background(), kbin, spec, stages.NewKernelConfig())
		if err != nil {
			t.Fatal(err)
		}
		return c.WithKernels(k)
	})
	if out, err := s.Run(context.Background(), vendorInput(10), nil); err != nil || len(out) != 0 {
		t.Fatalf("%q, %v", out, err)
	}
	if n := s.Owner().Streams()[0].(*sim.Stream).Submitted(); n != 10 {
		t.Fatalf("%d commands, want 10", n)
	}
}

// BenchmarkWasmVendorLaunch: 1000 stream_launch calls of the vendor PTX
// kernel "double" over 1024 floats per stage call, one sync at the end;
// ns/launch is the whole time per launch.
func BenchmarkWasmVendorLaunch(b *testing.B) {
	p := requireCUDA(b)
	dev, err := p.Device("cuda0")
	if err != nil {
		b.Fatal(err)
	}
	ptx, err := os.ReadFile("../../../hw/cuda/testdata/vendor/double.ptx")
	if err != nil {
		b.Fatal(err)
	}
	s := vendorSession(b, dev, func(c stages.SessionConfig, _ *stages.Engine) stages.SessionConfig {
		return c.WithVendorProgram(doubleInfo, func(d hw.Device) (hw.Program, error) {
			return d.(*cuda.Device).PrepareVendor(ptx, "double.ptx", "double", doubleInfo)
		})
	})
	const count = 1000
	in := vendorInput(count)
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
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/count, "ns/launch")
}
