package cuda

import (
	"math"
	"strings"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/internal/ops"
)

// The op library (package hw/internal/ops) on CUDA: every program of the
// library is a kernel of the module (kernels/kernels.cu), validated at
// Submit by the library's own rules (ops.Kernel.Validate) and then packed
// into the PTX entry's parameters here. The fast tier of gemm calls
// cuBLAS (blas.go) when libcublas loads, and the exact kernel otherwise;
// conv2d's fast tier is the exact kernel.

// Unary op codes of unary_* (U_* in kernels.cu).
var unaryCodes = map[string]uint64{
	"exp": 0, "log": 1, "tanh": 2, "sigmoid": 3, "gelu_tanh": 4, "gelu_erf": 5,
	"silu": 6, "rsqrt": 7, "sqrt": 8, "neg": 9, "abs": 10,
}

// Binary op codes of binary_* (B_* in kernels.cu).
var binaryCodes = map[string]uint64{"add": 0, "sub": 1, "mul": 2, "div": 3, "max": 4, "min": 5}

// Reduction op codes of reduce_* (R_* in kernels.cu).
var reduceCodes = map[string]uint64{"reduce_sum": 0, "reduce_mean": 1, "reduce_max": 2, "reduce_argmax": 3}

// Bound is a bounded op's stated error on CUDA: a result y with float64
// reference r (the op computed in float64 from the same float32 inputs,
// then rounded once to the storage type) satisfies
//
//	|y - r| ≤ ULPs·ulp(r) + Abs
//
// where ulp(r) is the spacing of the storage type at |r| (the smallest
// subnormal's spacing below the normal range). Equal infinities, and NaN
// for NaN, count as exact.
type Bound struct {
	ULPs float64
	Abs  float64
}

// OpBounds are the CUDA error bounds of the bounded ops, float32 storage
// (tested in ops_gpu_test.go). CUDA's float32 functions have documented
// maximum errors (CUDA C Programming Guide, "Mathematical Functions"):
// expf 2 ulp, logf 1 ulp, tanhf 2 ulp, erfcf 4 ulp; the rest is derived
// from the formulas in kernels.cu. softmax and log_softmax: see
// SoftmaxBound. With f16 or bf16 storage every bounded op is within 1 ulp
// of the storage type (the float32 result, within these bounds, is
// rounded once), plus the same Abs.
var OpBounds = map[string]Bound{
	"exp":       {ULPs: 2},
	"log":       {ULPs: 1},
	"tanh":      {ULPs: 2},
	"sigmoid":   {ULPs: 4, Abs: 0x1p-140},
	"silu":      {ULPs: 5, Abs: 0x1p-140},
	"gelu_tanh": {ULPs: 6, Abs: 0x1p-126},
	"gelu_erf":  {ULPs: 8, Abs: 0x1p-126},
}

// SoftmaxBound is the bound of softmax and log_softmax on CUDA for a row
// of cols values: each lane sums its exponentials in order and the tree
// adds 8 levels, so the row sum's relative error is at most
// (cols/256 + 8)·2^-24 (plus expf's 2 ulp); softmax is within
// (cols/256 + 16) ulp of the float64 result (plus 2^-126 absolute, for
// results that underflow), log_softmax within 4 ulp plus
// (cols/256 + 16)·2^-24 absolute (ln of the sum's relative error).
func SoftmaxBound(op string, cols int) Bound {
	k := float64(cols)/256 + 16
	if op == "log_softmax" {
		return Bound{ULPs: 4, Abs: k * 0x1p-24}
	}
	return Bound{ULPs: k, Abs: 0x1p-126}
}

// FastGemmBound is the fast tier's stated error on CUDA (cuBLAS, float32
// compute, no TF32): every C value is within
//
//	(K + 4)·2^-23·(|alpha|·Σk |a_ik·b_kj| + |beta·c_ij|)
//
// of the exact result, plus one rounding of the storage type (2^-11
// relative for f16, 2^-8 for bf16). cuBLAS may sum in any order and fuse
// multiply-adds; f16 and bf16 products are exact in float32.
func FastGemmBound(k int) float64 { return float64(k+4) * 0x1p-23 }

// opEntry is the PTX entry of an op kernel, and its op code.
func opEntry(k *ops.Kernel) (entry string, code uint64) {
	suf := k.DType.String()
	width := "b32"
	if k.DType == ops.F16 || k.DType == ops.BF16 {
		width = "b16"
	}
	if code, ok := unaryCodes[k.Op]; ok {
		return "unary_" + suf, code
	}
	switch op := k.Op; {
	case op == "affine":
		return "affine_" + suf, 0
	case op == "add" || op == "sub" || op == "mul" || op == "div" || op == "max" || op == "min":
		return "binary_" + suf, binaryCodes[op]
	case strings.HasPrefix(op, "reduce_"):
		return "reduce_" + suf, reduceCodes[op]
	case op == "softmax":
		return "softmax_" + suf, 0
	case op == "log_softmax":
		return "softmax_" + suf, 1
	case op == "layernorm" || op == "rmsnorm" || op == "gemm":
		return op + "_" + suf, 0
	case op == "transpose":
		return "permute_" + width, 0
	case op == "gather":
		return "gather_b32", 0 // float32 only
	case op == "conv2d":
		return "conv2d_f32", 0
	case op == "maxpool2d":
		return "pool2d_f32", 0
	case op == "avgpool2d":
		return "pool2d_f32", 1
	case op == "cast":
		return "cast", 0
	}
	return "", 0
}

// opKernels is a kernel for every program of the op library.
func opKernels() []*kernel {
	var ks []*kernel
	for _, ok := range ops.Kernels() {
		entry, code := opEntry(ok)
		if entry == "" {
			panic("cuda: no kernel for op program " + ok.Name)
		}
		ks = append(ks, &kernel{id: kOp, name: ok.Name, entry: entry, code: code, op: ok, block: defaultBlock})
	}
	return ks
}

// opInfo describes an op program from the library's table.
func opInfo(k *ops.Kernel) hw.KernelInfo {
	in := k.Info()
	ki := hw.KernelInfo{Name: in.Name, Doc: in.Doc, Constraints: in.Constraints}
	for _, a := range in.Args {
		ki.Args = append(ki.Args, hw.KernelArg{Name: a.Name, Kind: a.Kind, Type: a.Type, Dir: a.Dir, Len: a.Len})
	}
	setTier(&ki, in)
	return ki
}

// resolveOpArgs resolves an op program's arguments (device ownership and
// ranges) and validates them with the library's rules.
func (d *Device) resolveOpArgs(k *kernel, args []hw.Arg, res *[hw.MaxArgs]resolved) error {
	var oa [hw.MaxArgs]ops.Arg // stays on the stack: Validate keeps no reference
	for i, a := range args {
		r := &res[i]
		*r = resolved{}
		if a.Buffer != nil {
			buf, err := d.bufferOf(a.Buffer, i)
			if err != nil {
				return err
			}
			if err := checkRange(i, a.Offset, a.Length, buf.size); err != nil {
				return err
			}
			r.isBuf, r.ptr, r.len = true, uint64(buf.ptr)+uint64(a.Offset), uint64(a.Length)
			oa[i] = ops.Arg{Buffer: true, Addr: r.ptr, Len: r.len}
			continue
		}
		r.val = a.Value
		oa[i] = ops.Arg{Value: a.Value}
	}
	if err := k.op.Validate(oa[:len(args)]); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %w", err)
	}
	return nil
}

// packOp turns validated op arguments into the PTX entry's parameters
// (the order and widths of its declaration in kernels.cu).
func packOp(k *kernel, a []resolved, p *[maxParams]uint64) (int, launchShape) {
	ok := k.op
	es := uint64(ok.DType.Size())
	u := func(v uint64) uint64 { return v & math.MaxUint32 }
	switch ok.Op {
	case "affine":
		n := a[0].len / es
		p[0], p[1], p[2], p[3], p[4] = a[0].ptr, a[1].ptr, n, u(a[2].val), u(a[3].val)
		return 5, launchShape{elems: n}
	case "add", "sub", "mul", "div", "max", "min":
		var ad, bd, cd [4]uint64
		for i := range 4 {
			ad[i], bd[i] = a[3+i].val, a[7+i].val
			cd[i] = max(ad[i], bd[i])
		}
		sa, sb := bcastStrides(ad), bcastStrides(bd)
		if ad == bd {
			// No broadcasting: one dim, which the kernel loops over
			// without index arithmetic.
			n := cd[0] * cd[1] * cd[2] * cd[3]
			cd, sa, sb = [4]uint64{1, 1, 1, n}, [4]uint64{0, 0, 0, 1}, [4]uint64{0, 0, 0, 1}
		}
		p[0], p[1], p[2], p[3] = a[0].ptr, a[1].ptr, a[2].ptr, k.code
		copy(p[4:8], cd[:])
		copy(p[8:12], sa[:])
		copy(p[12:16], sb[:])
		return 16, launchShape{elems: cd[0] * cd[1] * cd[2] * cd[3]}
	case "reduce_sum", "reduce_mean", "reduce_max", "reduce_argmax":
		outer, n, inner := a[2].val, a[3].val, a[4].val
		p[0], p[1], p[2], p[3], p[4], p[5] = a[0].ptr, a[1].ptr, outer, n, inner, k.code
		return 6, launchShape{elems: outer * inner * defaultBlock}
	case "softmax", "log_softmax":
		rows := a[2].val
		p[0], p[1], p[2], p[3], p[4], p[5] = a[0].ptr, a[1].ptr, rows, a[3].val, a[4].val, k.code
		return 6, rowShape(rows, a[3].val)
	case "layernorm":
		rows := a[4].val
		p[0], p[1], p[2], p[3], p[4], p[5], p[6] = a[0].ptr, a[1].ptr, a[2].ptr, a[3].ptr, rows, a[5].val, u(a[6].val)
		return 7, rowShape(rows, a[5].val)
	case "rmsnorm":
		rows := a[3].val
		p[0], p[1], p[2], p[3], p[4], p[5] = a[0].ptr, a[1].ptr, a[2].ptr, rows, a[4].val, u(a[5].val)
		return 6, rowShape(rows, a[4].val)
	case "transpose":
		var dd, perm [4]uint64
		for i := range 4 {
			dd[i], perm[i] = a[2+i].val, a[6+i].val
		}
		xs := [4]uint64{dd[1] * dd[2] * dd[3], dd[2] * dd[3], dd[3], 1}
		p[0], p[1] = a[0].ptr, a[1].ptr
		n := uint64(1)
		for i := range 4 {
			p[2+i] = dd[perm[i]]
			p[6+i] = xs[perm[i]]
			n *= dd[i]
		}
		return 10, launchShape{elems: n}
	case "gemm":
		m, n, batch := a[3].val, a[4].val, a[10].val
		for i := range 14 {
			if i < 3 {
				p[i] = a[i].ptr
			} else {
				p[i] = u(a[i].val)
			}
		}
		tiles := batch * ((m + 63) / 64) * ((n + 63) / 64)
		return 14, launchShape{elems: tiles * defaultBlock}
	case "gather":
		rows, cols := a[3].val, a[4].val
		nidx := a[1].len / 4
		p[0], p[1], p[2], p[3], p[4], p[5] = a[0].ptr, a[1].ptr, a[2].ptr, rows, cols, nidx
		return 6, launchShape{elems: nidx * cols}
	case "conv2d":
		for i := range 4 {
			p[i] = a[i].ptr
		}
		if a[2].len == 0 {
			p[2] = 0 // no bias
		}
		for i := 4; i < 15; i++ {
			p[i] = a[i].val
		}
		h, w, r, s := a[6].val, a[7].val, a[9].val, a[10].val
		pp, q := convOut(h, r, a[11].val, a[12].val, a[13].val), convOut(w, s, a[11].val>>32, a[12].val>>32, a[13].val>>32)
		p[15], p[16] = pp, q
		return 17, launchShape{elems: a[4].val * a[8].val * pp * q}
	case "maxpool2d", "avgpool2d":
		p[0], p[1] = a[0].ptr, a[1].ptr
		for i := 2; i < 10; i++ {
			p[i] = a[i].val
		}
		h, w, r, s := a[4].val, a[5].val, a[6].val, a[7].val
		pp, q := convOut(h, r, a[8].val, a[9].val, 1), convOut(w, s, a[8].val>>32, a[9].val>>32, 1)
		p[10], p[11], p[12] = pp, q, k.code
		return 13, launchShape{elems: a[2].val * a[3].val * pp * q}
	case "cast":
		from := a[2].val
		n := a[0].len / uint64(ops.DType(from).Size())
		p[0], p[1], p[2], p[3], p[4] = a[0].ptr, a[1].ptr, n, a[2].val, a[3].val
		return 5, launchShape{elems: n}
	}
	// The unary ops.
	n := a[0].len / es
	p[0], p[1], p[2], p[3] = a[0].ptr, a[1].ptr, n, k.code
	return 4, launchShape{elems: n}
}

// warpRowCols is WARP_COLS of kernels.cu: softmax, log_softmax,
// layernorm and rmsnorm compute a row of at most this many values with
// one warp (8 rows per block of 256), a longer row with a whole block.
const warpRowCols = 1024

// rowShape is the launch of a per-row kernel: a warp (32 threads) per row
// of at most warpRowCols values, a block per longer row. Any grid gives
// the same results (the kernels stride over the rows); this one has no
// idle blocks.
func rowShape(rows, cols uint64) launchShape {
	if cols <= warpRowCols {
		return launchShape{elems: rows * 32}
	}
	return launchShape{elems: rows * defaultBlock}
}

// bcastStrides are the element strides of a row-major 4-dim shape, 0 on
// a dim of size 1 (so that a broadcast dim re-reads the same values).
func bcastStrides(d [4]uint64) [4]uint64 {
	var s [4]uint64
	st := uint64(1)
	for i := 3; i >= 0; i-- {
		if d[i] != 1 {
			s[i] = st
		}
		st *= d[i]
	}
	return s
}

// convOut is a convolution's output extent for one axis: the low 32 bits
// of the packed stride, pad and dil are this axis' values (the caller
// shifts for the width). Validation guarantees a result ≥ 1.
func convOut(in, r, stride, pad, dil uint64) uint64 {
	stride, pad, dil = stride&math.MaxUint32, pad&math.MaxUint32, dil&math.MaxUint32
	return (in+2*pad-dil*(r-1)-1)/stride + 1
}

// setTier records the program's exactness tier in its description.
func setTier(ki *hw.KernelInfo, in ops.Info) { ki.Tier, ki.Exactness = in.Tier, in.Exactness }
