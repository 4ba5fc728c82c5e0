package cuda_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
)

// Open the CUDA platform, fill a device buffer and read it back. Without
// libcuda.so.1 or a GPU, Open fails with errdefs.ErrUnsupported.
func ExampleOpen() {
	p, err := cuda.Open(cuda.NewConfig())
	if errors.Is(err, errdefs.ErrUnsupported) {
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
	p, err := cuda.Open(cuda.NewConfig())
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
	p, err := cuda.Open(cuda.NewConfig())
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

// A host program: Go code the host device "host0" runs in order on its
// streams, here over memory shared with the GPUs. Register programs in an
// init function.
func ExampleRegisterHostProgram() {
	cuda.RegisterHostProgram("example_negate", func(l *cuda.HostLaunch) error {
		b := l.Bytes(0)
		for i := range b {
			b[i] = -b[i]
		}
		return nil
	})
	p, err := cuda.Open(cuda.NewConfig())
	if err != nil {
		return
	}
	defer p.Close()
	sh, err := p.AllocShared(64, []hw.Device{p.Devices()[0], p.Host()}, nil)
	if err != nil {
		panic(err)
	}
	defer sh.Free()
	view, _ := sh.View(p.Host())
	s, _ := p.Host().NewStream()
	defer s.Close(context.Background())
	prog, _ := p.Host().Prepare("example_negate")
	sh.Bytes()[0] = 3
	c, _ := s.Submit(&hw.Command{Program: prog, Args: []hw.Arg{hw.BufferArg(view, 0, -1)}})
	if err := c.Wait(context.Background()); err != nil {
		panic(err)
	}
	fmt.Println(int8(sh.Bytes()[0]))
}

// A batch is validated whole and handed to the stream's driver thread in
// one go; repeated, it is replayed from a cached CUDA graph.
func ExampleStream_SubmitBatch() {
	p, err := cuda.Open(cuda.NewConfig())
	if err != nil {
		return
	}
	defer p.Close()
	dev, _ := p.Device("cuda0")
	s, _ := dev.NewStream()
	defer s.Close(context.Background())
	buf, _ := dev.Alloc(1024, 0, nil)
	defer buf.Free()
	fill, _ := dev.Prepare("fill")
	relu, _ := dev.Prepare("relu")
	batch := []hw.Command{
		{Program: fill, Args: []hw.Arg{hw.BufferArg(buf, 0, -1), hw.Float32(-1)}},
		{Program: relu, Args: []hw.Arg{hw.BufferArg(buf, 0, -1)}},
	}
	for range 3 {
		c, err := s.(hw.BatchSubmitter).SubmitBatch(batch)
		if err != nil {
			panic(err)
		}
		if err := c.Wait(context.Background()); err != nil {
			panic(err)
		}
	}
}

// A fast-tier gemm: cuBLAS when it loads, the exact kernel otherwise
// (Platform.BLAS says which). cuda.NewConfig().WithBLASLibrary("-") would force
// the exact kernels; WithBLASLibrary(path) names the library.
func ExamplePlatform_BLAS() {
	p, err := cuda.Open(cuda.NewConfig())
	if errors.Is(err, errdefs.ErrUnsupported) {
		fmt.Println("no CUDA GPU here:", err)
		return
	}
	if err != nil {
		panic(err)
	}
	defer p.Close()
	if v, err := p.BLAS(); err != nil {
		fmt.Println("gemm*.fast runs the exact kernels:", err)
	} else {
		fmt.Println("cuBLAS", v)
	}

	dev, _ := p.Device("cuda0")
	s, err := dev.NewStream()
	if err != nil {
		panic(err)
	}
	defer s.Close(context.Background())
	const m, n, k = 64, 32, 16
	var bufs [3]hw.Buffer
	for i, vals := range []int{m * k, k * n, m * n} {
		if bufs[i], err = dev.Alloc(2*vals, 0, nil); err != nil { // bf16 values
			panic(err)
		}
		defer bufs[i].Free()
	}
	gemm, _ := dev.Prepare("gemm.bf16.fast")
	u := func(v uint64) hw.Arg { return hw.Uint(v) }
	c, err := s.Submit(&hw.Command{Program: gemm, Args: []hw.Arg{
		hw.BufferArg(bufs[0], 0, -1), hw.BufferArg(bufs[1], 0, -1), hw.BufferArg(bufs[2], 0, -1),
		u(m), u(n), u(k), u(0), u(0), hw.Float32(1), hw.Float32(0), // C = 1·A·B + 0·C
		u(1), u(0), u(0), u(0), // batch 1 (strides unused)
	}})
	if err != nil {
		panic(err) // a shape the op refuses: errdefs.ErrInvalidArgument naming the argument
	}
	if err := c.Wait(context.Background()); err != nil {
		panic(err)
	}
}

// Verify a vendor kernel's PTX on the first GPU under a local memory
// limit of 64 MiB, and print what the driver says it needs. Over the
// limit, CheckVendor fails with errdefs.ErrInvalidArgument naming the
// numbers.
func ExampleDevice_CheckVendor() {
	p, err := cuda.Open(cuda.NewConfig())
	if err != nil {
		fmt.Println("no CUDA GPU here:", err)
		return
	}
	defer p.Close()
	dev := p.Devices()[0].(*cuda.Device)
	ptx := []byte(`.version 8.0
.target sm_90
.address_size 64
.visible .entry nop(.param .u32 n)
{
	ret;
}
`)
	res, err := dev.CheckVendor(ptx, "nop.ptx", "nop", []cuda.ParamDecl{{Name: "n", Size: cuda.ParamSize("u32")}},
		cuda.VendorLimits{MaxLocalMemory: 64 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s; %d resident threads\n", res, res.ResidentThreads())
}

// The worst-case local memory reservation of a kernel with 480 KiB of
// local memory per thread on an H200: every thread the device can hold
// at once gets it.
func ExampleKernelResources_LocalReservation() {
	r := cuda.KernelResources{LocalBytes: 480 << 10, Multiprocessors: 132, ThreadsPerMultiprocessor: 2048}
	fmt.Printf("%d threads, %d bytes (%.1f GiB), over the default limit: %v\n",
		r.ResidentThreads(), r.LocalReservation(), float64(r.LocalReservation())/(1<<30), r.LocalReservation() > cuda.DefaultMaxLocalMemory)
	// Output: 270336 threads, 132875550720 bytes (123.8 GiB), over the default limit: true
}
