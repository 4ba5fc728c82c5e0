//go:build !wasip1

package stagehost

import (
	"sync"

	"github.com/stagehost/stagehost/guest-sdk/internal/host"
)

// On platforms other than wasip1 every ABI call goes to the in-process host
// attached through package internal/host (the emulator, package emu). With
// none attached, calls return UNSUPPORTED.

func init() {
	host.SetRun(func(stage any) int32 {
		fn, _ := stage.(func(*Call) error)
		return int32(dispatch(fn))
	})
}

var recordPool = sync.Pool{New: func() any { return new(argRecords) }}

func cur() host.Host { return host.Current() }

// noHost is the status of a call made while no host is attached.
const noHost = StatusUnsupported

func hInputSize(out *uint32) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	n, st := h.InputSize()
	if st == 0 {
		*out = n
	}
	return Status(st)
}

func hInputRead(offset uint32, dst []byte, n *uint32) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	got, st := h.InputRead(offset, dst)
	if st == 0 {
		*n = got
	}
	return Status(st)
}

func hOutputWrite(src []byte) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	return Status(h.OutputWrite(src))
}

func hEntryName(dst []byte, n *uint32) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	got, st := h.EntryName(dst)
	if st == 0 || Status(st) == StatusOutOfBounds {
		*n = got
	}
	return Status(st)
}

func hErrorSet(msg string) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	return Status(h.ErrorSet(strBytesView(msg)))
}

func hLastError(dst []byte, n *uint32) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	got, st := h.LastError(dst)
	if st == 0 || Status(st) == StatusOutOfBounds {
		*n = got
	}
	return Status(st)
}

func hLog(level int32, msg string) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	return Status(h.Log(level, strBytesView(msg)))
}

func hLookup(get func(host.Host, []byte) (uint64, int32), name string, out *uint64) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	v, st := get(h, strBytesView(name))
	if st == 0 {
		*out = v
	}
	return Status(st)
}

func hStreamGet(name string, out *uint64) Status {
	return hLookup(host.Host.StreamGet, name, out)
}

func hBufferGet(name string, out *uint64) Status {
	return hLookup(host.Host.BufferGet, name, out)
}

func hProgramGet(name string, out *uint64) Status {
	return hLookup(host.Host.ProgramGet, name, out)
}

func hWeightsGet(name string, out *uint64) Status {
	return hLookup(host.Host.WeightsGet, name, out)
}

func hTensorGet(name string, rec *[tensorRecordSize]byte) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	return Status(h.TensorGet(strBytesView(name), rec[:]))
}

func hBufferAlloc(size uint32, out *uint64) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	v, st := h.BufferAlloc(size)
	if st == 0 {
		*out = v
	}
	return Status(st)
}

func hBufferAllocNamed(name string, size uint32, out *uint64) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	v, st := h.BufferAllocNamed(strBytesView(name), size)
	if st == 0 {
		*out = v
	}
	return Status(st)
}

func hBufferFree(buffer uint64) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	return Status(h.BufferFree(buffer))
}

func hBufferSize(buffer uint64, out *uint32) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	v, st := h.BufferSize(buffer)
	if st == 0 {
		*out = v
	}
	return Status(st)
}

func hStreamWrite(stream, buffer uint64, offset uint32, src []byte) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	return Status(h.StreamWrite(stream, buffer, offset, src))
}

func hStreamRead(stream, buffer uint64, offset uint32, dst []byte) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	return Status(h.StreamRead(stream, buffer, offset, dst))
}

func hStreamSubmit(stream, program uint64, rec *argRecords, count uint32) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	// Copy the records so that rec, which Submit keeps on its stack, does
	// not escape through the interface call.
	p := recordPool.Get().(*argRecords)
	*p = *rec
	st := h.StreamSubmit(stream, program, p[:min(int(count), MaxArgs)*argRecordSize], count)
	recordPool.Put(p)
	return Status(st)
}

func hStreamLaunch(stream, program uint64, grid, block *[3]uint32, shared uint32, rec *argRecords, count uint32) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	p := recordPool.Get().(*argRecords)
	*p = *rec
	st := h.StreamLaunch(stream, program, *grid, *block, shared, p[:min(int(count), MaxArgs)*argRecordSize], count)
	recordPool.Put(p)
	return Status(st)
}

// argsBase: natively, batch records address their argument records by
// offset into the args region.
func argsBase([]byte) uint32 { return 0 }

func hStreamSubmitBatch(stream uint64, cmds, args []byte, count uint32) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	return Status(h.StreamSubmitBatch(stream, cmds, args, count))
}

func hStreamSync(stream uint64) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	return Status(h.StreamSync(stream))
}

func hStreamIdle(stream uint64, out *uint32) Status {
	h := cur()
	if h == nil {
		return noHost
	}
	v, st := h.StreamIdle(stream)
	if st == 0 {
		*out = v
	}
	return Status(st)
}
