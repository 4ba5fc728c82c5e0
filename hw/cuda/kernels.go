package cuda

import (
	_ "embed"
	"math"
	"math/bits"
	"slices"
	"strings"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/internal/ops"
)

//go:generate sh kernels/gen.sh

// kernelsPTX is the module every device loads eagerly at Open.
//
//go:embed kernels/kernels.ptx
var kernelsPTX []byte

// argKind is what a program expects in one argument slot.
type argKind uint8

const (
	argF32s  argKind = iota + 1 // a buffer range of float32: 4-byte aligned, whole values
	argBytes                    // a buffer range of bytes
	argF32                      // a float32 scalar (hw.Float32; the low 32 bits)
	argU32                      // an unsigned scalar below 2^32
	argU64                      // any scalar
	argAny                      // a buffer range or a scalar (noop)
)

func (k argKind) String() string {
	switch k {
	case argF32s:
		return "a float32 buffer range"
	case argBytes:
		return "a buffer range"
	case argF32:
		return "a float32 scalar"
	case argU32:
		return "a uint32 scalar"
	case argU64:
		return "a scalar"
	case argAny:
		return "a buffer range or a scalar"
	}
	return "?"
}

func (k argKind) isBuffer() bool { return k == argF32s || k == argBytes }

// resolved is one validated argument: a device address and range length
// for a buffer, or the scalar.
type resolved struct {
	isBuf bool
	ptr   uint64 // device address of the range start
	len   uint64 // range length in bytes
	val   uint64 // scalar value
}

// launchShape is what a kernel's pack step decides besides parameters.
type launchShape struct {
	elems  uint64 // work items; the default grid covers them
	single bool   // exactly one block of `block` threads
	serial bool   // exactly one thread
}

// kernelID names a kernel of the module.
type kernelID uint8

const (
	kNoop kernelID = iota
	kFill
	kCopy
	kSaxpy
	kMatmul
	kBias
	kRelu
	kArgmax
	kMLPForward
	kFault
	kSpin
	kResident
	kOp // a program of the op library (ops.go)
)

// residentPayloadBytes is the least payload resident_gpu_exchange takes:
// the layout of package sessions/exchange's payload (exchange.PayloadSize):
// the GPU's control line (observed word at 0, credit at 4), the NPU's
// (observed at 64, credit at 68), then 16 float32 values at 128.
const residentPayloadBytes = 128 + 4*16

// mlpMaxWidth bounds mlp_forward's hidden and output widths: the kernel
// keeps both layers in shared memory (MLP_MAX_WIDTH in kernels.cu); the
// simulator takes the same bound.
const mlpMaxWidth = 1024

// kernel describes one program of the module: the arguments callers pass
// (validated by resolveArgs), and how pack turns them into the PTX
// parameters, in the order and width the PTX entry declares. The argument
// conventions are the simulator's (hw/sim), checked at Submit instead of
// when the kernel runs.
type kernel struct {
	id       kernelID
	name     string
	args     []arg
	variadic bool   // any number of argAny arguments (noop)
	block    uint32 // threads per block

	// Op library programs (kOp): the PTX entry (names with dots have
	// none of their own), the op code it takes, and the library's kernel.
	entry string
	code  uint64
	op    *ops.Kernel

	// For the reference (KernelInfos): a one-line description and the
	// further rules pack checks.
	doc         string
	constraints []string
}

// arg is one argument slot of a kernel: what resolveArgs accepts, and its
// name, direction ("in", "out", "inout") and length rule for KernelInfos.
type arg struct {
	kind      argKind
	name, dir string
	len       string
}

// in, out and inout are argument slots; scalars are "in".
func in(k argKind, name, length string) arg    { return arg{k, name, "in", length} }
func out(k argKind, name, length string) arg   { return arg{k, name, "out", length} }
func inout(k argKind, name, length string) arg { return arg{k, name, "inout", length} }
func sc(k argKind, name string) arg            { return arg{k, name, "in", ""} }

// info is k's description.
func (k *kernel) info() hw.KernelInfo {
	if k.op != nil {
		return opInfo(k.op)
	}
	ki := hw.KernelInfo{Name: k.name, Doc: k.doc, Variadic: k.variadic, Constraints: slices.Clone(k.constraints)}
	for _, a := range k.args {
		ka := hw.KernelArg{Name: a.name, Kind: hw.KindScalar, Dir: a.dir, Len: a.len}
		if a.kind.isBuffer() {
			ka.Kind = hw.KindBuffer
		}
		switch a.kind {
		case argF32s, argF32:
			ka.Type = "f32"
		case argBytes:
			ka.Type = "bytes"
		case argU32:
			ka.Type = "u32"
		case argU64:
			ka.Type = "u64"
		}
		ki.Args = append(ki.Args, ka)
	}
	return ki
}

// KernelInfos describes the kernels of the module, sorted by name. It
// needs no GPU or driver.
func KernelInfos() []hw.KernelInfo {
	infos := make([]hw.KernelInfo, 0, len(kernels))
	for _, k := range kernels {
		infos = append(infos, k.info())
	}
	slices.SortFunc(infos, func(a, b hw.KernelInfo) int { return strings.Compare(a.Name, b.Name) })
	return infos
}

const defaultBlock = 256

// maxGridBlocks bounds the default grid; grid-stride loops cover the rest.
const maxGridBlocks = 1 << 16

// ptxEntry is the kernel's entry in the module.
func (k *kernel) ptxEntry() string {
	if k.entry != "" {
		return k.entry
	}
	return k.name
}

// fastGemm reports whether k is a fast-tier gemm (cuBLAS when loaded).
func (k *kernel) fastGemm() bool { return k.op != nil && k.op.Fast && k.op.Op == "gemm" }

// kernels are the module's own programs, then the op library's.
var kernels = append(baseKernels, opKernels()...)

var baseKernels = []*kernel{
	{id: kNoop, name: "noop", variadic: true, block: 1,
		doc: "Does nothing; accepts and ignores any arguments."},
	{id: kFill, name: "fill", block: defaultBlock,
		args: []arg{out(argF32s, "buf", ""), sc(argF32, "value")},
		doc:  "Sets every float32 of buf to value."},
	{id: kCopy, name: "copy", block: defaultBlock,
		args:        []arg{out(argBytes, "dst", "len(src) bytes"), in(argBytes, "src", "")},
		doc:         "Copies src's bytes into dst.",
		constraints: []string{"dst and src may overlap."}},
	{id: kSaxpy, name: "saxpy", block: defaultBlock,
		args: []arg{sc(argF32, "a"), in(argF32s, "x", "len(y) values"), inout(argF32s, "y", "")},
		doc:  "y[i] = a*x[i] + y[i], the product rounded before the add."},
	{id: kMatmul, name: "matmul", block: defaultBlock,
		args: []arg{in(argF32s, "A", "M*K values"), in(argF32s, "B", "K*N values"), out(argF32s, "C", "M*N values"),
			sc(argU32, "M"), sc(argU32, "N"), sc(argU32, "K")},
		doc:         "C = A·B, row-major; each C[i][j] summed from 0 over k in order.",
		constraints: []string{"C must not overlap A or B."}},
	{id: kBias, name: "bias", block: defaultBlock,
		args: []arg{inout(argF32s, "x", "M*N values"), in(argF32s, "b", "N values"), sc(argU32, "M"), sc(argU32, "N")},
		doc:  "x[i][j] += b[j] for an M×N row-major x."},
	{id: kRelu, name: "relu", block: defaultBlock,
		args: []arg{inout(argF32s, "x", "")},
		doc:  "x[i] = max(x[i], 0): negative values (not -0 or NaN) become 0."},
	{id: kArgmax, name: "argmax", block: 256,
		args:        []arg{in(argF32s, "x", "1 to 2^32-1 values"), out(argBytes, "out", "at least 8 bytes")},
		doc:         "Writes the index (u32 LE) and float32 bits (LE) of x's first largest value into out.",
		constraints: []string{"NaN never compares larger."}},
	{id: kMLPForward, name: "mlp_forward", block: 256,
		args: []arg{in(argF32s, "x", "I values"), in(argF32s, "W1", "I*H values"), in(argF32s, "b1", "H values"),
			in(argF32s, "W2", "H*C values"), in(argF32s, "b2", "C values"), out(argF32s, "scores", "C values"),
			out(argBytes, "out", "at least 8 bytes"), sc(argU32, "I"), sc(argU32, "H"), sc(argU32, "C")},
		doc: "A two-layer perceptron on one row in one launch: scores = relu(x·W1 + b1)·W2 + b2, out = argmax(scores).",
		constraints: []string{
			"I ≥ 1 and 1 ≤ H, C ≤ 1024.",
			"scores and out overlap neither each other nor any input.",
			"Bit for bit the six launches matmul, bias, relu, matmul, bias, argmax.",
		}},
	{id: kFault, name: "fault", block: 1,
		doc: "A test kernel: stores through an unmapped address, provoking CUDA_ERROR_ILLEGAL_ADDRESS (sticky, context-wide)."},
	{id: kSpin, name: "spin", block: 1,
		args:        []arg{in(argBytes, "buf", "at least off+4 bytes"), sc(argU64, "off"), sc(argU32, "want")},
		doc:         "A test kernel: polls the uint32 at byte offset off of buf until it equals want, or the device is lost.",
		constraints: []string{"The word at off is 4-byte aligned."}},
	{id: kResident, name: "resident_gpu_exchange", block: 1,
		args: []arg{in(argBytes, "line", "at least 4 bytes, 4-byte aligned"), inout(argBytes, "payload", "at least 192 bytes, 4-byte aligned"),
			sc(argU32, "rounds")},
		doc:         "The GPU side of a resident GPU–NPU session: waits for the startup word, then exchanges the payload with the NPU.",
		constraints: []string{"payload does not overlap line."}},
}

func f32words(r resolved) uint64 { return r.len / 4 }

// pack writes k's parameters into p (64-bit slots; 32-bit parameters use
// the low half, which is what cuLaunchKernel reads on this little-endian
// host) and returns their count and the launch shape. It checks the sizes
// the scalars imply against the buffer ranges. a has been validated
// against k.args. (A switch, not per-kernel closures, so that nothing
// escapes and Submit stays allocation-free.)
func pack(k *kernel, a []resolved, p *[maxParams]uint64) (int, launchShape, error) {
	switch k.id {
	case kNoop, kFault:
		return 0, launchShape{elems: 1, single: true}, nil
	case kFill:
		n := f32words(a[0])
		p[0], p[1], p[2] = a[0].ptr, a[1].val&math.MaxUint32, n
		return 3, launchShape{elems: n}, nil
	case kCopy:
		if a[0].len != a[1].len {
			return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"cuda: copy: dst has %d bytes, src %d", a[0].len, a[1].len)
		}
		n := a[0].len
		p[0], p[1], p[2] = a[0].ptr, a[1].ptr, n
		// Overlapping ranges: one thread copies in the safe direction.
		overlap := n > 0 && a[0].ptr < a[1].ptr+n && a[1].ptr < a[0].ptr+n
		return 3, launchShape{elems: n, serial: overlap}, nil
	case kSaxpy:
		if a[1].len != a[2].len {
			return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"cuda: saxpy: x has %d values, y %d", f32words(a[1]), f32words(a[2]))
		}
		n := f32words(a[2])
		p[0], p[1], p[2], p[3] = a[0].val&math.MaxUint32, a[1].ptr, a[2].ptr, n
		return 4, launchShape{elems: n}, nil
	case kMatmul:
		m, n, kk := a[3].val, a[4].val, a[5].val
		if err := exactF32s(k.name, 0, a[0], m, kk); err != nil {
			return 0, launchShape{}, err
		}
		if err := exactF32s(k.name, 1, a[1], kk, n); err != nil {
			return 0, launchShape{}, err
		}
		if err := exactF32s(k.name, 2, a[2], m, n); err != nil {
			return 0, launchShape{}, err
		}
		p[0], p[1], p[2], p[3], p[4], p[5] = a[0].ptr, a[1].ptr, a[2].ptr, m, n, kk
		return 6, launchShape{elems: m * n}, nil
	case kBias:
		m, n := a[2].val, a[3].val
		if err := exactF32s(k.name, 0, a[0], m, n); err != nil {
			return 0, launchShape{}, err
		}
		if err := exactF32s(k.name, 1, a[1], 1, n); err != nil {
			return 0, launchShape{}, err
		}
		p[0], p[1], p[2], p[3] = a[0].ptr, a[1].ptr, m, n
		return 4, launchShape{elems: m * n}, nil
	case kRelu:
		n := f32words(a[0])
		p[0], p[1] = a[0].ptr, n
		return 2, launchShape{elems: n}, nil
	case kArgmax:
		n := f32words(a[0])
		if n == 0 || n > math.MaxUint32 {
			return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"cuda: argmax: argument 0 has %d values (want 1 to 2^32-1)", n)
		}
		if a[1].len < 8 {
			return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"cuda: argmax: argument 1 has %d bytes, want at least 8 (index, max)", a[1].len)
		}
		p[0], p[1], p[2] = a[0].ptr, a[1].ptr, n
		return 3, launchShape{elems: n, single: true}, nil
	case kMLPForward:
		return packMLPForward(a, p)
	case kOp:
		n, shape := packOp(k, a, p)
		return n, shape, nil
	case kSpin:
		off := a[1].val
		if a[0].len < 4 || off > a[0].len-4 {
			return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"cuda: spin: offset %d outside a %d-byte range", off, a[0].len)
		}
		if (a[0].ptr+off)%4 != 0 {
			return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"cuda: spin: word at offset %d is not 4-byte aligned", off)
		}
		p[0], p[1], p[2] = a[0].ptr, off, a[2].val&math.MaxUint32
		return 3, launchShape{elems: 1, single: true}, nil
	case kResident:
		line, pay := a[0], a[1]
		if line.len < 4 || line.ptr%4 != 0 {
			return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"cuda: resident_gpu_exchange: argument 0 (startup word) needs 4 aligned bytes, got %d at %#x", line.len, line.ptr)
		}
		if pay.len < residentPayloadBytes || pay.ptr%4 != 0 {
			return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"cuda: resident_gpu_exchange: argument 1 (payload) needs %d aligned bytes, got %d", residentPayloadBytes, pay.len)
		}
		// The kernel writes the payload: it must not reach the line it
		// may only read.
		if pay.ptr < line.ptr+line.len && line.ptr < pay.ptr+residentPayloadBytes {
			return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"cuda: resident_gpu_exchange: the payload overlaps the startup line")
		}
		p[0], p[1], p[2] = line.ptr, pay.ptr, a[2].val&math.MaxUint32
		return 3, launchShape{elems: 1, single: true}, nil
	}
	return 0, launchShape{}, errdefs.Errorf(errdefs.ErrNotFound, "cuda: kernel %q has no parameter table", k.name)
}

// packMLPForward checks mlp_forward(x, W1, b1, W2, b2, scores, out, I, H,
// C) as the simulator does: 1 ≤ I, 1 ≤ H, C ≤ mlpMaxWidth; x 1×I, W1 I×H,
// b1 1×H, W2 H×C, b2 and scores 1×C float32 values exactly; out at least 8
// bytes; scores and out overlapping neither each other nor an input (the
// kernel reads the inputs while other threads write the outputs).
func packMLPForward(a []resolved, p *[maxParams]uint64) (int, launchShape, error) {
	const name = "mlp_forward"
	in, hid, cls := a[7].val, a[8].val, a[9].val
	if in == 0 || in > math.MaxInt32 || hid == 0 || hid > mlpMaxWidth || cls == 0 || cls > mlpMaxWidth {
		return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
			"cuda: mlp_forward: I=%d H=%d C=%d: want I ≥ 1 and 1 ≤ H, C ≤ %d", in, hid, cls, mlpMaxWidth)
	}
	shapes := [6][2]uint64{{1, in}, {in, hid}, {1, hid}, {hid, cls}, {1, cls}, {1, cls}}
	for i, sh := range shapes {
		if err := exactF32s(name, i, a[i], sh[0], sh[1]); err != nil {
			return 0, launchShape{}, err
		}
	}
	if a[6].len < 8 {
		return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
			"cuda: mlp_forward: argument 6 has %d bytes, want at least 8 (index, max)", a[6].len)
	}
	for _, o := range [...]int{5, 6} {
		for i := range 7 {
			if i != o && rangesOverlap(a[o], a[i]) {
				return 0, launchShape{}, errdefs.Errorf(errdefs.ErrInvalidArgument,
					"cuda: mlp_forward: argument %d (an output) overlaps argument %d", o, i)
			}
		}
	}
	for i := range 7 {
		p[i] = a[i].ptr
	}
	p[7], p[8], p[9] = in, hid, cls
	return 10, launchShape{elems: hid, single: true}, nil
}

// rangesOverlap reports whether two non-empty device ranges share bytes.
func rangesOverlap(x, y resolved) bool {
	return x.len > 0 && y.len > 0 && x.ptr < y.ptr+y.len && y.ptr < x.ptr+x.len
}

// kernelByName indexes kernels.
var kernelByName = func() map[string]*kernel {
	m := make(map[string]*kernel, len(kernels))
	for _, k := range kernels {
		m[k.name] = k
	}
	return m
}()

// exactF32s checks that buffer argument i of prog holds exactly rows×cols
// float32 values.
func exactF32s(prog string, i int, r resolved, rows, cols uint64) error {
	hi, elems := bits.Mul64(rows, cols)
	hi2, need := bits.Mul64(elems, 4)
	if hi != 0 || hi2 != 0 || need != r.len {
		return errdefs.Errorf(errdefs.ErrInvalidArgument,
			"cuda: %s: argument %d has %d bytes, want %d×%d float32 values", prog, i, r.len, rows, cols)
	}
	return nil
}

// bufferOf returns the backend buffer behind b, or an error naming arg i.
func (d *Device) bufferOf(b hw.Buffer, i int) (*buffer, error) {
	buf, ok := b.(*buffer)
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: argument %d: buffer %T is not a CUDA buffer", i, b)
	}
	if buf.dev != d {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: argument %d: buffer belongs to %s, not %s", i, buf.dev.name, d.name)
	}
	if buf.isFreed() {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "cuda: argument %d: buffer was freed", i)
	}
	return buf, nil
}

// checkRange validates [off, off+length) against a buffer of size bytes.
func checkRange(i int, off, length, size int) error {
	if off < 0 || length < 0 || off > size || length > size-off {
		return errdefs.Errorf(errdefs.ErrInvalidArgument,
			"cuda: argument %d: range [%d,+%d) outside buffer of %d bytes", i, off, length, size)
	}
	return nil
}

// resolveArgs validates cmd's arguments against k and d, and converts
// them. It allocates nothing on success.
func (d *Device) resolveArgs(k *kernel, args []hw.Arg, out *[hw.MaxArgs]resolved) error {
	if k.op != nil {
		return d.resolveOpArgs(k, args, out)
	}
	if !k.variadic && len(args) != len(k.args) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s takes %d argument(s), got %d", k.name, len(k.args), len(args))
	}
	for i, a := range args {
		want := argAny
		if !k.variadic {
			want = k.args[i].kind
		}
		r := &out[i]
		*r = resolved{}
		if a.Buffer != nil {
			if !want.isBuffer() && want != argAny {
				return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: argument %d must be %s, got a buffer", k.name, i, want)
			}
			buf, err := d.bufferOf(a.Buffer, i)
			if err != nil {
				return err
			}
			if err := checkRange(i, a.Offset, a.Length, buf.size); err != nil {
				return err
			}
			// float32 accesses must be aligned, or the device faults
			// with a sticky CUDA_ERROR_MISALIGNED_ADDRESS.
			if want == argF32s && (a.Offset%4 != 0 || a.Length%4 != 0) {
				return errdefs.Errorf(errdefs.ErrInvalidArgument,
					"cuda: %s: argument %d: range [%d,+%d) is not 4-byte aligned whole float32 values", k.name, i, a.Offset, a.Length)
			}
			r.isBuf = true
			r.ptr = uint64(buf.ptr) + uint64(a.Offset)
			r.len = uint64(a.Length)
			continue
		}
		switch want {
		case argF32s, argBytes:
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: argument %d must be %s, got a scalar", k.name, i, want)
		case argU32:
			if a.Value > math.MaxUint32 {
				return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: argument %d must be %s, got %#x", k.name, i, want, a.Value)
			}
		}
		r.val = a.Value
	}
	return nil
}

// launch is a validated, packed kernel launch, or a cuBLAS gemm (blas:
// params hold gemm's 14 arguments, dtype cuBLAS's data type).
type launch struct {
	blas    bool
	dtype   int32
	fn      cuFunction
	grid    [3]uint32
	block   [3]uint32
	nparams int
	params  [maxParams]uint64
	shared  uint32 // dynamic shared memory (vendor kernels)
}

// prepareLaunch validates cmd for device d and packs it into l.
func (d *Device) prepareLaunch(cmd *hw.Command, l *launch) error {
	if cmd == nil || cmd.Program == nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: command has no program")
	}
	prog, ok := cmd.Program.(*program)
	if !ok {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: program %T is not a CUDA program", cmd.Program)
	}
	if prog.dev != d {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: program %s belongs to %s, not %s", prog.k.name, prog.dev.name, d.name)
	}
	if len(cmd.Args) > hw.MaxArgs {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %d arguments, at most %d", len(cmd.Args), hw.MaxArgs)
	}
	if prog.vendor != nil {
		return d.prepareVendorLaunch(prog, cmd, l)
	}
	l.shared = 0
	var res [hw.MaxArgs]resolved
	if err := d.resolveArgs(prog.k, cmd.Args, &res); err != nil {
		return err
	}
	n, shape, err := pack(prog.k, res[:len(cmd.Args)], &l.params)
	if err != nil {
		return err
	}
	l.fn = prog.fn
	l.nparams = n
	l.block, l.grid = launchDims(prog.k, shape, cmd.Grid)
	l.blas, l.dtype = false, 0
	if prog.k.fastGemm() && d.fastBLAS() != nil {
		l.blas, l.dtype = true, blasType(prog.k.op.DType)
	}
	return nil
}

// launchDims sizes a launch. Every kernel is one-dimensional and loops
// grid-stride, so any grid computes the whole result; Grid[1] and Grid[2]
// are ignored (more blocks in y or z would repeat the work). Single-block
// kernels ignore Grid. Otherwise a non-zero Grid[0] is a thread count,
// rounded up to whole blocks; a zero one covers the element count, capped
// at maxGridBlocks blocks.
func launchDims(k *kernel, shape launchShape, grid [3]uint32) (block, blocks [3]uint32) {
	block = [3]uint32{k.block, 1, 1}
	if shape.serial {
		return [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}
	}
	if shape.single {
		return block, [3]uint32{1, 1, 1}
	}
	threads := shape.elems
	limit := uint64(maxGridBlocks)
	if grid[0] != 0 {
		threads = uint64(grid[0])
		limit = math.MaxInt32
	}
	nb := (threads + uint64(k.block) - 1) / uint64(k.block)
	nb = min(max(nb, 1), limit)
	return block, [3]uint32{uint32(nb), 1, 1}
}
