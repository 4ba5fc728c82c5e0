package stagehost

import "math"

// The device op library (docs/kernels.md): typed helpers that build its
// launches. A Tensor is a buffer range with a storage type and dims; an
// Ops collects launches (looking each program up once, by the name the
// op and the storage type make: "softmax", "gemm.bf16", "conv2d.fast")
// and submits them as one batch. The host checks every launch against its
// op's contract at submit; the helpers only derive the scalar arguments
// from the dims.

// DType is a storage type; the values are the cast op's dtype codes.
type DType uint8

// Storage types.
const (
	DTypeF32  DType = 0
	DTypeF16  DType = 1
	DTypeBF16 DType = 2
	DTypeI32  DType = 3
)

// Size is the size of one value in bytes.
func (d DType) Size() int {
	if d == DTypeF16 || d == DTypeBF16 {
		return 2
	}
	return 4
}

// suffix is the program-name suffix of the storage type.
func (d DType) suffix() string {
	switch d {
	case DTypeF16:
		return ".f16"
	case DTypeBF16:
		return ".bf16"
	}
	return ""
}

// Tensor is a typed, row-major view of a buffer range: the values start
// at byte Off of Buf.
type Tensor struct {
	Buf  Buffer
	Off  int
	Type DType
	Dims []int
}

// NewTensor is the tensor of dims values of type dt at byte off of b.
func NewTensor(b Buffer, off int, dt DType, dims ...int) Tensor {
	return Tensor{Buf: b, Off: off, Type: dt, Dims: dims}
}

// Len is the number of values: the product of the dims (1 for none).
func (t Tensor) Len() int {
	n := 1
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Bytes is the size of the range.
func (t Tensor) Bytes() int { return t.Len() * t.Type.Size() }

// Arg is the tensor's range as a launch argument.
func (t Tensor) Arg() Arg { return Buf(t.Buf, t.Off, t.Bytes()) }

// Reshape is the same range with other dims (of the same product: the
// host refuses a launch whose lengths do not fit).
func (t Tensor) Reshape(dims ...int) Tensor { t.Dims = dims; return t }

// Ops builds launches of the op library. The zero value is ready; reuse
// one for a call's launches, or keep one per instance (its program
// handles stay valid as long as the instance). Errors (a program the
// session may not use, dims a helper cannot map) are kept: the first one
// is returned by Submit and Err, and the launches after it are dropped.
type Ops struct {
	progs map[string]Program
	cmds  []Command
	err   error
}

// Err is the first error of the launches built since the last Submit.
func (o *Ops) Err() error { return o.err }

// Commands returns the launches built since the last Submit, to submit
// them another way or keep them (copy the slice: Ops reuses its storage
// after Submit).
func (o *Ops) Commands() []Command { return o.cmds }

// Submit enqueues the launches built so far on s as batches of at most
// MaxBatch (one stream_submit_batch each) and forgets them. It returns the
// first error of building them (enqueuing nothing) or of enqueuing.
func (o *Ops) Submit(s Stream) error {
	cmds, err := o.cmds, o.err
	o.cmds, o.err = o.cmds[:0], nil
	if err != nil {
		return err
	}
	for len(cmds) > 0 {
		n := min(len(cmds), MaxBatch)
		if err := s.SubmitBatch(cmds[:n]...); err != nil {
			return err
		}
		cmds = cmds[n:]
	}
	return nil
}

// Launch adds a launch of the program called name (any program).
func (o *Ops) Launch(name string, args ...Arg) *Ops {
	if o.err != nil {
		return o
	}
	p, ok := o.progs[name]
	if !ok {
		var err error
		if p, err = LookupProgram(name); err != nil {
			o.err = err
			return o
		}
		if o.progs == nil {
			o.progs = map[string]Program{}
		}
		o.progs[name] = p
	}
	o.cmds = append(o.cmds, Cmd(p, args...))
	return o
}

func (o *Ops) fail(op string) *Ops {
	if o.err == nil {
		o.err = &Error{Op: op, Status: StatusInvalidArgument}
	}
	return o
}

func u32arg(v int) Arg { return U64(uint64(v)) }

func (o *Ops) unary(op string, x, y Tensor) *Ops {
	return o.Launch(op+x.Type.suffix(), x.Arg(), y.Arg())
}

// Exp: y = e^x. y may be x.
func (o *Ops) Exp(x, y Tensor) *Ops { return o.unary("exp", x, y) }

// Log: y = ln x.
func (o *Ops) Log(x, y Tensor) *Ops { return o.unary("log", x, y) }

// Tanh: y = tanh x.
func (o *Ops) Tanh(x, y Tensor) *Ops { return o.unary("tanh", x, y) }

// Sigmoid: y = 1/(1+e^-x).
func (o *Ops) Sigmoid(x, y Tensor) *Ops { return o.unary("sigmoid", x, y) }

// GeluTanh: the tanh approximation of GELU (gelu_tanh).
func (o *Ops) GeluTanh(x, y Tensor) *Ops { return o.unary("gelu_tanh", x, y) }

// GeluErf: GELU with erf (gelu_erf).
func (o *Ops) GeluErf(x, y Tensor) *Ops { return o.unary("gelu_erf", x, y) }

// Silu: y = x·sigmoid(x).
func (o *Ops) Silu(x, y Tensor) *Ops { return o.unary("silu", x, y) }

// Rsqrt: y = 1/sqrt(x).
func (o *Ops) Rsqrt(x, y Tensor) *Ops { return o.unary("rsqrt", x, y) }

// Sqrt: y = sqrt(x).
func (o *Ops) Sqrt(x, y Tensor) *Ops { return o.unary("sqrt", x, y) }

// Neg: y = -x.
func (o *Ops) Neg(x, y Tensor) *Ops { return o.unary("neg", x, y) }

// Abs: y = |x|.
func (o *Ops) Abs(x, y Tensor) *Ops { return o.unary("abs", x, y) }

// Affine: y = a·x + b.
func (o *Ops) Affine(x, y Tensor, a, b float32) *Ops {
	return o.Launch("affine"+x.Type.suffix(), x.Arg(), y.Arg(), F32(a), F32(b))
}

// dims4 pads dims to 4 with leading 1s; false for more than 4.
func dims4(d []int) ([4]int, bool) {
	s := [4]int{1, 1, 1, 1}
	if len(d) > 4 {
		return s, false
	}
	copy(s[4-len(d):], d)
	return s, true
}

func (o *Ops) binary(op string, a, b, c Tensor) *Ops {
	as, ok1 := dims4(a.Dims)
	bs, ok2 := dims4(b.Dims)
	if !ok1 || !ok2 {
		return o.fail(op)
	}
	args := []Arg{a.Arg(), b.Arg(), c.Arg()}
	for _, d := range as {
		args = append(args, u32arg(d))
	}
	for _, d := range bs {
		args = append(args, u32arg(d))
	}
	return o.Launch(op+a.Type.suffix(), args...)
}

// Add: c = a + b, NumPy broadcasting over up to 4 dims (a's and b's dims
// are right-aligned).
func (o *Ops) Add(a, b, c Tensor) *Ops { return o.binary("add", a, b, c) }

// Sub: c = a - b, broadcast.
func (o *Ops) Sub(a, b, c Tensor) *Ops { return o.binary("sub", a, b, c) }

// Mul: c = a·b, broadcast.
func (o *Ops) Mul(a, b, c Tensor) *Ops { return o.binary("mul", a, b, c) }

// Div: c = a/b, broadcast.
func (o *Ops) Div(a, b, c Tensor) *Ops { return o.binary("div", a, b, c) }

// Max: c = max(a, b), broadcast; NaN propagates.
func (o *Ops) Max(a, b, c Tensor) *Ops { return o.binary("max", a, b, c) }

// Min: c = min(a, b), broadcast; NaN propagates.
func (o *Ops) Min(a, b, c Tensor) *Ops { return o.binary("min", a, b, c) }

// axisSplit views dims as [outer, n, inner] around axis.
func axisSplit(dims []int, axis int) (outer, n, inner int, ok bool) {
	if axis < 0 || axis >= len(dims) {
		return 0, 0, 0, false
	}
	outer, inner = 1, 1
	for _, d := range dims[:axis] {
		outer *= d
	}
	for _, d := range dims[axis+1:] {
		inner *= d
	}
	return outer, dims[axis], inner, true
}

func (o *Ops) reduce(op string, x, y Tensor, axis int) *Ops {
	outer, n, inner, ok := axisSplit(x.Dims, axis)
	if !ok {
		return o.fail(op)
	}
	return o.Launch(op+x.Type.suffix(), x.Arg(), y.Arg(), u32arg(outer), u32arg(n), u32arg(inner))
}

// ReduceSum: y = the sum of x along axis (the fixed reduction order).
func (o *Ops) ReduceSum(x, y Tensor, axis int) *Ops { return o.reduce("reduce_sum", x, y, axis) }

// ReduceMean: y = the mean of x along axis.
func (o *Ops) ReduceMean(x, y Tensor, axis int) *Ops { return o.reduce("reduce_mean", x, y, axis) }

// ReduceMax: y = the largest value of x along axis.
func (o *Ops) ReduceMax(x, y Tensor, axis int) *Ops { return o.reduce("reduce_max", x, y, axis) }

// ReduceArgmax: y (i32) = the first index of the largest value along axis.
func (o *Ops) ReduceArgmax(x, y Tensor, axis int) *Ops {
	return o.reduce("reduce_argmax", x, y, axis)
}

// rowsCols views dims as rows of the last dim.
func rowsCols(dims []int) (rows, cols int, ok bool) {
	if len(dims) == 0 {
		return 0, 0, false
	}
	rows = 1
	for _, d := range dims[:len(dims)-1] {
		rows *= d
	}
	return rows, dims[len(dims)-1], true
}

func (o *Ops) softmax(op string, x, y Tensor, causal int) *Ops {
	rows, cols, ok := rowsCols(x.Dims)
	if !ok {
		return o.fail(op)
	}
	return o.Launch(op+x.Type.suffix(), x.Arg(), y.Arg(), u32arg(rows), u32arg(cols), u32arg(causal))
}

// Softmax along the last dim. causal = 0: no mask; causal = Sq: row r is
// query r mod Sq, and columns after Sq's position (q + cols - Sq) are 0.
func (o *Ops) Softmax(x, y Tensor, causal int) *Ops { return o.softmax("softmax", x, y, causal) }

// LogSoftmax along the last dim (masked columns -Inf).
func (o *Ops) LogSoftmax(x, y Tensor, causal int) *Ops {
	return o.softmax("log_softmax", x, y, causal)
}

// Layernorm along the last dim: y = (x-mean)·rsqrt(var+eps)·gamma + beta.
func (o *Ops) Layernorm(x, gamma, beta, y Tensor, eps float32) *Ops {
	rows, cols, ok := rowsCols(x.Dims)
	if !ok {
		return o.fail("layernorm")
	}
	return o.Launch("layernorm"+x.Type.suffix(), x.Arg(), gamma.Arg(), beta.Arg(), y.Arg(), u32arg(rows), u32arg(cols), F32(eps))
}

// Rmsnorm along the last dim: y = x·rsqrt(mean(x²)+eps)·gamma.
func (o *Ops) Rmsnorm(x, gamma, y Tensor, eps float32) *Ops {
	rows, cols, ok := rowsCols(x.Dims)
	if !ok {
		return o.fail("rmsnorm")
	}
	return o.Launch("rmsnorm"+x.Type.suffix(), x.Arg(), gamma.Arg(), y.Arg(), u32arg(rows), u32arg(cols), F32(eps))
}

// Transpose: y = x with its dims permuted by perm (len(perm) == len(x.Dims)
// ≤ 4): y's dim i is x's dim perm[i].
func (o *Ops) Transpose(x, y Tensor, perm ...int) *Ops {
	d, ok := dims4(x.Dims)
	if !ok || len(perm) != len(x.Dims) {
		return o.fail("transpose")
	}
	k := 4 - len(perm)
	p := [4]int{0, 1, 2, 3}
	for i, v := range perm {
		p[k+i] = v + k
	}
	return o.Launch("transpose"+x.Type.suffix(), x.Arg(), y.Arg(),
		u32arg(d[0]), u32arg(d[1]), u32arg(d[2]), u32arg(d[3]), u32arg(p[0]), u32arg(p[1]), u32arg(p[2]), u32arg(p[3]))
}

// GemmOpts are gemm's options; the zero value is C = A·B.
type GemmOpts struct {
	// TransA: A is stored K×M; TransB: B is stored N×K.
	TransA, TransB bool
	// Alpha scales A·B; 0 means 1 unless AlphaSet. Beta scales C (0: C
	// is not read).
	Alpha, Beta float32
	AlphaSet    bool
	// Fast selects the fast tier (cuBLAS on CUDA).
	Fast bool
}

// Gemm: C_b = alpha·op(A_b)·op(B_b) + beta·C_b. A, B and C have 2 dims
// (one matrix) or 3 (a batch); a 2-dim A or B is used for every matrix of
// a batched C (stride 0). M and N come from C's last two dims, K from A.
func (o *Ops) Gemm(a, b, c Tensor, opt GemmOpts) *Ops {
	mat := func(t Tensor) (batch, r, cl int, ok bool) {
		switch len(t.Dims) {
		case 2:
			return 1, t.Dims[0], t.Dims[1], true
		case 3:
			return t.Dims[0], t.Dims[1], t.Dims[2], true
		}
		return 0, 0, 0, false
	}
	ba, ar, ac, ok1 := mat(a)
	bb, _, _, ok2 := mat(b)
	bc, m, n, ok3 := mat(c)
	if !ok1 || !ok2 || !ok3 || (ba != bc && ba != 1) || (bb != bc && bb != 1) {
		return o.fail("gemm")
	}
	k := ac
	if opt.TransA {
		k = ar
	}
	stride := func(t Tensor, batch int) int {
		if len(t.Dims) == 2 || batch == 1 && bc > 1 {
			return 0
		}
		return t.Dims[1] * t.Dims[2]
	}
	alpha := opt.Alpha
	if alpha == 0 && !opt.AlphaSet {
		alpha = 1
	}
	name := "gemm" + a.Type.suffix()
	if opt.Fast {
		name += ".fast"
	}
	return o.Launch(name, a.Arg(), b.Arg(), c.Arg(), u32arg(m), u32arg(n), u32arg(k),
		u32arg(b2i(opt.TransA)), u32arg(b2i(opt.TransB)), F32(alpha), F32(opt.Beta),
		u32arg(bc), u32arg(stride(a, ba)), u32arg(stride(b, bb)), u32arg(stride(c, bc)))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Gather: out row i = table row idx[i] (a row of zeros for an index
// outside the table). table is rows×cols f32, idx i32.
func (o *Ops) Gather(table, idx, out Tensor) *Ops {
	if len(table.Dims) != 2 {
		return o.fail("gather")
	}
	return o.Launch("gather", table.Arg(), idx.Arg(), out.Arg(), u32arg(table.Dims[0]), u32arg(table.Dims[1]))
}

// ConvOpts are conv2d's geometry; zero strides and dilations mean 1, zero
// groups 1.
type ConvOpts struct {
	Stride, Pad, Dil [2]int
	Groups           int
	// Fast selects the fast tier.
	Fast bool
}

func pair(v [2]int, def int) uint64 {
	if v[0] == 0 {
		v[0] = def
	}
	if v[1] == 0 {
		v[1] = def
	}
	return uint64(uint32(v[0])) | uint64(uint32(v[1]))<<32
}

// Conv2d: NCHW convolution. x is N×C×H×W, w K×(C/groups)×R×S, bias K
// values or a Tensor with no Dims (no bias), y N×K×P×Q.
func (o *Ops) Conv2d(x, w, bias, y Tensor, opt ConvOpts) *Ops {
	if len(x.Dims) != 4 || len(w.Dims) != 4 {
		return o.fail("conv2d")
	}
	g := max(opt.Groups, 1)
	b := Buf(w.Buf, w.Off, 0)
	if len(bias.Dims) > 0 {
		b = bias.Arg()
	}
	name := "conv2d"
	if opt.Fast {
		name += ".fast"
	}
	return o.Launch(name, x.Arg(), w.Arg(), b, y.Arg(),
		u32arg(x.Dims[0]), u32arg(x.Dims[1]), u32arg(x.Dims[2]), u32arg(x.Dims[3]),
		u32arg(w.Dims[0]), u32arg(w.Dims[2]), u32arg(w.Dims[3]),
		U64(pair(opt.Stride, 1)), U64(pair(opt.Pad, 0)), U64(pair(opt.Dil, 1)), u32arg(g))
}

func (o *Ops) pool(op string, x, y Tensor, window, stride, pad [2]int) *Ops {
	if len(x.Dims) != 4 {
		return o.fail(op)
	}
	return o.Launch(op, x.Arg(), y.Arg(), u32arg(x.Dims[0]), u32arg(x.Dims[1]), u32arg(x.Dims[2]), u32arg(x.Dims[3]),
		u32arg(window[0]), u32arg(window[1]), U64(pair(stride, 1)), U64(pair(pad, 0)))
}

// Maxpool2d: NCHW max pooling over window (R, S); zero strides mean 1.
func (o *Ops) Maxpool2d(x, y Tensor, window, stride, pad [2]int) *Ops {
	return o.pool("maxpool2d", x, y, window, stride, pad)
}

// Avgpool2d: NCHW average pooling (padding not counted).
func (o *Ops) Avgpool2d(x, y Tensor, window, stride, pad [2]int) *Ops {
	return o.pool("avgpool2d", x, y, window, stride, pad)
}

// Cast: y = x converted from x.Type to y.Type.
func (o *Ops) Cast(x, y Tensor) *Ops {
	return o.Launch("cast", x.Arg(), y.Arg(), u32arg(int(x.Type)), u32arg(int(y.Type)))
}

// Float32Bytes encodes values as little-endian float32s, the layout of an
// F32 tensor.
func Float32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		le32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// Float32s decodes little-endian float32s.
func Float32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
	}
	return v
}
