// Package ops is the device op library's one definition: the table of
// programs (names, argument descriptions, exactness), the validation of a
// launch's arguments against an op's contract, and the reference
// implementation that the simulator (hw/sim) runs. The CUDA backend
// (hw/cuda) validates with it before packing kernel parameters, and the
// SDK emulator (guest-sdk/emu) runs a generated copy of it, so the three
// cannot drift.
//
// The package imports the standard library only: the emulator's module
// cannot import this one, so `go generate` copies these files into
// guest-sdk/emu/internal/ops, and a test fails when that copy is stale.
//
// # Names
//
// A program is named OP for float32 storage, OP.f16 or OP.bf16 for half
// storage (every value converted to float32, computed in float32, rounded
// back once to the storage type, round to nearest even), and OP.fast,
// OP.f16.fast or OP.bf16.fast for the fast tier of gemm and conv2d (cuBLAS
// on CUDA; on the simulator and the emulator the fast tier is the exact
// implementation).
//
// # Reductions
//
// Every reduction along a row or an axis (reduce_*, softmax's row max,
// layernorm, rmsnorm) uses one fixed order, the one a 256-thread block
// computes naturally: lane t (0 ≤ t < 256) starts from the identity (0 for
// a sum, -Inf for a max) and accumulates elements t, t+256, t+512, … in
// ascending order; then for s = 128, 64, …, 1 and every t < s, p[t] =
// p[t] ⊕ p[t+s]; the result is p[0]. A mean is that sum divided by n (one
// float32 division).
//
// # Errors
//
// [Kernel.Validate] returns an [*Error] naming the program and the
// argument, e.g. "softmax: x has 4,096 values, rows*cols = 4,097". Backends
// wrap it in their invalid-argument class.
package ops

import (
	"math"
	"slices"
	"strings"
)

// DType is a storage type, numbered as the cast op's dtype codes.
type DType uint8

// Storage types.
const (
	F32  DType = 0
	F16  DType = 1
	BF16 DType = 2
	I32  DType = 3
)

// String is the type's name in program names and descriptions: f32, f16,
// bf16 or i32.
func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	case I32:
		return "i32"
	}
	return "dtype(" + itoa(uint64(d)) + ")"
}

// Size is the size of one value in bytes.
func (d DType) Size() int {
	if d == F16 || d == BF16 {
		return 2
	}
	return 4
}

// Limits of every op.
const (
	// MaxElems is the most values one buffer argument, and every
	// dimension, may have: 2^31-1, so an index fits a 32-bit int on every
	// backend.
	MaxElems = math.MaxInt32
	// Lanes is the width of the fixed reduction order.
	Lanes = 256
)

// Exactness tiers (Info.Tier).
const (
	// TierExact: bit-identical on every backend (NaN payloads excepted).
	TierExact = "exact"
	// TierBounded: within a stated error bound of the float64 result.
	TierBounded = "bounded"
	// TierFast: within a stated relative error (cuBLAS on CUDA; the exact
	// implementation on the simulator and the emulator).
	TierFast = "fast"
)

// Arg is one launch argument as a backend sees it.
type Arg struct {
	// Buffer marks a buffer range; otherwise the argument is the scalar
	// Value.
	Buffer bool
	// Addr is the address of the range's first byte, in any address space
	// where the ranges of one launch can be compared (host memory for the
	// simulator, device memory for CUDA): it decides overlaps and
	// alignment.
	Addr uint64
	// Len is the range's length in bytes.
	Len uint64
	// Value is the scalar.
	Value uint64
}

// ArgInfo describes one argument (the fields of hw.KernelArg).
type ArgInfo struct {
	Name string
	// Kind is "buffer" or "scalar".
	Kind string
	// Type is "f32", "f16", "bf16", "i32", "bytes" (a buffer of any
	// storage type, see the op), "u32" or "u64".
	Type string
	// Dir is "in", "out" or "inout".
	Dir string
	// Len is the length rule for a buffer.
	Len string
}

// Info describes one program (the fields of hw.KernelInfo).
type Info struct {
	Name, Doc   string
	Args        []ArgInfo
	Constraints []string
	// Tier is TierExact, TierBounded or TierFast.
	Tier string
	// Exactness states the tier's guarantee for this op, one sentence.
	Exactness string
}

// Kernel is one program of the library: an op at one storage type and
// tier.
type Kernel struct {
	// Name is the program name (softmax, gemm.bf16.fast).
	Name string
	// Op is the op's name without suffixes (softmax, gemm).
	Op string
	// DType is the storage type of the op's typed buffers.
	DType DType
	// Fast marks the fast tier.
	Fast bool
	info Info
	def  *opDef
}

// Info describes the program.
func (k *Kernel) Info() Info {
	in := k.info
	in.Args = slices.Clone(in.Args)
	in.Constraints = slices.Clone(in.Constraints)
	return in
}

// Validate checks args against the op's contract: the argument count, each
// argument's kind, every buffer's length, alignment and overlaps, every
// scalar's range, and the dims (zero sizes, overflowing products and
// values over [MaxElems] are refused). It reads no memory.
//
// # Errors
//
// An [*Error] naming the program and the argument.
func (k *Kernel) Validate(args []Arg) error {
	l := launch{k: k, args: args}
	return l.validate()
}

// Run validates args and computes the op: mem[i] is the memory of buffer
// argument i (len(mem[i]) == args[i].Len), nil for a scalar. Outputs are
// written in place; inputs are read before any output is written, so an
// output that is exactly an input (where the op allows it) is computed as
// if it were separate.
//
// # Errors
//
// As for [Kernel.Validate], and an [*Error] when mem does not match args.
func (k *Kernel) Run(args []Arg, mem [][]byte) error {
	l := launch{k: k, args: args}
	if err := l.validate(); err != nil {
		return err
	}
	if len(mem) != len(args) {
		return l.errf("", "%d memory ranges for %d arguments", len(mem), len(args))
	}
	for i, a := range args {
		if a.Buffer && uint64(len(mem[i])) != a.Len {
			return l.errf("", "argument %d: %d bytes of memory for a %d-byte range", i, len(mem[i]), a.Len)
		}
	}
	l.mem = mem
	k.def.run(&l)
	return nil
}

// Error is a launch refused by an op's contract.
type Error struct {
	// Kernel is the program name.
	Kernel string
	// Arg is the argument's name, empty when the error concerns several.
	Arg string
	// Msg is the reason, starting with the argument's name where there is
	// one.
	Msg string
}

func (e *Error) Error() string { return e.Kernel + ": " + e.Msg }

var (
	table  = map[string]*Kernel{}
	sorted []*Kernel
)

// Lookup returns the program called name.
func Lookup(name string) (*Kernel, bool) {
	k, ok := table[name]
	return k, ok
}

// Kernels returns every program of the library, sorted by name.
func Kernels() []*Kernel { return slices.Clone(sorted) }

// Names returns every program name, sorted.
func Names() []string {
	names := make([]string, len(sorted))
	for i, k := range sorted {
		names[i] = k.Name
	}
	return names
}

// opDef is one op: its contract at every storage type it has.
type opDef struct {
	name, doc string
	// half: the op has .f16 and .bf16 variants.
	half bool
	// fast: the op has .fast variants.
	fast bool
	// tier and exact: the exactness tier and its statement.
	tier, exact string
	// args: "T" as a buffer type stands for the storage type.
	args        []ArgInfo
	constraints []string
	check       checker
	run         func(l *launch)
}

func build(defs []*opDef) {
	for _, d := range defs {
		types := []DType{F32}
		if d.half {
			types = append(types, F16, BF16)
		}
		for _, dt := range types {
			for _, fast := range []bool{false, true} {
				if fast && !d.fast {
					continue
				}
				name := d.name
				if dt != F32 {
					name += "." + dt.String()
				}
				tier, exact := d.tier, d.exact
				if fast {
					name += ".fast"
					tier = TierFast
					exact = fastExact
				}
				k := &Kernel{Name: name, Op: d.name, DType: dt, Fast: fast, def: d}
				k.info = Info{Name: name, Doc: d.doc, Constraints: d.constraints, Tier: tier, Exactness: exact}
				for _, a := range d.args {
					if a.Type == "T" {
						a.Type = dt.String()
					}
					k.info.Args = append(k.info.Args, a)
				}
				if dt != F32 {
					k.info.Doc = strings.TrimSuffix(d.doc, ".") + "; " + dt.String() + " storage, float32 arithmetic."
				}
				if _, dup := table[name]; dup {
					panic("ops: program " + name + " defined twice")
				}
				table[name] = k
				sorted = append(sorted, k)
			}
		}
	}
	slices.SortFunc(sorted, func(a, b *Kernel) int { return strings.Compare(a.Name, b.Name) })
}

const fastExact = "On CUDA (cuBLAS, float32 compute, no TF32; any summation order) each value is within (K + 4)·2^-23·(|alpha|·Σ|a·b| + |beta·c|) of the exact result, plus one rounding of the storage type; on the simulator and the emulator it is the exact implementation."

func init() { build(defs) }

func bufT(name, dir, length string) ArgInfo {
	return ArgInfo{Name: name, Kind: "buffer", Type: "T", Dir: dir, Len: length}
}

func bufOf(name, typ, dir, length string) ArgInfo {
	return ArgInfo{Name: name, Kind: "buffer", Type: typ, Dir: dir, Len: length}
}

func u32(name string) ArgInfo { return ArgInfo{Name: name, Kind: "scalar", Type: "u32", Dir: "in"} }

func u64(name string) ArgInfo { return ArgInfo{Name: name, Kind: "scalar", Type: "u64", Dir: "in"} }

func f32(name string) ArgInfo { return ArgInfo{Name: name, Kind: "scalar", Type: "f32", Dir: "in"} }

// itoa formats v in decimal.
func itoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}

// num formats v with thousands separators: 4,096.
func num(v uint64) string {
	s := itoa(v)
	if len(s) <= 3 {
		return s
	}
	var b strings.Builder
	lead := len(s) % 3
	if lead > 0 {
		b.WriteString(s[:lead])
	}
	for i := lead; i < len(s); i += 3 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}
