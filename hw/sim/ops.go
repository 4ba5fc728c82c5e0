package sim

import (
	"unsafe"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/internal/ops"
)

// The op library (hw/internal/ops): every program of its table is
// registered here, validated at submit (before anything is enqueued) and
// run by the library's reference implementation.
func init() {
	for _, k := range ops.Kernels() {
		register(k.Name, opInfo(k.Info()), opKernel(k), opCheck(k))
	}
}

// OpInfo converts an op's description into a [hw.KernelInfo].
func opInfo(in ops.Info) *hw.KernelInfo {
	info := &hw.KernelInfo{
		Name: in.Name, Doc: in.Doc, Constraints: in.Constraints,
		Tier: in.Tier, Exactness: in.Exactness,
	}
	for _, a := range in.Args {
		info.Args = append(info.Args, hw.KernelArg{Name: a.Name, Kind: a.Kind, Type: a.Type, Dir: a.Dir, Len: a.Len})
	}
	return info
}

// opArgs converts a command's arguments (buffers already checked against
// their buffers) for the library. Addresses are host addresses of the
// simulated device memory, so ranges of different buffers never overlap
// and views of one shared region compare as they should.
func opArgs(dst []ops.Arg, args []hw.Arg) []ops.Arg {
	dst = dst[:0]
	for i := range args {
		a := &args[i]
		if a.Buffer == nil {
			dst = append(dst, ops.Arg{Value: a.Value})
			continue
		}
		b := a.Buffer.(*Buffer)
		base := uintptr(unsafe.Pointer(unsafe.SliceData(b.region.mem)))
		dst = append(dst, ops.Arg{Buffer: true, Addr: uint64(base) + uint64(a.Offset), Len: uint64(a.Length)})
	}
	return dst
}

func opCheck(k *ops.Kernel) func([]hw.Arg) error {
	return func(args []hw.Arg) error {
		var buf [hw.MaxArgs]ops.Arg
		return k.Validate(opArgs(buf[:], args))
	}
}

func opKernel(k *ops.Kernel) Kernel {
	return func(l *Launch) error {
		var buf [hw.MaxArgs]ops.Arg
		var mem [hw.MaxArgs][]byte
		args := opArgs(buf[:], l.args)
		for i := range args {
			if args[i].Buffer {
				mem[i] = l.Bytes(i)
			}
		}
		return k.Run(args, mem[:len(args)])
	}
}
