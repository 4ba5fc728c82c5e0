// Package hw is stagehost's hardware contract: devices with an engine kind,
// ordered streams, buffers, prepared programs, completions, host-coherent
// shared allocations and memory budgets.
//
// Backends implement the interfaces here: package hw/sim is the default,
// concurrent simulator; package hw/cuda drives NVIDIA GPUs. Everything above
// this package (the runtime, stages, sessions) is written against these
// interfaces alone.
//
// Submission paths are allocation-free: a [Command] is copied into the
// stream's own queue, and a [Completion] is a small value, not an object.
package hw

import (
	"context"
	"math"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// Engine is the kind of execution engine a device offers.
type Engine uint8

const (
	// EngineCPU is a host-side engine (used for participants on machines
	// without an NPU, and for tests).
	EngineCPU Engine = iota
	// EngineGPU is a GPU compute engine.
	EngineGPU
	// EngineNPU is a neural processing unit.
	EngineNPU
)

func (e Engine) String() string {
	switch e {
	case EngineCPU:
		return "cpu"
	case EngineGPU:
		return "gpu"
	case EngineNPU:
		return "npu"
	}
	return "engine(?)"
}

// ParseEngine is the inverse of [Engine.String].
func ParseEngine(s string) (Engine, error) {
	switch s {
	case "cpu":
		return EngineCPU, nil
	case "gpu":
		return EngineGPU, nil
	case "npu":
		return EngineNPU, nil
	}
	return 0, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown engine %q (want gpu, npu or cpu)", s)
}

// Device is one execution device.
//
// A device is lost when it faults in a way that poisons every context on it
// (a sticky CUDA error, an injected loss on sim). From then on every pending
// and later call fails with [errdefs.ErrDeviceLost] and no wait hangs.
type Device interface {
	// Name is the device's unique name within its platform.
	Name() string
	// Engine is the kind of engine this device offers.
	Engine() Engine
	// NewStream creates an ordered command queue on the device.
	NewStream() (Stream, error)
	// Alloc allocates size bytes of device memory, charging budget (which
	// may be nil for none). Host-visible memory can be read and written by
	// the host through [Buffer.HostBytes].
	Alloc(size int, flags AllocFlags, budget *Budget) (Buffer, error)
	// Prepare looks up and prepares a named program for this device.
	Prepare(program string) (Program, error)
	// Err returns nil while the device is healthy, and an [errdefs.ErrDeviceLost]
	// error, naming the first cause, once it is lost.
	Err() error
	// Close releases the device. Streams and buffers must be closed first.
	Close() error
}

// AllocFlags select properties of an allocation.
type AllocFlags uint32

const (
	// AllocHostVisible asks for memory the host can map.
	AllocHostVisible AllocFlags = 1 << iota
)

// Buffer is a device allocation.
type Buffer interface {
	Device() Device
	Size() int
	// HostBytes returns the host mapping of a host-visible buffer, or an
	// [errdefs.ErrUnsupported] error. Reads and writes through it race with device
	// work unless the caller orders them with completions.
	HostBytes() ([]byte, error)
	// Free releases the memory and its budget charge. Freeing twice returns
	// an [errdefs.ErrClosed] error.
	Free() error
}

// Program is a prepared program (a kernel, graph or NPU program) bound to
// one device.
type Program interface {
	Name() string
	Device() Device
}

// MaxArgs is the most arguments one [Command] may carry.
const MaxArgs = 16

// Arg is one program argument: a buffer range, or a 64-bit scalar.
type Arg struct {
	Buffer Buffer // nil for a scalar
	Offset int    // byte offset into Buffer
	Length int    // byte length of the range; the range is bounds-checked at submit
	Value  uint64 // the scalar, when Buffer is nil
}

// BufferArg is a range of a buffer. A negative length means "to the end".
func BufferArg(b Buffer, offset, length int) Arg {
	if length < 0 && b != nil {
		length = b.Size() - offset
	}
	return Arg{Buffer: b, Offset: offset, Length: length}
}

// Uint is a scalar argument.
func Uint(v uint64) Arg { return Arg{Value: v} }

// Float32 is a scalar argument holding an IEEE-754 single.
func Float32(v float32) Arg { return Arg{Value: uint64(math.Float32bits(v))} }

// Float32Value reads back a scalar made by [Float32].
func (a Arg) Float32Value() float32 { return math.Float32frombits(uint32(a.Value)) }

// Command is one program launch. Streams copy it at submission, so the
// caller may reuse it (and its Args slice) at once.
type Command struct {
	Program Program
	Args    []Arg
	// Grid optionally sizes a launch (threads in x, y, z). Backends that
	// derive the size from the arguments ignore it.
	Grid [3]uint32
	// Shape is the launch shape of a vendor kernel launched with
	// stream_launch (abi/ABI.md §3.5); nil for every other command.
	Shape *LaunchShape
	// Deadline is the deadline of the module call that launched the
	// command (stream_launch sets it to the call's deadline, abi/ABI.md
	// §4.2); the zero time for none. A backend that can interrupt a
	// running program stops it there and fails its command: sim's
	// vendor kernels (a Wasm module, interrupted as stages are; the
	// command fails with an [errdefs.ErrFault] error that wraps
	// [errdefs.ErrDeadlineExceeded]). A backend that cannot ignores it:
	// CUDA has no way to stop one kernel, which is why a tenant's vendor
	// PTX runs in a worker process that is ended instead
	// (docs/security.md). It travels with the command, not the stream,
	// because one stream carries the work of many calls.
	Deadline time.Time
}

// LaunchShape is a launch's grid of blocks, each block's threads and
// its dynamic shared memory, as a CUDA launch takes them.
type LaunchShape struct {
	Grid, Block [3]uint32
	SharedBytes uint32
}

// LaunchLimits are a device's limits on a [LaunchShape].
type LaunchLimits struct {
	MaxThreadsPerBlock uint32    // the product of the block's dimensions
	MaxBlock           [3]uint32 // each block dimension
	MaxGrid            [3]uint32 // each grid dimension
	MaxSharedBytes     uint32    // dynamic shared memory per block
}

// DefaultLaunchLimits are the limits of a device that states none, and
// the fixed limits of sim devices: those of every CUDA GPU since compute
// capability 3.0 with the default (not opted-in) shared memory.
var DefaultLaunchLimits = LaunchLimits{
	MaxThreadsPerBlock: 1024,
	MaxBlock:           [3]uint32{1024, 1024, 64},
	MaxGrid:            [3]uint32{1<<31 - 1, 65535, 65535},
	MaxSharedBytes:     48 << 10,
}

// LaunchLimiter is a device that states its launch limits (a CUDA
// device reads them with cuDeviceGetAttribute).
type LaunchLimiter interface {
	LaunchLimits() LaunchLimits
}

// LimitsOf returns dev's launch limits: its own, or [DefaultLaunchLimits].
func LimitsOf(dev Device) LaunchLimits {
	if l, ok := dev.(LaunchLimiter); ok {
		return l.LaunchLimits()
	}
	return DefaultLaunchLimits
}

// Check reports the first dimension of s outside l, naming it: a zero
// dimension, a block or grid dimension over its maximum, more threads
// per block than allowed, or more shared memory.
func (l LaunchLimits) Check(s *LaunchShape) error {
	axes := "xyz"
	threads := uint64(1)
	for i := range 3 {
		if s.Grid[i] == 0 || s.Block[i] == 0 {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "launch shape: grid %v, block %v: every dimension is at least 1", s.Grid, s.Block)
		}
		if s.Block[i] > l.MaxBlock[i] {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "launch shape: block.%c = %d, over the device's limit of %d", axes[i], s.Block[i], l.MaxBlock[i])
		}
		if s.Grid[i] > l.MaxGrid[i] {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "launch shape: grid.%c = %d, over the device's limit of %d", axes[i], s.Grid[i], l.MaxGrid[i])
		}
		threads *= uint64(s.Block[i])
	}
	if threads > uint64(l.MaxThreadsPerBlock) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "launch shape: block %v is %d threads, over the device's limit of %d per block", s.Block, threads, l.MaxThreadsPerBlock)
	}
	if s.SharedBytes > l.MaxSharedBytes {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "launch shape: %d bytes of shared memory, over the device's limit of %d", s.SharedBytes, l.MaxSharedBytes)
	}
	return nil
}

// Stream is an ordered queue of commands on one device. Commands retire in
// submission order. A Stream is safe for concurrent use.
type Stream interface {
	Device() Device
	// Submit enqueues a program launch. Every buffer argument must belong
	// to this stream's device and its range must lie inside the buffer.
	Submit(cmd *Command) (Completion, error)
	// Write enqueues an upload of src into dst at off. src must stay
	// unchanged until the completion retires.
	Write(dst Buffer, off int, src []byte) (Completion, error)
	// Read enqueues a download of src at off into dst. dst must not be
	// touched until the completion retires.
	Read(src Buffer, off int, dst []byte) (Completion, error)
	// Idle reports whether every command submitted so far has retired,
	// without waiting and without making progress.
	Idle() bool
	// Sync waits until every command submitted so far has retired. It
	// returns the earliest failure among them that no earlier Sync
	// reported (each failure is reported once, in order), an
	// [errdefs.ErrDeviceLost] error if the device is lost, or an
	// [errdefs.ErrDeadlineExceeded] error if ctx ends first.
	Sync(ctx context.Context) error
	// Close waits for the stream to drain (as Sync with ctx) and releases
	// it.
	Close(ctx context.Context) error
}

// Platform is a backend's set of devices plus the memory fabric between
// them.
type Platform interface {
	// Devices lists every device, in a stable order.
	Devices() []Device
	// Device returns a device by name, or an [errdefs.ErrNotFound] error.
	Device(name string) (Device, error)
	// AllocShared allocates host-coherent memory that every listed device
	// can access, charging budget. See [Shared].
	AllocShared(size int, devices []Device, budget *Budget) (Shared, error)
	// Close closes every device.
	Close() error
}
