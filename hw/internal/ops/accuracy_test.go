package ops

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// Every op against an independent float64 reference, on random and
// adversarial inputs, at every storage type it has.

var dtypes = []DType{F32, F16, BF16}

func sigmoidRef(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// unaryRef is the float64 definition of each unary op.
var unaryRef = map[string]func(float64) float64{
	"exp":     math.Exp,
	"log":     math.Log,
	"tanh":    math.Tanh,
	"sigmoid": sigmoidRef,
	"gelu_tanh": func(x float64) float64 {
		u := math.Sqrt(2/math.Pi) * (x + 0.044715*x*x*x)
		if x > -3 {
			return 0.5 * x * (1 + math.Tanh(u))
		}
		e := math.Exp(2 * u) // 1 + tanh u = 2e^(2u)/(1+e^(2u)), without cancellation
		return x * e / (1 + e)
	},
	"gelu_erf": func(x float64) float64 {
		if x > -3 {
			return 0.5 * x * (1 + math.Erf(x/math.Sqrt2))
		}
		return 0.5 * x * math.Erfc(-x/math.Sqrt2)
	},
	"silu":  func(x float64) float64 { return x / (1 + math.Exp(-x)) },
	"rsqrt": func(x float64) float64 { return 1 / math.Sqrt(x) },
	"sqrt":  math.Sqrt,
	"neg":   func(x float64) float64 { return -x },
	"abs":   math.Abs,
}

func TestUnaryAgainstFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for name, ref := range unaryRef {
		for _, dt := range dtypes {
			x := append(append([]float32(nil), adversarial...), randVals(r, 300, 12)...)
			x = roundTo(dt, x)
			pname := progName(name, dt)
			y := f32v(run(t, pname, tv(dt, x), zeros(len(x)*dt.Size()))[1], dt)
			for i, v := range x {
				want := ref(float64(v))
				if math.IsInf(float64(v), -1) && (name == "gelu_tanh" || name == "gelu_erf" || name == "silu") {
					want = math.Copysign(0, -1) // the limit
				}
				got := y[i]
				switch name {
				case "sqrt", "neg", "abs":
					// Exact: correctly rounded to float32, then to storage.
					w := roundTo(dt, []float32{float32(want)})[0]
					if !same32(got, w) {
						t.Errorf("%s(%g) = %g, want %g exactly", pname, v, got, w)
					}
				default:
					// Bounded: 1 ulp of float32, plus the storage rounding.
					tol := ulp(want)
					if name == "rsqrt" {
						tol = 2 * ulp(want) // two rounded steps, pinned exactly below
					}
					if dt != F32 {
						tol = storageUlp(dt, want)
					}
					if !near(dt, got, want, tol) {
						t.Errorf("%s(%g) = %g, want %g within %g", pname, v, got, want, tol)
					}
				}
				if name == "rsqrt" {
					w := roundTo(dt, []float32{1 / float32(math.Sqrt(float64(v)))})[0]
					if !same32(got, w) {
						t.Errorf("%s(%g) = %g, want 1/sqrt in two float32 steps = %g", pname, v, got, w)
					}
				}
			}
		}
	}
}

func progName(op string, dt DType) string {
	if dt == F32 {
		return op
	}
	return op + "." + dt.String()
}

func TestAffineAgainstFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, dt := range dtypes {
		x := roundTo(dt, append(append([]float32(nil), adversarial...), randVals(r, 200, 10)...))
		a, b := float32(0.3), float32(-1.7)
		y := f32v(run(t, progName("affine", dt), tv(dt, x), zeros(len(x)*dt.Size()), scF(a), scF(b))[1], dt)
		for i, v := range x {
			// Never fused: the product rounded to float32 first.
			w := roundTo(dt, []float32{float32(float64(float32(float64(a)*float64(v))) + float64(b))})[0]
			if !same32(y[i], w) {
				t.Errorf("affine.%s(%g) = %g, want %g", dt, v, y[i], w)
			}
		}
	}
}

var binaryRef = map[string]func(a, b float64) float64{
	"add": func(a, b float64) float64 { return a + b },
	"sub": func(a, b float64) float64 { return a - b },
	"mul": func(a, b float64) float64 { return a * b },
	"div": func(a, b float64) float64 { return a / b },
	"max": nanFirst(math.Max), // math.Max(+Inf, NaN) is +Inf; the op's is NaN
	"min": nanFirst(math.Min),
}

func nanFirst(f func(a, b float64) float64) func(a, b float64) float64 {
	return func(a, b float64) float64 {
		if a != a || b != b {
			return math.NaN()
		}
		return f(a, b)
	}
}

func TestBinaryBroadcastAgainstFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	shapes := [][2][4]uint64{
		{{1, 1, 1, 7}, {1, 1, 1, 7}},
		{{1, 1, 3, 5}, {1, 1, 1, 5}},
		{{1, 1, 3, 1}, {1, 1, 1, 4}},
		{{2, 1, 3, 4}, {1, 5, 1, 4}},
		{{1, 1, 1, 1}, {2, 3, 2, 3}},
		{{1, 1, 6, 7}, {1, 1, 6, 7}},
	}
	for name, ref := range binaryRef {
		for _, dt := range dtypes {
			for _, sh := range shapes {
				as, bs := sh[0], sh[1]
				na, nb := prod(as), prod(bs)
				a := roundTo(dt, pick(r, na))
				b := roundTo(dt, pick(r, nb))
				var cs [4]uint64
				for i := range cs {
					cs[i] = max(as[i], bs[i])
				}
				nc := prod(cs)
				args := []spec{tv(dt, a), tv(dt, b), zeros(int(nc) * dt.Size())}
				for _, d := range as {
					args = append(args, sc(d))
				}
				for _, d := range bs {
					args = append(args, sc(d))
				}
				c := f32v(run(t, progName(name, dt), args...)[2], dt)
				for i := range nc {
					co := unravel(i, cs)
					ia, ib := ravel(co, as), ravel(co, bs)
					w := roundTo(dt, []float32{float32(ref(float64(a[ia]), float64(b[ib])))})[0]
					if !same32(c[i], w) {
						t.Errorf("%s.%s %v %v at %v: %g op %g = %g, want %g", name, dt, as, bs, co, a[ia], b[ib], c[i], w)
					}
				}
			}
		}
	}
}

// pick returns n values, adversarial ones first.
func pick(r *rand.Rand, n uint64) []float32 {
	v := randVals(r, int(n), 50)
	for i := range v {
		if r.IntN(4) == 0 {
			v[i] = adversarial[r.IntN(len(adversarial))]
		}
	}
	return v
}

func prod(s [4]uint64) uint64 { return s[0] * s[1] * s[2] * s[3] }

func unravel(i uint64, s [4]uint64) [4]uint64 {
	var c [4]uint64
	for d := 3; d >= 0; d-- {
		c[d] = i % s[d]
		i /= s[d]
	}
	return c
}

// ravel maps coordinates onto a (possibly broadcast) shape.
func ravel(c, s [4]uint64) uint64 {
	var i uint64
	for d := range 4 {
		x := c[d]
		if s[d] == 1 {
			x = 0
		}
		i = i*s[d] + x
	}
	return i
}

func TestMaxMinSignedZeroAndNaN(t *testing.T) {
	nz := float32(math.Copysign(0, -1))
	nan := float32(math.NaN())
	cases := []struct {
		op      string
		a, b, c float32
	}{
		{"max", nz, 0, 0}, {"max", 0, nz, 0}, {"min", nz, 0, nz}, {"min", 0, nz, nz},
		{"max", nan, 1, nan}, {"max", 1, nan, nan}, {"min", nan, 1, nan}, {"min", 1, nan, nan},
	}
	for _, c := range cases {
		out := f32v(run(t, c.op, tv(F32, []float32{c.a}), tv(F32, []float32{c.b}), zeros(4),
			sc(1), sc(1), sc(1), sc(1), sc(1), sc(1), sc(1), sc(1))[2], F32)
		if !same32(out[0], c.c) {
			t.Errorf("%s(%g, %g) = %g, want %g", c.op, c.a, c.b, out[0], c.c)
		}
	}
}

// treeRef is the fixed reduction order written out independently: lane
// sums into a slice, then the halving tree.
func treeRef(x []float32, combine func(a, b float32) float32, identity float32) float32 {
	lanes := make([]float32, Lanes)
	for t := range lanes {
		lanes[t] = identity
	}
	for j, v := range x {
		lanes[j%Lanes] = combine(lanes[j%Lanes], v)
	}
	for width := Lanes; width > 1; width /= 2 {
		for t := 0; t < width/2; t++ {
			lanes[t] = combine(lanes[t], lanes[t+width/2])
		}
	}
	return lanes[0]
}

func TestReductionsAgainstFloat64AndTheFixedOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	add := func(a, b float32) float32 { return a + b }
	for _, dt := range dtypes {
		for _, sh := range [][3]int{{1, 1, 1}, {2, 5, 3}, {1, 257, 1}, {3, 1000, 2}, {1, 4096, 1}, {2, 513, 1}} {
			outer, n, inner := sh[0], sh[1], sh[2]
			x := roundTo(dt, randVals(r, outer*n*inner, 100))
			if n > 300 {
				x[7] = 3e4 // a large value makes the order visible in the low bits
				x = roundTo(dt, x)
			}
			for _, op := range []string{"reduce_sum", "reduce_mean", "reduce_max", "reduce_argmax"} {
				ysize := outer * inner * dt.Size()
				if op == "reduce_argmax" {
					ysize = outer * inner * 4
				}
				mem := run(t, progName(op, dt), tv(dt, x), zeros(ysize), sc(uint64(outer)), sc(uint64(n)), sc(uint64(inner)))
				for o := range outer {
					for i := range inner {
						line := make([]float32, n)
						var sum, abs, mx float64 = 0, 0, math.Inf(-1)
						arg := 0
						for j := range n {
							v := x[(o*n+j)*inner+i]
							line[j] = v
							sum += float64(v)
							abs += math.Abs(float64(v))
							if float64(v) > mx {
								mx, arg = float64(v), j
							}
						}
						k := o*inner + i
						switch op {
						case "reduce_argmax":
							if got := int(binary.LittleEndian.Uint32(mem[1][4*k:])); got != arg {
								t.Errorf("%s %v: argmax %d, want %d", dt, sh, got, arg)
							}
							continue
						case "reduce_max":
							if got := f32v(mem[1], dt)[k]; float64(got) != mx {
								t.Errorf("%s %v: max %g, want %g", dt, sh, got, mx)
							}
							continue
						}
						got := f32v(mem[1], dt)[k]
						want, exact := sum, treeRef(line, add, 0)
						if op == "reduce_mean" {
							want /= float64(n)
							exact /= float32(n)
							abs /= float64(n)
						}
						exact = roundTo(dt, []float32{exact})[0]
						if !same32(got, exact) {
							t.Errorf("%s.%s %v: %g, the fixed order gives %g", op, dt, sh, got, exact)
						}
						tol := float64(n+2)*math.Ldexp(abs, -24) + storageUlp(dt, want)
						if !near(dt, got, want, tol) {
							t.Errorf("%s.%s %v: %g, float64 %g (tolerance %g)", op, dt, sh, got, want, tol)
						}
					}
				}
			}
		}
	}
}

func TestReduceArgmaxAndMaxSpecialValues(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	cases := []struct {
		x      []float32
		arg    uint32
		maxNaN bool
	}{
		{[]float32{nan, 1, 3, 3}, 2, true},
		{[]float32{nan, nan}, 0, true},
		{[]float32{-inf, -inf}, 0, false},
		{[]float32{1, inf, nan, inf}, 1, true},
		{[]float32{2, 2, 2}, 0, false},
	}
	for _, c := range cases {
		n := uint64(len(c.x))
		m := run(t, "reduce_argmax", tv(F32, c.x), zeros(4), sc(1), sc(n), sc(1))
		if got := binary.LittleEndian.Uint32(m[1]); got != c.arg {
			t.Errorf("argmax %v = %d, want %d", c.x, got, c.arg)
		}
		m = run(t, "reduce_max", tv(F32, c.x), zeros(4), sc(1), sc(n), sc(1))
		if got := f32v(m[1], F32)[0]; (got != got) != c.maxNaN {
			t.Errorf("max %v = %g, NaN expected: %v", c.x, got, c.maxNaN)
		}
	}
}

func softmaxRef(row []float32, live int, logs bool) []float64 {
	out := make([]float64, len(row))
	m := math.Inf(-1)
	for _, v := range row[:live] {
		m = math.Max(m, float64(v))
	}
	var s float64
	for _, v := range row[:live] {
		s += math.Exp(float64(v) - m)
	}
	for j := range row {
		switch {
		case j >= live && logs:
			out[j] = math.Inf(-1)
		case j >= live:
			out[j] = 0
		case logs:
			out[j] = float64(row[j]) - m - math.Log(s)
		default:
			out[j] = math.Exp(float64(row[j])-m) / s
		}
	}
	return out
}

func TestSoftmaxAgainstFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	inf := float32(math.Inf(1))
	for _, op := range []string{"softmax", "log_softmax"} {
		for _, dt := range dtypes {
			for _, c := range []struct{ rows, cols, causal int }{{3, 7, 0}, {4, 300, 0}, {8, 8, 8}, {6, 10, 3}, {2, 1, 1}, {5, 600, 5}} {
				x := roundTo(dt, randVals(r, c.rows*c.cols, 20))
				// A huge row, a row with -Inf, a row of tiny values.
				x[0] = 3e38
				if c.cols > 2 {
					x[c.cols+1] = -inf
					for j := range c.cols {
						if c.rows > 2 {
							x[2*c.cols+j] = 1e-40
						}
					}
				}
				x = roundTo(dt, x)
				y := f32v(run(t, progName(op, dt), tv(dt, x), zeros(len(x)*dt.Size()), sc(uint64(c.rows)), sc(uint64(c.cols)), sc(uint64(c.causal)))[1], dt)
				for row := range c.rows {
					live := c.cols
					if c.causal > 0 {
						live = row%c.causal + c.cols - c.causal + 1
					}
					want := softmaxRef(x[row*c.cols:(row+1)*c.cols], live, op == "log_softmax")
					for j, w := range want {
						got := y[row*c.cols+j]
						tol := ulp(w) // the stated bound on sim and emu
						if dt != F32 {
							tol = storageUlp(dt, w) + ulp(w)
						}
						if j >= live {
							tol = 0
						}
						if !near(dt, got, w, tol) {
							t.Errorf("%s.%s %+v row %d col %d: %g, want %g (tolerance %g)", op, dt, c, row, j, got, w, tol)
						}
					}
				}
			}
		}
	}
	// Every unmasked value -Inf: NaN (documented); masked stay 0.
	ninf := float32(math.Inf(-1))
	y := f32v(run(t, "softmax", tv(F32, []float32{ninf, ninf, 5}), zeros(12), sc(1), sc(3), sc(3))[1], F32)
	if y[0] == y[0] || y[1] != 0 || y[2] != 0 {
		t.Errorf("softmax of an all -Inf causal row = %v, want [NaN 0 0]", y)
	}
}

func TestNormsAgainstFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, dt := range dtypes {
		for _, c := range []struct{ rows, cols int }{{1, 1}, {3, 16}, {2, 300}, {4, 1024}} {
			x := roundTo(dt, randVals(r, c.rows*c.cols, 4))
			for i := range x {
				x[i] += 2 // a mean away from 0
			}
			x = roundTo(dt, x)
			g := roundTo(dt, randVals(r, c.cols, 2))
			b := roundTo(dt, randVals(r, c.cols, 1))
			eps := float32(1e-5)
			ln := f32v(run(t, progName("layernorm", dt), tv(dt, x), tv(dt, g), tv(dt, b), zeros(len(x)*dt.Size()),
				sc(uint64(c.rows)), sc(uint64(c.cols)), scF(eps))[3], dt)
			rms := f32v(run(t, progName("rmsnorm", dt), tv(dt, x), tv(dt, g), zeros(len(x)*dt.Size()),
				sc(uint64(c.rows)), sc(uint64(c.cols)), scF(eps))[2], dt)
			for row := range c.rows {
				xs := x[row*c.cols : (row+1)*c.cols]
				var mean, ms float64
				for _, v := range xs {
					mean += float64(v)
					ms += float64(v) * float64(v)
				}
				mean /= float64(c.cols)
				ms /= float64(c.cols)
				var variance float64
				for _, v := range xs {
					variance += (float64(v) - mean) * (float64(v) - mean)
				}
				variance /= float64(c.cols)
				for j, v := range xs {
					nl := (float64(v) - mean) / math.Sqrt(variance+float64(eps))
					wl := nl*float64(g[j]) + float64(b[j])
					nr := float64(v) / math.Sqrt(ms+float64(eps))
					wr := nr * float64(g[j])
					tl := float64(c.cols+16)*math.Ldexp(math.Abs(nl*float64(g[j]))+math.Abs(float64(b[j]))+1, -23) + storageUlp(dt, wl)
					tr := float64(c.cols+16)*math.Ldexp(math.Abs(wr)+1e-3, -23) + storageUlp(dt, wr)
					if got := ln[row*c.cols+j]; !near(dt, got, wl, tl) {
						t.Errorf("layernorm.%s %+v [%d][%d] = %g, want %g (tolerance %g)", dt, c, row, j, got, wl, tl)
					}
					if got := rms[row*c.cols+j]; !near(dt, got, wr, tr) {
						t.Errorf("rmsnorm.%s %+v [%d][%d] = %g, want %g (tolerance %g)", dt, c, row, j, got, wr, tr)
					}
				}
			}
		}
	}
}

func TestTransposeAgainstIndexing(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, dt := range dtypes {
		for _, c := range []struct{ d, p [4]uint64 }{
			{[4]uint64{1, 1, 3, 5}, [4]uint64{0, 1, 3, 2}},
			{[4]uint64{2, 3, 4, 5}, [4]uint64{3, 1, 0, 2}},
			{[4]uint64{1, 4, 6, 2}, [4]uint64{0, 2, 1, 3}},
			{[4]uint64{2, 2, 2, 2}, [4]uint64{0, 1, 2, 3}},
		} {
			n := prod(c.d)
			x := roundTo(dt, randVals(r, int(n), 9))
			args := []spec{tv(dt, x), zeros(int(n) * dt.Size())}
			for _, v := range c.d {
				args = append(args, sc(v))
			}
			for _, v := range c.p {
				args = append(args, sc(v))
			}
			y := f32v(run(t, progName("transpose", dt), args...)[1], dt)
			var e [4]uint64
			for i := range e {
				e[i] = c.d[c.p[i]]
			}
			for i := range n {
				yc := unravel(i, e)
				var xc [4]uint64
				for k := range 4 {
					xc[c.p[k]] = yc[k]
				}
				if w := x[ravel(xc, c.d)]; !same32(y[i], w) {
					t.Errorf("transpose.%s %v: y%v = %g, want %g", dt, c, yc, y[i], w)
				}
			}
		}
	}
}

func TestGemmAgainstFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	type gc struct {
		m, n, k, ta, tb, batch, sa, sb, sc int
		alpha, beta                        float32
	}
	cases := []gc{
		{3, 4, 5, 0, 0, 1, 0, 0, 0, 1, 0},
		{7, 3, 300, 1, 0, 1, 0, 0, 0, 0.5, 0},
		{4, 6, 8, 0, 1, 3, 32, 48, 24, 1, 0},
		{4, 6, 8, 1, 1, 2, 0, 48, 30, 2, -0.5},
		{1, 1, 1, 0, 0, 1, 0, 0, 0, -1, 1},
		{5, 5, 64, 0, 1, 4, 320, 0, 25, 0.125, 0.25},
	}
	for _, dt := range dtypes {
		for _, fast := range []string{"", ".fast"} {
			for _, c := range cases {
				la := (c.batch-1)*c.sa + c.m*c.k
				lb := (c.batch-1)*c.sb + c.k*c.n
				lc := (c.batch-1)*c.sc + c.m*c.n
				a := roundTo(dt, randVals(r, la, 3))
				b := roundTo(dt, randVals(r, lb, 3))
				c0 := roundTo(dt, randVals(r, lc, 3))
				if c.beta == 0 {
					c0[0] = float32(math.NaN()) // never read
				}
				name := progName("gemm", dt) + fast
				out := f32v(run(t, name, tv(dt, a), tv(dt, b), tv(dt, c0),
					sc(uint64(c.m)), sc(uint64(c.n)), sc(uint64(c.k)), sc(uint64(c.ta)), sc(uint64(c.tb)),
					scF(c.alpha), scF(c.beta), sc(uint64(c.batch)), sc(uint64(c.sa)), sc(uint64(c.sb)), sc(uint64(c.sc)))[2], dt)
				for bi := range c.batch {
					for i := range c.m {
						for j := range c.n {
							var sum, abs float64
							for p := range c.k {
								var av, bv float64
								if c.ta == 1 {
									av = float64(a[bi*c.sa+p*c.m+i])
								} else {
									av = float64(a[bi*c.sa+i*c.k+p])
								}
								if c.tb == 1 {
									bv = float64(b[bi*c.sb+j*c.k+p])
								} else {
									bv = float64(b[bi*c.sb+p*c.n+j])
								}
								sum += av * bv
								abs += math.Abs(av * bv)
							}
							ci := bi*c.sc + i*c.n + j
							want := float64(c.alpha) * sum
							abs *= math.Abs(float64(c.alpha))
							if c.beta != 0 {
								want += float64(c.beta) * float64(c0[ci])
								abs += math.Abs(float64(c.beta) * float64(c0[ci]))
							}
							tol := float64(c.k+2)*math.Ldexp(abs, -23) + storageUlp(dt, want)
							if got := out[ci]; !near(dt, got, want, tol) {
								t.Errorf("%s %+v [%d][%d][%d] = %g, want %g (tolerance %g)", name, c, bi, i, j, got, want, tol)
							}
						}
					}
				}
			}
		}
	}
}

func TestGatherClampsOutOfRangeRowsToZero(t *testing.T) {
	table := []float32{1, 2, 3, 4, 5, 6} // 3 rows × 2
	out := f32v(run(t, "gather", tv(F32, table), i32s(2, 0, -1, 3, 1, math.MaxInt32, math.MinInt32), zeros(7*2*4), sc(3), sc(2))[2], F32)
	want := []float32{5, 6, 1, 2, 0, 0, 0, 0, 3, 4, 0, 0, 0, 0}
	for i := range want {
		if out[i] != want[i] {
			t.Fatalf("gather = %v, want %v", out, want)
		}
	}
}

func TestConvAndPoolingAgainstFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	type cc struct{ n, c, h, w, k, r, s, sh, sw, ph, pw, dh, dw, g int }
	for _, c := range []cc{
		{1, 1, 5, 5, 1, 3, 3, 1, 1, 0, 0, 1, 1, 1},
		{2, 3, 7, 6, 4, 3, 2, 2, 1, 1, 2, 1, 1, 1},
		{1, 4, 8, 8, 6, 3, 3, 1, 2, 2, 1, 2, 1, 2},
		{1, 2, 4, 4, 2, 1, 1, 1, 1, 0, 0, 1, 1, 2},
	} {
		x := randVals(r, c.n*c.c*c.h*c.w, 3)
		cg := c.c / c.g
		w := randVals(r, c.k*cg*c.r*c.s, 3)
		bias := randVals(r, c.k, 1)
		p := (c.h+2*c.ph-c.dh*(c.r-1)-1)/c.sh + 1
		q := (c.w+2*c.pw-c.dw*(c.s-1)-1)/c.sw + 1
		for _, name := range []string{"conv2d", "conv2d.fast"} {
			for _, withBias := range []bool{true, false} {
				bs := tv(F32, bias)
				if !withBias {
					bs = zeros(0)
				}
				y := f32v(run(t, name, tv(F32, x), tv(F32, w), bs, zeros(c.n*c.k*p*q*4),
					sc(uint64(c.n)), sc(uint64(c.c)), sc(uint64(c.h)), sc(uint64(c.w)), sc(uint64(c.k)), sc(uint64(c.r)), sc(uint64(c.s)),
					pack(uint32(c.sh), uint32(c.sw)), pack(uint32(c.ph), uint32(c.pw)), pack(uint32(c.dh), uint32(c.dw)), sc(uint64(c.g)))[3], F32)
				for ni := range c.n {
					for ki := range c.k {
						for pi := range p {
							for qi := range q {
								var sum, abs float64
								for ci := range cg {
									for ri := range c.r {
										for si := range c.s {
											hi, wi := pi*c.sh-c.ph+ri*c.dh, qi*c.sw-c.pw+si*c.dw
											if hi < 0 || hi >= c.h || wi < 0 || wi >= c.w {
												continue
											}
											v := float64(x[((ni*c.c+(ki/(c.k/c.g))*cg+ci)*c.h+hi)*c.w+wi]) * float64(w[((ki*cg+ci)*c.r+ri)*c.s+si])
											sum += v
											abs += math.Abs(v)
										}
									}
								}
								if withBias {
									sum += float64(bias[ki])
									abs += math.Abs(float64(bias[ki]))
								}
								got := y[((ni*c.k+ki)*p+pi)*q+qi]
								tol := float64(cg*c.r*c.s+2) * math.Ldexp(abs, -23)
								if !near(F32, got, sum, tol) {
									t.Errorf("%s %+v bias %v y[%d][%d][%d][%d] = %g, want %g", name, c, withBias, ni, ki, pi, qi, got, sum)
								}
							}
						}
					}
				}
			}
		}
	}
	// Pooling, with a window entirely in the padding.
	for _, c := range []cc{
		{1, 2, 5, 5, 0, 2, 2, 2, 2, 0, 0, 1, 1, 1},
		{2, 1, 6, 7, 0, 3, 3, 1, 2, 1, 1, 1, 1, 1},
		{1, 1, 2, 2, 0, 2, 2, 1, 1, 2, 2, 1, 1, 1},
	} {
		x := randVals(r, c.n*c.c*c.h*c.w, 5)
		p := (c.h+2*c.ph-c.r)/c.sh + 1
		q := (c.w+2*c.pw-c.s)/c.sw + 1
		for _, name := range []string{"maxpool2d", "avgpool2d"} {
			y := f32v(run(t, name, tv(F32, x), zeros(c.n*c.c*p*q*4),
				sc(uint64(c.n)), sc(uint64(c.c)), sc(uint64(c.h)), sc(uint64(c.w)), sc(uint64(c.r)), sc(uint64(c.s)),
				pack(uint32(c.sh), uint32(c.sw)), pack(uint32(c.ph), uint32(c.pw)))[1], F32)
			for nc := range c.n * c.c {
				for pi := range p {
					for qi := range q {
						mx, sum, cnt := math.Inf(-1), 0.0, 0
						for ri := range c.r {
							for si := range c.s {
								hi, wi := pi*c.sh-c.ph+ri, qi*c.sw-c.pw+si
								if hi < 0 || hi >= c.h || wi < 0 || wi >= c.w {
									continue
								}
								v := float64(x[(nc*c.h+hi)*c.w+wi])
								mx = math.Max(mx, v)
								sum += v
								cnt++
							}
						}
						got := y[(nc*p+pi)*q+qi]
						if name == "maxpool2d" {
							if float64(got) != mx {
								t.Errorf("maxpool %+v = %g, want %g", c, got, mx)
							}
							continue
						}
						want := 0.0
						if cnt > 0 {
							want = sum / float64(cnt)
						}
						if !near(F32, got, want, float64(c.r*c.s+2)*math.Ldexp(math.Abs(want)+5, -23)) {
							t.Errorf("avgpool %+v = %g, want %g", c, got, want)
						}
					}
				}
			}
		}
	}
}

func TestHalfConversionsRoundToNearestEven(t *testing.T) {
	// Every half survives a round trip.
	for h := range 1 << 16 {
		f := F16ToF32(uint16(h))
		if f != f {
			if back := F32ToF16(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("f16 NaN %#04x came back %#04x", h, back)
			}
			continue
		}
		if back := F32ToF16(f); back != uint16(h) {
			t.Fatalf("f16 %#04x -> %g -> %#04x", h, f, back)
		}
		b := BF16ToF32(uint16(h))
		if b == b && F32ToBF16(b) != uint16(h) {
			t.Fatalf("bf16 %#04x did not round-trip", h)
		}
	}
	// Random float32 values round to the nearest neighbour, ties to even.
	r := rand.New(rand.NewPCG(19, 20))
	check := func(x float32, h uint16, dec func(uint16) float32, kind string) {
		v := float64(dec(h))
		if math.IsInf(v, 0) {
			return // overflow, checked below
		}
		for _, nb := range []uint16{h - 1, h + 1} {
			w := float64(dec(nb))
			if w != w || math.IsInf(w, 0) || math.Signbit(w) != math.Signbit(v) && v != 0 {
				continue
			}
			d0, d1 := math.Abs(float64(x)-v), math.Abs(float64(x)-w)
			if d1 < d0 || (d1 == d0 && h&1 == 1) {
				t.Fatalf("%s(%g) = %g, but %g is nearer (or the even tie)", kind, x, v, w)
			}
		}
	}
	for range 200000 {
		x := math.Float32frombits(r.Uint32())
		if x != x {
			continue
		}
		if math.Abs(float64(x)) < 70000 {
			check(x, F32ToF16(x), F16ToF32, "f16")
		}
		check(x, F32ToBF16(x), BF16ToF32, "bf16")
	}
	for _, c := range []struct {
		x float32
		h uint16
	}{{65519, 0x7bff}, {65520, 0x7c00}, {-1e9, 0xfc00}, {2.9802322e-08, 0}, {2.9802326e-08, 1}, {5.9604645e-08, 1}, {8.940697e-08, 2}} {
		if got := F32ToF16(c.x); got != c.h {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", c.x, got, c.h)
		}
	}
}

func TestCast(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	x := []float32{1.5, -2.7, nan, inf, -inf, 3e9, -3e9, 65520, 1e-8, 0.1}
	i := f32v(nil, F32)
	_ = i
	m := run(t, "cast", tv(F32, x), zeros(len(x)*4), sc(0), sc(3))
	wantI := []int32{1, -2, 0, math.MaxInt32, math.MinInt32, math.MaxInt32, math.MinInt32, 65520, 0, 0}
	for k, w := range wantI {
		if got := int32(binary.LittleEndian.Uint32(m[1][4*k:])); got != w {
			t.Errorf("cast f32 %g -> i32 = %d, want %d", x[k], got, w)
		}
	}
	for to := F16; to <= BF16; to++ {
		m = run(t, "cast", tv(F32, x), zeros(len(x)*2), sc(0), sc(uint64(to)))
		got := f32v(m[1], to)
		want := roundTo(to, x)
		for k := range x {
			if !same32(got[k], want[k]) {
				t.Errorf("cast f32 %g -> %s = %g, want %g", x[k], to, got[k], want[k])
			}
		}
		back := f32v(run(t, "cast", raw(m[1]), zeros(len(x)*4), sc(uint64(to)), sc(0))[1], F32)
		for k := range x {
			if !same32(back[k], got[k]) {
				t.Errorf("cast %s %g -> f32 = %g", to, got[k], back[k])
			}
		}
	}
	// i32 to bf16 rounds once: 2^24+2^16+1 is nearer 2^24+2^17 than 2^24.
	ints := []int32{16777216 + 65536 + 1, -7, math.MaxInt32, math.MinInt32, 0}
	m = run(t, "cast", i32s(ints...), zeros(len(ints)*2), sc(3), sc(2))
	got := f32v(m[1], BF16)
	for k, v := range ints {
		want := float64(v)
		// The nearest bf16 by search.
		best := float32(0)
		for h := range 1 << 16 {
			f := BF16ToF32(uint16(h))
			if f == f && math.Abs(float64(f)-want) < math.Abs(float64(best)-want) {
				best = f
			}
		}
		if got[k] != best {
			t.Errorf("cast i32 %d -> bf16 = %g, want %g", v, got[k], best)
		}
	}
}
