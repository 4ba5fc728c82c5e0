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
// Buffer.Free; otherwise it lives as long as the session. A size below 0
// or above 2^32 − 1 is asked for as 0, which the host refuses
// (INVALID_ARGUMENT, its last error "buffer size 0").
func AllocBuffer(size int) (Buffer, error) {
	var h uint64
	if err := check("buffer_alloc", hBufferAlloc(sizeArg(size), &h)); err != nil {
		return Buffer{}, err
	}
	return Buffer{h}, nil
}

// AllocNamedBuffer returns the buffer this session allocated under name
// (buffer_alloc_named), or allocates it: size bytes on the session's
// device, charged to its budget. Use it for buffers the stage keeps across
// calls: a new instance (after a trap or timeout) finds them again, where
// handles kept in Go variables are lost with the old instance.
// INVALID_ARGUMENT if a buffer of that name has another size. A size that
// does not fit 32 bits is asked for as 0, as in AllocBuffer.
func AllocNamedBuffer(name string, size int) (Buffer, error) {
	var h uint64
	if err := check("buffer_alloc_named", hBufferAllocNamed(name, sizeArg(size), &h)); err != nil {
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

// A size, offset or length that does not fit the ABI's 32-bit parameters
// is not refused by the SDK: it goes to the host as a value the host
// refuses (INVALID_ARGUMENT), so the error's Reason and LastError give the
// host's own last error, as for any other refused call, and the host's
// order of checks holds (a bad handle is still BAD_HANDLE).
const (
	// outsideOffset stands for an offset below 0 or above 2^32 − 1: no
	// buffer of fewer than 2^32 − 1 bytes has a byte there.
	outsideOffset = math.MaxUint32
	// outsideLength stands for a length that does not fit: the longest
	// that is not ToEnd. A record of both is outside every buffer of
	// fewer than 2^33 − 3 bytes.
	outsideLength = math.MaxUint32 - 1
)

// u32 converts an offset or length, reporting whether it fits an i32
// parameter (interpreted unsigned).
func u32(v int) (uint32, bool) {
	if v < 0 || uint64(v) > math.MaxUint32 {
		return 0, false
	}
	return uint32(v), true
}

// offsetArg is off as a transfer's offset parameter: outsideOffset if
// it does not fit.
func offsetArg(off int) uint32 {
	if o, ok := u32(off); ok {
		return o
	}
	return outsideOffset
}

// sizeArg is size as buffer_alloc's parameter: 0, which the host refuses,
// if it does not fit.
func sizeArg(size int) uint32 {
	n, _ := u32(size)
	return n
}

// Write enqueues an upload of data into b at byte offset off
// (stream_write). The host copies data before Write returns, so data may be
// reused at once. An offset below 0 or above 2^32 − 1 is sent as
// 2^32 − 1, which the host refuses ("range [4294967295,+4) outside a
// buffer of 64 bytes").
func (s Stream) Write(b Buffer, off int, data []byte) error {
	return check("stream_write", hStreamWrite(s.h, b.h, offsetArg(off), data))
}

// Read downloads len(dst) bytes of b at byte offset off into dst
// (stream_read). It waits for the download and every earlier command on
// the stream. Failures of earlier launches are reported by Sync. An
// offset that does not fit 32 bits is sent as in Write.
func (s Stream) Read(b Buffer, off int, dst []byte) error {
	return check("stream_read", hStreamRead(s.h, b.h, offsetArg(off), dst))
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
	value  uint64
}

// Buf is the byte range [off, off+length) of b. Both must lie inside the
// buffer when the launch is submitted (INVALID_ARGUMENT otherwise, the
// host's last error naming the argument: "argument 0: range [60,+8)
// outside a buffer of 64 bytes"). An offset or length that does not fit
// 32 bits (a negative one, say) makes the record the range
// [2^32 − 1, +2^32 − 2), which the host refuses in the same words
// ("argument 0: range [4294967295,+4294967294) outside a buffer of 64
// bytes").
func Buf(b Buffer, off, length int) Arg {
	o, ok1 := u32(off)
	l, ok2 := u32(length)
	if !ok1 || !ok2 {
		o, l = outsideOffset, outsideLength
	}
	return Arg{kind: argBuffer, off: o, length: l, value: b.h}
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

// encodeArgs writes the 24-byte records of args into dst (ABI.md §3.1).
func encodeArgs(dst []byte, args []Arg) {
	for i := range args {
		a := &args[i]
		r := dst[i*argRecordSize : (i+1)*argRecordSize]
		le32(r[0:], a.kind)
		le32(r[4:], a.off)
		le32(r[8:], a.length)
		le32(r[12:], 0)
		le64(r[16:], a.value)
	}
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
	encodeArgs(rec[:], args)
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
	encodeArgs(rec[:], args)
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
		encodeArgs(sc.args[off:off+n*argRecordSize], c.Args)
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
