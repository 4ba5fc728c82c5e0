package sim_test

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

func TestKernelsRegistered(t *testing.T) {
	got := sim.Kernels()
	for _, k := range []string{"argmax", "bias", "copy", "fill", "matmul", "mlp_forward", "noop", "relu", "saxpy", "spin"} {
		if !slices.Contains(got, k) {
			t.Errorf("kernel %q not registered (have %v)", k, got)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("registering noop twice did not panic")
		}
	}()
	sim.Register("noop", func(*sim.Launch) error { return nil })
}

func TestFillCopySaxpy(t *testing.T) {
	r := newRig(t)
	x := r.alloc(r.dev, 12)
	y := r.alloc(r.dev, 12)
	z := r.alloc(r.dev, 12)
	putF32(host(t, x), 1, 2, 3)
	putF32(host(t, y), 10, 20, 30)
	r.submit(r.st, r.prog(r.dev, "saxpy"), hw.Float32(2), hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1))
	r.submit(r.st, r.prog(r.dev, "copy"), hw.BufferArg(z, 0, -1), hw.BufferArg(y, 0, -1))
	// fill only the middle value of y, after the copy.
	r.submit(r.st, r.prog(r.dev, "fill"), hw.BufferArg(y, 4, 4), hw.Float32(-0.5))
	r.sync(r.st)
	equalF32(t, "y", getF32(host(t, y)), []float32{12, -0.5, 36})
	equalF32(t, "z", getF32(host(t, z)), []float32{12, 24, 36})
	equalF32(t, "x", getF32(host(t, x)), []float32{1, 2, 3})
}

// TestMLP runs a two-layer perceptron on a batch of two inputs:
// logits = relu(X·W1 + b1)·W2 + b2, then argmax per row. All values are
// exact in float32, so the results are hand-computed exactly.
func TestMLP(t *testing.T) {
	r := newRig(t)
	f32 := func(n int) *sim.Buffer { return r.alloc(r.dev, 4*n) }
	X, W1, B1, H := f32(2*3), f32(3*4), f32(4), f32(2*4)
	W2, B2, L := f32(4*2), f32(2), f32(2*2)
	out := r.alloc(r.dev, 16)
	putF32(host(t, X), 1, -2, 0.5, 2, 0, 0)
	putF32(host(t, W1),
		1, 0, -1, 2,
		0.5, 1, 0, -1,
		2, -1, 1, 0)
	putF32(host(t, B1), 0.5, 1, 1, -1)
	putF32(host(t, W2),
		1, -1,
		2, 0,
		-2, 1,
		0.5, 0.25)
	putF32(host(t, B2), -1, 2)

	all := func(b *sim.Buffer) hw.Arg { return hw.BufferArg(b, 0, -1) }
	matmul, bias := r.prog(r.dev, "matmul"), r.prog(r.dev, "bias")
	relu, argmax := r.prog(r.dev, "relu"), r.prog(r.dev, "argmax")
	hPre := r.submit(r.st, matmul, all(X), all(W1), all(H), hw.Uint(2), hw.Uint(4), hw.Uint(3))
	r.submit(r.st, bias, all(H), all(B1), hw.Uint(2), hw.Uint(4))
	r.submit(r.st, relu, all(H))
	r.submit(r.st, matmul, all(H), all(W2), all(L), hw.Uint(2), hw.Uint(2), hw.Uint(4))
	r.submit(r.st, bias, all(L), all(B2), hw.Uint(2), hw.Uint(2))
	r.submit(r.st, argmax, hw.BufferArg(L, 0, 8), hw.BufferArg(out, 0, 8))
	r.submit(r.st, argmax, hw.BufferArg(L, 8, 8), hw.BufferArg(out, 8, 8))
	r.sync(r.st)
	if !hPre.Done() {
		t.Fatal("first command not done after Sync")
	}
	equalF32(t, "hidden", getF32(host(t, H)), []float32{1.5, 0, 0.5, 3, 2.5, 1, 0, 3})
	equalF32(t, "logits", getF32(host(t, L)), []float32{1, 1.75, 5, 0.25})
	o := host(t, out)
	for row, want := range []struct {
		idx uint32
		val float32
	}{{1, 1.75}, {0, 5}} {
		idx := binary.LittleEndian.Uint32(o[8*row:])
		val := math.Float32frombits(binary.LittleEndian.Uint32(o[8*row+4:]))
		if idx != want.idx || val != want.val {
			t.Errorf("row %d: argmax %d (%v), want %d (%v)", row, idx, val, want.idx, want.val)
		}
	}
}

func TestArgmaxFirstOfTies(t *testing.T) {
	r := newRig(t)
	x, out := r.alloc(r.dev, 16), r.alloc(r.dev, 8)
	putF32(host(t, x), 3, 5, 5, -1)
	r.submit(r.st, r.prog(r.dev, "argmax"), hw.BufferArg(x, 0, -1), hw.BufferArg(out, 0, -1))
	r.sync(r.st)
	o := host(t, out)
	if idx, val := binary.LittleEndian.Uint32(o), math.Float32frombits(binary.LittleEndian.Uint32(o[4:])); idx != 1 || val != 5 {
		t.Fatalf("argmax = %d (%v), want 1 (5)", idx, val)
	}
}

func TestReluKeepsNonNegative(t *testing.T) {
	r := newRig(t)
	x := r.alloc(r.dev, 16)
	putF32(host(t, x), -3, 0, 2.5, float32(math.Inf(-1)))
	r.submit(r.st, r.prog(r.dev, "relu"), hw.BufferArg(x, 0, -1))
	r.sync(r.st)
	equalF32(t, "relu", getF32(host(t, x)), []float32{0, 0, 2.5, 0})
}

func TestKernelArgumentErrors(t *testing.T) {
	r := newRig(t)
	a := r.alloc(r.dev, 24)
	b := r.alloc(r.dev, 24)
	all := func(x *sim.Buffer) hw.Arg { return hw.BufferArg(x, 0, -1) }
	for _, tc := range []struct {
		kernel string
		args   []hw.Arg
		words  []string
	}{
		{"matmul", []hw.Arg{all(a), all(b), all(a), hw.Uint(2), hw.Uint(2), hw.Uint(2)}, []string{"matmul"}},
		{"matmul", []hw.Arg{all(a), all(b), all(a), hw.Uint(1 << 40), hw.Uint(1 << 40), hw.Uint(2)}, []string{"too large"}},
		{"matmul", []hw.Arg{all(a)}, []string{"6 arguments"}},
		{"bias", []hw.Arg{all(a), hw.BufferArg(b, 0, 8), hw.Uint(2), hw.Uint(3)}, []string{"bias"}},
		{"saxpy", []hw.Arg{hw.Float32(1), all(a), hw.BufferArg(b, 0, 8)}, []string{"saxpy"}},
		{"copy", []hw.Arg{all(a), hw.BufferArg(b, 0, 4)}, []string{"copy"}},
		{"argmax", []hw.Arg{hw.BufferArg(a, 0, 0), all(b)}, []string{"argmax"}},
		{"argmax", []hw.Arg{all(a), hw.BufferArg(b, 0, 4)}, []string{"8"}},
		{"fill", []hw.Arg{all(a), all(b)}, []string{"argument 1 is a buffer"}},
		{"fill", []hw.Arg{hw.Float32(1), hw.Float32(1)}, []string{"argument 0 is a scalar"}},
		{"test.floats", []hw.Arg{hw.BufferArg(a, 0, 6)}, []string{"whole number"}},
		{"test.floats", []hw.Arg{hw.BufferArg(a, 2, 4)}, []string{"aligned"}},
		{"test.floats", nil, []string{"argument 0 missing"}},
		{"spin", []hw.Arg{all(a), hw.Uint(22), hw.Uint(0)}, []string{"outside"}},
		{"spin", []hw.Arg{all(a), hw.Uint(2), hw.Uint(0)}, []string{"aligned"}},
	} {
		c := r.submit(r.st, r.prog(r.dev, tc.kernel), tc.args...)
		err := c.Wait(ctxT(t))
		wantClass(t, err, errdefs.ErrFault, tc.words...)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s %v: error %v does not also match ErrInvalidArgument", tc.kernel, tc.args, err)
		}
		if errdefs.ClassOf(err) != errdefs.ErrFault {
			t.Errorf("class of %v is %v", err, errdefs.ClassOf(err))
		}
	}
	// Kernel failures are not losses: the stream goes on.
	r.submit(r.st, r.prog(r.dev, "noop"))
	if err := r.st.Sync(ctxT(t)); err == nil {
		t.Fatal("Sync did not report the failures")
	}
	if r.dev.Err() != nil {
		t.Fatal(r.dev.Err())
	}
}
