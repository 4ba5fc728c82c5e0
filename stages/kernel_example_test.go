package stages_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/stages"
)

// Load a vendor Wasm kernel against its declaration and run it on a sim
// device's stream. A session gets it with SessionConfig.WithKernels and
// its guest launches it with stream_launch.
func ExampleEngine_LoadKernel() {
	ctx := context.Background()
	eng, _ := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
	defer eng.Close(ctx)
	bin, _ := os.ReadFile("testdata/kernels/double.wasm")
	spec := stages.KernelSpec{Name: "double", Entry: "double", Args: []hw.KernelArg{
		hw.KernelBuffer("x", "f32", "in", ""), hw.KernelBuffer("y", "f32", "out", ""), hw.KernelScalar("n", "u32")}}
	k, err := eng.LoadKernel(ctx, bin, spec, stages.NewKernelConfig())
	if err != nil {
		fmt.Println(err)
		return
	}
	p := sim.New()
	defer p.Close()
	dev, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	prog, _ := dev.PrepareKernel(spec.Info(), k.SimKernel())
	s, _ := dev.NewStream()
	defer s.Close(ctx)
	x, _ := dev.Alloc(8, hw.AllocHostVisible, nil)
	y, _ := dev.Alloc(8, hw.AllocHostVisible, nil)
	xb, _ := x.HostBytes()
	binary.LittleEndian.PutUint32(xb, math.Float32bits(1.5))
	binary.LittleEndian.PutUint32(xb[4:], math.Float32bits(-2))
	s.Submit(&hw.Command{Program: prog, Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1), hw.Uint(2)}})
	fmt.Println(s.Sync(ctx))
	yb, _ := y.HostBytes()
	fmt.Println(math.Float32frombits(binary.LittleEndian.Uint32(yb)), math.Float32frombits(binary.LittleEndian.Uint32(yb[4:])))

	// A module whose export does not fit the declaration is refused.
	bad, _ := os.ReadFile("testdata/kernels/wrongsig.wasm")
	fmt.Println(stages.ValidateKernel(bad, spec, stages.NewKernelConfig()))
	// Output:
	// <nil>
	// 3 -4
	// kernel "double": export "double" is (i32) -> (), want (i32, i32, i32, i32, i32) -> () (abi/ABI.md, "Vendor kernels on sim")
}
