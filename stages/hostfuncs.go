package stages

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tetratelabs/wazero/api"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/internal/deadline"
	"github.com/stagehost/stagehost/internal/monotime"
)

// hostFunc is one host function of module stagehost_v1, given the calling
// session's state. Parameters arrive in stack; the i32 status goes back in
// stack[0].
type hostFunc func(ctx context.Context, st *callState, mod api.Module, stack []uint64)

// stackBased adapts the hostFunc named name to wazero's stack-based
// api.GoModuleFunc, finding the session through the call's context. A
// call during the initialisation a snapshot is taken of (there is no
// session) unwinds it, so the module is not snapshotted. A call the host
// did not make (impossible through the public API) gets BUSY.
//
// A non-OK status becomes the session's last error (ABI.md §3,
// last_error), except last_error's own: the error the function gave with
// it ([retErr]), or the status's own text. An OK status costs one
// comparison here and changes nothing.
func stackBased(name string, f hostFunc) api.GoModuleFunc {
	notes := name != abi.FnLastError
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		st := state(ctx)
		if st == nil {
			if c, ok := ctx.(*callContext); ok && c.template {
				panic(&errTemplateHostCall{fn: name})
			}
			ret(stack, abi.StatusBusy)
			return
		}
		f(ctx, st, mod, stack)
		if s := abi.Status(uint32(stack[0])); s != abi.StatusOK && notes {
			st.noteError(s)
		}
	}
}

// noteError makes the failure behind status s the call's last error: the
// error the host function recorded with [retErr], else the
// status's own text (for the statuses a function returns without
// detail, such as OUT_OF_BOUNDS).
func (st *callState) noteError(s abi.Status) {
	err := st.failure
	st.failure = nil
	if err == nil {
		err = s.Err()
	}
	st.lastErr = appendMessage(st.lastErr[:0], err.Error())
}

// appendMessage appends msg to dst, cut to abi.MaxErrorMessage bytes at
// a UTF-8 character boundary.
func appendMessage(dst []byte, msg string) []byte {
	if len(msg) > abi.MaxErrorMessage {
		cut := abi.MaxErrorMessage
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	return append(dst, msg...)
}

// hostFunctions implements module stagehost_v1 (ABI.md §3).
var hostFunctions = map[string]hostFunc{
	abi.FnInputSize:         hostInputSize,
	abi.FnInputRead:         hostInputRead,
	abi.FnOutputWrite:       hostOutputWrite,
	abi.FnEntryName:         hostEntryName,
	abi.FnErrorSet:          hostErrorSet,
	abi.FnLastError:         hostLastError,
	abi.FnLog:               hostLog,
	abi.FnStreamGet:         hostLookup(abi.KindStream),
	abi.FnBufferGet:         hostLookup(abi.KindBuffer),
	abi.FnProgramGet:        hostLookup(abi.KindProgram),
	abi.FnBufferAlloc:       hostBufferAlloc,
	abi.FnBufferAllocNamed:  hostBufferAllocNamed,
	abi.FnBufferFree:        hostBufferFree,
	abi.FnBufferSize:        hostBufferSize,
	abi.FnStreamWrite:       hostStreamWrite,
	abi.FnStreamRead:        hostStreamRead,
	abi.FnStreamSubmit:      hostStreamSubmit,
	abi.FnStreamLaunch:      hostStreamLaunch,
	abi.FnStreamSubmitBatch: hostStreamSubmitBatch,
	abi.FnStreamSync:        hostStreamSync,
	abi.FnStreamIdle:        hostStreamIdle,
	abi.FnWeightsGet:        hostWeightsGet,
	abi.FnTensorGet:         hostTensorGet,
}

// callContext is the context of every host-initiated entry into a
// session's guest code: the entry's deadline and the caller's values and
// cancellation (a reusable [deadline.Context], so an entry allocates
// nothing), plus the session state host functions act on.
type callContext struct {
	deadline.Context
	st    *callState
	slice time.Duration // when the guest's current time slice began (a monotime offset; 0: not yet)
	// template: the initialisation at load that a snapshot is taken of,
	// with no session (st is nil).
	template bool
}

// guestSlice is how long a guest runs before [hostYield] lets other
// goroutines run.
const guestSlice = 500 * time.Microsecond

// state returns the calling session, or nil for a call the host did not
// make (which cannot happen through the public API). It asserts the
// concrete type: an assertion to an interface would cost an itab lookup
// on every host call.
func state(ctx context.Context) *callState {
	if c, ok := ctx.(*callContext); ok {
		return c.st
	}
	return nil
}

// interruption unwinds a guest whose deadline passed or whose caller gave
// up: [hostYield] panics with it, and the engine returns it, wrapped, from
// the guest call.
type interruption struct{ cause error }

func (e *interruption) Error() string { return "guest interrupted: " + e.cause.Error() }

// yieldFuel is the countdown an instrumented module gets back from
// [hostYield]: about this many Wasm instructions run between two checks
// of the deadline (a tenth of a millisecond of guest code or so).
const yieldFuel = 1 << 18

// hostYield is stagehost_internal.yield, which every instrumented module
// calls when its countdown runs out. It unwinds the guest if its entry's
// deadline passed or its caller's context ended; otherwise it returns a
// new countdown. Returning to Go also gives the scheduler and the garbage
// collector a safe point.
func hostYield(ctx context.Context, _ api.Module, stack []uint64) {
	if c, ok := ctx.(*callContext); ok {
		if err := c.Err(); err != nil {
			panic(&interruption{cause: err})
		}
		// Every guestSlice of guest time, let other goroutines run:
		// guests that spin then share the CPUs at that granularity
		// rather than the scheduler's 10 ms, so a guest past its
		// deadline soon gets a CPU to notice it.
		now := monotime.Since()
		if c.slice == 0 {
			c.slice = now
		} else if now-c.slice >= guestSlice {
			c.slice = now
			runtime.Gosched()
		}
	} else if err := ctx.Err(); err != nil { // a vendor kernel's launch (kernel.go)
		panic(&interruption{cause: err})
	}
	stack[0] = yieldFuel
}

func ret(stack []uint64, s abi.Status) { stack[0] = uint64(uint32(s)) }

// retErr returns err's status, and records err as the failure behind it
// for the call's last error (see [callState.noteError]).
func retErr(st *callState, stack []uint64, err error) {
	if err != nil {
		st.failure = err
	}
	ret(stack, abi.StatusOf(err))
}

// guest returns the guest memory range [ptr, ptr+n), or false.
func guest(mod api.Module, ptr, n uint32) ([]byte, bool) {
	mem := mod.Memory()
	if mem == nil || uint64(ptr)+uint64(n) > uint64(mem.Size()) {
		return nil, false
	}
	return mem.Read(ptr, n)
}

func putU32(mod api.Module, ptr, v uint32) bool {
	b, ok := guest(mod, ptr, 4)
	if ok {
		binary.LittleEndian.PutUint32(b, v)
	}
	return ok
}

func putU64(mod api.Module, ptr uint32, v uint64) bool {
	b, ok := guest(mod, ptr, 8)
	if ok {
		binary.LittleEndian.PutUint64(b, v)
	}
	return ok
}

func hostInputSize(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	if !putU32(mod, uint32(stack[0]), uint32(len(st.input))) {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	ret(stack, abi.StatusOK)
}

func hostInputRead(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	off, dstPtr, dstLen, outPtr := uint32(stack[0]), uint32(stack[1]), uint32(stack[2]), uint32(stack[3])
	dst, ok := guest(mod, dstPtr, dstLen)
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	if _, ok := guest(mod, outPtr, 4); !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	if uint64(off) > uint64(len(st.input)) {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrInvalidArgument, "offset %d is beyond the input's %d bytes", off, len(st.input)))
		return
	}
	n := copy(dst, st.input[off:])
	putU32(mod, outPtr, uint32(n))
	ret(stack, abi.StatusOK)
}

func hostOutputWrite(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	src, ok := guest(mod, uint32(stack[0]), uint32(stack[1]))
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	if len(st.output)-st.outputBase+len(src) > st.outputLimit {
		retErr(st, stack, fmt.Errorf("%d more bytes would take the output past its limit of %d bytes: %w", len(src), st.outputLimit, abi.ErrOutputTooLarge))
		return
	}
	st.output = append(st.output, src...)
	ret(stack, abi.StatusOK)
}

func hostEntryName(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	dstPtr, dstCap, outPtr := uint32(stack[0]), uint32(stack[1]), uint32(stack[2])
	dst, okDst := guest(mod, dstPtr, dstCap)
	if _, ok := guest(mod, outPtr, 4); !ok || !okDst {
		ret(stack, abi.StatusOutOfBounds) // nothing written
		return
	}
	putU32(mod, outPtr, uint32(len(st.entry)))
	if len(dst) < len(st.entry) {
		ret(stack, abi.StatusOutOfBounds) // the length only, so the guest can size its buffer
		return
	}
	copy(dst, st.entry)
	ret(stack, abi.StatusOK)
}

func hostErrorSet(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	src, ok := guest(mod, uint32(stack[0]), uint32(stack[1]))
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	st.errMsg = string(src[:min(len(src), abi.MaxErrorMessage)])
	ret(stack, abi.StatusOK)
}

// hostLastError is last_error: entry_name's out-parameter rule applied to
// the call's last error message (empty when there is none).
func hostLastError(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	dstPtr, dstCap, outPtr := uint32(stack[0]), uint32(stack[1]), uint32(stack[2])
	dst, okDst := guest(mod, dstPtr, dstCap)
	if _, ok := guest(mod, outPtr, 4); !ok || !okDst {
		ret(stack, abi.StatusOutOfBounds) // nothing written
		return
	}
	putU32(mod, outPtr, uint32(len(st.lastErr)))
	if len(dst) < len(st.lastErr) {
		ret(stack, abi.StatusOutOfBounds) // the length only, so the guest can size its buffer
		return
	}
	copy(dst, st.lastErr)
	ret(stack, abi.StatusOK)
}

// maxLogsPerCall bounds guest log lines per call; the rest are counted and
// dropped.
const maxLogsPerCall = 64

func hostLog(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	level := int32(stack[0])
	src, ok := guest(mod, uint32(stack[1]), uint32(stack[2]))
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	if level < abi.LogDebug || level > abi.LogError {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrInvalidArgument, "log level %d is not one of 0 to 3", level))
		return
	}
	st.logs++
	if st.logs <= maxLogsPerCall {
		lv := []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError}[level]
		st.sess.logger.Log(ctx, lv, string(src[:min(len(src), 4096)]), "session", st.sess.name)
	}
	ret(stack, abi.StatusOK)
}

// notDeclared says why a lookup by name found nothing.
var notDeclared = map[abi.HandleKind]string{
	abi.KindStream:  "declares no stream of that name",
	abi.KindBuffer:  "declares no buffer of that name",
	abi.KindProgram: "may use no program of that name",
}

func hostLookup(kind abi.HandleKind) hostFunc {
	return func(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
		name, ok := guest(mod, uint32(stack[0]), uint32(stack[1]))
		if !ok {
			ret(stack, abi.StatusOutOfBounds)
			return
		}
		outPtr := uint32(stack[2])
		if _, ok := guest(mod, outPtr, 8); !ok {
			ret(stack, abi.StatusOutOfBounds)
			return
		}
		h, found := st.table.lookup(kind, name)
		if !found {
			retErr(st, stack, errdefs.Errorf(errdefs.ErrNotFound, "%s %q not found: the session %s", kind, name, notDeclared[kind]))
			return
		}
		putU64(mod, outPtr, uint64(h))
		ret(stack, abi.StatusOK)
	}
}

// maxLiveAllocations bounds a session's guest allocations, whatever their
// size, so tiny allocations cannot exhaust host mappings.
const maxLiveAllocations = 4096

func hostBufferAlloc(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	size, outPtr := uint32(stack[0]), uint32(stack[1])
	if _, ok := guest(mod, outPtr, 8); !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	h, err := allocBuffer(st, size, "")
	if err != nil {
		retErr(st, stack, err)
		return
	}
	putU64(mod, outPtr, uint64(h))
	ret(stack, abi.StatusOK)
}

// allocBuffer allocates a guest buffer on the session's device and gives it
// a handle (and, when name is not empty, a name).
func allocBuffer(st *callState, size uint32, name string) (abi.Handle, error) {
	if size == 0 {
		return 0, errdefs.Errorf(errdefs.ErrInvalidArgument, "buffer size 0")
	}
	if st.table.live() >= maxLiveAllocations {
		return 0, errdefs.Errorf(errdefs.ErrOutOfBudget, "%d live allocations", st.table.live())
	}
	buf, err := st.sess.owner.Alloc(st.sess.cfg.device, int(size), 0)
	if err != nil {
		return 0, err
	}
	h, err := st.table.allocate(&handleEntry{kind: abi.KindBuffer, buffer: buf, name: name})
	if err != nil {
		_ = st.sess.owner.FreeBuffer(buf)
		return 0, err
	}
	if name != "" {
		st.table.named[name] = h
	}
	return h, nil
}

// hostBufferAllocNamed returns the live buffer allocated under a name, or
// allocates one, so a replaced instance finds its buffers again.
func hostBufferAllocNamed(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	name, ok := guest(mod, uint32(stack[0]), uint32(stack[1]))
	size, outPtr := uint32(stack[2]), uint32(stack[3])
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	if _, ok := guest(mod, outPtr, 8); !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	if len(name) == 0 || len(name) > abi.MaxBufferName {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrInvalidArgument, "a buffer name of %d bytes: 1 to %d", len(name), abi.MaxBufferName))
		return
	}
	if h, found := st.table.named[string(name)]; found {
		e, err := st.table.get(uint64(h), abi.KindBuffer)
		if err != nil {
			retErr(st, stack, err)
			return
		}
		if uint64(e.buffer.Size()) != uint64(size) {
			retErr(st, stack, errdefs.Errorf(errdefs.ErrInvalidArgument, "buffer %q has %d bytes, not %d", name, e.buffer.Size(), size))
			return
		}
		putU64(mod, outPtr, uint64(h))
		ret(stack, abi.StatusOK)
		return
	}
	h, err := allocBuffer(st, size, string(name))
	if err != nil {
		retErr(st, stack, err)
		return
	}
	putU64(mod, outPtr, uint64(h))
	ret(stack, abi.StatusOK)
}

func hostBufferFree(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	e, err := st.table.get(stack[0], abi.KindBuffer)
	if err != nil {
		retErr(st, stack, err)
		return
	}
	if e.weights != nil {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrInvalidArgument, "buffer_free: buffer is %s, which cannot be freed", readOnlyNote(e)))
		return
	}
	if e.declared {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrInvalidArgument, "a declared buffer cannot be freed"))
		return
	}
	// The handle dies now; the memory is freed only after a fence has
	// proven that no device work still uses it.
	st.table.free(abi.Handle(stack[0]))
	st.pendingFree = append(st.pendingFree, e.buffer)
	ret(stack, abi.StatusOK)
}

func hostBufferSize(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	e, err := st.table.get(stack[0], abi.KindBuffer)
	if err != nil {
		retErr(st, stack, err)
		return
	}
	if !putU32(mod, uint32(stack[1]), uint32(e.buffer.Size())) {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	ret(stack, abi.StatusOK)
}

// streamAndBuffer resolves the (stream, buffer) handle pair of a transfer.
func streamAndBuffer(st *callState, stream, buffer uint64) (hw.Stream, hw.Buffer, error) {
	s, err := st.table.get(stream, abi.KindStream)
	if err != nil {
		return nil, nil, err
	}
	b, err := st.table.get(buffer, abi.KindBuffer)
	if err != nil {
		return nil, nil, err
	}
	return s.stream, b.buffer, nil
}

func checkRange(b hw.Buffer, off, n uint32) error {
	if uint64(off)+uint64(n) > uint64(b.Size()) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "range [%d,+%d) outside a buffer of %d bytes", off, n, b.Size())
	}
	return nil
}

func hostStreamWrite(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	stream, buf, err := streamAndBuffer(st, stack[0], stack[1])
	if err != nil {
		retErr(st, stack, err)
		return
	}
	if e, _ := st.table.get(stack[1], abi.KindBuffer); e.weights != nil {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrInvalidArgument, "stream_write: buffer is %s, which cannot be written", readOnlyNote(e)))
		return
	}
	off := uint32(stack[2])
	src, ok := guest(mod, uint32(stack[3]), uint32(stack[4]))
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	if err := checkRange(buf, off, uint32(len(src))); err != nil {
		retErr(st, stack, err)
		return
	}
	// Capture the bytes now: the guest may reuse its memory as soon as the
	// call returns, while the upload runs later on the stream.
	staged, err := st.stage(ctx, len(src))
	if err != nil {
		retErr(st, stack, err)
		return
	}
	copy(staged, src)
	_, err = stream.Write(buf, int(off), staged)
	retErr(st, stack, err)
}

func hostStreamRead(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	stream, buf, err := streamAndBuffer(st, stack[0], stack[1])
	if err != nil {
		retErr(st, stack, err)
		return
	}
	off := uint32(stack[2])
	dst, ok := guest(mod, uint32(stack[3]), uint32(stack[4]))
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	if err := checkRange(buf, off, uint32(len(dst))); err != nil {
		retErr(st, stack, err)
		return
	}
	// The guest is blocked in this call, so its memory cannot move or
	// grow until the read has landed.
	c, err := stream.Read(buf, int(off), dst)
	if err == nil {
		err = c.Wait(ctx)
	}
	retErr(st, stack, err)
}

// decodeArgs fills st.args from n argument records at ptr.
func decodeArgs(st *callState, mod api.Module, prog *handleEntry, ptr, n uint32) ([]hw.Arg, error) {
	if n > abi.MaxArgs {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%d arguments, at most %d", n, abi.MaxArgs)
	}
	recs, ok := guest(mod, ptr, n*abi.ArgRecordSize)
	if !ok {
		return nil, abi.ErrOutOfBounds
	}
	args := st.args[:n]
	for i := range args {
		r := recs[i*abi.ArgRecordSize:]
		kind := binary.LittleEndian.Uint32(r[0:])
		off := binary.LittleEndian.Uint32(r[4:])
		length := binary.LittleEndian.Uint32(r[8:])
		reserved := binary.LittleEndian.Uint32(r[12:])
		val := binary.LittleEndian.Uint64(r[16:])
		if reserved != 0 {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "argument %d: reserved field is not zero", i)
		}
		switch kind {
		case abi.ArgScalar:
			args[i] = hw.Arg{Value: val}
		case abi.ArgBuffer:
			e, err := st.table.get(val, abi.KindBuffer)
			if err != nil {
				return nil, err
			}
			if e.weights != nil {
				if err := readOnlyArg(prog, i, e); err != nil {
					return nil, err
				}
			}
			size := e.buffer.Size()
			if length == abi.ToEnd {
				if uint64(off) > uint64(size) {
					return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "argument %d: offset %d beyond a buffer of %d bytes", i, off, size)
				}
				length = uint32(size) - off
			}
			if err := checkRange(e.buffer, off, length); err != nil {
				return nil, fmt.Errorf("argument %d: %w", i, err)
			}
			args[i] = hw.Arg{Buffer: e.buffer, Offset: int(off), Length: int(length)}
		default:
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "argument %d: unknown kind %d", i, kind)
		}
	}
	return args, nil
}

func hostStreamSubmit(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	s, err := st.table.get(stack[0], abi.KindStream)
	if err != nil {
		retErr(st, stack, err)
		return
	}
	p, err := st.table.get(stack[1], abi.KindProgram)
	if err != nil {
		retErr(st, stack, err)
		return
	}
	if p.vendor != nil {
		retErr(st, stack, needsLaunch(p))
		return
	}
	args, err := decodeArgs(st, mod, p, uint32(stack[2]), uint32(stack[3]))
	if err != nil {
		retErr(st, stack, err)
		return
	}
	st.cmd.Program, st.cmd.Args = p.program, args
	_, err = s.stream.Submit(&st.cmd)
	clear(args)
	st.cmd.Program, st.cmd.Args = nil, nil
	retErr(st, stack, err)
}

// needsLaunch is the error of a vendor kernel given to stream_submit or
// stream_submit_batch.
func needsLaunch(p *handleEntry) error {
	return errdefs.Errorf(errdefs.ErrInvalidArgument, "program %q is a vendor kernel: launch it with stream_launch, which gives its grid, block and shared memory (ABI.md §3.5)", p.program.Name())
}

// hostStreamLaunch is stream_launch (revision 4): one launch of a vendor
// kernel with its shape, validated against the device's launch limits
// and the kernel's declaration before anything is enqueued.
func hostStreamLaunch(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	s, err := st.table.get(stack[0], abi.KindStream)
	if err != nil {
		retErr(st, stack, err)
		return
	}
	p, err := st.table.get(stack[1], abi.KindProgram)
	if err != nil {
		retErr(st, stack, err)
		return
	}
	grid, ok1 := guest(mod, uint32(stack[2]), 12)
	block, ok2 := guest(mod, uint32(stack[3]), 12)
	if !ok1 || !ok2 {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	if p.vendor == nil {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrInvalidArgument, "program %q is built in: stream_launch launches vendor kernels; use stream_submit", p.program.Name()))
		return
	}
	sh := &st.shape
	for i := range 3 {
		sh.Grid[i] = binary.LittleEndian.Uint32(grid[4*i:])
		sh.Block[i] = binary.LittleEndian.Uint32(block[4*i:])
	}
	sh.SharedBytes = uint32(stack[4])
	if err := hw.LimitsOf(s.stream.Device()).Check(sh); err != nil {
		retErr(st, stack, fmt.Errorf("kernel %q: %w", p.vendor.Name, err))
		return
	}
	args, err := decodeArgs(st, mod, p, uint32(stack[5]), uint32(stack[6]))
	if err == nil {
		err = checkSignature(p.vendor, args)
	}
	if err != nil {
		clear(args)
		retErr(st, stack, err)
		return
	}
	st.cmd.Program, st.cmd.Args, st.cmd.Shape = p.program, args, sh
	// The launch carries the call's deadline (ABI.md §3.6): a backend
	// that can stop a running kernel (sim's Wasm kernels) stops it there,
	// so the fence that drains the stream after an interrupted call is
	// not held up by it. ctx is the call's context, armed with the
	// earlier of the entry's deadline (counted from when the call asked
	// for the compute lane, §4.2) and the caller's.
	st.cmd.Deadline, _ = ctx.Deadline()
	_, err = s.stream.Submit(&st.cmd)
	clear(args)
	st.cmd.Program, st.cmd.Args, st.cmd.Shape, st.cmd.Deadline = nil, nil, nil, time.Time{}
	retErr(st, stack, err)
}

// checkSignature checks a launch's arguments against a vendor kernel's
// declaration: their count, each one's kind (buffer or scalar), a
// buffer's length against its dtype, a scalar's value against a 32-bit
// type. (Weights were checked to be in arguments by decodeArgs.)
func checkSignature(k *hw.KernelInfo, args []hw.Arg) error {
	if len(args) != len(k.Args) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q takes %d arguments, got %d", k.Name, len(k.Args), len(args))
	}
	for i, a := range k.Args {
		isBuf := args[i].Buffer != nil
		switch {
		case a.Kind == hw.KindBuffer && !isBuf:
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: argument %d (%s) is a buffer (%s, %s), got a scalar", k.Name, i, a.Name, a.Type, a.Dir)
		case a.Kind != hw.KindBuffer && isBuf:
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: argument %d (%s) is %s scalar, got a buffer", k.Name, i, a.Name, hw.WithArticle(a.Type))
		case isBuf && args[i].Length%hw.DTypeSize(a.Type) != 0:
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: argument %d (%s): %d bytes is not a whole number of %s values", k.Name, i, a.Name, args[i].Length, a.Type)
		case !isBuf && a.Type != "u64" && args[i].Value>>32 != 0:
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: argument %d (%s): %#x does not fit %s", k.Name, i, a.Name, args[i].Value, hw.WithArticle(a.Type))
		}
	}
	return nil
}

func hostStreamSubmitBatch(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	s, err := st.table.get(stack[0], abi.KindStream)
	if err != nil {
		retErr(st, stack, err)
		return
	}
	ptr, n := uint32(stack[1]), uint32(stack[2])
	if n > abi.MaxBatch {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrInvalidArgument, "a batch of %d commands, at most %d", n, abi.MaxBatch))
		return
	}
	recs, ok := guest(mod, ptr, n*abi.BatchRecordSize)
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	cmds, err := decodeBatch(st, mod, recs, n)
	if err == nil {
		err = submitAll(s.stream, cmds)
	}
	st.batch.reset()
	retErr(st, stack, err)
}

// batchArena holds a decoded batch. It lives in the session's call state
// (one call at a time), so batches of a steady size allocate nothing.
type batchArena struct {
	cmds []hw.Command
	args []hw.Arg
	ends []int
}

func (a *batchArena) reset() {
	clear(a.cmds)
	clear(a.args)
	a.cmds, a.args, a.ends = a.cmds[:0], a.args[:0], a.ends[:0]
}

// decodeBatch resolves and checks all n records before any is enqueued.
func decodeBatch(st *callState, mod api.Module, recs []byte, n uint32) ([]hw.Command, error) {
	a := &st.batch
	for i := range n {
		r := recs[i*abi.BatchRecordSize:]
		p, err := st.table.get(binary.LittleEndian.Uint64(r[0:]), abi.KindProgram)
		if err != nil {
			return nil, err
		}
		if p.vendor != nil {
			return nil, fmt.Errorf("command %d: %w", i, needsLaunch(p))
		}
		args, err := decodeArgs(st, mod, p, binary.LittleEndian.Uint32(r[8:]), binary.LittleEndian.Uint32(r[12:]))
		if err != nil {
			return nil, err
		}
		a.args = append(a.args, args...)
		clear(args)
		a.ends = append(a.ends, len(a.args))
		a.cmds = append(a.cmds, hw.Command{Program: p.program})
	}
	// The argument slices are cut only now: appending may have moved them.
	start := 0
	for i := range a.cmds {
		a.cmds[i].Args = a.args[start:a.ends[i]:a.ends[i]]
		start = a.ends[i]
	}
	return a.cmds, nil
}

// submitAll enqueues cmds in order: in one hand-off when the stream takes
// batches ([hw.BatchSubmitter]), else one by one.
func submitAll(s hw.Stream, cmds []hw.Command) error {
	if bs, ok := s.(hw.BatchSubmitter); ok {
		_, err := bs.SubmitBatch(cmds)
		return err
	}
	for i := range cmds {
		if _, err := s.Submit(&cmds[i]); err != nil {
			return err
		}
	}
	return nil
}

func hostStreamSync(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	s, err := st.table.get(stack[0], abi.KindStream)
	if err != nil {
		retErr(st, stack, err)
		return
	}
	err = s.stream.Sync(ctx)
	if errdefs.ClassOf(err) == errdefs.ErrFault {
		st.sess.owner.NoteFault(err) // the call fails with Fault even if the guest ignores it
	}
	retErr(st, stack, err)
}

func hostStreamIdle(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	s, err := st.table.get(stack[0], abi.KindStream)
	if err != nil {
		retErr(st, stack, err)
		return
	}
	idle := uint32(0)
	if s.stream.Idle() {
		idle = 1
	}
	if !putU32(mod, uint32(stack[1]), idle) {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	ret(stack, abi.StatusOK)
}

// readOnlyArg refuses weights as argument i of program prog unless the
// program's kernel describes that argument as read only ("in"): a
// kernel without a description, a variadic one, or an argument past the
// described ones may write, so it cannot take weights.
func readOnlyArg(prog *handleEntry, i int, e *handleEntry) error {
	name := prog.program.Name()
	if i < len(prog.dirs) && prog.dirs[i] == "in" {
		return nil
	}
	dir := "not described as read only"
	if i < len(prog.dirs) {
		dir = "written (direction " + prog.dirs[i] + ")"
	}
	return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: argument %d is %s, but the kernel's argument %d is %s", name, i, readOnlyNote(e), i, dir)
}

// hostWeightsGet is weights_get: the read-only buffer handle of weights
// the session lists.
func hostWeightsGet(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	name, ok := guest(mod, uint32(stack[0]), uint32(stack[1]))
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	outPtr := uint32(stack[2])
	if _, ok := guest(mod, outPtr, 8); !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	h, found := st.table.weights[string(name)]
	if !found {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrNotFound, "weights %q not found: the session lists no weights of that name", name))
		return
	}
	putU64(mod, outPtr, uint64(h))
	ret(stack, abi.StatusOK)
}

// hostTensorGet is tensor_get: "<weights>/<tensor>" to a 96-byte record.
func hostTensorGet(ctx context.Context, st *callState, mod api.Module, stack []uint64) {
	name, ok := guest(mod, uint32(stack[0]), uint32(stack[1]))
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	rec, ok := guest(mod, uint32(stack[2]), abi.TensorRecordSize)
	if !ok {
		ret(stack, abi.StatusOutOfBounds)
		return
	}
	wname, tname, cut := strings.Cut(string(name), "/")
	if !cut {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrNotFound, "tensor %q not found: a tensor is named \"<weights>/<tensor>\"", name))
		return
	}
	h, found := st.table.weights[wname]
	if !found {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrNotFound, "tensor %q not found: the session lists no weights %q", name, wname))
		return
	}
	e, _ := st.table.get(uint64(h), abi.KindBuffer)
	t, found := e.weights.tensor(tname)
	if !found {
		retErr(st, stack, errdefs.Errorf(errdefs.ErrNotFound, "tensor %q not found: the weights %q have no tensor %q", name, wname, tname))
		return
	}
	tensorRecord(rec, h, t)
	ret(stack, abi.StatusOK)
}
