package ops

import (
	"encoding/binary"
	"math"
)

// The reference arithmetic. Values are decoded from their storage type to
// float32, computed in float32 (with an explicit float32 conversion after
// every product and sum, which forbids fusing) or, for the bounded ops, in
// float64 rounded once to float32, then rounded once to the storage type.
// Buffers are little-endian, the byte order of every supported platform.

// load decodes buffer argument name into float32 values.
func (l *launch) load(name string) []float32 {
	i := l.index(name)
	return decode(l.mem[i], l.k.info.Args[i].Type)
}

func decode(b []byte, typ string) []float32 {
	switch typ {
	case "f16", "bf16":
		v := make([]float32, len(b)/2)
		for j := range v {
			h := binary.LittleEndian.Uint16(b[2*j:])
			if typ == "f16" {
				v[j] = F16ToF32(h)
			} else {
				v[j] = BF16ToF32(h)
			}
		}
		return v
	}
	v := make([]float32, len(b)/4)
	for j := range v {
		v[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
	}
	return v
}

// store encodes v into buffer argument name, rounding to its type.
func (l *launch) store(name string, v []float32) {
	i := l.index(name)
	encode(l.mem[i], l.k.info.Args[i].Type, v)
}

func encode(b []byte, typ string, v []float32) {
	switch typ {
	case "f16":
		for j, x := range v {
			binary.LittleEndian.PutUint16(b[2*j:], F32ToF16(x))
		}
	case "bf16":
		for j, x := range v {
			binary.LittleEndian.PutUint16(b[2*j:], F32ToBF16(x))
		}
	default:
		for j, x := range v {
			binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(x))
		}
	}
}

// Unary functions.

func fExp(x float32) float32  { return float32(math.Exp(float64(x))) }
func fLog(x float32) float32  { return float32(math.Log(float64(x))) }
func fTanh(x float32) float32 { return float32(math.Tanh(float64(x))) }

func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

func fSigmoid(x float32) float32 { return float32(sigmoid64(float64(x))) }

func fGeluTanh(x float32) float32 {
	if math.IsInf(float64(x), -1) {
		return float32(math.Copysign(0, -1))
	}
	v := float64(x)
	u := math.Sqrt(2/math.Pi) * (v + 0.044715*v*v*v)
	return float32(v * sigmoid64(2*u))
}

func fGeluErf(x float32) float32 {
	if math.IsInf(float64(x), -1) {
		return float32(math.Copysign(0, -1))
	}
	v := float64(x)
	return float32(0.5 * v * math.Erfc(-v/math.Sqrt2))
}

func fSilu(x float32) float32 {
	if math.IsInf(float64(x), -1) {
		return float32(math.Copysign(0, -1))
	}
	v := float64(x)
	return float32(v * sigmoid64(v))
}

// fSqrt is correctly rounded: a float64 square root rounded to float32 is.
func fSqrt(x float32) float32 { return float32(math.Sqrt(float64(x))) }

func fRsqrt(x float32) float32 { return 1 / fSqrt(x) }

func fNeg(x float32) float32 { return math.Float32frombits(math.Float32bits(x) ^ 0x80000000) }

func fAbs(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ 0x80000000) }

func runUnary(l *launch, f func(float32) float32) {
	x := l.load("x")
	for i, v := range x {
		x[i] = f(v)
	}
	l.store("y", x)
}

func runAffine(l *launch) {
	a, b := l.f32("a"), l.f32("b")
	x := l.load("x")
	for i, v := range x {
		x[i] = float32(a*v) + b
	}
	l.store("y", x)
}

// Binary functions.

var binaryFuncs = map[string]func(a, b float32) float32{
	"add": func(a, b float32) float32 { return a + b },
	"sub": func(a, b float32) float32 { return a - b },
	"mul": func(a, b float32) float32 { return a * b },
	"div": func(a, b float32) float32 { return a / b },
	"max": fMax,
	"min": fMin,
}

// fMax is max with NaN propagating and max(-0, +0) = +0.
func fMax(a, b float32) float32 {
	switch {
	case a != a:
		return a
	case b != b:
		return b
	case a > b:
		return a
	case b > a:
		return b
	case math.Signbit(float64(a)):
		return b // equal: b is +0 if either is
	}
	return a
}

// fMin is min with NaN propagating and min(-0, +0) = -0.
func fMin(a, b float32) float32 {
	switch {
	case a != a:
		return a
	case b != b:
		return b
	case a < b:
		return a
	case b < a:
		return b
	case math.Signbit(float64(a)):
		return a
	}
	return b
}

func runBinary(l *launch, f func(a, b float32) float32) {
	var as, bs, cs [4]int
	for i := range 4 {
		as[i] = int(l.scalar("a" + itoa(uint64(i))))
		bs[i] = int(l.scalar("b" + itoa(uint64(i))))
		cs[i] = max(as[i], bs[i])
	}
	// Strides, 0 along a broadcast dim.
	var sa, sb [4]int
	pa, pb := 1, 1
	for i := 3; i >= 0; i-- {
		if as[i] != 1 {
			sa[i] = pa
		}
		if bs[i] != 1 {
			sb[i] = pb
		}
		pa *= as[i]
		pb *= bs[i]
	}
	a, b := l.load("a"), l.load("b")
	c := make([]float32, cs[0]*cs[1]*cs[2]*cs[3])
	n := 0
	for i0 := range cs[0] {
		for i1 := range cs[1] {
			for i2 := range cs[2] {
				for i3 := range cs[3] {
					ia := i0*sa[0] + i1*sa[1] + i2*sa[2] + i3*sa[3]
					ib := i0*sb[0] + i1*sb[1] + i2*sb[2] + i3*sb[3]
					c[n] = f(a[ia], b[ib])
					n++
				}
			}
		}
	}
	l.store("c", c)
}

// Reductions.

// TreeSum sums at(0..n-1) in the fixed reduction order: lane t starts from
// 0 and adds t, t+256, … in order; then the lanes combine by the tree
// p[t] += p[t+s] for s = 128, 64, …, 1.
func TreeSum(n int, at func(int) float32) float32 {
	var p [Lanes]float32
	for t := 0; t < Lanes && t < n; t++ {
		var s float32
		for j := t; j < n; j += Lanes {
			s = float32(s + at(j))
		}
		p[t] = s
	}
	for s := Lanes / 2; s >= 1; s /= 2 {
		for t := range s {
			p[t] = float32(p[t] + p[t+s])
		}
	}
	return p[0]
}

// TreeMax is the largest of at(0..n-1) in the fixed reduction order, lanes
// starting from -Inf; NaN propagates.
func TreeMax(n int, at func(int) float32) float32 {
	var p [Lanes]float32
	for t := range p {
		p[t] = negInf
		for j := t; j < n; j += Lanes {
			p[t] = fMax(p[t], at(j))
		}
	}
	for s := Lanes / 2; s >= 1; s /= 2 {
		for t := range s {
			p[t] = fMax(p[t], p[t+s])
		}
	}
	return p[0]
}

func (l *launch) reduceDims() (outer, n, inner int) {
	return int(l.scalar("outer")), int(l.scalar("n")), int(l.scalar("inner"))
}

func runReduce(l *launch) {
	outer, n, inner := l.reduceDims()
	x := l.load("x")
	y := make([]float32, outer*inner)
	for o := range outer {
		for i := range inner {
			at := func(j int) float32 { return x[(o*n+j)*inner+i] }
			var v float32
			switch l.k.Op {
			case "reduce_max":
				v = TreeMax(n, at)
			case "reduce_mean":
				v = TreeSum(n, at) / float32(n)
			default:
				v = TreeSum(n, at)
			}
			y[o*inner+i] = v
		}
	}
	l.store("y", y)
}

func runArgmax(l *launch) {
	outer, n, inner := l.reduceDims()
	x := l.load("x")
	y := l.mem[l.index("y")]
	for o := range outer {
		for i := range inner {
			best, bestV := -1, float32(0)
			for j := range n {
				v := x[(o*n+j)*inner+i]
				if v != v {
					continue
				}
				if best < 0 || v > bestV {
					best, bestV = j, v
				}
			}
			binary.LittleEndian.PutUint32(y[4*(o*inner+i):], uint32(max(best, 0)))
		}
	}
}

// Rows.

func runSoftmax(l *launch) {
	rows, cols := int(l.scalar("rows")), int(l.scalar("cols"))
	sq := int(l.scalar("causal"))
	logs := l.k.Op == "log_softmax"
	x := l.load("x")
	y := make([]float32, len(x))
	for r := range rows {
		row, out := x[r*cols:(r+1)*cols], y[r*cols:(r+1)*cols]
		live := cols
		if sq > 0 {
			live = r%sq + (cols - sq) + 1
		}
		m := float64(TreeMax(live, func(j int) float32 { return row[j] }))
		var s float64
		for _, v := range row[:live] {
			s += math.Exp(float64(v) - m)
		}
		for j, v := range row[:live] {
			if logs {
				out[j] = float32((float64(v) - m) - math.Log(s))
			} else {
				out[j] = float32(math.Exp(float64(v)-m) / s)
			}
		}
		for j := live; j < cols; j++ {
			if logs {
				out[j] = negInf
			} else {
				out[j] = 0
			}
		}
	}
	l.store("y", y)
}

// rsqrt32 is 1/sqrt(v), two correctly rounded float32 operations.
func rsqrt32(v float32) float32 { return 1 / fSqrt(v) }

func runLayernorm(l *launch) {
	rows, cols := int(l.scalar("rows")), int(l.scalar("cols"))
	eps := l.f32("eps")
	x, g, b := l.load("x"), l.load("gamma"), l.load("beta")
	n := float32(cols)
	d := make([]float32, cols)
	for r := range rows {
		row := x[r*cols : (r+1)*cols]
		mean := TreeSum(cols, func(j int) float32 { return row[j] }) / n
		for j, v := range row {
			d[j] = v - mean
		}
		variance := TreeSum(cols, func(j int) float32 { return float32(d[j] * d[j]) }) / n
		inv := rsqrt32(variance + eps)
		for j := range row {
			row[j] = float32(float32(d[j]*inv)*g[j]) + b[j]
		}
	}
	l.store("y", x)
}

func runRmsnorm(l *launch) {
	rows, cols := int(l.scalar("rows")), int(l.scalar("cols"))
	eps := l.f32("eps")
	x, g := l.load("x"), l.load("gamma")
	n := float32(cols)
	for r := range rows {
		row := x[r*cols : (r+1)*cols]
		ms := TreeSum(cols, func(j int) float32 { return float32(row[j] * row[j]) }) / n
		inv := rsqrt32(ms + eps)
		for j, v := range row {
			row[j] = float32(float32(v*inv) * g[j])
		}
	}
	l.store("y", x)
}

func runTranspose(l *launch) {
	var d, p, xs [4]int
	for i := range 4 {
		d[i] = int(l.scalar("d" + itoa(uint64(i))))
		p[i] = int(l.scalar("p" + itoa(uint64(i))))
	}
	s := 1
	for i := 3; i >= 0; i-- {
		xs[i] = s
		s *= d[i]
	}
	var e, es [4]int // y's dims and the x stride of each
	for i := range 4 {
		e[i], es[i] = d[p[i]], xs[p[i]]
	}
	x := l.load("x")
	y := make([]float32, len(x))
	n := 0
	for i0 := range e[0] {
		for i1 := range e[1] {
			for i2 := range e[2] {
				for i3 := range e[3] {
					y[n] = x[i0*es[0]+i1*es[1]+i2*es[2]+i3*es[3]]
					n++
				}
			}
		}
	}
	l.store("y", y)
}

func runGemm(l *launch) {
	m, n, k := int(l.scalar("M")), int(l.scalar("N")), int(l.scalar("K"))
	ta, tb := l.scalar("transA") == 1, l.scalar("transB") == 1
	alpha, beta := l.f32("alpha"), l.f32("beta")
	batch := int(l.scalar("batch"))
	sa, sb, sc := int(l.scalar("strideA")), int(l.scalar("strideB")), int(l.scalar("strideC"))
	a, b, c := l.load("A"), l.load("B"), l.load("C")
	for bi := range batch {
		ab, bb, cb := a[bi*sa:], b[bi*sb:], c[bi*sc:]
		for i := range m {
			for j := range n {
				var sum float32
				for p := range k {
					var av, bv float32
					if ta {
						av = ab[p*m+i]
					} else {
						av = ab[i*k+p]
					}
					if tb {
						bv = bb[j*k+p]
					} else {
						bv = bb[p*n+j]
					}
					sum = float32(sum + float32(av*bv))
				}
				v := float32(alpha * sum)
				if beta != 0 {
					v = float32(v + float32(beta*cb[i*n+j]))
				}
				cb[i*n+j] = v
			}
		}
	}
	l.store("C", c)
}

func runGather(l *launch) {
	rows, cols := int(l.scalar("rows")), int(l.scalar("cols"))
	table, idx, out := l.mem[0], l.mem[1], l.mem[2]
	w := 4 * cols
	for i := range len(idx) / 4 {
		r := int32(binary.LittleEndian.Uint32(idx[4*i:]))
		dst := out[i*w : (i+1)*w]
		if r < 0 || int(r) >= rows {
			clear(dst)
			continue
		}
		copy(dst, table[int(r)*w:(int(r)+1)*w])
	}
}

func runConv(l *launch) {
	g := func(name string) int { return int(l.scalar(name)) }
	nn, c, h, w, k, r, s, groups := g("N"), g("C"), g("H"), g("W"), g("K"), g("R"), g("S"), g("groups")
	sh, sw := halves(l.scalar("stride"))
	ph, pw := halves(l.scalar("pad"))
	dh, dw := halves(l.scalar("dil"))
	p := (h+2*int(ph)-int(dh)*(r-1)-1)/int(sh) + 1
	q := (w+2*int(pw)-int(dw)*(s-1)-1)/int(sw) + 1
	x, wt, bias := l.load("x"), l.load("w"), l.load("bias")
	y := make([]float32, nn*k*p*q)
	cg, kg := c/groups, k/groups
	for ni := range nn {
		for ki := range k {
			c0 := (ki / kg) * cg
			for pi := range p {
				for qi := range q {
					var sum float32
					for ci := range cg {
						for ri := range r {
							hi := pi*int(sh) - int(ph) + ri*int(dh)
							if hi < 0 || hi >= h {
								continue
							}
							for si := range s {
								wi := qi*int(sw) - int(pw) + si*int(dw)
								if wi < 0 || wi >= w {
									continue
								}
								xv := x[((ni*c+c0+ci)*h+hi)*w+wi]
								wv := wt[((ki*cg+ci)*r+ri)*s+si]
								sum = float32(sum + float32(xv*wv))
							}
						}
					}
					if len(bias) > 0 {
						sum = float32(sum + bias[ki])
					}
					y[((ni*k+ki)*p+pi)*q+qi] = sum
				}
			}
		}
	}
	l.store("y", y)
}

func runPool(l *launch) {
	g := func(name string) int { return int(l.scalar(name)) }
	nn, c, h, w, r, s := g("N"), g("C"), g("H"), g("W"), g("R"), g("S")
	sh, sw := halves(l.scalar("stride"))
	ph, pw := halves(l.scalar("pad"))
	p := (h+2*int(ph)-r)/int(sh) + 1
	q := (w+2*int(pw)-s)/int(sw) + 1
	isMax := l.k.Op == "maxpool2d"
	x := l.load("x")
	y := make([]float32, nn*c*p*q)
	for nc := range nn * c {
		plane := x[nc*h*w : (nc+1)*h*w]
		for pi := range p {
			for qi := range q {
				acc, count := float32(0), 0
				if isMax {
					acc = negInf
				}
				for ri := range r {
					hi := pi*int(sh) - int(ph) + ri
					if hi < 0 || hi >= h {
						continue
					}
					for si := range s {
						wi := qi*int(sw) - int(pw) + si
						if wi < 0 || wi >= w {
							continue
						}
						v := plane[hi*w+wi]
						if isMax {
							acc = fMax(acc, v)
						} else {
							acc = float32(acc + v)
						}
						count++
					}
				}
				if !isMax && count > 0 {
					acc /= float32(count)
				}
				y[(nc*p+pi)*q+qi] = acc
			}
		}
	}
	l.store("y", y)
}

func runCast(l *launch) {
	from, to := DType(l.scalar("from")), DType(l.scalar("to"))
	x, y := l.mem[0], l.mem[1]
	n := len(x) / from.Size()
	out := make([]byte, len(y))
	for i := range n {
		if from == I32 {
			v := int32(binary.LittleEndian.Uint32(x[4*i:]))
			switch to {
			case I32:
				binary.LittleEndian.PutUint32(out[4*i:], uint32(v))
			case BF16:
				binary.LittleEndian.PutUint16(out[2*i:], i32ToBF16(v))
			default:
				putFloat(out, to, i, float32(v))
			}
			continue
		}
		var f float32
		switch from {
		case F16:
			f = F16ToF32(binary.LittleEndian.Uint16(x[2*i:]))
		case BF16:
			f = BF16ToF32(binary.LittleEndian.Uint16(x[2*i:]))
		default:
			f = math.Float32frombits(binary.LittleEndian.Uint32(x[4*i:]))
		}
		if to == I32 {
			binary.LittleEndian.PutUint32(out[4*i:], uint32(f32ToI32(f)))
			continue
		}
		putFloat(out, to, i, f)
	}
	copy(y, out)
}

// putFloat stores f as value i of a float buffer of type t.
func putFloat(b []byte, t DType, i int, f float32) {
	switch t {
	case F16:
		binary.LittleEndian.PutUint16(b[2*i:], F32ToF16(f))
	case BF16:
		binary.LittleEndian.PutUint16(b[2*i:], F32ToBF16(f))
	default:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
}
