package sim_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

func ExampleNew() {
	ctx := context.Background()
	p := sim.New()
	dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		panic(err)
	}
	st, _ := dev.NewStream()
	x, _ := dev.Alloc(16, hw.AllocHostVisible, nil)
	y, _ := dev.Alloc(16, hw.AllocHostVisible, nil)
	fill, _ := dev.Prepare("fill")
	saxpy, _ := dev.Prepare("saxpy")

	// y = 3*x + y with x = 2 and y = 1, in stream order.
	st.Submit(&hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.Float32(2)}})
	st.Submit(&hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(y, 0, -1), hw.Float32(1)}})
	st.Submit(&hw.Command{Program: saxpy, Args: []hw.Arg{hw.Float32(3), hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1)}})
	out := make([]byte, 16)
	c, _ := st.Read(y, 0, out)
	if err := c.Wait(ctx); err != nil {
		panic(err)
	}
	var ys []float32
	for i := 0; i < len(out); i += 4 {
		ys = append(ys, math.Float32frombits(binary.NativeEndian.Uint32(out[i:])))
	}
	fmt.Println(ys)

	st.Close(ctx)
	x.Free()
	y.Free()
	fmt.Println(p.Close())
	// Output:
	// [7 7 7 7]
	// <nil>
}
