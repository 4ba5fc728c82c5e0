package sim

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// Kernel is a program the simulator can run: Go code executed on a
// stream's worker goroutine. It reads its arguments through l, which is
// valid only until the kernel returns; slices obtained from l must not be
// kept either.
//
// A returned error retires the command with an [errdefs.ErrFault] error that
// wraps it. Kernels must be deterministic: float32 math in a fixed order,
// with explicit float32 conversions where a fused multiply-add would
// otherwise be allowed. A kernel that may run for long (a resident
// participant polling memory, for instance) must watch [Launch.Lost].
type Kernel func(l *Launch) error

var registry struct {
	sync.RWMutex
	m map[string]entry
}

// entry is a registered kernel, its description (nil for a kernel
// registered with [Register]) and, for the op library, the check its
// commands pass at submit.
type entry struct {
	k     Kernel
	info  *hw.KernelInfo
	check func([]hw.Arg) error
}

// Register adds a kernel under name to the process-wide registry used by
// [Device.Prepare]. It is meant for init functions and panics on an empty
// name, a nil kernel or a name registered before.
func Register(name string, k Kernel) { register(name, nil, k, nil) }

// registerInfo registers a kernel of the library with its description.
func registerInfo(info hw.KernelInfo, k Kernel) { register(info.Name, &info, k, nil) }

func register(name string, info *hw.KernelInfo, k Kernel, check func([]hw.Arg) error) {
	if name == "" || k == nil {
		panic("sim: Register: empty name or nil kernel")
	}
	registry.Lock()
	defer registry.Unlock()
	if registry.m == nil {
		registry.m = make(map[string]entry)
	}
	if _, dup := registry.m[name]; dup {
		panic(fmt.Sprintf("sim: Register: kernel %q registered twice", name))
	}
	registry.m[name] = entry{k, info, check}
}

// KernelInfos describes the kernels of the simulator's library, sorted by
// name. Kernels added with [Register] have no description and are left
// out.
func KernelInfos() []hw.KernelInfo {
	registry.RLock()
	defer registry.RUnlock()
	var infos []hw.KernelInfo
	for _, e := range registry.m {
		if e.info != nil {
			infos = append(infos, *e.info)
		}
	}
	slices.SortFunc(infos, func(a, b hw.KernelInfo) int { return strings.Compare(a.Name, b.Name) })
	return infos
}

// Kernels lists the registered kernel names, sorted.
func Kernels() []string {
	registry.RLock()
	defer registry.RUnlock()
	names := make([]string, 0, len(registry.m))
	for n := range registry.m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func lookupKernel(name string) (entry, bool) {
	registry.RLock()
	defer registry.RUnlock()
	e, ok := registry.m[name]
	return e, ok
}

// Program is a kernel prepared for one device. It implements [hw.Program].
type Program struct {
	dev    *Device
	name   string
	kernel Kernel
	// check validates a command's arguments at submit (the op library's
	// kernels); nil when the kernel checks them as it runs.
	check func([]hw.Arg) error
	info  *hw.KernelInfo // nil for a kernel registered without a description
}

var (
	_ hw.Program   = (*Program)(nil)
	_ hw.Describer = (*Program)(nil)
)

// KernelInfo returns the kernel's description; false for a kernel added
// with [Register].
func (p *Program) KernelInfo() (hw.KernelInfo, bool) {
	if p.info == nil {
		return hw.KernelInfo{}, false
	}
	return *p.info, true
}

// Name is the kernel's registered name.
func (p *Program) Name() string { return p.name }

// Device is the device the program was prepared for.
func (p *Program) Device() hw.Device { return p.dev }

// Launch is what a [Kernel] sees of its command: the arguments (already
// validated against their buffers at submit), the grid, the device and
// its loss signal. One Launch per stream is reused for every command, so
// launching allocates nothing.
//
// The accessors check their use: asking for a missing argument, a scalar
// as a buffer or the other way round, or a float32 view of a range whose
// length is not a multiple of 4, panics with a launch error that the
// stream recovers; the command then retires with an [errdefs.ErrFault] error
// that also matches [errdefs.ErrInvalidArgument]. (Any other panic in a kernel
// is recovered as well and retires the command with an [errdefs.ErrFault]
// error.)
type Launch struct {
	dev  *Device
	prog *Program
	args []hw.Arg
	grid [3]uint32
	// deadline is the command's hw.Command.Deadline.
	deadline time.Time
}

// launchError is the panic value of a misused Launch accessor.
type launchError struct{ err error }

func (l *Launch) fail(format string, args ...any) {
	panic(launchError{errdefs.Errorf(errdefs.ErrInvalidArgument, format, args...)})
}

// Args returns the command's arguments. The slice must not be modified or
// kept.
func (l *Launch) Args() []hw.Arg { return l.args }

// Grid returns the command's grid (zero when none was given).
func (l *Launch) Grid() [3]uint32 { return l.grid }

// Deadline returns the deadline the command carries
// ([hw.Command.Deadline]: that of the module call that launched it), or
// the zero time when it carries none. The simulator itself does not act
// on it: a kernel that can stop early (a vendor kernel's Wasm module,
// stages.WasmKernel.SimKernel) stops there and returns an error.
func (l *Launch) Deadline() time.Time { return l.deadline }

// Device is the device the kernel runs on.
func (l *Launch) Device() *Device { return l.dev }

// Lost returns a channel closed when the device is lost. Long-running
// kernels must return soon after it closes; their result is discarded.
func (l *Launch) Lost() <-chan struct{} { return l.dev.lostCh }

func (l *Launch) arg(i int) *hw.Arg {
	if i < 0 || i >= len(l.args) {
		l.fail("kernel %q: argument %d missing (%d given)", l.prog.name, i, len(l.args))
	}
	return &l.args[i]
}

// Bytes returns the byte range of buffer argument i (its Offset and Length
// within the buffer, checked at submit).
func (l *Launch) Bytes(i int) []byte {
	a := l.arg(i)
	b, ok := a.Buffer.(*Buffer)
	if !ok {
		l.fail("kernel %q: argument %d is a scalar, not a buffer", l.prog.name, i)
	}
	end := a.Offset + a.Length
	return b.region.mem[a.Offset:end:end]
}

// Float32s returns buffer argument i's range viewed as float32 values in
// native byte order (the same memory as [Launch.Bytes]). The range must be
// 4-byte aligned and its length a multiple of 4.
func (l *Launch) Float32s(i int) []float32 {
	b := l.Bytes(i)
	if len(b)%4 != 0 {
		l.fail("kernel %q: argument %d: %d bytes is not a whole number of float32", l.prog.name, i, len(b))
	}
	if len(b) == 0 {
		return nil
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%4 != 0 {
		l.fail("kernel %q: argument %d: offset %d is not 4-byte aligned", l.prog.name, i, l.args[i].Offset)
	}
	return unsafe.Slice((*float32)(p), len(b)/4)
}

// Uint returns scalar argument i.
func (l *Launch) Uint(i int) uint64 {
	a := l.arg(i)
	if a.Buffer != nil {
		l.fail("kernel %q: argument %d is a buffer, not a scalar", l.prog.name, i)
	}
	return a.Value
}

// Float32 returns scalar argument i read as a float32 (see [hw.Float32]).
func (l *Launch) Float32(i int) float32 {
	l.Uint(i)
	return l.args[i].Float32Value()
}
