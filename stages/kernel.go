package stages

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/stages/internal/wasmbin"
)

// Vendor kernels on sim (abi/ABI.md, "Vendor kernels on sim"): a wasm32
// module that exports its linear memory as "memory" and one function per
// kernel, imports nothing, and is run by the host on a sim device's
// stream. The host lays each buffer argument out in a fresh instance's
// memory, calls the export, and copies the out and inout buffers back.

// Kernel defaults.
const (
	// DefaultKernelMemoryLimit caps a vendor kernel instance's linear
	// memory, its buffers included: 256 MiB.
	DefaultKernelMemoryLimit = 256 << 20
	// DefaultKernelTimeLimit bounds one launch of a vendor kernel: 5 s.
	// A launch is interrupted at the earlier of its time limit and the
	// deadline of the call that launched it (stream_launch gives the
	// command that deadline, [hw.Command.Deadline]), so a kernel never
	// outlives its call, and the limit bounds a launch of a call whose
	// deadline is longer, and a launch made without one (through the Go
	// API). With the session defaults (a 5 s deadline, a 10 s fence
	// timeout) a kernel has stopped before the fence gives up, and a
	// looping kernel never quarantines its session.
	DefaultKernelTimeLimit = 5 * time.Second
)

// KernelConfig configures [Engine.LoadKernel]. The zero value is not
// usable; start from [NewKernelConfig].
type KernelConfig struct {
	memoryPages uint32
	timeLimit   time.Duration
}

// NewKernelConfig returns the defaults: a memory limit of
// [DefaultKernelMemoryLimit] and a time limit of [DefaultKernelTimeLimit].
func NewKernelConfig() KernelConfig {
	return KernelConfig{memoryPages: DefaultKernelMemoryLimit >> 16, timeLimit: DefaultKernelTimeLimit}
}

// WithMemoryLimit caps an instance's linear memory at bytes, rounded
// down to 64 KiB pages (at least one page, at most 4 GiB).
func (c KernelConfig) WithMemoryLimit(bytes int64) KernelConfig {
	c.memoryPages = uint32(min(max(bytes>>16, 1), 65536))
	return c
}

// WithTimeLimit bounds one launch; a launch that runs longer is
// interrupted and fails. A launch whose command carries an earlier
// deadline (the call's, [hw.Command.Deadline]) is interrupted at that
// instead. A limit of 0 or less keeps the default.
func (c KernelConfig) WithTimeLimit(d time.Duration) KernelConfig {
	if d > 0 {
		c.timeLimit = d
	}
	return c
}

// KernelSpec is a vendor kernel's declaration: its program name, the
// export that runs it, and its arguments in order. A buffer argument has
// Kind [hw.KindBuffer], a Type (f32, f16, bf16, i32 or bytes) and a Dir
// (in, out or inout); a scalar has Kind [hw.KindScalar] and a Type of
// u32, i32, u64 or f32.
type KernelSpec struct {
	Name  string
	Entry string
	Args  []hw.KernelArg
}

// Info returns the spec as a kernel description.
func (s KernelSpec) Info() hw.KernelInfo {
	return hw.KernelInfo{Name: s.Name, Doc: "A vendor kernel (export " + s.Entry + ").", Args: s.Args}
}

// WasmParams returns the Wasm parameter types the spec's export must
// take: two i32 (offset, length in bytes) per buffer, i32 for u32 and
// i32, i64 for u64, f32 for f32.
func (s KernelSpec) WasmParams() ([]api.ValueType, error) {
	var ps []api.ValueType
	for i, a := range s.Args {
		switch {
		case a.Kind == hw.KindBuffer:
			switch a.Dir {
			case "in", "out", "inout":
			default:
				return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: argument %d (%s): direction %q (want in, out or inout)", s.Name, i, a.Name, a.Dir)
			}
			ps = append(ps, api.ValueTypeI32, api.ValueTypeI32)
		case a.Kind == hw.KindScalar && (a.Type == "u32" || a.Type == "i32"):
			ps = append(ps, api.ValueTypeI32)
		case a.Kind == hw.KindScalar && a.Type == "u64":
			ps = append(ps, api.ValueTypeI64)
		case a.Kind == hw.KindScalar && a.Type == "f32":
			ps = append(ps, api.ValueTypeF32)
		default:
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: argument %d (%s): kind %q type %q (want a buffer, or a u32, i32, u64 or f32 scalar)", s.Name, i, a.Name, a.Kind, a.Type)
		}
	}
	return ps, nil
}

// ValidateKernel runs every check [Engine.LoadKernel] makes of a vendor
// kernel's Wasm module against its spec and cfg's memory limit (the zero
// KernelConfig: the defaults, [NewKernelConfig]): the binary is well
// formed, imports nothing, exports its memory as "memory" (one memory,
// not shared, whose minimum is at most the memory limit: a larger maximum
// is allowed, and capped at the limit by the load), exports spec.Entry
// as a function of exactly [KernelSpec.WasmParams] and no results, and
// validates as the engine validates it when it compiles it (operand-stack
// types included). It compiles the module with wazero's interpreter for
// that last check only: nothing is instantiated and no machine code is
// made, so a tool (`stagehost check`) refuses what the load would.
//
// # Errors
//
// [errdefs.ErrInvalidArgument], naming the kernel and what is wrong: the
// import, the missing export, the expected and actual signatures, the
// memory's minimum and the limit, or the engine's validation error
// ("does not compile: ...").
func ValidateKernel(bin []byte, spec KernelSpec, cfg KernelConfig) error {
	if cfg.memoryPages == 0 {
		cfg = NewKernelConfig()
	}
	_, err := validateKernel(bin, spec, cfg)
	return err
}

func validateKernel(bin []byte, spec KernelSpec, cfg KernelConfig) (*wasmbin.Module, error) {
	fail := func(format string, args ...any) (*wasmbin.Module, error) {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: "+format, append([]any{spec.Name}, args...)...)
	}
	want, err := spec.WasmParams()
	if err != nil {
		return nil, err
	}
	p, err := wasmbin.Parse(bin)
	if err != nil {
		return fail("%v", err)
	}
	if err := p.ValidateCode(); err != nil {
		return fail("%v", err)
	}
	if len(p.Imports) > 0 {
		im := p.Imports[0]
		return fail("imports %s.%s: a vendor kernel imports nothing (%d imports)", im.Module, im.Name, len(p.Imports))
	}
	if mem, ok := p.Export("memory"); !ok || mem.Kind != wasmbin.KindMemory {
		return fail("exports no memory named \"memory\"")
	}
	if len(p.Memories) == 1 && p.Memories[0].Shared {
		return fail("its memory is shared: a vendor kernel's memory is its own")
	}
	if len(p.Memories) == 1 && p.Memories[0].Min > cfg.memoryPages {
		pages := p.Memories[0].Min
		return fail("its memory's minimum is %d pages (%s), over the kernel memory limit of %d pages (%s): it could never be instantiated", pages, pagesSize(pages), cfg.memoryPages, pagesSize(cfg.memoryPages))
	}
	for i, tb := range p.Tables {
		if tb.Limits.Min > MaxTableElements {
			return fail("its table %d's minimum is %d elements, over the limit of %d: it could never be instantiated", i, tb.Limits.Min, MaxTableElements)
		}
	}
	ex, ok := p.Export(spec.Entry)
	if !ok || ex.Kind != wasmbin.KindFunc {
		return fail("exports no function %q", spec.Entry)
	}
	if !sameTypes(ex.Type.Params, want) || len(ex.Type.Results) != 0 {
		return fail("export %q is %s, want %s (abi/ABI.md, \"Vendor kernels on sim\")", spec.Entry, sigString(ex.Type.Params, ex.Type.Results), sigString(want, nil))
	}
	if err := engineValidate(bin); err != nil {
		return fail("does not compile: %v", err)
	}
	return p, nil
}

// engineValidate validates bin as the engine does when it compiles it
// (wazero's validation, which checks what wasmbin does not: the types on
// the operand stack), compiling it with the interpreter, which makes no
// machine code, in a runtime of its own that is closed at once.
func engineValidate(bin []byte) error {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	_, err := rt.CompileModule(ctx, bin)
	return err
}

// pagesSize is a number of 64 KiB pages as a size: "256 MiB", "64 KiB".
func pagesSize(pages uint32) string {
	if pages%16 == 0 {
		return fmt.Sprintf("%d MiB", pages/16)
	}
	return fmt.Sprintf("%d KiB", uint64(pages)*64)
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func sigString(params, results []api.ValueType) string {
	name := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(s, ", ") + ")"
	}
	return name(params) + " -> " + name(results)
}

// WasmKernel is a vendor kernel compiled for sim devices. It is safe for
// concurrent use: every launch runs in an instance of its own.
type WasmKernel struct {
	spec     KernelSpec
	cfg      KernelConfig
	engine   *Engine
	compiled wazero.CompiledModule
	// runtime is the one that compiled it, where it instantiates: the
	// engine's, or the one without the file cache ([Engine.compile]).
	runtime wazero.Runtime
	// startDesc is how the engine names the start function of the
	// compiled module and of the module as loaded ([wasmbin.Module.StartDesc]),
	// so that a start function that fails is named by the module's own
	// index; equal (both empty) without instrumentation or a start
	// section.
	startDesc [2]string
}

// LoadKernel validates a vendor kernel's module ([ValidateKernel]),
// instruments it for interruption as stage modules are, caps its memory
// at cfg's limit and compiles it through the engine's file cache.
//
// # Errors
//
// [errdefs.ErrInvalidArgument]: as for [ValidateKernel], or the module
// does not compile.
func (e *Engine) LoadKernel(ctx context.Context, bin []byte, spec KernelSpec, cfg KernelConfig) (*WasmKernel, error) {
	if cfg.memoryPages == 0 {
		cfg = NewKernelConfig()
	}
	p, err := validateKernel(bin, spec, cfg)
	if err != nil {
		return nil, err
	}
	rewritten, _, err := p.Rewrite(wasmbin.RewriteOptions{MaxPages: cfg.memoryPages, MaxTableElements: MaxTableElements})
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: %v", spec.Name, err)
	}
	k := &WasmKernel{spec: spec, cfg: cfg, engine: e}
	if !e.cfg.uninterruptible {
		if rewritten, k.startDesc, err = instrument(rewritten); err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: %v", spec.Name, err)
		}
	}
	if k.compiled, err = e.compile(ctx, spec.Name, rewritten); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: does not compile: %v", spec.Name, err)
	}
	k.runtime = e.runtimeOf(k.compiled)
	return k, nil
}

// Spec returns the kernel's declaration.
func (k *WasmKernel) Spec() KernelSpec { return k.spec }

// Close releases the compiled module.
func (k *WasmKernel) Close(ctx context.Context) error {
	k.engine.inUncached.Delete(k.compiled)
	return k.compiled.Close(ctx)
}

// KernelArgs are one launch's arguments: Bufs[i] is argument i's bytes
// for a buffer (nil for a scalar), Scalars[i] its value for a scalar (f32
// as IEEE bits in the low 32 bits).
type KernelArgs struct {
	Bufs    [][]byte
	Scalars []uint64
}

// Run runs one launch in a fresh instance: it grows the instance's
// memory by the pages the buffers need, copies every in and inout buffer
// there (16-byte aligned, in argument order), calls the export, and
// copies every out and inout buffer back. An out buffer starts zeroed.
// Nothing is copied back when the launch fails. The module's start
// function, if it has one, runs in every launch's instance. The instance
// is closed before Run returns, and on Linux its memory, a mapping of
// its own, is given back to the system then.
//
// # Errors
//
// All wrap [errdefs.ErrFault]:
//   - the buffers do not fit the memory limit (also
//     [errdefs.ErrOutOfBudget]);
//   - the kernel trapped (an out-of-bounds access, unreachable, a stack
//     overflow, a division by zero), naming the trap; or its start
//     function did ("does not instantiate: start function[K] failed",
//     K the module's own index);
//   - the kernel ran past its time limit ("interrupted: it ran past its
//     time limit of 5s"), or past ctx's deadline when that came first
//     ("interrupted at its call's deadline"; a ctx whose deadline has
//     passed already does not run it), or ctx was cancelled (all also
//     [errdefs.ErrDeadlineExceeded]).
func (k *WasmKernel) Run(ctx context.Context, args KernelArgs) error {
	deadline, _ := ctx.Deadline()
	return k.run(ctx, args, fmt.Sprintf("kernel %q: ", k.spec.Name), deadline)
}

// run is Run with the prefix of its errors (the sim stream names the
// kernel itself) and the deadline of the call that launched it (the zero
// time for none): the launch is interrupted at the earlier of that
// deadline and its time limit.
func (k *WasmKernel) run(ctx context.Context, args KernelArgs, prefix string, deadline time.Time) error {
	limit := time.Now().Add(k.cfg.timeLimit)
	atCall := !deadline.IsZero() && deadline.Before(limit)
	var cancel context.CancelFunc
	if atCall {
		ctx, cancel = context.WithDeadline(ctx, deadline)
	} else {
		ctx, cancel = context.WithDeadline(ctx, limit)
	}
	defer cancel()
	if ctx.Err() != nil { // the call's deadline passed before the launch began
		return k.failure(ctx, prefix, atCall, "did not start", ctx.Err())
	}
	mod, err := k.runtime.InstantiateModule(withKernelMemory(ctx), k.compiled, wazero.NewModuleConfig().WithName("").WithStartFunctions())
	if err != nil {
		return k.failure(ctx, prefix, atCall, "does not instantiate", wasmbin.RenameStart(err, k.startDesc[0], k.startDesc[1]))
	}
	defer mod.Close(context.WithoutCancel(ctx))
	mem := mod.Memory()
	total := uint64(0)
	for i, a := range k.spec.Args {
		if a.Kind == hw.KindBuffer {
			total += uint64(len(args.Bufs[i])+15) &^ 15
		}
	}
	base := uint64(mem.Size())
	if total > 0 {
		if _, ok := mem.Grow(uint32((total + 65535) >> 16)); !ok {
			return errdefs.Errorf(errdefs.ErrFault, "%sits buffers (%d bytes) and its own memory (%d bytes) do not fit its memory limit of %d bytes: %w", prefix, total, base, uint64(k.cfg.memoryPages)<<16, errdefs.ErrOutOfBudget)
		}
	}
	params := make([]uint64, 0, 2*len(k.spec.Args))
	off := base
	offs := make([]uint64, len(k.spec.Args))
	for i, a := range k.spec.Args {
		if a.Kind != hw.KindBuffer {
			v := args.Scalars[i]
			if a.Type != "u64" {
				v = uint64(uint32(v))
			}
			params = append(params, v)
			continue
		}
		b := args.Bufs[i]
		offs[i] = off
		if a.Dir != "out" {
			mem.Write(uint32(off), b)
		}
		params = append(params, off, uint64(len(b)))
		off += uint64(len(b)+15) &^ 15
	}
	if _, err := mod.ExportedFunction(k.spec.Entry).Call(ctx, params...); err != nil {
		return k.failure(ctx, prefix, atCall, "failed", err)
	}
	for i, a := range k.spec.Args {
		if a.Kind == hw.KindBuffer && a.Dir != "in" {
			got, ok := mem.Read(uint32(offs[i]), uint32(len(args.Bufs[i])))
			if !ok {
				return errdefs.Errorf(errdefs.ErrFault, "%sargument %d (%s) is no longer in its memory", prefix, i, a.Name)
			}
			copy(args.Bufs[i], got)
		}
	}
	return nil
}

// failure is the error of a launch that failed: interrupted, when ctx
// ended (at the call's deadline when atCall, else at the time limit, or
// cancelled), or else what failed and the trap.
func (k *WasmKernel) failure(ctx context.Context, prefix string, atCall bool, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		switch {
		case !errors.Is(cerr, context.DeadlineExceeded):
			return errdefs.Errorf(errdefs.ErrFault, "%sinterrupted: its launch was cancelled (the device was lost): %w", prefix, errdefs.ErrDeadlineExceeded)
		case atCall:
			return errdefs.Errorf(errdefs.ErrFault, "%sinterrupted at its call's deadline: %w", prefix, errdefs.ErrDeadlineExceeded)
		}
		return errdefs.Errorf(errdefs.ErrFault, "%sinterrupted: it ran past its time limit of %v: %w", prefix, k.cfg.timeLimit, errdefs.ErrDeadlineExceeded)
	}
	return errdefs.Errorf(errdefs.ErrFault, "%s%s: %s", prefix, what, kernelTrapText(err))
}

// kernelTrapText is a trap's message without wazero's stack trace.
func kernelTrapText(err error) string {
	s := err.Error()
	if i := strings.Index(s, "\nwasm stack trace"); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// SimKernel returns the kernel as a [sim.Kernel], for
// [sim.Device.PrepareKernel]: it runs on the stream's worker and is
// interrupted when the device is lost, or at the earlier of its time
// limit and the deadline its command carries ([sim.Launch.Deadline],
// [hw.Command.Deadline]: stream_launch gives it the deadline of the call
// that launched it). A launch whose command's deadline has passed before
// it begins does not run. Both interruptions fail the command with an
// [errdefs.ErrFault] error that wraps [errdefs.ErrDeadlineExceeded] and
// says which it was: "interrupted at its call's deadline" or
// "interrupted: it ran past its time limit of 5s".
func (k *WasmKernel) SimKernel() sim.Kernel {
	return func(l *sim.Launch) error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-l.Lost():
				cancel()
			case <-ctx.Done():
			}
		}()
		n := len(k.spec.Args)
		a := KernelArgs{Bufs: make([][]byte, n), Scalars: make([]uint64, n)}
		for i, s := range k.spec.Args {
			if s.Kind == hw.KindBuffer {
				a.Bufs[i] = l.Bytes(i)
			} else {
				a.Scalars[i] = l.Uint(i)
			}
		}
		return k.run(ctx, a, "", l.Deadline())
	}
}
