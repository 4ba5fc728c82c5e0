package ops

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// spec is one argument of a test launch: a buffer's initial bytes, or a
// scalar.
type spec struct {
	buffer bool
	data   []byte
	value  uint64
	// alias: the buffer is argument alias-1's range (in place).
	alias int
}

func sc(v uint64) spec      { return spec{value: v} }
func scF(v float32) spec    { return spec{value: uint64(math.Float32bits(v))} }
func raw(b []byte) spec     { return spec{buffer: true, data: b} }
func zeros(n int) spec      { return spec{buffer: true, data: make([]byte, n)} }
func aliasOf(i int) spec    { return spec{buffer: true, alias: i + 1} }
func pack(h, w uint32) spec { return sc(uint64(h) | uint64(w)<<32) }

// tv encodes float32 values in storage type dt.
func tv(dt DType, v []float32) spec {
	b := make([]byte, len(v)*dt.Size())
	encode(b, dt.String(), v)
	return raw(b)
}

func i32s(v ...int32) spec {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return raw(b)
}

// place lays the buffers out in one arena at 64-byte aligned addresses
// (from 4096) and returns the launch's args and memory.
func place(specs []spec) ([]Arg, [][]byte) {
	args := make([]Arg, len(specs))
	mem := make([][]byte, len(specs))
	size := 0
	for _, s := range specs {
		size += (len(s.data) + 63) &^ 63
	}
	arena := make([]byte, size)
	off := 0
	for i, s := range specs {
		switch {
		case s.alias > 0:
			args[i], mem[i] = args[s.alias-1], mem[s.alias-1]
		case s.buffer:
			n := len(s.data)
			mem[i] = arena[off : off+n : off+n]
			copy(mem[i], s.data)
			args[i] = Arg{Buffer: true, Addr: uint64(4096 + off), Len: uint64(n)}
			off += (n + 63) &^ 63
		default:
			args[i] = Arg{Value: s.value}
		}
	}
	return args, mem
}

// run runs program name and returns every argument's memory afterwards.
func run(t testing.TB, name string, specs ...spec) [][]byte {
	t.Helper()
	k, ok := Lookup(name)
	if !ok {
		t.Fatalf("no program %q", name)
	}
	args, mem := place(specs)
	if err := k.Run(args, mem); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return mem
}

// validate returns the error of a launch of name with specs.
func validate(name string, specs ...spec) error {
	k, ok := Lookup(name)
	if !ok {
		panic("no program " + name)
	}
	args, _ := place(specs)
	return k.Validate(args)
}

func f32v(b []byte, dt DType) []float32 { return decode(b, dt.String()) }

// Inputs.

// adversarial are the special values every elementwise op is tried on.
var adversarial = []float32{
	0, float32(math.Copysign(0, -1)), 1, -1, 0.5, -0.5, 2, 1e-3, -1e-3,
	float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
	math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, 1e-40, -1e-40, 1.1754942e-38,
	math.MaxFloat32, -math.MaxFloat32, 88, -88, 89, -104, 1e10, -1e10, 20, -20, 3.4e38, 65504, 65520, -65520,
	6e-8, 3e-8, 1e-5, 0.1, 0.7, 1.5, 3.14159, 10, -10, 100, -100,
}

func randVals(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((r.Float64()*2 - 1) * scale)
	}
	return v
}

// roundTo rounds v to storage type dt and back.
func roundTo(dt DType, v []float32) []float32 {
	b := make([]byte, len(v)*dt.Size())
	encode(b, dt.String(), v)
	return decode(b, dt.String())
}

// ulp is the distance from |v| to the next float32 away from zero.
func ulp(v float64) float64 {
	f := math.Abs(v)
	if f > math.MaxFloat32 {
		return math.Inf(1)
	}
	x := float32(f)
	return float64(math.Nextafter32(x, float32(math.Inf(1)))) - float64(x)
}

// storageUlp is one unit in the last place of dt at v's magnitude.
func storageUlp(dt DType, v float64) float64 {
	switch dt {
	case F16:
		return math.Max(ulp(v)*(1<<13), math.Ldexp(1, -24))
	case BF16:
		return ulp(v) * (1 << 16)
	}
	return ulp(v)
}

// near reports whether got is within tol of want for storage type dt:
// NaN matches NaN, and an exact result at or past dt's largest finite value
// may round to the infinity of its sign.
func near(dt DType, got float32, want, tol float64) bool {
	g := float64(got)
	switch {
	case math.IsNaN(want) || math.IsNaN(g):
		return math.IsNaN(want) && math.IsNaN(g)
	case math.IsInf(g, 0):
		return g == want || (math.Abs(want) >= maxFinite(dt) && math.Signbit(g) == math.Signbit(want))
	case math.IsInf(want, 0):
		return false
	}
	return math.Abs(g-want) <= tol
}

func maxFinite(dt DType) float64 {
	switch dt {
	case F16:
		return 65504
	case BF16:
		return float64(BF16ToF32(0x7f7f))
	}
	return math.MaxFloat32
}

func same32(a, b float32) bool {
	return a == b && math.Signbit(float64(a)) == math.Signbit(float64(b)) || (a != a && b != b)
}
