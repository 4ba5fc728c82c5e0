package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/internal/ops"
)

// TestOpShapesRefusedAtSubmit: an op launch whose arguments break the
// op's contract is refused by Submit and SubmitBatch with an
// invalid-argument error naming the op and the argument, and nothing is
// enqueued.
func TestOpShapesRefusedAtSubmit(t *testing.T) {
	p, _ := newFakePlatform(t, 2)
	d := p.devices[0]
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	alloc := func(dev *Device, n int) hw.Buffer {
		b, err := dev.Alloc(n, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free() })
		return b
	}
	x, y := alloc(d, 4*4096), alloc(d, 4*4097)
	other := alloc(p.devices[1], 64)
	prog := func(name string) hw.Program {
		pr, err := d.Prepare(name)
		if err != nil {
			t.Fatal(err)
		}
		return pr
	}
	u := func(v uint64) hw.Arg { return hw.Uint(v) }
	X, Y := hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1)
	for _, c := range []struct {
		name string
		args []hw.Arg
		want string
	}{
		{"softmax", []hw.Arg{X, hw.BufferArg(y, 0, 4*4096), u(1), u(4097), u(0)}, "softmax: x has 4,096 values, rows*cols = 4,097"},
		{"softmax", []hw.Arg{X, X, u(64), u(64), u(65)}, "causal = 65 exceeds cols = 64"},
		{"softmax.bf16", []hw.Arg{hw.BufferArg(x, 0, 8192), hw.BufferArg(x, 2, 8192), u(64), u(64), u(0)}, "softmax.bf16: y partially overlaps x"},
		{"reduce_sum", []hw.Arg{X, Y, u(0), u(4096), u(1)}, "reduce_sum: outer = 0"},
		{"gemm", []hw.Arg{X, X, hw.BufferArg(x, 0, 64), u(4), u(4), u(4), u(0), u(0), hw.Float32(1), hw.Float32(0), u(1), u(0), u(0), u(0)}, "gemm: A has 4,096 values"},
		{"transpose", []hw.Arg{X, Y, u(1), u(1), u(64), u(64), u(0), u(1), u(1), u(3)}, "not a permutation"},
		{"add", []hw.Arg{X, X, Y, u(1), u(1), u(64), u(64), u(1), u(1), u(64), u(64)}, "add: c has 4,097 values"},
		{"exp", []hw.Arg{X, hw.Float32(1)}, "exp: y (argument 1) is a scalar"},
		{"exp", []hw.Arg{X}, "exp: takes 2 arguments, got 1"},
		{"gemm.fast", []hw.Arg{X, X, Y, u(1 << 31), u(4), u(4), u(0), u(0), hw.Float32(1), hw.Float32(0), u(1), u(0), u(0), u(0)}, "gemm.fast: M = 2,147,483,648 exceeds the limit"},
		{"conv2d", []hw.Arg{X, X, hw.BufferArg(x, 0, 0), Y, u(1), u(1), u(64), u(64), u(1), u(3), u(3), u(0), u(0), u(1 | 1<<32), u(1)}, "stride = (0, 0)"},
		{"cast", []hw.Arg{X, Y, u(0), u(4)}, "to = 4 is not a dtype code"},
	} {
		before := s.(*Stream).rec.Submitted()
		_, err := s.Submit(&hw.Command{Program: prog(c.name), Args: c.args})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Submit: %v, want invalid argument containing %q", c.name, err, c.want)
		}
		_, err = s.(*Stream).SubmitBatch([]hw.Command{{Program: prog("noop")}, {Program: prog(c.name), Args: c.args}})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "batch command 1") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: SubmitBatch: %v, want invalid argument naming command 1 and %q", c.name, err, c.want)
		}
		if got := s.(*Stream).rec.Submitted(); got != before {
			t.Errorf("%s: %d commands enqueued by refused launches", c.name, got-before)
		}
	}
	// A buffer of another device is refused before the op's rules run.
	_, err = s.Submit(&hw.Command{Program: prog("exp"), Args: []hw.Arg{hw.BufferArg(other, 0, -1), hw.BufferArg(x, 0, 64)}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "belongs to cuda1") {
		t.Errorf("foreign buffer: %v", err)
	}
}

// fakeBLAS records cuBLAS calls and checks that each runs on an OS thread
// with the device's context current.
type fakeBLAS struct {
	f       *fakeDriver
	mu      sync.Mutex
	created int
	streams []cuStream
	ws      []cuDevicePtr // workspaces bound, per call
	calls   []gemmCall
	bad     int // calls without the context current
}

func (b *fakeBLAS) ctxOK() {
	if b.f.cur() != ctxOf(0) {
		b.bad++
	}
}

func (b *fakeBLAS) Create() (blasHandle, int32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ctxOK()
	b.created++
	return blasHandle(0x5000 + b.created), blasSuccess
}
func (b *fakeBLAS) Destroy(h blasHandle) int32               { return blasSuccess }
func (b *fakeBLAS) SetMathMode(h blasHandle, m uint32) int32 { return blasSuccess }
func (b *fakeBLAS) Version() int                             { return 130100 }
func (b *fakeBLAS) SetStream(h blasHandle, s cuStream) int32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ctxOK()
	b.streams = append(b.streams, s)
	return blasSuccess
}
func (b *fakeBLAS) SetWorkspace(h blasHandle, ws cuDevicePtr, size uintptr) int32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ctxOK()
	if size != blasWorkspaceBytes || b.f.bytes(uint64(ws), uint64(size)) == nil {
		b.bad++ // not a live allocation of that size
	}
	b.ws = append(b.ws, ws)
	return blasSuccess
}

func (b *fakeBLAS) GemmStridedBatched(h blasHandle, g *gemmCall) int32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ctxOK()
	b.calls = append(b.calls, *g)
	return blasSuccess
}

// TestFastGemmCallsCUBLAS: gemm.*.fast becomes one
// cublasGemmStridedBatchedEx on the launch's stream, with the row-major
// product expressed in column-major terms (operands swapped, M and N
// swapped, leading dimensions of the row-major matrices), on a thread with
// the context current; the exact gemm stays a kernel.
func TestFastGemmCallsCUBLAS(t *testing.T) {
	f := newFake(1)
	fb := &fakeBLAS{f: f}
	p, err := Open(NewConfig().withDriver(f).withBLAS(fb))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d := p.devices[0]
	// The handle is created at the first Prepare of a fast program: on
	// this OS thread, with no context current until the backend makes
	// its own current.
	runtime.LockOSThread()
	f.CtxSetCurrent(0)
	if _, err := d.Prepare("gemm.fast"); err != nil {
		t.Fatal(err)
	}
	runtime.UnlockOSThread()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	const m, n, k, batch = 3, 5, 7, 2
	const sa, sb, sc = m*k + 1, k * n, m*n + 2
	bufs := make([]hw.Buffer, 3)
	for i, vals := range []int{(batch-1)*sa + m*k, (batch-1)*sb + k*n, (batch-1)*sc + m*n} {
		if bufs[i], err = d.Alloc(2*vals, 0, nil); err != nil {
			t.Fatal(err)
		}
		defer bufs[i].Free()
	}
	u := func(v uint64) hw.Arg { return hw.Uint(v) }
	for _, tc := range []struct {
		ta, tb      uint64
		transa, lda int32
		transb, ldb int32
	}{
		{0, 0, blasOpN, n, blasOpN, k},
		{1, 0, blasOpN, n, blasOpT, m},
		{0, 1, blasOpT, k, blasOpN, k},
	} {
		fast, _ := d.Prepare("gemm.bf16.fast")
		c, err := s.Submit(&hw.Command{Program: fast, Args: []hw.Arg{
			hw.BufferArg(bufs[0], 0, -1), hw.BufferArg(bufs[1], 0, -1), hw.BufferArg(bufs[2], 0, -1),
			u(m), u(n), u(k), u(tc.ta), u(tc.tb), hw.Float32(2), hw.Float32(0.5), u(batch), u(sa), u(sb), u(sc)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		fb.mu.Lock()
		g := fb.calls[len(fb.calls)-1]
		fb.mu.Unlock()
		A, B, C := bufs[0].(*buffer).ptr, bufs[1].(*buffer).ptr, bufs[2].(*buffer).ptr
		want := gemmCall{transa: tc.transa, transb: tc.transb, m: n, n: m, k: k, alpha: 2, beta: 0.5,
			a: B, b: A, c: C, dtype: blasR16BF, lda: tc.lda, ldb: tc.ldb, ldc: n,
			strideA: sb, strideB: sa, strideC: sc, batch: batch}
		if g != want {
			t.Errorf("transA=%d transB=%d: cuBLAS call\n%+v, want\n%+v", tc.ta, tc.tb, g, want)
		}
	}
	// A batch holding a cuBLAS gemm is issued call by call every time,
	// never captured into a graph.
	fast, _ := d.Prepare("gemm.bf16.fast")
	cmd := hw.Command{Program: fast, Args: []hw.Arg{
		hw.BufferArg(bufs[0], 0, -1), hw.BufferArg(bufs[1], 0, -1), hw.BufferArg(bufs[2], 0, -1),
		u(m), u(n), u(k), u(0), u(0), hw.Float32(1), hw.Float32(0), u(batch), u(sa), u(sb), u(sc)}}
	for range 3 {
		c, err := s.(*Stream).SubmitBatch([]hw.Command{cmd, cmd})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.(*Stream).batchCapture.Load(); n != 0 {
		t.Errorf("%d graphs captured for batches of cuBLAS gemms", n)
	}
	// Another stream binds a workspace of its own.
	s2, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	c2, err := s2.Submit(&cmd)
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	fb.mu.Lock()
	if w := fb.ws; len(w) != 10 || w[0] != w[8] || w[9] == w[0] {
		t.Errorf("workspaces bound %#x: want one per stream", w)
	}
	fb.mu.Unlock()
	// A recorded graph holds the exact kernel instead.
	g, err := s.(*Stream).RecordGraph([]hw.Command{cmd})
	if err != nil {
		t.Fatal(err)
	}
	gc, err := s.(*Stream).SubmitGraph(g)
	if err != nil {
		t.Fatal(err)
	}
	if err := gc.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	g.Close()
	exact, _ := d.Prepare("gemm")
	if _, err := s.Submit(&hw.Command{Program: exact, Args: []hw.Arg{
		hw.BufferArg(bufs[0], 0, 4*m*k), hw.BufferArg(bufs[1], 0, 4*k*n), hw.BufferArg(bufs[2], 0, 4*m*n),
		u(m), u(n), u(k), u(0), u(0), hw.Float32(1), hw.Float32(0), u(1), u(0), u(0), u(0)}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if fb.created != 1 || len(fb.calls) != 10 || fb.bad != 0 {
		t.Errorf("%d handles, %d gemm calls, %d without the context current or a workspace; want 1, 10, 0", fb.created, len(fb.calls), fb.bad)
	}
	for i, cs := range fb.streams {
		want := s.(*Stream).cs
		if i == 9 {
			want = s2.(*Stream).cs
		}
		if cs != want {
			t.Errorf("call %d: cuBLAS bound to stream %#x, the launch's is %#x", i, cs, want)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kernelsRun["gemm_bf16"] != 1 || f.kernelsRun["gemm_f32"] != 1 {
		t.Errorf("kernels run: %v; want gemm_f32 once (the exact gemm) and gemm_bf16 once (the recorded graph)", f.kernelsRun)
	}
}

// TestFastGemmFallsBack: without cuBLAS the fast programs run the exact
// kernels, and BLAS says why.
func TestFastGemmFallsBack(t *testing.T) {
	p, f := newFakePlatform(t, 1, NewConfig().WithBLASLibrary("-"))
	d := p.devices[0]
	if _, err := p.BLAS(); !errors.Is(err, errdefs.ErrUnsupported) {
		t.Fatalf("BLAS: %v, want unsupported", err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	buf, err := d.Alloc(64, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	fast, _ := d.Prepare("gemm.fast")
	u := func(v uint64) hw.Arg { return hw.Uint(v) }
	c, err := s.Submit(&hw.Command{Program: fast, Args: []hw.Arg{
		hw.BufferArg(buf, 0, 4), hw.BufferArg(buf, 4, 4), hw.BufferArg(buf, 8, 4),
		u(1), u(1), u(1), u(0), u(0), hw.Float32(1), hw.Float32(0), u(1), u(0), u(0), u(0)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kernelsRun["gemm_f32"] != 1 {
		t.Errorf("kernels run: %v; want gemm_f32 once", f.kernelsRun)
	}
}

// TestLoadBLASSymbols: every missing required cuBLAS symbol is named in
// one error.
func TestLoadBLASSymbols(t *testing.T) {
	_, err := loadBLASSymbols(func(name string) (uintptr, error) {
		if name == "cublasCreate_v2" || name == "cublasGetVersion_v2" {
			return 0, errors.New("absent")
		}
		return 1, nil
	})
	if !errors.Is(err, errdefs.ErrUnsupported) || !strings.Contains(err.Error(), "1 required symbol(s): cublasCreate_v2") {
		t.Fatalf("got %v", err)
	}
	s, err := loadBLASSymbols(func(name string) (uintptr, error) { return 7, nil })
	if err != nil || s.cublasGemmStridedBatchedEx != 7 {
		t.Fatalf("got %+v, %v", s, err)
	}
}

// TestBoundsMatchContract: the bounds this package tests its kernels
// against are the ones the op library's descriptions state (docs/kernels.md
// and `stagehost kernels` print those).
func TestBoundsMatchContract(t *testing.T) {
	pow2 := func(v float64) string {
		_, e := math.Frexp(v)
		return fmt.Sprintf("2^%d", e-1)
	}
	for op, b := range OpBounds {
		want := fmt.Sprintf("%g ulp", b.ULPs)
		if b.Abs > 0 {
			want += " + " + pow2(b.Abs)
		}
		for _, name := range []string{op, op + ".f16", op + ".bf16"} {
			k, ok := ops.Lookup(name)
			if !ok {
				t.Errorf("no program %s", name)
				continue
			}
			if ex := k.Info().Exactness; !strings.Contains(ex, "within "+want+" of the float64 result") {
				t.Errorf("%s: the contract states %q, CUDA is tested against %s", name, ex, want)
			}
		}
	}
	for _, c := range []struct{ op, want string }{
		{"softmax", "within (cols/256 + 16) ulp + 2^-126"},
		{"log_softmax", "within 4 ulp + (cols/256 + 16)·2^-24"},
		{"gemm.fast", "within (K + 4)·2^-23·(|alpha|·Σ|a·b| + |beta·c|)"},
	} {
		k, _ := ops.Lookup(c.op)
		if !strings.Contains(k.Info().Exactness, c.want) {
			t.Errorf("%s: the contract states %q, CUDA is tested against %q", c.op, k.Info().Exactness, c.want)
		}
	}
	if b := SoftmaxBound("softmax", 512); b.ULPs != 512.0/256+16 || b.Abs != 0x1p-126 {
		t.Errorf("SoftmaxBound(softmax, 512) = %+v", b)
	}
	if b := SoftmaxBound("log_softmax", 512); b.ULPs != 4 || b.Abs != (512.0/256+16)*0x1p-24 {
		t.Errorf("SoftmaxBound(log_softmax, 512) = %+v", b)
	}
	if got := FastGemmBound(60); got != 64*0x1p-23 {
		t.Errorf("FastGemmBound(60) = %g", got)
	}
}

// failingBLAS refuses every gemm with status 13
// (CUBLAS_STATUS_EXECUTION_FAILED).
type failingBLAS struct{ fakeBLAS }

func (b *failingBLAS) GemmStridedBatched(h blasHandle, g *gemmCall) int32 { return 13 }

// TestFastGemmFailure: a gemm cuBLAS refuses fails its completion with
// ErrRejected naming the status; the device stays usable.
func TestFastGemmFailure(t *testing.T) {
	f := newFake(1)
	p, err := Open(NewConfig().withDriver(f).withBLAS(&failingBLAS{fakeBLAS{f: f}}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d := p.devices[0]
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	buf, err := d.Alloc(64, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	fast, _ := d.Prepare("gemm.fast")
	u := func(v uint64) hw.Arg { return hw.Uint(v) }
	c, err := s.Submit(&hw.Command{Program: fast, Args: []hw.Arg{
		hw.BufferArg(buf, 0, 4), hw.BufferArg(buf, 4, 4), hw.BufferArg(buf, 8, 4),
		u(1), u(1), u(1), u(0), u(0), hw.Float32(1), hw.Float32(0), u(1), u(0), u(0), u(0)}})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Wait(testCtx(t))
	if !errors.Is(err, errdefs.ErrRejected) || !strings.Contains(err.Error(), "cuBLAS (status 13)") {
		t.Fatalf("completion: %v, want rejected naming cuBLAS status 13", err)
	}
	if d.Err() != nil {
		t.Fatalf("device lost: %v", d.Err())
	}
}

// TestOpSubmitAllocatesNothing: validating and packing an op launch
// allocates nothing (the library's validation does not either).
func TestOpSubmitAllocatesNothing(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	d := p.devices[0]
	x, err := d.Alloc(4*64, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	u := func(v uint64) hw.Arg { return hw.Uint(v) }
	for _, c := range []struct {
		name string
		args []hw.Arg
	}{
		{"exp", []hw.Arg{hw.BufferArg(x, 0, 128), hw.BufferArg(x, 128, 128)}},
		{"softmax.bf16", []hw.Arg{hw.BufferArg(x, 0, 64), hw.BufferArg(x, 64, 64), u(4), u(8), u(2)}},
		{"add", []hw.Arg{hw.BufferArg(x, 0, 32), hw.BufferArg(x, 32, 16), hw.BufferArg(x, 64, 32), u(1), u(1), u(2), u(4), u(1), u(1), u(1), u(4)}},
		{"gemm.fast", []hw.Arg{hw.BufferArg(x, 0, 64), hw.BufferArg(x, 64, 64), hw.BufferArg(x, 128, 64),
			u(4), u(4), u(4), u(0), u(0), hw.Float32(1), hw.Float32(0), u(1), u(0), u(0), u(0)}},
	} {
		pr, err := d.Prepare(c.name)
		if err != nil {
			t.Fatal(err)
		}
		cmd := &hw.Command{Program: pr, Args: c.args}
		var l launch
		if err := d.prepareLaunch(cmd, &l); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if n := testing.AllocsPerRun(100, func() { d.prepareLaunch(cmd, &l) }); n != 0 {
			t.Errorf("%s: %.0f allocations per launch validated", c.name, n)
		}
	}
}
