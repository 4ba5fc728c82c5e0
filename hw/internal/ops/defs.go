package ops

import (
	"fmt"
	"math"
)

// The ops. Each definition holds its contract (arguments, constraints,
// exactness) and its checks; the reference arithmetic is in ref.go.
var defs = buildDefs()

const (
	exactElem   = "Exact: float32 arithmetic per element, bit-identical on every backend."
	boundedElem = "Bounded: the simulator and the emulator compute in float64 and round once (at most 1 ulp, correctly rounded in practice); CUDA uses its float32 functions, within %s of the float64 result; with f16 or bf16 storage, 1 ulp of the storage type more."
	exactReduce = "Exact: the fixed 256-lane reduction order (see the package doc), bit-identical on every backend."
)

// unaryDocs lists the unary ops: doc, bounded.
var unaryDocs = []struct {
	name, doc string
	// cudaBound is the CUDA bound of a bounded op ("" for an exact one).
	cudaBound string
	f         func(float32) float32
}{
	{"exp", "y = e^x.", "2 ulp", fExp},
	{"log", "y = ln x (ln 0 = -Inf, ln of a negative value = NaN).", "1 ulp", fLog},
	{"tanh", "y = tanh x.", "2 ulp", fTanh},
	{"sigmoid", "y = 1/(1+e^-x).", "4 ulp + 2^-140", fSigmoid},
	{"gelu_tanh", "y = x·sigmoid(2u), u = √(2/π)(x + 0.044715x³), the tanh approximation of GELU; gelu_tanh(-Inf) = -0.", "6 ulp + 2^-126", fGeluTanh},
	{"gelu_erf", "y = x·Φ(x) = 0.5x·erfc(-x/√2); gelu_erf(-Inf) = -0.", "8 ulp + 2^-126", fGeluErf},
	{"silu", "y = x·sigmoid(x); silu(-Inf) = -0.", "5 ulp + 2^-140", fSilu},
	{"rsqrt", "y = 1/sqrt(x): two correctly rounded float32 operations.", "", fRsqrt},
	{"sqrt", "y = sqrt(x), correctly rounded.", "", fSqrt},
	{"neg", "y = -x (the sign bit flipped).", "", fNeg},
	{"abs", "y = |x| (the sign bit cleared).", "", fAbs},
}

func buildDefs() []*opDef {
	var d []*opDef
	for _, u := range unaryDocs {
		tier, exact := TierExact, exactElem
		if u.cudaBound != "" {
			tier, exact = TierBounded, fmt.Sprintf(boundedElem, u.cudaBound)
		}
		f := u.f
		d = append(d, &opDef{
			name: u.name, doc: u.doc, half: true, tier: tier, exact: exact,
			args:        []ArgInfo{bufT("x", "in", "n ≥ 1 values"), bufT("y", "out", "len(x) values")},
			constraints: []string{"y is exactly x (in place) or does not overlap it."},
			check:       cUnary,
			run:         func(l *launch) { runUnary(l, f) },
		})
	}
	d = append(d, &opDef{
		name: "affine", doc: "y = a·x + b, the product rounded before the add (never fused).", half: true,
		tier: TierExact, exact: exactElem,
		args:        []ArgInfo{bufT("x", "in", "n ≥ 1 values"), bufT("y", "out", "len(x) values"), f32("a"), f32("b")},
		constraints: []string{"y is exactly x (in place) or does not overlap it."},
		check:       cUnary,
		run:         runAffine,
	})
	for _, b := range []struct{ name, doc string }{
		{"add", "c = a + b with NumPy broadcasting over 4 dims."},
		{"sub", "c = a - b with NumPy broadcasting over 4 dims."},
		{"mul", "c = a · b with NumPy broadcasting over 4 dims."},
		{"div", "c = a / b with NumPy broadcasting over 4 dims."},
		{"max", "c = max(a, b) with NumPy broadcasting; NaN if either is NaN; max(-0, +0) = +0."},
		{"min", "c = min(a, b) with NumPy broadcasting; NaN if either is NaN; min(-0, +0) = -0."},
	} {
		f := binaryFuncs[b.name]
		d = append(d, &opDef{
			name: b.name, doc: b.doc, half: true, tier: TierExact, exact: exactElem,
			args: []ArgInfo{
				bufT("a", "in", "a0*a1*a2*a3 values"), bufT("b", "in", "b0*b1*b2*b3 values"),
				bufT("c", "out", "the broadcast shape's values"),
				u32("a0"), u32("a1"), u32("a2"), u32("a3"), u32("b0"), u32("b1"), u32("b2"), u32("b3"),
			},
			constraints: []string{
				"The dims of a and b, padded with leading 1s, are each 1 to 2^31-1; per dim they are equal or one of them is 1; c has the larger.",
				"c is exactly a (or b) when that operand has c's shape, or overlaps neither.",
			},
			check: cBinary,
			run:   func(l *launch) { runBinary(l, f) },
		})
	}
	for _, r := range []struct{ name, doc string }{
		{"reduce_sum", "y[o][i] = the sum of x[o][j][i] over j < n, in the fixed reduction order."},
		{"reduce_mean", "y[o][i] = reduce_sum / n (one float32 division by float32(n))."},
		{"reduce_max", "y[o][i] = the largest x[o][j][i] over j < n; NaN if any is NaN."},
	} {
		d = append(d, &opDef{
			name: r.name, doc: r.doc, half: true, tier: TierExact, exact: exactReduce,
			args:        []ArgInfo{bufT("x", "in", "outer*n*inner values"), bufT("y", "out", "outer*inner values"), u32("outer"), u32("n"), u32("inner")},
			constraints: []string{"y does not overlap x."},
			check:       cReduce,
			run:         runReduce,
		})
	}
	d = append(d, &opDef{
		name: "reduce_argmax", doc: "y[o][i] = the first j < n with the largest x[o][j][i]; NaN never compares larger (0 when every value is NaN).",
		half: true, tier: TierExact, exact: "Exact: an order-independent definition, bit-identical on every backend.",
		args:        []ArgInfo{bufT("x", "in", "outer*n*inner values"), bufOf("y", "i32", "out", "outer*inner values"), u32("outer"), u32("n"), u32("inner")},
		constraints: []string{"y does not overlap x."},
		check:       cReduce,
		run:         runArgmax,
	})
	const softmaxSim = "Bounded: the row max is exact (the fixed reduction order); on the simulator and the emulator the rest is float64 rounded once (at most 1 ulp); on CUDA "
	const softmaxNaN = " A row whose unmasked values are all -Inf, or holding NaN or +Inf, yields NaN."
	for _, s := range []struct{ name, doc, bound string }{
		{"softmax", "Each row y = exp(x - max)/Σexp(x - max); masked columns are exactly 0.",
			softmaxSim + "within (cols/256 + 16) ulp + 2^-126 of the float64 result." + softmaxNaN},
		{"log_softmax", "Each row y = (x - max) - ln Σexp(x - max); masked columns are -Inf.",
			softmaxSim + "within 4 ulp + (cols/256 + 16)·2^-24 of the float64 result." + softmaxNaN},
	} {
		d = append(d, &opDef{
			name: s.name, doc: s.doc, half: true, tier: TierBounded,
			exact: s.bound,
			args: []ArgInfo{
				bufT("x", "in", "rows*cols values"), bufT("y", "out", "rows*cols values"),
				u32("rows"), u32("cols"), u32("causal"),
			},
			constraints: []string{
				"causal = 0: no mask; causal = Sq with 1 ≤ Sq ≤ cols: row r is query q = r mod Sq and columns j > q + (cols - Sq) are masked.",
				"y is exactly x (in place) or does not overlap it.",
			},
			check: cSoftmax,
			run:   runSoftmax,
		})
	}
	d = append(d, &opDef{
		name: "layernorm", doc: "Each row y = (x - mean)·rsqrt(var + eps)·gamma + beta, var the biased mean of squared deviations.",
		half: true, tier: TierExact,
		exact: "Exact: mean and variance by the fixed reduction order, rsqrt as two correctly rounded operations, then ((x-mean)·r)·gamma + beta, each step rounded.",
		args: []ArgInfo{
			bufT("x", "in", "rows*cols values"), bufT("gamma", "in", "cols values"), bufT("beta", "in", "cols values"),
			bufT("y", "out", "rows*cols values"), u32("rows"), u32("cols"), f32("eps"),
		},
		constraints: []string{"y is exactly x (in place) or does not overlap it; y overlaps neither gamma nor beta."},
		check:       cNorm,
		run:         runLayernorm,
	})
	d = append(d, &opDef{
		name: "rmsnorm", doc: "Each row y = x·rsqrt(mean(x²) + eps)·gamma.",
		half: true, tier: TierExact,
		exact: "Exact: mean(x²) by the fixed reduction order, rsqrt as two correctly rounded operations, then (x·r)·gamma, each step rounded.",
		args: []ArgInfo{
			bufT("x", "in", "rows*cols values"), bufT("gamma", "in", "cols values"),
			bufT("y", "out", "rows*cols values"), u32("rows"), u32("cols"), f32("eps"),
		},
		constraints: []string{"y is exactly x (in place) or does not overlap it; y does not overlap gamma."},
		check:       cNorm,
		run:         runRmsnorm,
	})
	d = append(d, &opDef{
		name: "transpose", doc: "y = x with its 4 dims permuted by p: y's dim i is d[p[i]].",
		half: true, tier: TierExact, exact: "Exact: values are copied.",
		args: []ArgInfo{
			bufT("x", "in", "d0*d1*d2*d3 values"), bufT("y", "out", "d0*d1*d2*d3 values"),
			u32("d0"), u32("d1"), u32("d2"), u32("d3"), u32("p0"), u32("p1"), u32("p2"), u32("p3"),
		},
		constraints: []string{"p is a permutation of 0..3; y does not overlap x."},
		check:       cTranspose,
		run:         runTranspose,
	})
	d = append(d, &opDef{
		name: "gemm", doc: "For each b < batch, C_b = alpha·op(A_b)·op(B_b) + beta·C_b, row-major; X_b starts at value b·strideX.",
		half: true, fast: true, tier: TierExact,
		exact: "Exact: each C value sums k = 0..K-1 in order from 0, products rounded, then alpha·sum, then + beta·c (beta·c rounded first), never fused; with alpha = 1, beta = 0 and batch = 1 it is matmul bit for bit.",
		args: []ArgInfo{
			bufT("A", "in", "(batch-1)*strideA + M*K values"), bufT("B", "in", "(batch-1)*strideB + K*N values"),
			bufT("C", "inout", "(batch-1)*strideC + M*N values"),
			u32("M"), u32("N"), u32("K"), u32("transA"), u32("transB"), f32("alpha"), f32("beta"),
			u32("batch"), u32("strideA"), u32("strideB"), u32("strideC"),
		},
		constraints: []string{
			"op(A) is M×K (A stored K×M when transA = 1), op(B) is K×N (stored N×K when transB = 1); transA and transB are 0 or 1.",
			"beta = 0: C is not read (NaN or Inf in C do not propagate).",
			"C overlaps neither A nor B; with batch > 1, strideC ≥ M*N.",
		},
		check: cGemm,
		run:   runGemm,
	})
	d = append(d, &opDef{
		name: "gather", doc: "Embedding lookup: out row i = table row idx[i]; an index outside [0, rows) writes a row of zeros.",
		tier: TierExact, exact: "Exact: values are copied.",
		args: []ArgInfo{
			bufOf("table", "f32", "in", "rows*cols values"), bufOf("idx", "i32", "in", "n ≥ 1 values"),
			bufOf("out", "f32", "out", "n*cols values"), u32("rows"), u32("cols"),
		},
		constraints: []string{"out overlaps neither table nor idx."},
		check:       cGather,
		run:         runGather,
	})
	d = append(d, &opDef{
		name: "conv2d", doc: "NCHW convolution: y[n][k][p][q] = Σ over c, r, s of x·w, then + bias[k].", fast: true,
		tier:  TierExact,
		exact: "Exact: each y value sums c, then r, then s ascending from 0 (positions in the padding are skipped), products rounded, then + bias.",
		args: []ArgInfo{
			bufOf("x", "f32", "in", "N*C*H*W values"), bufOf("w", "f32", "in", "K*(C/groups)*R*S values"),
			bufOf("bias", "f32", "in", "K values, or empty (no bias)"), bufOf("y", "f32", "out", "N*K*P*Q values"),
			u32("N"), u32("C"), u32("H"), u32("W"), u32("K"), u32("R"), u32("S"),
			u64("stride"), u64("pad"), u64("dil"), u32("groups"),
		},
		constraints: []string{
			"stride, pad and dil pack (h | w<<32); stride and dil halves are ≥ 1; groups divides C and K.",
			"P = (H + 2·ph - dh·(R-1) - 1)/sh + 1 and Q likewise are both ≥ 1.",
			"y overlaps none of x, w and bias.",
		},
		check: cConv,
		run:   runConv,
	})
	for _, p := range []struct{ name, doc string }{
		{"maxpool2d", "NCHW max pooling over R×S windows; padding is -Inf (a window entirely in padding gives -Inf); NaN propagates."},
		{"avgpool2d", "NCHW average pooling over R×S windows; padding is excluded from the count (a window entirely in padding gives 0)."},
	} {
		d = append(d, &opDef{
			name: p.name, doc: p.doc, tier: TierExact,
			exact: "Exact: the window is visited r, then s ascending; the average is the sum from 0 divided once by the count.",
			args: []ArgInfo{
				bufOf("x", "f32", "in", "N*C*H*W values"), bufOf("y", "f32", "out", "N*C*P*Q values"),
				u32("N"), u32("C"), u32("H"), u32("W"), u32("R"), u32("S"), u64("stride"), u64("pad"),
			},
			constraints: []string{
				"stride and pad pack (h | w<<32); stride halves are ≥ 1.",
				"P = (H + 2·ph - R)/sh + 1 and Q likewise are both ≥ 1.",
				"y does not overlap x.",
			},
			check: cPool,
			run:   runPool,
		})
	}
	d = append(d, &opDef{
		name: "cast", doc: "y = x converted between dtypes 0 f32, 1 f16, 2 bf16, 3 i32.",
		tier: TierExact, exact: "Exact: float to float rounds to nearest even (NaN stays NaN, overflow gives ±Inf); float to i32 truncates toward zero, saturates, NaN gives 0; i32 to float rounds to nearest even.",
		args: []ArgInfo{
			bufOf("x", "bytes", "in", "n ≥ 1 values of dtype from"), bufOf("y", "bytes", "out", "n values of dtype to"),
			u32("from"), u32("to"),
		},
		constraints: []string{"from and to are 0 to 3; y is exactly x (same value size) or does not overlap it."},
		check:       cCast,
		run:         runCast,
	})
	return d
}

// checker names an op's check function. Validate calls them through a
// switch (checkOp), not through a func value, so that the launch being
// checked, and the caller's argument slice, stay on the stack: a submit
// allocates nothing to be checked.
type checker uint8

const (
	cUnary checker = iota + 1
	cBinary
	cReduce
	cSoftmax
	cNorm
	cTranspose
	cGemm
	cGather
	cConv
	cPool
	cCast
)

func (l *launch) checkOp() error {
	switch l.k.def.check {
	case cUnary:
		return checkUnary(l)
	case cBinary:
		return checkBinary(l)
	case cReduce:
		return checkReduce(l)
	case cSoftmax:
		return checkSoftmax(l)
	case cNorm:
		return checkNorm(l)
	case cTranspose:
		return checkTranspose(l)
	case cGemm:
		return checkGemm(l)
	case cGather:
		return checkGather(l)
	case cConv:
		return checkConv(l)
	case cPool:
		return checkPool(l)
	case cCast:
		return checkCast(l)
	}
	panic("ops: " + l.k.Name + " has no check")
}

func checkUnary(l *launch) error {
	n := l.count("x")
	if n == 0 {
		return l.errf("x", "x has 0 values: zero-size launches are refused")
	}
	if err := l.wantCount("y", n, "len(x)"); err != nil {
		return err
	}
	return l.inPlace("y", "x")
}

// names4 are the names of the 4-dim scalars (written out: building them
// would allocate on every launch).
var names4 = map[string][4]string{
	"a": {"a0", "a1", "a2", "a3"},
	"b": {"b0", "b1", "b2", "b3"},
	"d": {"d0", "d1", "d2", "d3"},
	"p": {"p0", "p1", "p2", "p3"},
}

// shape4 reads the 4 dims called prefix0..prefix3.
func (l *launch) shape4(prefix string) ([4]uint64, error) {
	var s [4]uint64
	for i := range s {
		v, err := l.dim(names4[prefix][i])
		if err != nil {
			return s, err
		}
		s[i] = v
	}
	return s, nil
}

func checkBinary(l *launch) error {
	a, err := l.shape4("a")
	if err != nil {
		return err
	}
	b, err := l.shape4("b")
	if err != nil {
		return err
	}
	var c [4]uint64
	for i := range c {
		switch {
		case a[i] == b[i] || b[i] == 1:
			c[i] = a[i]
		case a[i] == 1:
			c[i] = b[i]
		default:
			return l.errf("", "dim %d: a%d = %s and b%d = %s do not broadcast", i, i, num(a[i]), i, num(b[i]))
		}
	}
	na, err := l.product("a0*a1*a2*a3", a[:]...)
	if err != nil {
		return err
	}
	nb, err := l.product("b0*b1*b2*b3", b[:]...)
	if err != nil {
		return err
	}
	nc, err := l.product("the broadcast shape", c[:]...)
	if err != nil {
		return err
	}
	if err := l.wantCount("a", na, "a0*a1*a2*a3"); err != nil {
		return err
	}
	if err := l.wantCount("b", nb, "b0*b1*b2*b3"); err != nil {
		return err
	}
	if err := l.wantCount("c", nc, "the broadcast shape's product"); err != nil {
		return err
	}
	for _, in := range []struct {
		name string
		n    uint64
	}{{"a", na}, {"b", nb}} {
		if l.same("c", in.name) && in.n == nc {
			continue
		}
		if l.overlap("c", in.name) {
			if in.n != nc {
				return l.errf("c", "c overlaps %s, which is broadcast (only an operand of c's shape may be c)", in.name)
			}
			return l.errf("c", "c partially overlaps %s (it may be exactly %s, or apart)", in.name, in.name)
		}
	}
	return nil
}

func checkReduce(l *launch) error {
	da, err := l.dims("outer", "n", "inner")
	d := da[:3]
	if err != nil {
		return err
	}
	nx, err := l.product("outer*n*inner", d...)
	if err != nil {
		return err
	}
	ny, _ := l.product("outer*inner", d[0], d[2])
	if err := l.wantCount("x", nx, "outer*n*inner"); err != nil {
		return err
	}
	if err := l.wantCount("y", ny, "outer*inner"); err != nil {
		return err
	}
	return l.disjoint("y", "x")
}

func (l *launch) rowsCols() (rows, cols uint64, err error) {
	da, err := l.dims("rows", "cols")
	d := da[:2]
	if err != nil {
		return 0, 0, err
	}
	n, err := l.product("rows*cols", d...)
	if err != nil {
		return 0, 0, err
	}
	if err := l.wantCount("x", n, "rows*cols"); err != nil {
		return 0, 0, err
	}
	if err := l.wantCount("y", n, "rows*cols"); err != nil {
		return 0, 0, err
	}
	return d[0], d[1], l.inPlace("y", "x")
}

func checkSoftmax(l *launch) error {
	_, cols, err := l.rowsCols()
	if err != nil {
		return err
	}
	if sq := l.scalar("causal"); sq > cols {
		return l.errf("causal", "causal = %s exceeds cols = %s", num(sq), num(cols))
	}
	return nil
}

func checkNorm(l *launch) error {
	_, cols, err := l.rowsCols()
	if err != nil {
		return err
	}
	params := []string{"gamma"}
	if l.k.Op == "layernorm" {
		params = append(params, "beta")
	}
	for _, p := range params {
		if err := l.wantCount(p, cols, "cols"); err != nil {
			return err
		}
	}
	return l.disjoint("y", params...)
}

func checkTranspose(l *launch) error {
	d, err := l.shape4("d")
	if err != nil {
		return err
	}
	var seen [4]bool
	for i := range 4 {
		p := l.scalar(names4["p"][i])
		if p > 3 || seen[p] {
			return l.errf(names4["p"][i], "p0..p3 = %d %d %d %d is not a permutation of 0..3",
				l.scalar("p0"), l.scalar("p1"), l.scalar("p2"), l.scalar("p3"))
		}
		seen[p] = true
	}
	n, err := l.product("d0*d1*d2*d3", d[:]...)
	if err != nil {
		return err
	}
	if err := l.wantCount("x", n, "d0*d1*d2*d3"); err != nil {
		return err
	}
	if err := l.wantCount("y", n, "d0*d1*d2*d3"); err != nil {
		return err
	}
	return l.disjoint("y", "x")
}

// extent returns (batch-1)*stride + size, refusing an overflow.
func (l *launch) extent(expr string, batch, stride, size uint64) (uint64, error) {
	off, err := l.product(expr, batch-1, stride)
	if err != nil {
		return 0, err
	}
	if off+size > MaxElems {
		return 0, l.errf("", "%s exceeds the limit %s", expr, num(MaxElems))
	}
	return off + size, nil
}

func checkGemm(l *launch) error {
	da, err := l.dims("M", "N", "K", "batch")
	d := da[:4]
	if err != nil {
		return err
	}
	m, n, k, batch := d[0], d[1], d[2], d[3]
	for _, t := range []string{"transA", "transB"} {
		if v := l.scalar(t); v > 1 {
			return l.errf(t, "%s = %s, want 0 or 1", t, num(v))
		}
	}
	for _, x := range []struct {
		buf, stride, expr string
		a, b              uint64
	}{
		{"A", "strideA", "(batch-1)*strideA + M*K", m, k},
		{"B", "strideB", "(batch-1)*strideB + K*N", k, n},
		{"C", "strideC", "(batch-1)*strideC + M*N", m, n},
	} {
		size, err := l.product(x.expr, x.a, x.b)
		if err != nil {
			return err
		}
		stride := l.scalar(x.stride)
		if x.buf == "C" && batch > 1 && stride < size {
			return l.errf("strideC", "strideC = %s is less than M*N = %s: the batch's C matrices would overlap", num(stride), num(size))
		}
		want, err := l.extent(x.expr, batch, stride, size)
		if err != nil {
			return err
		}
		if err := l.wantCount(x.buf, want, x.expr); err != nil {
			return err
		}
	}
	return l.disjoint("C", "A", "B")
}

func checkGather(l *launch) error {
	da, err := l.dims("rows", "cols")
	d := da[:2]
	if err != nil {
		return err
	}
	n, err := l.product("rows*cols", d...)
	if err != nil {
		return err
	}
	if err := l.wantCount("table", n, "rows*cols"); err != nil {
		return err
	}
	ni := l.count("idx")
	if ni == 0 {
		return l.errf("idx", "idx has 0 values: zero-size launches are refused")
	}
	no, err := l.product("len(idx)*cols", ni, d[1])
	if err != nil {
		return err
	}
	if err := l.wantCount("out", no, "len(idx)*cols"); err != nil {
		return err
	}
	return l.disjoint("out", "table", "idx")
}

// window computes an output extent (in + 2·pad - dil·(r-1) - 1)/stride + 1,
// or an error when it is below 1. Every operand is below 2^32, so nothing
// overflows.
func (l *launch) window(axis string, in, r, stride, pad, dil uint64) (uint64, error) {
	span := dil*(r-1) + 1
	if in+2*pad < span {
		return 0, l.errf("", "the %s window spans %s values, more than the padded input's %s: the output would be empty", axis, num(span), num(in+2*pad))
	}
	return (in+2*pad-span)/stride + 1, nil
}

// geometry checks stride, pad and dil (when given) and returns P and Q.
func (l *launch) geometry(h, w, r, s uint64, withDil bool) (p, q uint64, err error) {
	sh, sw := halves(l.scalar("stride"))
	ph, pw := halves(l.scalar("pad"))
	dh, dw := uint64(1), uint64(1)
	if withDil {
		dh, dw = halves(l.scalar("dil"))
	}
	if sh == 0 || sw == 0 {
		return 0, 0, l.errf("stride", "stride = (%d, %d): both halves must be at least 1", sh, sw)
	}
	if dh == 0 || dw == 0 {
		return 0, 0, l.errf("dil", "dil = (%d, %d): both halves must be at least 1", dh, dw)
	}
	if p, err = l.window("height", h, r, sh, ph, dh); err != nil {
		return 0, 0, err
	}
	if q, err = l.window("width", w, s, sw, pw, dw); err != nil {
		return 0, 0, err
	}
	return p, q, nil
}

func checkConv(l *launch) error {
	da, err := l.dims("N", "C", "H", "W", "K", "R", "S", "groups")
	d := da[:8]
	if err != nil {
		return err
	}
	n, c, h, w, k, r, s, g := d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]
	if c%g != 0 || k%g != 0 {
		return l.errf("groups", "groups = %s divides neither C = %s nor K = %s evenly", num(g), num(c), num(k))
	}
	p, q, err := l.geometry(h, w, r, s, true)
	if err != nil {
		return err
	}
	nx, err := l.product("N*C*H*W", n, c, h, w)
	if err != nil {
		return err
	}
	nw, err := l.product("K*(C/groups)*R*S", k, c/g, r, s)
	if err != nil {
		return err
	}
	ny, err := l.product("N*K*P*Q", n, k, p, q)
	if err != nil {
		return err
	}
	if err := l.wantCount("x", nx, "N*C*H*W"); err != nil {
		return err
	}
	if err := l.wantCount("w", nw, "K*(C/groups)*R*S"); err != nil {
		return err
	}
	if nb := l.count("bias"); nb != 0 && nb != k {
		return l.errf("bias", "bias has %s values, want K = %s or none", num(nb), num(k))
	}
	if err := l.wantCount("y", ny, "N*K*P*Q"); err != nil {
		return err
	}
	return l.disjoint("y", "x", "w", "bias")
}

func checkPool(l *launch) error {
	da, err := l.dims("N", "C", "H", "W", "R", "S")
	d := da[:6]
	if err != nil {
		return err
	}
	p, q, err := l.geometry(d[2], d[3], d[4], d[5], false)
	if err != nil {
		return err
	}
	nx, err := l.product("N*C*H*W", d[:4]...)
	if err != nil {
		return err
	}
	ny, err := l.product("N*C*P*Q", d[0], d[1], p, q)
	if err != nil {
		return err
	}
	if err := l.wantCount("x", nx, "N*C*H*W"); err != nil {
		return err
	}
	if err := l.wantCount("y", ny, "N*C*P*Q"); err != nil {
		return err
	}
	return l.disjoint("y", "x")
}

func checkCast(l *launch) error {
	from, to := l.scalar("from"), l.scalar("to")
	for _, c := range []struct {
		name string
		v    uint64
	}{{"from", from}, {"to", to}} {
		if c.v > 3 {
			return l.errf(c.name, "%s = %s is not a dtype code (0 f32, 1 f16, 2 bf16, 3 i32)", c.name, num(c.v))
		}
	}
	fs, ts := uint64(DType(from).Size()), uint64(DType(to).Size())
	x, y := l.args[0], l.args[1]
	if x.Len%fs != 0 || (x.Len > 0 && x.Addr%fs != 0) {
		return l.errf("x", "x (%s bytes) is not whole, aligned %s values", num(x.Len), DType(from))
	}
	if y.Len%ts != 0 || (y.Len > 0 && y.Addr%ts != 0) {
		return l.errf("y", "y (%s bytes) is not whole, aligned %s values", num(y.Len), DType(to))
	}
	n := x.Len / fs
	if n == 0 {
		return l.errf("x", "x has 0 values: zero-size launches are refused")
	}
	if y.Len/ts != n {
		return l.errf("y", "y has %s %s values, len(x) = %s", num(y.Len/ts), DType(to), num(n))
	}
	if fs == ts {
		return l.inPlace("y", "x")
	}
	return l.disjoint("y", "x")
}

// negInf is -Inf as a float32.
var negInf = float32(math.Inf(-1))
