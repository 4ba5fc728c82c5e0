package emu

import (
	"fmt"

	"github.com/stagehost/stagehost/guest-sdk/emu/internal/ops"
)

// VendorArg is one declared argument of a vendor kernel, as a manifest's
// [[kernel]] args give it: Kind is buffer, u32, u64, i32 or f32; a
// buffer has a DType (f32, f16, bf16, i32 or bytes; "" means bytes) and
// a Dir (in, out or inout).
type VendorArg struct {
	Name, Kind, DType, Dir string
}

func (a VendorArg) check() error {
	switch a.Kind {
	case "buffer":
		switch a.DType {
		case "", "f32", "f16", "bf16", "i32", "bytes":
		default:
			return fmt.Errorf("argument %q: unknown dtype %q", a.Name, a.DType)
		}
		switch a.Dir {
		case "in", "out", "inout":
		default:
			return fmt.Errorf("argument %q: unknown direction %q", a.Name, a.Dir)
		}
	case "u32", "u64", "i32", "f32":
	default:
		return fmt.Errorf("argument %q: unknown kind %q", a.Name, a.Kind)
	}
	return nil
}

// LaunchLimits are the fixed launch limits the emulator checks a
// Stream.Launch against: the host's sim devices' (abi/ABI.md §3.5).
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
			return e.failLocked(invalidArgument, "kernel %q: argument %d (%s) is a %s scalar, got a buffer", p.name, i, a.Name, a.Kind)
		case args[i].buffer && len(args[i].Bytes)%ops.TypeSize(a.DType) != 0:
			return e.failLocked(invalidArgument, "kernel %q: argument %d (%s): %d bytes is not a whole number of %s values", p.name, i, a.Name, len(args[i].Bytes), a.DType)
		case !args[i].buffer && a.Kind != "u64" && args[i].Value>>32 != 0:
			return e.failLocked(invalidArgument, "kernel %q: argument %d (%s): %#x does not fit a %s", p.name, i, a.Name, args[i].Value, a.Kind)
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
