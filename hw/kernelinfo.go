package hw

import (
	"fmt"
	"strings"

	"github.com/stagehost/stagehost/hw/internal/ops"
)

// KernelInfo describes one program a backend can prepare by name: its
// arguments in order, as [Command.Args] must give them. Backends export
// their registry's descriptions (sim.KernelInfos, cuda.KernelInfos); the
// kernel reference docs/kernels.md is generated from them.
type KernelInfo struct {
	Name string
	// Doc is a one-line description.
	Doc string
	// Args are the arguments in order.
	Args []KernelArg
	// Variadic: any number of arguments of either kind, all ignored; Args
	// is empty.
	Variadic bool
	// Constraints are the further rules a launch is checked against
	// (overlaps, bounds), one short sentence each.
	Constraints []string
	// Tier is the op library's exactness tier: "exact" (bit-identical on
	// every backend, NaN payloads excepted), "bounded" (within a stated
	// error of the float64 result) or "fast" (within a stated relative
	// error; cuBLAS on CUDA). Empty for the kernels outside the op
	// library, which are exact float32 arithmetic in a fixed order.
	Tier string
	// Exactness states the tier's guarantee for this kernel, one sentence.
	Exactness string
}

// KernelArg describes one argument of a kernel.
type KernelArg struct {
	Name string
	// Kind is "buffer" (a buffer range) or "scalar".
	Kind string
	// Type is the element type: for a buffer "f32" (native-order float32
	// values, 4-byte aligned), "f16" or "bf16" (2-byte halves, 2-byte
	// aligned), "i32" (int32 values, 4-byte aligned) or "bytes"; for a
	// scalar "f32" (IEEE bits in the low 32 bits), "u32" (below 2^32) or
	// "u64".
	Type string
	// Dir is "in", "out" or "inout" (scalars are "in").
	Dir string
	// Len is the length rule for a buffer, as short text ("M*K values",
	// "at least 8 bytes"); empty when any length will do.
	Len string
}

// Argument kinds of [KernelArg].
const (
	KindBuffer = "buffer"
	KindScalar = "scalar"
)

// DTypeSize is the size in bytes of one value of a buffer argument of
// dtype t ([KernelArg.Type]): 4 for f32 and i32, 2 for f16 and bf16, 1
// for bytes. It is the op library's own rule (a buffer's length must be a
// whole number of values).
func DTypeSize(t string) int { return ops.TypeSize(t) }

// WithArticle is a scalar kind or dtype t ([KernelArg.Type]) after its
// indefinite article, as the host's messages say it: "an i32", "an f32",
// "an f16", "a u32", "a u64", "a bf16".
func WithArticle(t string) string {
	if strings.HasPrefix(t, "i") || strings.HasPrefix(t, "f") {
		return "an " + t
	}
	return "a " + t
}

// KernelBuffer is a [KernelArg] of kind buffer.
func KernelBuffer(name, typ, dir, length string) KernelArg {
	return KernelArg{Name: name, Kind: KindBuffer, Type: typ, Dir: dir, Len: length}
}

// KernelScalar is a [KernelArg] of kind scalar.
func KernelScalar(name, typ string) KernelArg {
	return KernelArg{Name: name, Kind: KindScalar, Type: typ, Dir: "in"}
}

// Check reports the first thing missing or inconsistent in k's
// description: a name, a one-line Doc, and for each argument a name, a
// kind, a type fitting the kind, and a direction ("in" for a scalar).
func (k KernelInfo) Check() error {
	if k.Name == "" || k.Doc == "" || strings.Contains(k.Doc, "\n") {
		return fmt.Errorf("kernel %q: want a name and a one-line description", k.Name)
	}
	switch k.Tier {
	case "", "exact", "bounded", "fast":
	default:
		return fmt.Errorf("kernel %q: unknown tier %q", k.Name, k.Tier)
	}
	if (k.Tier == "") != (k.Exactness == "") {
		return fmt.Errorf("kernel %q: a tier needs its exactness statement, and the other way round", k.Name)
	}
	if k.Variadic && len(k.Args) > 0 {
		return fmt.Errorf("kernel %q: variadic with arguments", k.Name)
	}
	for i, a := range k.Args {
		ok := a.Name != ""
		switch a.Kind {
		case KindBuffer:
			ok = ok && (a.Type == "f32" || a.Type == "f16" || a.Type == "bf16" || a.Type == "i32" || a.Type == "bytes") && (a.Dir == "in" || a.Dir == "out" || a.Dir == "inout")
		case KindScalar:
			ok = ok && (a.Type == "f32" || a.Type == "u32" || a.Type == "u64") && a.Dir == "in" && a.Len == ""
		default:
			ok = false
		}
		if !ok {
			return fmt.Errorf("kernel %q: argument %d (%q): bad description %+v", k.Name, i, a.Name, a)
		}
	}
	return nil
}

// Describer is implemented by a [Program] whose kernel has a description
// (every program of a backend's library: sim and cuda). Hosts read the
// arguments' directions from it, to refuse a read-only buffer as an
// argument the kernel writes before anything is enqueued.
type Describer interface {
	// KernelInfo returns the kernel's description, or false for a kernel
	// registered without one.
	KernelInfo() (KernelInfo, bool)
}
