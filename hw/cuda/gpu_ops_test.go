package cuda

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/internal/ops"
)

// opArg is one argument of an op test case: a buffer of n values of type
// dt holding data, or a scalar.
type opArg struct {
	buf  bool
	dt   ops.DType
	data []byte
	val  uint64
}

func sc64(v uint64) opArg     { return opArg{val: v} }
func scF(v float32) opArg     { return opArg{val: uint64(math.Float32bits(v))} }
func pack2(h, w uint64) opArg { return opArg{val: h | w<<32} }

// specials are adversarial float32 inputs: zeros, infinities, NaN,
// subnormals, the extremes, values near overflow of exp.
var specials = []float32{
	0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
	math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, 1e-40, -3e-39, 1.1754944e-38,
	math.MaxFloat32, -math.MaxFloat32, 1, -1, 0.5, 88.7, -87.3, -103.9, 89, 20, -20, 9.5, -9.5, 1e10, -1e10, 65504, 70000,
}

// floats returns n values: normal draws times scale, and (when adv) one
// special value in 8.
func floats(rng *rand.Rand, n int, scale float64, adv bool) []float32 {
	x := make([]float32, n)
	for i := range x {
		if adv && rng.Intn(8) == 0 {
			x[i] = specials[rng.Intn(len(specials))]
			continue
		}
		x[i] = float32(rng.NormFloat64() * scale)
	}
	return x
}

// encode stores float32 values as dt (rounding to nearest even).
func encode(dt ops.DType, x []float32) []byte {
	b := make([]byte, len(x)*dt.Size())
	for i, v := range x {
		switch dt {
		case ops.F16:
			binary.LittleEndian.PutUint16(b[2*i:], ops.F32ToF16(v))
		case ops.BF16:
			binary.LittleEndian.PutUint16(b[2*i:], ops.F32ToBF16(v))
		case ops.I32:
			binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v)))
		default:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	}
	return b
}

// decode reads value i of dt as float64 (i32 as its integer).
func decode(dt ops.DType, b []byte, i int) float64 {
	switch dt {
	case ops.F16:
		return float64(ops.F16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
	case ops.BF16:
		return float64(ops.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
	case ops.I32:
		return float64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
}

func fbuf(dt ops.DType, x []float32) opArg { return opArg{buf: true, dt: dt, data: encode(dt, x)} }

func ibuf(x []int32) opArg {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return opArg{buf: true, dt: ops.I32, data: b}
}

// opCases builds the test cases of program k: random inputs, adversarial
// ones when adv.
func opCases(k *ops.Kernel, rng *rand.Rand, adv bool) [][]opArg {
	dt := k.DType
	f := func(n int, scale float64) opArg { return fbuf(dt, floats(rng, n, scale, adv)) }
	switch k.Op {
	case "affine":
		return [][]opArg{{f(1000, 10), f(1000, 1), scF(1.5), scF(-0.25)}, {f(7, 1), f(7, 1), scF(float32(math.Inf(1))), scF(0)}}
	case "add", "sub", "mul", "div", "max", "min":
		return [][]opArg{
			{f(2*3*1*5, 4), f(1*3*4*1, 4), f(2*3*4*5, 1), sc64(2), sc64(3), sc64(1), sc64(5), sc64(1), sc64(3), sc64(4), sc64(1)},
			{f(777, 4), f(777, 4), f(777, 1), sc64(1), sc64(1), sc64(1), sc64(777), sc64(1), sc64(1), sc64(1), sc64(777)},
			{f(1, 4), f(600, 4), f(600, 1), sc64(1), sc64(1), sc64(1), sc64(1), sc64(2), sc64(3), sc64(10), sc64(10)},
		}
	case "reduce_sum", "reduce_mean", "reduce_max", "reduce_argmax":
		out := func(n int) opArg { return f(n, 1) }
		if k.Op == "reduce_argmax" {
			out = func(n int) opArg { return ibuf(make([]int32, n)) }
		}
		return [][]opArg{
			{f(3*700*2, 3), out(3 * 2), sc64(3), sc64(700), sc64(2)},
			{f(2*3000, 3), out(2), sc64(2), sc64(3000), sc64(1)},
			{f(5*1*4, 3), out(5 * 4), sc64(5), sc64(1), sc64(4)},
			{f(300, 3), out(1), sc64(1), sc64(300), sc64(1)},
		}
	case "softmax", "log_softmax":
		big := floats(rng, 4*300, 1e30, false) // huge rows
		ninf := make([]float32, 2*40)
		for i := range ninf {
			ninf[i] = float32(math.Inf(-1))
		}
		return [][]opArg{
			{f(6*300, 4), f(6*300, 1), sc64(6), sc64(300), sc64(0)},
			{f(8*37, 4), f(8*37, 1), sc64(8), sc64(37), sc64(4)},
			{f(3*1000, 30), f(3*1000, 1), sc64(3), sc64(1000), sc64(3)},
			{fbuf(dt, big), f(4*300, 1), sc64(4), sc64(300), sc64(0)},
			{fbuf(dt, ninf), f(2*40, 1), sc64(2), sc64(40), sc64(0)},
			{f(3*3000, 4), f(3*3000, 1), sc64(3), sc64(3000), sc64(2)}, // rows not held in registers
			{f(5*1024, 4), f(5*1024, 1), sc64(5), sc64(1024), sc64(0)}, // the longest row a warp computes
			{f(3*1500, 4), f(3*1500, 1), sc64(3), sc64(1500), sc64(2)}, // a block per row, held in registers
		}
	case "layernorm":
		return [][]opArg{
			{f(5*777, 3), f(777, 1), f(777, 1), f(5*777, 1), sc64(5), sc64(777), scF(1e-5)},
			{f(3*64, 1e-3), f(64, 1), f(64, 1), f(3*64, 1), sc64(3), sc64(64), scF(0)},
			{f(2*2500, 3), f(2500, 1), f(2500, 1), f(2*2500, 1), sc64(2), sc64(2500), scF(1e-5)},
			{f(3*1024, 3), f(1024, 1), f(1024, 1), f(3*1024, 1), sc64(3), sc64(1024), scF(1e-5)},
			{f(3*1500, 3), f(1500, 1), f(1500, 1), f(3*1500, 1), sc64(3), sc64(1500), scF(1e-5)},
		}
	case "rmsnorm":
		return [][]opArg{
			{f(5*777, 3), f(777, 1), f(5*777, 1), sc64(5), sc64(777), scF(1e-5)},
			{f(3*64, 1e-3), f(64, 1), f(3*64, 1), sc64(3), sc64(64), scF(0)},
			{f(2*2500, 3), f(2500, 1), f(2*2500, 1), sc64(2), sc64(2500), scF(1e-5)},
			{f(3*1024, 3), f(1024, 1), f(3*1024, 1), sc64(3), sc64(1024), scF(1e-5)},
			{f(3*1500, 3), f(1500, 1), f(3*1500, 1), sc64(3), sc64(1500), scF(1e-5)},
		}
	case "transpose":
		return [][]opArg{
			{f(2*3*4*5, 1), f(120, 1), sc64(2), sc64(3), sc64(4), sc64(5), sc64(3), sc64(1), sc64(0), sc64(2)},
			{f(70*33, 1), f(70*33, 1), sc64(1), sc64(1), sc64(70), sc64(33), sc64(0), sc64(1), sc64(3), sc64(2)},
		}
	case "gemm":
		var cs [][]opArg
		for _, g := range []struct {
			m, n, kk, ta, tb, batch int
			alpha, beta             float32
		}{
			{70, 45, 33, 0, 0, 1, 1, 0}, {64, 64, 64, 1, 0, 1, 1.5, 0.5}, {37, 129, 17, 0, 1, 2, -1, 2},
			{100, 3, 200, 1, 1, 3, 0.25, 0}, {1, 1, 1, 0, 0, 1, 1, 1},
		} {
			s := 1.0
			if k.Fast {
				adv = false // the fast tier's bound is relative: finite inputs
			}
			sa, sb, sc := g.m*g.kk+3, g.kk*g.n, g.m*g.n+5
			nA, nB, nC := (g.batch-1)*sa+g.m*g.kk, (g.batch-1)*sb+g.kk*g.n, (g.batch-1)*sc+g.m*g.n
			C := floats(rng, nC, 1, false)
			if g.beta == 0 {
				for i := range C {
					if i%3 == 0 {
						C[i] = float32(math.NaN()) // never read when beta = 0
					}
				}
			}
			cs = append(cs, []opArg{fbuf(dt, floats(rng, nA, s, adv)), fbuf(dt, floats(rng, nB, s, adv)), fbuf(dt, C),
				sc64(uint64(g.m)), sc64(uint64(g.n)), sc64(uint64(g.kk)), sc64(uint64(g.ta)), sc64(uint64(g.tb)),
				scF(g.alpha), scF(g.beta), sc64(uint64(g.batch)), sc64(uint64(sa)), sc64(uint64(sb)), sc64(uint64(sc))})
		}
		return cs
	case "gather":
		return [][]opArg{{f(10*7, 1), ibuf([]int32{0, 9, 3, -1, 10, 100, 5, 5, -2147483648, 2147483647, 1, 2}), f(12*7, 1), sc64(10), sc64(7)}}
	case "conv2d":
		conv := func(n, c, h, w, kk, r, s, groups int, stride, pad, dil [2]uint64, bias bool) []opArg {
			ph := (uint64(h)+2*pad[0]-dil[0]*uint64(r-1)-1)/stride[0] + 1
			pw := (uint64(w)+2*pad[1]-dil[1]*uint64(s-1)-1)/stride[1] + 1
			b := fbuf(dt, nil)
			if bias {
				b = f(kk, 1)
			}
			return []opArg{f(n*c*h*w, 1), f(kk*(c/groups)*r*s, 1), b, f(n*kk*int(ph*pw), 1),
				sc64(uint64(n)), sc64(uint64(c)), sc64(uint64(h)), sc64(uint64(w)), sc64(uint64(kk)), sc64(uint64(r)), sc64(uint64(s)),
				pack2(stride[0], stride[1]), pack2(pad[0], pad[1]), pack2(dil[0], dil[1]), sc64(uint64(groups))}
		}
		return [][]opArg{
			conv(2, 4, 9, 8, 6, 3, 2, 2, [2]uint64{2, 1}, [2]uint64{1, 2}, [2]uint64{1, 2}, true),
			conv(1, 3, 5, 5, 2, 3, 3, 1, [2]uint64{1, 1}, [2]uint64{0, 0}, [2]uint64{1, 1}, false),
			conv(1, 2, 4, 4, 2, 2, 2, 2, [2]uint64{3, 3}, [2]uint64{2, 2}, [2]uint64{1, 1}, true),
		}
	case "maxpool2d", "avgpool2d":
		pool := func(n, c, h, w, r, s int, stride, pad [2]uint64) []opArg {
			ph := (uint64(h)+2*pad[0]-uint64(r))/stride[0] + 1
			pw := (uint64(w)+2*pad[1]-uint64(s))/stride[1] + 1
			return []opArg{f(n*c*h*w, 1), f(n*c*int(ph*pw), 1), sc64(uint64(n)), sc64(uint64(c)), sc64(uint64(h)), sc64(uint64(w)),
				sc64(uint64(r)), sc64(uint64(s)), pack2(stride[0], stride[1]), pack2(pad[0], pad[1])}
		}
		return [][]opArg{
			pool(2, 3, 7, 6, 3, 2, [2]uint64{2, 2}, [2]uint64{1, 1}),
			pool(1, 2, 2, 2, 3, 3, [2]uint64{1, 1}, [2]uint64{2, 2}), // windows entirely in the padding
		}
	case "cast":
		var cs [][]opArg
		for from := ops.DType(0); from < 4; from++ {
			for to := ops.DType(0); to < 4; to++ {
				var x opArg
				if from == ops.I32 {
					v := make([]int32, 600)
					for i := range v {
						v[i] = int32(rng.Uint32()) >> uint(rng.Intn(31))
					}
					v[0], v[1], v[2] = math.MaxInt32, math.MinInt32, 16777217
					x = ibuf(v)
				} else {
					x = fbuf(from, append(floats(rng, 600, 1e4, true), 3e9, -3e9, 2.5, -2.5, 2147483520, 65520, 65519, 1e-7))
				}
				n := len(x.data) / from.Size()
				cs = append(cs, []opArg{x, {buf: true, dt: to, data: make([]byte, n*to.Size())}, sc64(uint64(from)), sc64(uint64(to))})
			}
		}
		return cs
	}
	// The unary ops.
	x := floats(rng, 2000, 3, adv)
	x = append(x, specials...)
	if k.Op == "log" || k.Op == "sqrt" || k.Op == "rsqrt" {
		for i := range x[:1000] {
			x[i] = float32(math.Abs(float64(x[i])))
		}
	}
	return [][]opArg{{fbuf(dt, x), f(len(x), 1)}}
}

// TestGPUOps runs every program of the op library on the GPU, on random
// and adversarial inputs, and compares each output with the library's
// reference (hw/internal/ops, the simulator's arithmetic): bit for bit for
// the exact tier, within OpBounds / SoftmaxBound for the bounded ops, and
// within FastGemmBound of float64 for the fast tier.
func TestGPUOps(t *testing.T) {
	p := requireGPU(t)
	dev := p.Devices()[0]
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if v, err := p.BLAS(); err != nil {
		t.Logf("cuBLAS: %v (the fast tier runs the exact kernels)", err)
	} else {
		t.Logf("cuBLAS version %d", v)
	}
	rng := rand.New(rand.NewSource(1))
	for _, k := range ops.Kernels() {
		t.Run(k.Name, func(t *testing.T) {
			worst := 0.0
			for ci, c := range append(opCases(k, rng, false), opCases(k, rng, true)...) {
				w := runOpCase(t, dev, s, k, c, ci)
				worst = max(worst, w)
			}
			if k.Info().Tier != ops.TierExact {
				t.Logf("%s: worst error %.3g of the bound", k.Name, worst)
			}
		})
	}
}

// runOpCase runs one case on the GPU and on the reference, and compares.
// It returns the worst error as a fraction of the bound (bounded and fast
// tiers).
func runOpCase(t *testing.T, dev hw.Device, s hw.Stream, k *ops.Kernel, c []opArg, ci int) float64 {
	t.Helper()
	ctx := testCtx(t)
	info := k.Info()
	args := make([]hw.Arg, len(c))
	oargs := make([]ops.Arg, len(c))
	mem := make([][]byte, len(c))
	bufs := make([]hw.Buffer, len(c))
	for i, a := range c {
		if !a.buf {
			args[i] = hw.Uint(a.val)
			oargs[i] = ops.Arg{Value: a.val}
			continue
		}
		b, err := dev.Alloc(max(len(a.data), 4), 0, nil)
		if err != nil {
			t.Fatalf("Alloc: %v", err)
		}
		defer b.Free()
		bufs[i] = b
		if len(a.data) > 0 {
			if _, err := s.Write(b, 0, a.data); err != nil {
				t.Fatal(err)
			}
		}
		args[i] = hw.BufferArg(b, 0, len(a.data))
		oargs[i] = ops.Arg{Buffer: true, Addr: uint64(i+1) << 32, Len: uint64(len(a.data))}
		mem[i] = append([]byte(nil), a.data...)
	}
	prog, err := dev.Prepare(k.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(&hw.Command{Program: prog, Args: args}); err != nil {
		t.Fatalf("case %d: Submit: %v", ci, err)
	}
	if err := k.Run(oargs, mem); err != nil {
		t.Fatalf("case %d: reference: %v", ci, err)
	}
	worst := 0.0
	for i, ai := range info.Args {
		if ai.Kind != "buffer" || ai.Dir == "in" {
			continue
		}
		got := make([]byte, len(c[i].data))
		if len(got) == 0 {
			continue
		}
		cp, err := s.Read(bufs[i], 0, got)
		if err != nil {
			t.Fatal(err)
		}
		if err := cp.Wait(ctx); err != nil {
			t.Fatalf("case %d: %v", ci, err)
		}
		dt := c[i].dt
		n := len(got) / dt.Size()
		bad := 0
		for j := range n {
			g, w := decode(dt, got, j), decode(dt, mem[i], j)
			ok, frac := compareOp(k, c, dt, g, w, j)
			worst = max(worst, frac)
			if !ok {
				if bad < 5 {
					t.Errorf("case %d: %s[%d] = %v (%#x), reference %v (%#x), input %s", ci, ai.Name, j, g, rawBits(dt, got, j), w, rawBits(dt, mem[i], j), inputAt(k, c, j))
				}
				bad++
			}
		}
		if bad > 5 {
			t.Errorf("case %d: %s: %d of %d values differ", ci, ai.Name, bad, n)
		}
	}
	return worst
}

func rawBits(dt ops.DType, b []byte, i int) uint32 {
	if dt.Size() == 2 {
		return uint32(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return binary.LittleEndian.Uint32(b[4*i:])
}

// inputAt names the input of an elementwise op at j (for messages).
func inputAt(k *ops.Kernel, c []opArg, j int) string {
	if c[0].buf && j < len(c[0].data)/c[0].dt.Size() {
		return fmt.Sprint(decode(c[0].dt, c[0].data, j))
	}
	return "-"
}

// ulpOf is the spacing of dt at |v| (the subnormal spacing below the
// normal range).
func ulpOf(dt ops.DType, v float64) float64 {
	a := math.Abs(v)
	mant, minExp := 24, -126
	switch dt {
	case ops.F16:
		mant, minExp = 11, -14
	case ops.BF16:
		mant = 8
	}
	e := minExp
	if a >= math.Ldexp(1, minExp) {
		_, ex := math.Frexp(a)
		e = ex - 1
	}
	return math.Ldexp(1, e-mant+1)
}

// compareOp checks one output value g against the reference w; it
// returns whether it passes and, for bounded tiers, the error as a
// fraction of the bound.
func compareOp(k *ops.Kernel, c []opArg, dt ops.DType, g, w float64, j int) (bool, float64) {
	if math.IsNaN(w) || math.IsNaN(g) {
		return math.IsNaN(w) && math.IsNaN(g), 0
	}
	tier := k.Info().Tier
	if tier == ops.TierExact {
		return math.Float64bits(g) == math.Float64bits(w), 0
	}
	if math.IsInf(w, 0) || math.IsInf(g, 0) {
		return g == w, 0
	}
	var bound float64
	switch {
	case tier == ops.TierFast:
		bound = fastBound(k, c, dt, j, w)
	case k.Op == "softmax" || k.Op == "log_softmax":
		cols := int(c[3].val)
		b := SoftmaxBound(k.Op, cols)
		bound = boundFor(dt, b, w)
	default:
		bound = boundFor(dt, OpBounds[k.Op], w)
	}
	d := math.Abs(g - w)
	if bound == 0 {
		return d == 0, 0
	}
	return d <= bound, d / bound
}

// boundFor turns a Bound into an absolute error allowance at reference w:
// for float32 the bound plus the reference's own rounding (1 ulp); for a
// half type 1 ulp of it plus Abs.
func boundFor(dt ops.DType, b Bound, w float64) float64 {
	if dt != ops.F32 {
		return ulpOf(dt, w) + b.Abs
	}
	return (b.ULPs+1)*ulpOf(dt, w) + b.Abs
}

// fastBound is the fast tier's allowance at output j of a gemm case:
// FastGemmBound(K) times alpha·Σ|a·b| + |beta·c|, plus the storage
// rounding, plus the exact reference's own error (the same form).
func fastBound(k *ops.Kernel, c []opArg, dt ops.DType, j int, w float64) float64 {
	if k.Op != "gemm" {
		return ulpOf(dt, w) // conv2d.fast is the exact kernel
	}
	m, n, kk := int(c[3].val), int(c[4].val), int(c[5].val)
	ta, tb := c[6].val != 0, c[7].val != 0
	alpha := float64(math.Float32frombits(uint32(c[8].val)))
	beta := float64(math.Float32frombits(uint32(c[9].val)))
	sa, sb, scc := int(c[11].val), int(c[12].val), int(c[13].val)
	b := j / scc
	r := j % scc
	if r >= m*n {
		return 0 // between the batch's matrices: untouched
	}
	i, jj := r/n, r%n
	mag := 0.0
	for q := range kk {
		ai := b*sa + i*kk + q
		if ta {
			ai = b*sa + q*m + i
		}
		bi := b*sb + q*n + jj
		if tb {
			bi = b*sb + jj*kk + q
		}
		mag += math.Abs(decode(dt, c[0].data, ai) * decode(dt, c[1].data, bi))
	}
	mag = math.Abs(alpha) * mag
	if beta != 0 {
		mag += math.Abs(beta * decode(dt, c[2].data, j))
	}
	return 2*FastGemmBound(kk)*mag + 2*ulpOf(dt, w) + math.SmallestNonzeroFloat32
}

// BenchmarkGPUOps measures the memory-bound ops on 256 MiB float32
// tensors (rows of 1024) and gemm at 4096³ in both tiers; MB/s counts the
// tensor read once and written once, as a device-to-device copy would
// (bench/cuda/gemm_cublas.c prints that copy's bandwidth).
func BenchmarkGPUOps(b *testing.B) {
	p := requireGPU(b)
	dev := p.Devices()[0]
	s, err := dev.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(context.Background())
	ctx := context.Background()
	alloc := func(n int) hw.Buffer {
		buf, err := dev.Alloc(n, 0, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { buf.Free() })
		return buf
	}
	const vals, cols = 64 << 20, 1024
	x, x2, y, g, bt := alloc(4*vals), alloc(4*vals), alloc(4*vals), alloc(4*cols), alloc(4*cols)
	u := func(v uint64) hw.Arg { return hw.Uint(v) }
	X, Y := hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1)
	const gn = 4096
	ga, gb, gc := alloc(4*gn*gn), alloc(4*gn*gn), alloc(4*gn*gn)
	gemmArgs := func(es int) []hw.Arg {
		return []hw.Arg{hw.BufferArg(ga, 0, es*gn*gn), hw.BufferArg(gb, 0, es*gn*gn), hw.BufferArg(gc, 0, es*gn*gn),
			u(gn), u(gn), u(gn), u(0), u(0), hw.Float32(1), hw.Float32(0), u(1), u(0), u(0), u(0)}
	}
	for _, c := range []struct {
		prog  string
		args  []hw.Arg
		bytes int64
		flops float64
	}{
		{"softmax", []hw.Arg{X, Y, u(vals / cols), u(cols), u(0)}, 8 * vals, 0},
		{"log_softmax", []hw.Arg{X, Y, u(vals / cols), u(cols), u(0)}, 8 * vals, 0},
		{"layernorm", []hw.Arg{X, hw.BufferArg(g, 0, -1), hw.BufferArg(bt, 0, -1), Y, u(vals / cols), u(cols), hw.Float32(1e-5)}, 8 * vals, 0},
		{"rmsnorm", []hw.Arg{X, hw.BufferArg(g, 0, -1), Y, u(vals / cols), u(cols), hw.Float32(1e-5)}, 8 * vals, 0},
		{"add", []hw.Arg{X, hw.BufferArg(x2, 0, -1), Y, u(1), u(1), u(vals / cols), u(cols), u(1), u(1), u(vals / cols), u(cols)}, 12 * vals, 0},
		{"gemm.fast", gemmArgs(4), 0, 2 * gn * gn * gn},
		{"gemm.bf16.fast", gemmArgs(2), 0, 2 * gn * gn * gn},
		{"gemm", gemmArgs(4), 0, 2 * gn * gn * gn},
	} {
		b.Run(c.prog, func(b *testing.B) {
			prog, err := dev.Prepare(c.prog)
			if err != nil {
				b.Fatal(err)
			}
			cmd := &hw.Command{Program: prog, Args: c.args}
			if _, err := s.Submit(cmd); err != nil {
				b.Fatal(err)
			}
			if err := s.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(c.bytes)
			b.ResetTimer()
			for range b.N {
				if _, err := s.Submit(cmd); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			if c.flops > 0 {
				b.ReportMetric(c.flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			}
		})
	}
}

// TestGPUFastGemmStreams runs gemm.fast and gemm.bf16.fast on 4 streams
// at once, 8 times each, from 4 goroutines (one cuBLAS handle, a
// workspace per stream): every result equals the one computed alone.
func TestGPUFastGemmStreams(t *testing.T) {
	p := requireGPU(t)
	dev := p.Devices()[0]
	ctx := testCtx(t)
	rng := rand.New(rand.NewSource(3))
	const n = 384
	for _, name := range []string{"gemm.fast", "gemm.bf16.fast"} {
		dt := ops.F32
		if name == "gemm.bf16.fast" {
			dt = ops.BF16
		}
		prog, err := dev.Prepare(name)
		if err != nil {
			t.Fatal(err)
		}
		a, b := encode(dt, floats(rng, n*n, 1, false)), encode(dt, floats(rng, n*n, 1, false))
		run := func(s hw.Stream, reps int) ([]byte, error) {
			var bufs [3]hw.Buffer
			for i := range bufs {
				buf, err := dev.Alloc(len(a), 0, nil)
				if err != nil {
					return nil, err
				}
				defer buf.Free()
				bufs[i] = buf
			}
			s.Write(bufs[0], 0, a)
			s.Write(bufs[1], 0, b)
			u := func(v uint64) hw.Arg { return hw.Uint(v) }
			for range reps {
				if _, err := s.Submit(&hw.Command{Program: prog, Args: []hw.Arg{
					hw.BufferArg(bufs[0], 0, -1), hw.BufferArg(bufs[1], 0, -1), hw.BufferArg(bufs[2], 0, -1),
					u(n), u(n), u(n), u(0), u(0), hw.Float32(1), hw.Float32(0), u(1), u(0), u(0), u(0)}}); err != nil {
					return nil, err
				}
			}
			out := make([]byte, len(a))
			c, err := s.Read(bufs[2], 0, out)
			if err != nil {
				return nil, err
			}
			return out, c.Wait(ctx)
		}
		streams := make([]hw.Stream, 4)
		for i := range streams {
			if streams[i], err = dev.NewStream(); err != nil {
				t.Fatal(err)
			}
			defer streams[i].Close(context.Background())
		}
		want, err := run(streams[0], 1)
		if err != nil {
			t.Fatal(err)
		}
		type res struct {
			out []byte
			err error
		}
		results := make(chan res, len(streams))
		for _, s := range streams {
			go func() {
				out, err := run(s, 8)
				results <- res{out, err}
			}()
		}
		for range streams {
			r := <-results
			if r.err != nil {
				t.Fatal(r.err)
			}
			if string(r.out) != string(want) {
				t.Errorf("%s: a result computed on 4 streams at once differs from the one computed alone", name)
			}
		}
	}
}

// TestGPUOpsInPlace: an op whose output is exactly its input's range (the
// contract allows it for elementwise ops, softmax, the norms, a binary op's
// unbroadcast operand and a cast between equal sizes) writes the same
// bytes as into a separate buffer.
func TestGPUOpsInPlace(t *testing.T) {
	p := requireGPU(t)
	dev := p.Devices()[0]
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	ctx := testCtx(t)
	rng := rand.New(rand.NewSource(5))
	for _, c := range []struct {
		prog        string
		cs, in, out int // case of opCases, input and output argument
	}{
		{"exp", 0, 0, 1}, {"neg.bf16", 0, 0, 1}, {"gelu_erf.f16", 0, 0, 1}, {"affine", 0, 0, 1},
		{"softmax", 0, 0, 1}, {"softmax", 5, 0, 1}, {"log_softmax.f16", 0, 0, 1},
		{"layernorm", 0, 0, 3}, {"layernorm", 2, 0, 3}, {"rmsnorm.bf16", 0, 0, 2},
		{"add.bf16", 1, 0, 2}, {"mul", 1, 1, 2}, {"cast", 3, 0, 1},
	} {
		k, ok := ops.Lookup(c.prog)
		if !ok {
			t.Fatalf("no program %s", c.prog)
		}
		args := opCases(k, rng, true)[c.cs]
		prog, err := dev.Prepare(c.prog)
		if err != nil {
			t.Fatal(err)
		}
		var outs [2][]byte
		for mode := range 2 {
			hargs := make([]hw.Arg, len(args))
			var outBuf hw.Buffer
			for i, a := range args {
				if !a.buf {
					hargs[i] = hw.Uint(a.val)
					continue
				}
				if mode == 1 && i == c.out {
					continue // the input's range, below
				}
				b, err := dev.Alloc(max(len(a.data), 4), 0, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer b.Free()
				if len(a.data) > 0 {
					s.Write(b, 0, a.data)
				}
				hargs[i] = hw.BufferArg(b, 0, len(a.data))
				if i == c.out || (mode == 1 && i == c.in) {
					outBuf = b
				}
			}
			if mode == 1 {
				hargs[c.out] = hargs[c.in]
			}
			if _, err := s.Submit(&hw.Command{Program: prog, Args: hargs}); err != nil {
				t.Fatalf("%s (in place: %v): %v", c.prog, mode == 1, err)
			}
			outs[mode] = make([]byte, len(args[c.out].data))
			rc, err := s.Read(outBuf, 0, outs[mode])
			if err != nil {
				t.Fatal(err)
			}
			if err := rc.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if string(outs[0]) != string(outs[1]) {
			t.Errorf("%s (case %d): in place differs from out of place", c.prog, c.cs)
		}
	}
}

// TestGPUSoftmaxVectorMatchesScalar: float32 rows of a multiple of 4
// columns at 16-byte aligned addresses take the float4 path
// (softmax_warp4), others the scalar one (softmax_warp); both keep the
// contract's lane partials and tree, so the same rows give the same bits
// either way (here: the same values at offset 0 and at offset 4 bytes).
func TestGPUSoftmaxVectorMatchesScalar(t *testing.T) {
	p := requireGPU(t)
	dev := p.Devices()[0]
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	ctx := testCtx(t)
	rng := rand.New(rand.NewSource(9))
	for _, op := range []string{"softmax", "log_softmax"} {
		prog, err := dev.Prepare(op)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ rows, cols, causal int }{
			{64, 1024, 0}, {16, 1000, 3}, {64, 128, 128}, {9, 300, 0}, {40, 40, 0}, {7, 4, 2},
		} {
			n := c.rows * c.cols
			data := encode(ops.F32, floats(rng, n, 8, false))
			var outs [2][]byte
			for i, off := range []int{0, 4} {
				x, err := dev.Alloc(4*n+16, 0, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer x.Free()
				y, err := dev.Alloc(4*n+16, 0, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer y.Free()
				if _, err := s.Write(x, off, data); err != nil {
					t.Fatal(err)
				}
				args := []hw.Arg{hw.BufferArg(x, off, 4*n), hw.BufferArg(y, off, 4*n), hw.Uint(uint64(c.rows)), hw.Uint(uint64(c.cols)), hw.Uint(uint64(c.causal))}
				if _, err := s.Submit(&hw.Command{Program: prog, Args: args}); err != nil {
					t.Fatal(err)
				}
				outs[i] = make([]byte, 4*n)
				if _, err := s.Read(y, off, outs[i]); err != nil {
					t.Fatal(err)
				}
				if err := s.Sync(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for j := 0; j < n; j++ {
				a, b := binary.LittleEndian.Uint32(outs[0][4*j:]), binary.LittleEndian.Uint32(outs[1][4*j:])
				if a != b {
					t.Errorf("%s rows %d cols %d causal %d: value %d (row %d col %d) is %#08x aligned, %#08x at offset 4", op, c.rows, c.cols, c.causal, j, j/c.cols, j%c.cols, a, b)
					break
				}
			}
		}
	}
}
