package cuda_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
)

// Open the CUDA platform, fill a device buffer and read it back. Without
// libcuda.so.1 or a GPU, Open fails with hw.ErrUnsupported.
func ExampleOpen() {
	p, err := cuda.Open()
	if errors.Is(err, hw.ErrUnsupported) {
		fmt.Println("no CUDA GPU here:", err)
		return
	}
	if err != nil {
		panic(err)
	}
	defer p.Close()

	dev, _ := p.Device("cuda0")
	s, err := dev.NewStream()
	if err != nil {
		panic(err)
	}
	defer s.Close(context.Background())
	buf, err := dev.Alloc(4*1024, 0, hw.NewBudget("example", 1<<20))
	if err != nil {
		panic(err)
	}
	defer buf.Free()

	fill, _ := dev.Prepare("fill")
	if _, err := s.Submit(&hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(buf, 0, -1), hw.Float32(1.5)}}); err != nil {
		panic(err)
	}
	out := make([]byte, 4)
	c, _ := s.Read(buf, 0, out)
	if err := c.Wait(context.Background()); err != nil {
		panic(err)
	}
	fmt.Println(math.Float32frombits(binary.LittleEndian.Uint32(out)))
}

// A device program polls a word of host-coherent memory that the host
// publishes with a release store (the resident-session startup protocol).
func ExamplePlatform_AllocShared() {
	p, err := cuda.Open()
	if err != nil {
		return
	}
	defer p.Close()
	dev := p.Devices()[0]
	startup, err := p.AllocShared(64, []hw.Device{dev}, nil)
	if err != nil {
		panic(err)
	}
	defer startup.Free()
	view, _ := startup.View(dev)
	release, _ := startup.PrepareRelease(dev, 0, 64)

	s, _ := dev.NewStream()
	defer s.Close(context.Background())
	spin, _ := dev.Prepare("spin")
	const run = 1
	done, _ := s.Submit(&hw.Command{Program: spin, Args: []hw.Arg{hw.BufferArg(view, 0, 64), hw.Uint(0), hw.Uint(run)}})

	startup.Store32Release(0, run) // publish RUN
	release.Execute()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	fmt.Println(done.Wait(ctx))
}

// Record a fixed sequence of launches once and replay it with one driver
// call per replay.
func ExampleStream_RecordGraph() {
	p, err := cuda.Open()
	if err != nil {
		return
	}
	defer p.Close()
	dev := p.Devices()[0]
	hs, _ := dev.NewStream()
	defer hs.Close(context.Background())
	s := hs.(*cuda.Stream)
	x, _ := dev.Alloc(4*256, 0, nil)
	defer x.Free()
	relu, _ := dev.Prepare("relu")
	g, err := s.RecordGraph([]hw.Command{
		{Program: relu, Args: []hw.Arg{hw.BufferArg(x, 0, -1)}},
		{Program: relu, Args: []hw.Arg{hw.BufferArg(x, 0, -1)}},
	})
	if err != nil {
		panic(err)
	}
	defer g.Close()
	for range 10 {
		s.SubmitGraph(g)
	}
	fmt.Println(s.Sync(context.Background()))
}
