package stages_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/stages"
)

func ExampleNewNative() {
	rt, _ := host.NewRuntime(host.NewConfig())
	p := sim.New()
	defer p.Close()
	gpu, _ := p.AddDevice("gpu0", hw.EngineGPU)

	owner := stages.NewOwner("relu-model", hw.NewBudget("relu-model", 1<<20))
	stream, _ := owner.NewStream(gpu)
	relu, _ := owner.Prepare(gpu, "relu")
	x, _ := owner.Alloc(gpu, 16, 0)

	sess := stages.NewNative(rt, owner, struct{}{}, nil) // nil: built-in drain fence
	input := make([]byte, 16)
	for i, v := range []float32{-2, -1, 1, 2} {
		binary.LittleEndian.PutUint32(input[4*i:], math.Float32bits(v))
	}
	out := make([]byte, 16)
	err := sess.Run(context.Background(), func(ctx context.Context, _ *struct{}) error {
		if _, err := stream.Write(x, 0, input); err != nil {
			return err
		}
		if _, err := stream.Submit(&hw.Command{Program: relu, Args: []hw.Arg{hw.BufferArg(x, 0, -1)}}); err != nil {
			return err
		}
		c, err := stream.Read(x, 0, out)
		if err != nil {
			return err
		}
		return c.Wait(ctx)
	})
	for i := 0; i < 4; i++ {
		fmt.Print(math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])), " ")
	}
	fmt.Println(err)
	fmt.Println(sess.Close(context.Background()))
	// Output:
	// 0 0 1 2 <nil>
	// <nil>
}
