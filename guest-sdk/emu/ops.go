package emu

import (
	"unsafe"

	"github.com/stagehost/stagehost/guest-sdk/emu/internal/ops"
)

// The op library: a generated copy of the host's (hw/internal/ops), so the
// emulator validates and computes every op exactly as the simulator does.
// Its launches are checked at submit, before anything is enqueued: a
// refused launch returns INVALID_ARGUMENT from stream_submit (or
// stream_submit_batch), with the op's reason as the last error.
func init() {
	for _, k := range ops.Kernels() {
		builtins[k.Name] = opKernel(k)
		opKernels[k.Name] = k
	}
}

// opKernels are the op library's programs by name.
var opKernels = map[string]*ops.Kernel{}

func opArgs(args []Arg) []ops.Arg {
	out := make([]ops.Arg, len(args))
	for i, a := range args {
		if a.buffer {
			out[i] = ops.Arg{Buffer: true, Addr: a.addr, Len: uint64(len(a.Bytes))}
		} else {
			out[i] = ops.Arg{Value: a.Value}
		}
	}
	return out
}

func opKernel(k *ops.Kernel) Kernel {
	return func(args []Arg) error {
		mem := make([][]byte, len(args))
		for i, a := range args {
			if a.buffer {
				mem[i] = a.Bytes
			}
		}
		return k.Run(opArgs(args), mem)
	}
}

// checkOp validates a launch of an op at submit; nil for other programs.
func checkOp(p *program, args []Arg) error {
	if p.op == nil {
		return nil
	}
	return p.op.Validate(opArgs(args))
}

// address is the host address of b's byte off, which decides overlaps.
func address(b []byte, off uint32) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) + uint64(off)
}
