package stagehost

import (
	"math"
	"sync"
)

// Stream is a handle to one of the session's command streams (ABI.md §2).
// It is a plain value: copy it, compare it, keep it in a global. Handles
// outlive the Wasm instance, but Go globals do not: a replaced instance
// starts with empty globals and looks its handles up again.
type Stream struct{ h uint64 }

// Buffer is a handle to a device buffer: a declared one (LookupBuffer) or
// one allocated with Alloc.
type Buffer struct{ h uint64 }

// Program is a handle to a program prepared on the session's device.
type Program struct{ h uint64 }

// Handle returns the raw i64 handle (0 for the zero Stream).
func (s Stream) Handle() uint64 { return s.h }

// Handle returns the raw i64 handle (0 for the zero Buffer).
func (b Buffer) Handle() uint64 { return b.h }

// Handle returns the raw i64 handle (0 for the zero Program).
func (p Program) Handle() uint64 { return p.h }

// LookupStream returns the declared stream called name (stream_get).
// NOT_FOUND if the operator declared none.
func LookupStream(name string) (Stream, error) {
	var h uint64
	if err := checkName("stream_get", name, hStreamGet(name, &h)); err != nil {
		return Stream{}, err
	}
	return Stream{h}, nil
}

// LookupBuffer returns the declared buffer called name (buffer_get).
func LookupBuffer(name string) (Buffer, error) {
	var h uint64
	if err := checkName("buffer_get", name, hBufferGet(name, &h)); err != nil {
		return Buffer{}, err
	}
	return Buffer{h}, nil
}

// LookupProgram returns the program called name, prepared on the session's
// device (program_get). NOT_FOUND if the session may not use it.
func LookupProgram(name string) (Program, error) {
	var h uint64
	if err := checkName("program_get", name, hProgramGet(name, &h)); err != nil {
		return Program{}, err
	}
	return Program{h}, nil
}

// LookupWeights returns the read-only buffer over the device copy of the
// weights called name (weights_get, ABI revision 3): the file's bytes for
// raw weights, the data section after the header for safetensors. Every
// session that lists the weights shares that one copy, so the buffer can
// be read (an op argument of direction "in", Stream.Read, Size) but never
// written or freed: Stream.Write into it, an op argument that writes
// (direction "out" or "inout") and Free are refused with
// INVALID_ARGUMENT before anything is enqueued. NOT_FOUND when the
// session does not list the weights.
func LookupWeights(name string) (Buffer, error) {
	var h uint64
	if err := checkName("weights_get", name, hWeightsGet(name, &h)); err != nil {
		return Buffer{}, err
	}
	return Buffer{h}, nil
}

// LookupTensor returns the tensor called "<weights>/<tensor>" of
// safetensors weights the session lists (tensor_get, ABI revision 3): its
// Buf is the weights' read-only buffer (see [LookupWeights]), Off its
// byte offset there (the file's data_offsets[0]), Type its dtype and Dims
// its shape. A dtype the op library does not take (F64, I64, U8, ...)
// has a code of 16 or more (ABI.md §3): read such a tensor by its buffer
// and offset. NOT_FOUND when the session lists no such weights, or they
// have no such tensor.
func LookupTensor(name string) (Tensor, error) {
	var rec [tensorRecordSize]byte
	if err := checkName("tensor_get", name, hTensorGet(name, &rec)); err != nil {
		return Tensor{}, err
	}
	le := func(off int) uint64 {
		var v uint64
		for i := range 8 {
			v |= uint64(rec[off+i]) << (8 * i)
		}
		return v
	}
	rank := min(int(uint32(le(24)>>32)), maxTensorRank)
	dims := make([]int, rank)
	for i := range dims {
		dims[i] = int(le(32 + 8*i))
	}
	return Tensor{Buf: Buffer{le(0)}, Off: int(le(8)), Type: DType(uint32(le(24))), Dims: dims}, nil
}

// AllocBuffer allocates size bytes on the session's device, charged to its
// budget (buffer_alloc): OUT_OF_BUDGET when they would not fit. Free it with
// Buffer.Free; otherwise it lives as long as the session.
func AllocBuffer(size int) (Buffer, error) {
	if size < 0 || uint64(size) > math.MaxUint32 {
		return Buffer{}, &Error{Op: "buffer_alloc", Status: StatusInvalidArgument}
	}
	var h uint64
	if err := check("buffer_alloc", hBufferAlloc(uint32(size), &h)); err != nil {
		return Buffer{}, err
	}
	return Buffer{h}, nil
}

// AllocNamedBuffer returns the buffer this session allocated under name
// (buffer_alloc_named), or allocates it: size bytes on the session's
// device, charged to its budget. Use it for buffers the stage keeps across
// calls: a new instance (after a trap or timeout) finds them again, where
// handles kept in Go variables are lost with the old instance.
// INVALID_ARGUMENT if a buffer of that name has another size.
func AllocNamedBuffer(name string, size int) (Buffer, error) {
	if size < 0 || uint64(size) > math.MaxUint32 {
		return Buffer{}, &Error{Op: "buffer_alloc_named", Status: StatusInvalidArgument}
	}
	var h uint64
	if err := check("buffer_alloc_named", hBufferAllocNamed(name, uint32(size), &h)); err != nil {
		return Buffer{}, err
	}
	return Buffer{h}, nil
}

// Size returns the buffer's size in bytes (buffer_size).
func (b Buffer) Size() (int, error) {
	var n uint32
	if err := check("buffer_size", hBufferSize(b.h, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Free frees an allocated buffer (buffer_free). Its handle, and every copy
// of it, is stale afterwards. Declared buffers cannot be freed
// (INVALID_ARGUMENT).
func (b Buffer) Free() error { return check("buffer_free", hBufferFree(b.h)) }

// u32 converts an offset or length, reporting whether it fits an i32
// parameter (interpreted unsigned).
func u32(v int) (uint32, bool) {
	if v < 0 || uint64(v) > math.MaxUint32 {
		return 0, false
	}
	return uint32(v), true
}

// Write enqueues an upload of data into b at byte offset off
// (stream_write). The host copies data before Write returns, so data may be
// reused at once.
func (s Stream) Write(b Buffer, off int, data []byte) error {
	o, ok := u32(off)
	if !ok {
		return &Error{Op: "stream_write", Status: StatusInvalidArgument}
	}
	return check("stream_write", hStreamWrite(s.h, b.h, o, data))
}

// Read downloads len(dst) bytes of b at byte offset off into dst
// (stream_read). It waits for the download and every earlier command on
// the stream. Failures of earlier launches are reported by Sync.
func (s Stream) Read(b Buffer, off int, dst []byte) error {
	o, ok := u32(off)
	if !ok {
		return &Error{Op: "stream_read", Status: StatusInvalidArgument}
	}
	return check("stream_read", hStreamRead(s.h, b.h, o, dst))
}

// Sync waits until every command on the stream has retired and returns the
// first failure no earlier Sync returned (stream_sync). A command that
// failed on the device gives an error of status FAULT (ErrFault), which the
// host also records: the call then fails with Fault even if the stage or
// fence ignores the error (ABI.md §4.4).
func (s Stream) Sync() error { return check("stream_sync", hStreamSync(s.h)) }

// Idle reports whether every command on the stream has retired, without
// waiting (stream_idle).
func (s Stream) Idle() (bool, error) {
	var v uint32
	if err := check("stream_idle", hStreamIdle(s.h, &v)); err != nil {
		return false, err
	}
	return v != 0, nil
}

// Arg is one argument of a program launch: a buffer range or a scalar
// (ABI.md §3.1). Make one with Buf, Whole, U32, U64 or F32.
type Arg struct {
	kind   uint32
	off    uint32
	length uint32
	bad    bool // an offset or length that does not fit the record
	value  uint64
}

// Buf is the byte range [off, off+length) of b. Both must lie inside the
// buffer when the launch is submitted (INVALID_ARGUMENT otherwise).
func Buf(b Buffer, off, length int) Arg {
	o, ok1 := u32(off)
	l, ok2 := u32(length)
	return Arg{kind: argBuffer, off: o, length: l, bad: !ok1 || !ok2, value: b.h}
}

// Whole is all of b: offset 0, length ToEnd.
func Whole(b Buffer) Arg { return Arg{kind: argBuffer, length: ToEnd, value: b.h} }

// U32 is an unsigned 32-bit scalar.
func U32(v uint32) Arg { return Arg{kind: argScalar, value: uint64(v)} }

// U64 is a 64-bit scalar.
func U64(v uint64) Arg { return Arg{kind: argScalar, value: v} }

// F32 is a float32 scalar: its IEEE-754 bits in the low 32 bits.
func F32(v float32) Arg { return Arg{kind: argScalar, value: uint64(math.Float32bits(v))} }

// argRecords holds the argument records of one launch.
type argRecords [MaxArgs * argRecordSize]byte

func le32(b []byte, v uint32) {
	_ = b[3]
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func le64(b []byte, v uint64) {
	_ = b[7]
	le32(b, uint32(v))
	le32(b[4:], uint32(v>>32))
}

// encodeArgs writes the 24-byte records of args into dst (ABI.md §3.1). It
// reports false for an argument made from an out-of-range offset or length.
func encodeArgs(dst []byte, args []Arg) bool {
	for i := range args {
		a := &args[i]
		if a.bad {
			return false
		}
		r := dst[i*argRecordSize : (i+1)*argRecordSize]
		le32(r[0:], a.kind)
		le32(r[4:], a.off)
		le32(r[8:], a.length)
		le32(r[12:], 0)
		le64(r[16:], a.value)
	}
	return true
}

// Submit enqueues one launch of p with args (stream_submit) and returns once
// it is enqueued; failures of the launch itself are reported by Sync. At
// most MaxArgs arguments: the host refuses more (StatusInvalidArgument,
// its last error "17 arguments, at most 16"). Submit does not allocate.
func (s Stream) Submit(p Program, args ...Arg) error {
	var rec argRecords // stays on the stack: the host copies the records
	if len(args) > MaxArgs {
		// The host refuses the count before it reads any record, and
		// sets the last error.
		return check("stream_submit", hStreamSubmit(s.h, p.h, &rec, uint32(len(args))))
	}
	if !encodeArgs(rec[:], args) {
		return &Error{Op: "stream_submit", Status: StatusInvalidArgument}
	}
	return check("stream_submit", hStreamSubmit(s.h, p.h, &rec, uint32(len(args))))
}

// Dim3 is a launch dimension: x, y, z.
type Dim3 = [3]uint32

// Launch enqueues one launch of the vendor kernel p (stream_launch, ABI
// revision 4) with its grid of blocks, each block's threads and its
// dynamic shared memory in bytes. The host checks the shape against the
// device's launch limits and args against the kernel's declaration
// before it enqueues anything. Built-in programs are launched with
// Submit; a vendor kernel given to Submit fails with
// StatusInvalidArgument.
func (s Stream) Launch(p Program, grid, block Dim3, sharedBytes uint32, args ...Arg) error {
	var rec argRecords
	if len(args) > MaxArgs {
		// Refused by the host, which sets the last error (see Submit).
		return check("stream_launch", hStreamLaunch(s.h, p.h, &grid, &block, sharedBytes, &rec, uint32(len(args))))
	}
	if !encodeArgs(rec[:], args) {
		return &Error{Op: "stream_launch", Status: StatusInvalidArgument}
	}
	return check("stream_launch", hStreamLaunch(s.h, p.h, &grid, &block, sharedBytes, &rec, uint32(len(args))))
}

// Command is one launch of a batch.
type Command struct {
	Program Program
	Args    []Arg
}

// Cmd is shorthand for Command{Program: p, Args: args}.
func Cmd(p Program, args ...Arg) Command { return Command{Program: p, Args: args} }

// batchScratch holds the encoded records of one SubmitBatch: the batch
// records, then every launch's argument records.
type batchScratch struct{ cmds, args []byte }

var batchPool = sync.Pool{New: func() any { return new(batchScratch) }}

// SubmitBatch enqueues cmds in order with one host call
// (stream_submit_batch); the host validates every command before enqueuing
// any. At most MaxBatch commands of at most MaxArgs arguments each: the
// host refuses more, with its last error. An empty batch does nothing.
func (s Stream) SubmitBatch(cmds ...Command) error {
	const op = "stream_submit_batch"
	if len(cmds) == 0 {
		return nil
	}
	if len(cmds) > MaxBatch {
		// The host refuses the count before it reads any record, and
		// sets the last error.
		return check(op, hStreamSubmitBatch(s.h, nil, nil, uint32(len(cmds))))
	}
	nargs := 0
	for i := range cmds {
		nargs += len(cmds[i].Args)
	}
	sc := batchPool.Get().(*batchScratch)
	defer batchPool.Put(sc)
	sc.cmds = grow(sc.cmds, len(cmds)*batchRecordSize)
	// Never empty, so that argsBase has an address even when no command
	// has arguments.
	sc.args = grow(sc.args, max(nargs*argRecordSize, argRecordSize))
	base := argsBase(sc.args)
	off := 0
	for i := range cmds {
		c := &cmds[i]
		n := len(c.Args)
		if !encodeArgs(sc.args[off:off+n*argRecordSize], c.Args) {
			return &Error{Op: op, Status: StatusInvalidArgument}
		}
		r := sc.cmds[i*batchRecordSize : (i+1)*batchRecordSize]
		le64(r[0:], c.Program.h)
		le32(r[8:], base+uint32(off))
		le32(r[12:], uint32(n))
		off += n * argRecordSize
	}
	return check(op, hStreamSubmitBatch(s.h, sc.cmds, sc.args, uint32(len(cmds))))
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
