package sim

import (
	"encoding/binary"
	"math"
	"math/bits"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// The kernel library. Buffers hold float32 values in native byte order
// (viewed through [Launch.Float32s]) unless said otherwise; matrices are
// row-major. Every kernel checks its argument count and sizes and fails
// with an error wrapping [errdefs.ErrInvalidArgument] when they do not fit.
// Arithmetic is float32, in a fixed order, never fused.
func init() {
	registerInfo(infoNoop, kernelNoop)
	registerInfo(infoFill, kernelFill)
	registerInfo(infoCopy, kernelCopy)
	registerInfo(infoSaxpy, kernelSaxpy)
	registerInfo(infoMatmul, kernelMatmul)
	registerInfo(infoBias, kernelBias)
	registerInfo(infoRelu, kernelRelu)
	registerInfo(infoArgmax, kernelArgmax)
	registerInfo(infoMLPForward, kernelMLPForward)
	registerInfo(infoSpin, kernelSpin)
}

// Shorthands for the descriptions next to each kernel.
var (
	buf    = hw.KernelBuffer
	scalar = hw.KernelScalar
)

func badArgs(format string, args ...any) error {
	return errdefs.Errorf(errdefs.ErrInvalidArgument, format, args...)
}

func wantArgs(l *Launch, n int) error {
	if got := len(l.Args()); got != n {
		return badArgs("kernel %q takes %d arguments, got %d", l.prog.name, n, got)
	}
	return nil
}

// elems returns rows*cols as an int, or false if it overflows.
func elems(rows, cols uint64) (int, bool) {
	hi, lo := bits.Mul64(rows, cols)
	if hi != 0 || lo > math.MaxInt32 {
		return 0, false
	}
	return int(lo), true
}

var infoNoop = hw.KernelInfo{Name: "noop", Doc: "Does nothing; accepts and ignores any arguments.", Variadic: true}

// noop does nothing; it accepts and ignores any arguments.
func kernelNoop(*Launch) error { return nil }

var infoFill = hw.KernelInfo{
	Name: "fill", Doc: "Sets every float32 of buf to value.",
	Args: []hw.KernelArg{buf("buf", "f32", "out", ""), scalar("value", "f32")},
}

// fill(buf, value f32): every float32 of buf becomes value.
func kernelFill(l *Launch) error {
	if err := wantArgs(l, 2); err != nil {
		return err
	}
	x, v := l.Float32s(0), l.Float32(1)
	for i := range x {
		x[i] = v
	}
	return nil
}

var infoCopy = hw.KernelInfo{
	Name: "copy", Doc: "Copies src's bytes into dst.",
	Args:        []hw.KernelArg{buf("dst", "bytes", "out", "len(src) bytes"), buf("src", "bytes", "in", "")},
	Constraints: []string{"dst and src may overlap."},
}

// copy(dst, src): copies src's bytes into dst; the ranges must have the
// same length (they may overlap).
func kernelCopy(l *Launch) error {
	if err := wantArgs(l, 2); err != nil {
		return err
	}
	dst, src := l.Bytes(0), l.Bytes(1)
	if len(dst) != len(src) {
		return badArgs("copy: dst has %d bytes, src %d", len(dst), len(src))
	}
	copy(dst, src)
	return nil
}

var infoSaxpy = hw.KernelInfo{
	Name: "saxpy", Doc: "y[i] = a*x[i] + y[i], the product rounded before the add.",
	Args: []hw.KernelArg{scalar("a", "f32"), buf("x", "f32", "in", "len(y) values"), buf("y", "f32", "inout", "")},
}

// saxpy(a f32, x, y): y[i] = a*x[i] + y[i]; x and y have the same length.
func kernelSaxpy(l *Launch) error {
	if err := wantArgs(l, 3); err != nil {
		return err
	}
	a, x, y := l.Float32(0), l.Float32s(1), l.Float32s(2)
	if len(x) != len(y) {
		return badArgs("saxpy: x has %d values, y %d", len(x), len(y))
	}
	for i := range y {
		y[i] = float32(a*x[i]) + y[i] // the conversion forbids fusing
	}
	return nil
}

var infoMatmul = hw.KernelInfo{
	Name: "matmul", Doc: "C = A·B, row-major; each C[i][j] summed from 0 over k in order.",
	Args: []hw.KernelArg{
		buf("A", "f32", "in", "M*K values"), buf("B", "f32", "in", "K*N values"), buf("C", "f32", "out", "M*N values"),
		scalar("M", "u32"), scalar("N", "u32"), scalar("K", "u32"),
	},
	Constraints: []string{"C must not overlap A or B."},
}

// matmul(A, B, C, M, N, K): C = A·B with A M×K, B K×N and C M×N; each
// range must hold exactly that many values. C must not overlap A or B.
// C[i][j] is accumulated from 0 over k = 0, 1, ..., K-1.
func kernelMatmul(l *Launch) error {
	if err := wantArgs(l, 6); err != nil {
		return err
	}
	a, b, c := l.Float32s(0), l.Float32s(1), l.Float32s(2)
	m64, n64, k64 := l.Uint(3), l.Uint(4), l.Uint(5)
	mk, ok1 := elems(m64, k64)
	kn, ok2 := elems(k64, n64)
	mn, ok3 := elems(m64, n64)
	if !ok1 || !ok2 || !ok3 {
		return badArgs("matmul: dimensions M=%d N=%d K=%d too large", m64, n64, k64)
	}
	if len(a) != mk || len(b) != kn || len(c) != mn {
		return badArgs("matmul: M=%d N=%d K=%d want A, B, C of %d, %d, %d values; got %d, %d, %d",
			m64, n64, k64, mk, kn, mn, len(a), len(b), len(c))
	}
	m, n, k := int(m64), int(n64), int(k64)
	for i := range m {
		row := a[i*k : (i+1)*k]
		for j := range n {
			var sum float32
			for p, av := range row {
				sum += float32(av * b[p*n+j])
			}
			c[i*n+j] = sum
		}
	}
	return nil
}

var infoBias = hw.KernelInfo{
	Name: "bias", Doc: "x[i][j] += b[j] for an M×N row-major x.",
	Args: []hw.KernelArg{buf("x", "f32", "inout", "M*N values"), buf("b", "f32", "in", "N values"), scalar("M", "u32"), scalar("N", "u32")},
}

// bias(x, b, M, N): x[i][j] += b[j] with x M×N and b of N values.
func kernelBias(l *Launch) error {
	if err := wantArgs(l, 4); err != nil {
		return err
	}
	x, b := l.Float32s(0), l.Float32s(1)
	m64, n64 := l.Uint(2), l.Uint(3)
	mn, ok := elems(m64, n64)
	if !ok || len(x) != mn || uint64(len(b)) != n64 {
		return badArgs("bias: M=%d N=%d want x of M*N and b of N values; got %d and %d", m64, n64, len(x), len(b))
	}
	n := int(n64)
	for i := 0; i < len(x); i += n {
		row := x[i : i+n]
		for j := range row {
			row[j] += b[j]
		}
	}
	return nil
}

var infoRelu = hw.KernelInfo{
	Name: "relu", Doc: "x[i] = max(x[i], 0): negative values (not -0 or NaN) become 0.",
	Args: []hw.KernelArg{buf("x", "f32", "inout", "")},
}

// relu(x): x[i] = max(x[i], 0). Negative values (not -0 or NaN) become 0.
func kernelRelu(l *Launch) error {
	if err := wantArgs(l, 1); err != nil {
		return err
	}
	x := l.Float32s(0)
	for i, v := range x {
		if v < 0 {
			x[i] = 0
		}
	}
	return nil
}

var infoArgmax = hw.KernelInfo{
	Name: "argmax", Doc: "Writes the index (u32 LE) and float32 bits (LE) of x's first largest value into out.",
	Args:        []hw.KernelArg{buf("x", "f32", "in", "1 to 2^32-1 values"), buf("out", "bytes", "out", "at least 8 bytes")},
	Constraints: []string{"NaN never compares larger."},
}

// argmax(x, out): finds the first largest value of x (non-empty; NaN
// never compares larger) and writes into out (≥ 8 bytes) the index as a
// little-endian uint32, then the value's float32 bits, little-endian.
func kernelArgmax(l *Launch) error {
	if err := wantArgs(l, 2); err != nil {
		return err
	}
	x, out := l.Float32s(0), l.Bytes(1)
	if len(x) == 0 || len(x) > math.MaxUint32 {
		return badArgs("argmax: x has %d values", len(x))
	}
	if len(out) < 8 {
		return badArgs("argmax: out has %d bytes, want at least 8", len(out))
	}
	putArgmax(out, x)
	return nil
}

// putArgmax writes into out[:8] the index of x's first largest value (x is
// not empty; NaN never compares larger) as a little-endian uint32, then
// the value's float32 bits, little-endian.
func putArgmax(out []byte, x []float32) {
	best, bestV := 0, x[0]
	for i, v := range x[1:] {
		if v > bestV {
			best, bestV = i+1, v
		}
	}
	binary.LittleEndian.PutUint32(out[0:4], uint32(best))
	binary.LittleEndian.PutUint32(out[4:8], math.Float32bits(bestV))
}

var infoMLPForward = hw.KernelInfo{
	Name: "mlp_forward", Doc: "A two-layer perceptron on one row in one launch: scores = relu(x·W1 + b1)·W2 + b2, out = argmax(scores).",
	Args: []hw.KernelArg{
		buf("x", "f32", "in", "I values"), buf("W1", "f32", "in", "I*H values"), buf("b1", "f32", "in", "H values"),
		buf("W2", "f32", "in", "H*C values"), buf("b2", "f32", "in", "C values"), buf("scores", "f32", "out", "C values"),
		buf("out", "bytes", "out", "at least 8 bytes"),
		scalar("I", "u32"), scalar("H", "u32"), scalar("C", "u32"),
	},
	Constraints: []string{
		"I ≥ 1 and 1 ≤ H, C ≤ 1024.",
		"scores and out overlap neither each other nor any input.",
		"Bit for bit the six launches matmul, bias, relu, matmul, bias, argmax.",
	},
}

// mlpMaxWidth is the most hidden units and classes mlp_forward takes (the
// CUDA kernel keeps both layers in shared memory).
const mlpMaxWidth = 1024

// mlp_forward(x, W1, b1, W2, b2, scores, out, I, H, C): a two-layer
// perceptron on one input row in one launch. x has I values, W1 is I×H,
// b1 has H values, W2 is H×C, b2 and scores have C values, out at least 8
// bytes; I ≥ 1 and 1 ≤ H, C ≤ 1024 (mlpMaxWidth). scores and out must not
// overlap each other or any input. It writes scores = relu(x·W1 + b1)·W2 +
// b2 and out = argmax(scores), bit for bit what the six launches
//
//	matmul(x, W1, h, 1, H, I); bias(h, b1, 1, H); relu(h)
//	matmul(h, W2, scores, 1, C, H); bias(scores, b2, 1, C); argmax(scores, out)
//
// write into scores and out: per element the same float32 operations in
// the same order (each sum from 0 over k in order, products rounded before
// adding, then the bias; first-largest argmax). The hidden layer h is not
// stored anywhere.
func kernelMLPForward(l *Launch) error {
	if err := wantArgs(l, 10); err != nil {
		return err
	}
	in, hid, cls := l.Uint(7), l.Uint(8), l.Uint(9)
	if in == 0 || in > math.MaxInt32 || hid == 0 || hid > mlpMaxWidth || cls == 0 || cls > mlpMaxWidth {
		return badArgs("mlp_forward: I=%d H=%d C=%d: want I ≥ 1 and 1 ≤ H, C ≤ %d", in, hid, cls, mlpMaxWidth)
	}
	want := [6]uint64{in, in * hid, hid, hid * cls, cls, cls}
	var v [6][]float32
	for i := range v {
		v[i] = l.Float32s(i)
		if uint64(len(v[i])) != want[i] {
			return badArgs("mlp_forward: I=%d H=%d C=%d: argument %d has %d values, want %d", in, hid, cls, i, len(v[i]), want[i])
		}
	}
	out := l.Bytes(6)
	if len(out) < 8 {
		return badArgs("mlp_forward: argument 6 has %d bytes, want at least 8 (index, max)", len(out))
	}
	for _, o := range [...]int{5, 6} {
		for i := range 7 {
			if i != o && overlaps(l.Bytes(o), l.Bytes(i)) {
				return badArgs("mlp_forward: argument %d (an output) overlaps argument %d", o, i)
			}
		}
	}
	x, w1, b1, w2, b2, scores := v[0], v[1], v[2], v[3], v[4], v[5]
	nh, nc := int(hid), int(cls)
	var h [mlpMaxWidth]float32
	for j := range nh {
		var sum float32
		for k, xv := range x {
			sum += float32(xv * w1[k*nh+j])
		}
		sum += b1[j]
		if sum < 0 {
			sum = 0
		}
		h[j] = sum
	}
	for j := range nc {
		var sum float32
		for k, hv := range h[:nh] {
			sum += float32(hv * w2[k*nc+j])
		}
		scores[j] = sum + b2[j]
	}
	putArgmax(out, scores)
	return nil
}

// overlaps reports whether two byte ranges share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

var infoSpin = hw.KernelInfo{
	Name: "spin", Doc: "A test kernel: polls the uint32 at byte offset off of buf until it equals want, or the device is lost.",
	Args:        []hw.KernelArg{buf("buf", "bytes", "in", "at least off+4 bytes"), scalar("off", "u64"), scalar("want", "u32")},
	Constraints: []string{"The word at off is 4-byte aligned."},
}

// spin(buf, off, want): polls the uint32 at byte offset off of buf's range
// (4-byte aligned) with atomic loads, yielding between polls, until it
// equals uint32(want). It fails with an [errdefs.ErrDeviceLost] error if the
// device is lost first. A test kernel: a stand-in for a resident program
// waiting for a startup word in shared memory.
func kernelSpin(l *Launch) error {
	if err := wantArgs(l, 3); err != nil {
		return err
	}
	b, off, want := l.Bytes(0), l.Uint(1), uint32(l.Uint(2))
	if len(b) < 4 || off > uint64(len(b)-4) {
		return badArgs("spin: offset %d outside a %d-byte range", off, len(b))
	}
	p := unsafe.Pointer(&b[off])
	if uintptr(p)%4 != 0 {
		return badArgs("spin: word at offset %d is not 4-byte aligned", off)
	}
	w, lost := (*uint32)(p), l.Lost()
	for atomic.LoadUint32(w) != want {
		select {
		case <-lost:
			return l.dev.Err()
		default:
		}
		runtime.Gosched()
	}
	return nil
}
