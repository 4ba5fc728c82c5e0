package emu

import (
	"fmt"
	"slices"
	"strings"

	"github.com/stagehost/stagehost/guest-sdk/emu/internal/ops"
)

// VendorArg is one declared argument of a vendor kernel, as a manifest's
// [[kernel]] args give it: Kind is buffer, u32, u64, i32 or f32; a
// buffer has a DType (f32, f16, bf16, i32 or bytes; "" means bytes) and
// a Dir (in, out or inout); a scalar has neither.
type VendorArg struct {
	Name, Kind, DType, Dir string
}

// checkVendorKernel checks a vendor kernel's name and declared args as a
// manifest's [[kernel]] is checked when it is read (docs/manifest.md):
// a name of 1 to 64 of a-z, 0-9, '_', '.' and '-' that no backend of the
// host has built in; at most 16 args, each with a name of its own (not
// empty); a buffer's dtype f32, f16, bf16, i32 or bytes ("" means bytes)
// and direction in, out or inout; a scalar (u32, u64, i32 or f32) with
// no dtype and no direction.
func checkVendorKernel(name string, args []VendorArg) error {
	if !validKernelName(name) {
		return fmt.Errorf("%q is not a kernel name: 1 to %d of a-z, 0-9, '_', '.' and '-'", name, maxKernelName)
	}
	if slices.Contains(hostPrograms, name) {
		return fmt.Errorf("%q is a built-in program's name: a vendor kernel needs a name of its own", name)
	}
	if len(args) > maxArgs {
		return fmt.Errorf("kernel %q: %d arguments, more than a launch carries (%d)", name, len(args), maxArgs)
	}
	seen := make(map[string]bool, len(args))
	for i, a := range args {
		switch {
		case a.Name == "":
			return fmt.Errorf("kernel %q: argument %d: an empty name", name, i)
		case seen[a.Name]:
			return fmt.Errorf("kernel %q: argument %d: the name %q is given twice", name, i, a.Name)
		}
		seen[a.Name] = true
		switch a.Kind {
		case "buffer":
			switch a.DType {
			case "", "f32", "f16", "bf16", "i32", "bytes":
			default:
				return fmt.Errorf("kernel %q: argument %d (%s): unknown dtype %q (want f32, f16, bf16, i32 or bytes)", name, i, a.Name, a.DType)
			}
			switch a.Dir {
			case "in", "out", "inout":
			default:
				return fmt.Errorf("kernel %q: argument %d (%s): unknown direction %q (want in, out or inout)", name, i, a.Name, a.Dir)
			}
		case "u32", "u64", "i32", "f32":
			if a.DType != "" || a.Dir != "" {
				return fmt.Errorf("kernel %q: argument %d (%s): only a buffer argument has a dtype or a direction (this one is %s scalar)", name, i, a.Name, withArticle(a.Kind))
			}
		default:
			return fmt.Errorf("kernel %q: argument %d (%s): unknown kind %q (want buffer, u32, u64, i32 or f32)", name, i, a.Name, a.Kind)
		}
	}
	return nil
}

// withArticle is a scalar kind after its indefinite article, as the
// host's messages say it (hw.WithArticle): "an i32", "an f32", "a u32".
func withArticle(t string) string {
	if strings.HasPrefix(t, "i") || strings.HasPrefix(t, "f") {
		return "an " + t
	}
	return "a " + t
}

// maxKernelName is the longest vendor kernel name a manifest takes.
const maxKernelName = 64

func validKernelName(s string) bool {
	if len(s) == 0 || len(s) > maxKernelName {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// hostPrograms are the program names a backend of the host has built in
// (sim's kernels and op library, cuda's kernels and host programs), which
// a manifest refuses as a vendor kernel's name. The manifest package's
// tests keep the list equal to the host's.
var hostPrograms = []string{
	"abs", "abs.bf16", "abs.f16", "add", "add.bf16", "add.f16", "affine",
	"affine.bf16", "affine.f16", "argmax", "avgpool2d", "bias", "cast",
	"conv2d", "conv2d.fast", "copy", "div", "div.bf16", "div.f16", "exp",
	"exp.bf16", "exp.f16", "fault", "fill", "gather", "gelu_erf",
	"gelu_erf.bf16", "gelu_erf.f16", "gelu_tanh", "gelu_tanh.bf16",
	"gelu_tanh.f16", "gemm", "gemm.bf16", "gemm.bf16.fast", "gemm.f16",
	"gemm.f16.fast", "gemm.fast", "layernorm", "layernorm.bf16",
	"layernorm.f16", "log", "log.bf16", "log.f16", "log_softmax",
	"log_softmax.bf16", "log_softmax.f16", "matmul", "max", "max.bf16",
	"max.f16", "maxpool2d", "min", "min.bf16", "min.f16", "mlp_forward",
	"mul", "mul.bf16", "mul.f16", "neg", "neg.bf16", "neg.f16", "noop",
	"reduce_argmax", "reduce_argmax.bf16", "reduce_argmax.f16", "reduce_max",
	"reduce_max.bf16", "reduce_max.f16", "reduce_mean", "reduce_mean.bf16",
	"reduce_mean.f16", "reduce_sum", "reduce_sum.bf16", "reduce_sum.f16",
	"relu", "resident_gpu_exchange", "resident_npu_exchange", "rmsnorm",
	"rmsnorm.bf16", "rmsnorm.f16", "rsqrt", "rsqrt.bf16", "rsqrt.f16",
	"saxpy", "sigmoid", "sigmoid.bf16", "sigmoid.f16", "silu", "silu.bf16",
	"silu.f16", "softmax", "softmax.bf16", "softmax.f16", "spin", "sqrt",
	"sqrt.bf16", "sqrt.f16", "sub", "sub.bf16", "sub.f16", "tanh",
	"tanh.bf16", "tanh.f16", "transpose", "transpose.bf16", "transpose.f16",
}

// LaunchLimits are the launch limits the emulator checks a Stream.Launch
// against. They start as the host's sim devices' fixed limits
// (abi/ABI.md §3.5). A test may set them to another device's (a cuda
// GPU's) to check its shapes against that device; the change holds for every emulator in the process, and
// must not be made while a stage runs.
var LaunchLimits = struct {
	MaxThreadsPerBlock uint32
	MaxBlock, MaxGrid  [3]uint32
	MaxSharedBytes     uint32
}{1024, [3]uint32{1024, 1024, 64}, [3]uint32{1<<31 - 1, 65535, 65535}, 48 << 10}

func (e *Emulator) checkShapeLocked(name string, grid, block [3]uint32, shared uint32) int32 {
	l := LaunchLimits
	threads := uint64(1)
	for i, axis := range "xyz" {
		switch {
		case grid[i] == 0 || block[i] == 0:
			return e.failLocked(invalidArgument, "kernel %q: launch shape: grid %v, block %v: every dimension is at least 1", name, grid, block)
		case block[i] > l.MaxBlock[i]:
			return e.failLocked(invalidArgument, "kernel %q: launch shape: block.%c = %d, over the device's limit of %d", name, axis, block[i], l.MaxBlock[i])
		case grid[i] > l.MaxGrid[i]:
			return e.failLocked(invalidArgument, "kernel %q: launch shape: grid.%c = %d, over the device's limit of %d", name, axis, grid[i], l.MaxGrid[i])
		}
		threads *= uint64(block[i])
	}
	if threads > uint64(l.MaxThreadsPerBlock) {
		return e.failLocked(invalidArgument, "kernel %q: launch shape: block %v is %d threads, over the device's limit of %d per block", name, block, threads, l.MaxThreadsPerBlock)
	}
	if shared > l.MaxSharedBytes {
		return e.failLocked(invalidArgument, "kernel %q: launch shape: %d bytes of shared memory, over the device's limit of %d", name, shared, l.MaxSharedBytes)
	}
	return ok
}

func (e *Emulator) checkVendorArgsLocked(p *program, args []Arg) int32 {
	if len(args) != len(p.vendor) {
		return e.failLocked(invalidArgument, "kernel %q takes %d arguments, got %d", p.name, len(p.vendor), len(args))
	}
	for i, a := range p.vendor {
		switch {
		case a.Kind == "buffer" && !args[i].buffer:
			return e.failLocked(invalidArgument, "kernel %q: argument %d (%s) is a buffer (%s, %s), got a scalar", p.name, i, a.Name, a.DType, a.Dir)
		case a.Kind != "buffer" && args[i].buffer:
			return e.failLocked(invalidArgument, "kernel %q: argument %d (%s) is %s scalar, got a buffer", p.name, i, a.Name, withArticle(a.Kind))
		case args[i].buffer && len(args[i].Bytes)%ops.TypeSize(a.DType) != 0:
			return e.failLocked(invalidArgument, "kernel %q: argument %d (%s): %d bytes is not a whole number of %s values", p.name, i, a.Name, len(args[i].Bytes), a.DType)
		case !args[i].buffer && a.Kind != "u64" && args[i].Value>>32 != 0:
			return e.failLocked(invalidArgument, "kernel %q: argument %d (%s): %#x does not fit %s", p.name, i, a.Name, args[i].Value, withArticle(a.Kind))
		}
	}
	return ok
}

func (e *Emulator) needsLaunchLocked(p *program) int32 {
	return e.failLocked(invalidArgument, "%s", needsLaunchText(p))
}

// needsLaunchText is the host's refusal of a vendor kernel given to
// stream_submit (stream_submit_batch puts "command N: " before it).
func needsLaunchText(p *program) string {
	return fmt.Sprintf("program %q is a vendor kernel: launch it with stream_launch, which gives its grid, block and shared memory (ABI.md §3.5)", p.name)
}

func (h *abiHost) streamLaunch(sh, ph uint64, grid, block [3]uint32, shared uint32, rec []byte, count uint32) int32 {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	so, st := e.resolveLocked(sh, kindStream)
	if st != ok {
		return st
	}
	po, st := e.resolveLocked(ph, kindProgram)
	if st != ok {
		return st
	}
	p := po.program
	if p.vendor == nil {
		return e.failLocked(invalidArgument, "program %q is built in: stream_launch launches vendor kernels; use stream_submit", p.name)
	}
	if st := e.checkShapeLocked(p.name, grid, block, shared); st != ok {
		return st
	}
	args, st := e.parseArgsLocked(p, rec, count)
	if st != ok {
		return st
	}
	if st := e.checkVendorArgsLocked(p, args); st != ok {
		return st
	}
	e.enqueueLocked(so.stream, command{op: opLaunch, prog: p, args: args})
	return ok
}

func (h *abiHost) StreamLaunch(stream, program uint64, grid, block [3]uint32, shared uint32, args []byte, count uint32) int32 {
	return h.note(h.streamLaunch(stream, program, grid, block, shared, args, count))
}
