package emu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"unsafe"
)

// Kernel is a program the emulator runs on the CPU when a launch retires.
// args are the launch's arguments in order; a buffer argument's Bytes is
// the device memory of its range, which the kernel may modify in place
// (a vendor kernel's is a copy instead, as on the host: see
// [Emulator.VendorKernel]).
// A returned error (or a panic) fails the command: the stream's next Sync
// returns FAULT.
//
// Kernels run with the emulator locked: they must not call back into the
// SDK.
type Kernel func(args []Arg) error

// Arg is one argument of a launch.
type Arg struct {
	// Bytes is the buffer range (its device memory; for a vendor kernel a
	// copy, see [Emulator.VendorKernel]), nil for a scalar.
	Bytes []byte
	// Offset is the range's byte offset in its buffer.
	Offset int
	// Value is the scalar (0 for a buffer).
	Value  uint64
	buffer bool
	// addr is the range's host address (the op library's overlap checks).
	addr uint64
}

// IsBuffer reports whether a is a buffer range.
func (a Arg) IsBuffer() bool { return a.buffer }

// Float32 reads a scalar as a float32 (its low 32 bits).
func (a Arg) Float32() float32 { return math.Float32frombits(uint32(a.Value)) }

// The built-in kernels: the simulated device's library (hw/sim), written
// again here because the SDK cannot import the host. Buffers hold
// little-endian float32 values unless said otherwise; matrices are
// row-major; arithmetic is float32 in a fixed order, never fused, so
// results are bit-identical to the simulator's.
var builtins = map[string]Kernel{
	"noop":   func([]Arg) error { return nil },
	"fill":   kernelFill,
	"copy":   kernelCopy,
	"saxpy":  kernelSaxpy,
	"matmul": kernelMatmul,
	"bias":   kernelBias,
	"relu":   kernelRelu,
	"argmax": kernelArgmax,

	"mlp_forward": kernelMLPForward,
}

// Builtins lists the names of the built-in kernels, sorted.
func Builtins() []string {
	names := make([]string, 0, len(builtins))
	for n := range builtins {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// argErr is a kernel's refusal of its arguments, in the words of the
// simulator's kernel (hw/sim), so a guest reads the same reason from the
// emulator and from the host.
func argErr(format string, a ...any) error {
	return fmt.Errorf(format, a...)
}

func want(name string, args []Arg, n int) error {
	if len(args) != n {
		return argErr("kernel %q takes %d arguments, got %d", name, n, len(args))
	}
	return nil
}

func bufArg(name string, args []Arg, i int) ([]byte, error) {
	if !args[i].buffer {
		return nil, argErr("kernel %q: argument %d is a scalar, not a buffer", name, i)
	}
	return args[i].Bytes, nil
}

func scalarArg(name string, args []Arg, i int) (uint64, error) {
	if args[i].buffer {
		return 0, argErr("kernel %q: argument %d is a buffer, not a scalar", name, i)
	}
	return args[i].Value, nil
}

// floats is a float32 view of a buffer argument: decoded values plus the
// bytes to store them back into.
type floats struct {
	v []float32
	b []byte
}

func floatArg(name string, args []Arg, i int) (floats, error) {
	b, err := bufArg(name, args, i)
	if err != nil {
		return floats{}, err
	}
	if len(b)%4 != 0 {
		return floats{}, argErr("kernel %q: argument %d: %d bytes is not a whole number of float32", name, i, len(b))
	}
	if len(b) > 0 && args[i].Offset%4 != 0 {
		return floats{}, argErr("kernel %q: argument %d: offset %d is not 4-byte aligned", name, i, args[i].Offset)
	}
	v := make([]float32, len(b)/4)
	for j := range v {
		v[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
	}
	return floats{v, b}, nil
}

func (f floats) store() {
	for j, x := range f.v {
		binary.LittleEndian.PutUint32(f.b[4*j:], math.Float32bits(x))
	}
}

func float32Arg(name string, args []Arg, i int) (float32, error) {
	v, err := scalarArg(name, args, i)
	return math.Float32frombits(uint32(v)), err
}

// product returns a*b as an int, or false if it overflows int32.
func product(a, b uint64) (int, bool) {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 || lo > math.MaxInt32 {
		return 0, false
	}
	return int(lo), true
}

// fill(buf, value f32): every float32 of buf becomes value.
func kernelFill(args []Arg) error {
	if err := want("fill", args, 2); err != nil {
		return err
	}
	x, err := floatArg("fill", args, 0)
	if err != nil {
		return err
	}
	v, err := float32Arg("fill", args, 1)
	if err != nil {
		return err
	}
	for i := range x.v {
		x.v[i] = v
	}
	x.store()
	return nil
}

// copy(dst, src): copies src's bytes into dst; same length (may overlap).
func kernelCopy(args []Arg) error {
	if err := want("copy", args, 2); err != nil {
		return err
	}
	dst, err := bufArg("copy", args, 0)
	if err != nil {
		return err
	}
	src, err := bufArg("copy", args, 1)
	if err != nil {
		return err
	}
	if len(dst) != len(src) {
		return argErr("copy: dst has %d bytes, src %d", len(dst), len(src))
	}
	copy(dst, src)
	return nil
}

// saxpy(a f32, x, y): y[i] = a*x[i] + y[i].
func kernelSaxpy(args []Arg) error {
	if err := want("saxpy", args, 3); err != nil {
		return err
	}
	a, err := float32Arg("saxpy", args, 0)
	if err != nil {
		return err
	}
	x, err := floatArg("saxpy", args, 1)
	if err != nil {
		return err
	}
	y, err := floatArg("saxpy", args, 2)
	if err != nil {
		return err
	}
	if len(x.v) != len(y.v) {
		return argErr("saxpy: x has %d values, y %d", len(x.v), len(y.v))
	}
	for i := range y.v {
		y.v[i] = float32(a*x.v[i]) + y.v[i] // the conversion forbids fusing
	}
	y.store()
	return nil
}

// matmul(A, B, C, M, N, K): C = A·B, A M×K, B K×N, C M×N; C[i][j] is summed
// from 0 over k = 0..K-1.
func kernelMatmul(args []Arg) error {
	if err := want("matmul", args, 6); err != nil {
		return err
	}
	var dims [3]uint64
	for i := range dims {
		v, err := scalarArg("matmul", args, 3+i)
		if err != nil {
			return err
		}
		dims[i] = v
	}
	a, err := floatArg("matmul", args, 0)
	if err != nil {
		return err
	}
	b, err := floatArg("matmul", args, 1)
	if err != nil {
		return err
	}
	c, err := floatArg("matmul", args, 2)
	if err != nil {
		return err
	}
	m64, n64, k64 := dims[0], dims[1], dims[2]
	mk, ok1 := product(m64, k64)
	kn, ok2 := product(k64, n64)
	mn, ok3 := product(m64, n64)
	if !ok1 || !ok2 || !ok3 {
		return argErr("matmul: dimensions M=%d N=%d K=%d too large", m64, n64, k64)
	}
	if len(a.v) != mk || len(b.v) != kn || len(c.v) != mn {
		return argErr("matmul: M=%d N=%d K=%d want A, B, C of %d, %d, %d values; got %d, %d, %d",
			m64, n64, k64, mk, kn, mn, len(a.v), len(b.v), len(c.v))
	}
	m, n, k := int(m64), int(n64), int(k64)
	for i := range m {
		for j := range n {
			var sum float32
			for p := range k {
				sum += float32(a.v[i*k+p] * b.v[p*n+j])
			}
			c.v[i*n+j] = sum
		}
	}
	c.store()
	return nil
}

// bias(x, b, M, N): x[i][j] += b[j], x M×N, b N values.
func kernelBias(args []Arg) error {
	if err := want("bias", args, 4); err != nil {
		return err
	}
	m64, err := scalarArg("bias", args, 2)
	if err != nil {
		return err
	}
	n64, err := scalarArg("bias", args, 3)
	if err != nil {
		return err
	}
	x, err := floatArg("bias", args, 0)
	if err != nil {
		return err
	}
	b, err := floatArg("bias", args, 1)
	if err != nil {
		return err
	}
	mn, ok := product(m64, n64)
	if !ok || len(x.v) != mn || uint64(len(b.v)) != n64 {
		return argErr("bias: M=%d N=%d want x of M*N and b of N values; got %d and %d", m64, n64, len(x.v), len(b.v))
	}
	n := int(n64)
	for i := range x.v {
		x.v[i] += b.v[i%n]
	}
	x.store()
	return nil
}

// relu(x): negative values become 0 (-0 and NaN stay).
func kernelRelu(args []Arg) error {
	if err := want("relu", args, 1); err != nil {
		return err
	}
	x, err := floatArg("relu", args, 0)
	if err != nil {
		return err
	}
	for i, v := range x.v {
		if v < 0 {
			x.v[i] = 0
		}
	}
	x.store()
	return nil
}

// argmax(x, out): the first largest value of x (non-empty; NaN never
// compares larger); out (≥ 8 bytes) gets the index as a little-endian
// uint32, then the value's float32 bits.
func kernelArgmax(args []Arg) error {
	if err := want("argmax", args, 2); err != nil {
		return err
	}
	x, err := floatArg("argmax", args, 0)
	if err != nil {
		return err
	}
	out, err := bufArg("argmax", args, 1)
	if err != nil {
		return err
	}
	if len(x.v) == 0 {
		return argErr("argmax: x is empty")
	}
	if len(out) < 8 {
		return argErr("argmax: out has %d bytes, want at least 8", len(out))
	}
	best, bestV := 0, x.v[0]
	for i, v := range x.v[1:] {
		if v > bestV {
			best, bestV = i+1, v
		}
	}
	binary.LittleEndian.PutUint32(out[0:4], uint32(best))
	binary.LittleEndian.PutUint32(out[4:8], math.Float32bits(bestV))
	return nil
}

// mlpMaxWidth is the most hidden units and classes mlp_forward takes, as
// on the simulator and the CUDA backend.
const mlpMaxWidth = 1024

// mlp_forward(x, W1, b1, W2, b2, scores, out, I, H, C): a two-layer
// perceptron on one input row in one launch: x has I values, W1 is I×H,
// b1 has H values, W2 is H×C, b2 and scores have C values, out at least 8
// bytes; I ≥ 1 and 1 ≤ H, C ≤ 1024; scores and out overlap neither each
// other nor any input. scores = relu(x·W1 + b1)·W2 + b2 and out =
// argmax(scores), bit for bit what matmul, bias, relu, matmul, bias and
// argmax write into them (the hidden layer is not stored).
func kernelMLPForward(args []Arg) error {
	const name = "mlp_forward"
	if err := want(name, args, 10); err != nil {
		return err
	}
	var dims [3]uint64
	for i := range dims {
		v, err := scalarArg(name, args, 7+i)
		if err != nil {
			return err
		}
		dims[i] = v
	}
	in, hid, cls := dims[0], dims[1], dims[2]
	if in == 0 || in > math.MaxInt32 || hid == 0 || hid > mlpMaxWidth || cls == 0 || cls > mlpMaxWidth {
		return argErr("mlp_forward: I=%d H=%d C=%d: want I ≥ 1 and 1 ≤ H, C ≤ %d", in, hid, cls, mlpMaxWidth)
	}
	wantLen := [6]uint64{in, in * hid, hid, hid * cls, cls, cls}
	var v [6]floats
	for i := range v {
		f, err := floatArg(name, args, i)
		if err != nil {
			return err
		}
		if uint64(len(f.v)) != wantLen[i] {
			return argErr("mlp_forward: I=%d H=%d C=%d: argument %d has %d values, want %d", in, hid, cls, i, len(f.v), wantLen[i])
		}
		v[i] = f
	}
	out, err := bufArg(name, args, 6)
	if err != nil {
		return err
	}
	if len(out) < 8 {
		return argErr("mlp_forward: argument 6 has %d bytes, want at least 8 (index, max)", len(out))
	}
	for _, o := range [...]int{5, 6} {
		for i := range 7 {
			if i != o && overlaps(args[o].Bytes, args[i].Bytes) {
				return argErr("mlp_forward: argument %d (an output) overlaps argument %d", o, i)
			}
		}
	}
	x, w1, b1, w2, b2, scores := v[0].v, v[1].v, v[2].v, v[3].v, v[4].v, v[5]
	nh, nc := int(hid), int(cls)
	h := make([]float32, nh)
	for j := range h {
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
		for k, hv := range h {
			sum += float32(hv * w2[k*nc+j])
		}
		scores.v[j] = sum + b2[j]
	}
	scores.store()
	best, bestV := 0, scores.v[0]
	for i, s := range scores.v[1:] {
		if s > bestV {
			best, bestV = i+1, s
		}
	}
	binary.LittleEndian.PutUint32(out[0:4], uint32(best))
	binary.LittleEndian.PutUint32(out[4:8], math.Float32bits(bestV))
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
