//go:build wasip1

package stagehost

import (
	"runtime"
	"unsafe"
)

// The host imports of ABI v1 (ABI.md §3), module stagehost_v1. Guest
// pointers are declared unsafe.Pointer, which the Go compiler passes as an
// i32 linear-memory address: unlike a pointer converted to an integer, it
// stays visible to the garbage collector and to stack copying until the
// call. //go:noescape lets the referenced memory live on the caller's
// stack (the host never keeps a pointer after returning), which is how
// package syscall declares its wasip1 imports too.

//go:wasmimport stagehost_v1 input_size
//go:noescape
func abiInputSize(outLenPtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 input_read
//go:noescape
func abiInputRead(offset uint32, dstPtr unsafe.Pointer, dstLen uint32, outNPtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 output_write
//go:noescape
func abiOutputWrite(srcPtr unsafe.Pointer, srcLen uint32) int32

//go:wasmimport stagehost_v1 entry_name
//go:noescape
func abiEntryName(dstPtr unsafe.Pointer, dstCap uint32, outLenPtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 error_set
//go:noescape
func abiErrorSet(srcPtr unsafe.Pointer, srcLen uint32) int32

// last_error is of ABI v1 revision 2: a module that imports it (every Go
// guest built with this SDK) needs a host of that revision.
//
//go:wasmimport stagehost_v1 last_error
//go:noescape
func abiLastError(dstPtr unsafe.Pointer, dstCap uint32, outLenPtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 log
//go:noescape
func abiLog(level int32, srcPtr unsafe.Pointer, srcLen uint32) int32

//go:wasmimport stagehost_v1 stream_get
//go:noescape
func abiStreamGet(namePtr unsafe.Pointer, nameLen uint32, outHandlePtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 buffer_get
//go:noescape
func abiBufferGet(namePtr unsafe.Pointer, nameLen uint32, outHandlePtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 program_get
//go:noescape
func abiProgramGet(namePtr unsafe.Pointer, nameLen uint32, outHandlePtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 buffer_alloc
//go:noescape
func abiBufferAlloc(size uint32, outHandlePtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 buffer_alloc_named
//go:noescape
func abiBufferAllocNamed(namePtr unsafe.Pointer, nameLen uint32, size uint32, outHandlePtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 buffer_free
func abiBufferFree(buffer uint64) int32

//go:wasmimport stagehost_v1 buffer_size
//go:noescape
func abiBufferSize(buffer uint64, outSizePtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 stream_write
//go:noescape
func abiStreamWrite(stream uint64, buffer uint64, offset uint32, srcPtr unsafe.Pointer, srcLen uint32) int32

//go:wasmimport stagehost_v1 stream_read
//go:noescape
func abiStreamRead(stream uint64, buffer uint64, offset uint32, dstPtr unsafe.Pointer, dstLen uint32) int32

//go:wasmimport stagehost_v1 stream_submit
//go:noescape
func abiStreamSubmit(stream uint64, program uint64, argsPtr unsafe.Pointer, argsCount uint32) int32

// stream_launch is of ABI v1 revision 4: only a module that calls
// Stream.Launch imports it.

//go:wasmimport stagehost_v1 stream_launch
//go:noescape
func abiStreamLaunch(stream uint64, program uint64, gridPtr unsafe.Pointer, blockPtr unsafe.Pointer, sharedBytes uint32, argsPtr unsafe.Pointer, argsCount uint32) int32

//go:wasmimport stagehost_v1 stream_submit_batch
//go:noescape
func abiStreamSubmitBatch(stream uint64, cmdsPtr unsafe.Pointer, cmdsCount uint32) int32

//go:wasmimport stagehost_v1 stream_sync
func abiStreamSync(stream uint64) int32

//go:wasmimport stagehost_v1 stream_idle
//go:noescape
func abiStreamIdle(stream uint64, outPtr unsafe.Pointer) int32

// weights_get and tensor_get are of ABI v1 revision 3: a module that
// imports them (one that calls LookupWeights or LookupTensor) needs a
// host of that revision.
//
//go:wasmimport stagehost_v1 weights_get
//go:noescape
func abiWeightsGet(namePtr unsafe.Pointer, nameLen uint32, outHandlePtr unsafe.Pointer) int32

//go:wasmimport stagehost_v1 tensor_get
//go:noescape
func abiTensorGet(namePtr unsafe.Pointer, nameLen uint32, outPtr unsafe.Pointer) int32

// The exports. stagehost_fence lives in package fence, and the SDK never
// exports stagehost_init: the presence of either changes what the host
// does.

//go:wasmexport stagehost_abi_v1
func abiMarkerV1() {}

//go:wasmexport stagehost_run
func abiRun() int32 { return int32(dispatch(nil)) }

// Bindings used by the portable code.

func bytesPtr(b []byte) unsafe.Pointer       { return unsafe.Pointer(unsafe.SliceData(b)) }
func stringPtr(s string) unsafe.Pointer      { return unsafe.Pointer(unsafe.StringData(s)) }
func sizeOf[T ~[]byte | ~string](v T) uint32 { return uint32(len(v)) }

func hInputSize(out *uint32) Status {
	return Status(abiInputSize(unsafe.Pointer(out)))
}

func hInputRead(offset uint32, dst []byte, n *uint32) Status {
	st := abiInputRead(offset, bytesPtr(dst), sizeOf(dst), unsafe.Pointer(n))
	runtime.KeepAlive(dst)
	return Status(st)
}

func hOutputWrite(src []byte) Status {
	st := abiOutputWrite(bytesPtr(src), sizeOf(src))
	runtime.KeepAlive(src)
	return Status(st)
}

func hEntryName(dst []byte, n *uint32) Status {
	st := abiEntryName(bytesPtr(dst), sizeOf(dst), unsafe.Pointer(n))
	runtime.KeepAlive(dst)
	return Status(st)
}

func hErrorSet(msg string) Status {
	st := abiErrorSet(stringPtr(msg), sizeOf(msg))
	runtime.KeepAlive(msg)
	return Status(st)
}

func hLastError(dst []byte, n *uint32) Status {
	st := abiLastError(bytesPtr(dst), sizeOf(dst), unsafe.Pointer(n))
	runtime.KeepAlive(dst)
	return Status(st)
}

func hLog(level int32, msg string) Status {
	st := abiLog(level, stringPtr(msg), sizeOf(msg))
	runtime.KeepAlive(msg)
	return Status(st)
}

func hStreamGet(name string, out *uint64) Status {
	st := abiStreamGet(stringPtr(name), sizeOf(name), unsafe.Pointer(out))
	runtime.KeepAlive(name)
	return Status(st)
}

func hBufferGet(name string, out *uint64) Status {
	st := abiBufferGet(stringPtr(name), sizeOf(name), unsafe.Pointer(out))
	runtime.KeepAlive(name)
	return Status(st)
}

func hProgramGet(name string, out *uint64) Status {
	st := abiProgramGet(stringPtr(name), sizeOf(name), unsafe.Pointer(out))
	runtime.KeepAlive(name)
	return Status(st)
}

func hWeightsGet(name string, out *uint64) Status {
	st := abiWeightsGet(stringPtr(name), sizeOf(name), unsafe.Pointer(out))
	runtime.KeepAlive(name)
	return Status(st)
}

func hTensorGet(name string, rec *[tensorRecordSize]byte) Status {
	st := abiTensorGet(stringPtr(name), sizeOf(name), unsafe.Pointer(rec))
	runtime.KeepAlive(name)
	return Status(st)
}

func hBufferAlloc(size uint32, out *uint64) Status {
	return Status(abiBufferAlloc(size, unsafe.Pointer(out)))
}

func hBufferAllocNamed(name string, size uint32, out *uint64) Status {
	st := abiBufferAllocNamed(stringPtr(name), sizeOf(name), size, unsafe.Pointer(out))
	runtime.KeepAlive(name)
	return Status(st)
}

func hBufferFree(buffer uint64) Status { return Status(abiBufferFree(buffer)) }

func hBufferSize(buffer uint64, out *uint32) Status {
	return Status(abiBufferSize(buffer, unsafe.Pointer(out)))
}

func hStreamWrite(stream, buffer uint64, offset uint32, src []byte) Status {
	st := abiStreamWrite(stream, buffer, offset, bytesPtr(src), sizeOf(src))
	runtime.KeepAlive(src)
	return Status(st)
}

func hStreamRead(stream, buffer uint64, offset uint32, dst []byte) Status {
	st := abiStreamRead(stream, buffer, offset, bytesPtr(dst), sizeOf(dst))
	runtime.KeepAlive(dst)
	return Status(st)
}

func hStreamSubmit(stream, program uint64, rec *argRecords, count uint32) Status {
	st := abiStreamSubmit(stream, program, unsafe.Pointer(rec), count)
	runtime.KeepAlive(rec)
	return Status(st)
}

func hStreamLaunch(stream, program uint64, grid, block *[3]uint32, shared uint32, rec *argRecords, count uint32) Status {
	st := abiStreamLaunch(stream, program, unsafe.Pointer(grid), unsafe.Pointer(block), shared, unsafe.Pointer(rec), count)
	runtime.KeepAlive(grid)
	runtime.KeepAlive(block)
	runtime.KeepAlive(rec)
	return Status(st)
}

// argsBase is the guest address of args, which the batch records' args_ptr
// fields are relative to. args must be heap memory (it is: see batchPool),
// which Go never moves.
func argsBase(args []byte) uint32 {
	return uint32(uintptr(bytesPtr(args)))
}

func hStreamSubmitBatch(stream uint64, cmds, args []byte, count uint32) Status {
	st := abiStreamSubmitBatch(stream, bytesPtr(cmds), count)
	// The records reach args only through integer addresses.
	runtime.KeepAlive(cmds)
	runtime.KeepAlive(args)
	return Status(st)
}

func hStreamSync(stream uint64) Status { return Status(abiStreamSync(stream)) }

func hStreamIdle(stream uint64, out *uint32) Status {
	return Status(abiStreamIdle(stream, unsafe.Pointer(out)))
}
