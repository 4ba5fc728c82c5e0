package emu

import (
	"encoding/binary"
	"fmt"
	"strings"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/internal/host"
)

// The host functions of ABI v1 (ABI.md §3), as internal/host.Host. Each
// locks e.mu; kernels run under it.

// abiHost is the Emulator as the SDK's in-process host; a separate type so
// that the ABI methods stay out of Emulator's API.
type abiHost Emulator

var _ host.Host = (*abiHost)(nil)

const (
	ok              = int32(stagehost.StatusOK)
	invalidArgument = int32(stagehost.StatusInvalidArgument)
	notFound        = int32(stagehost.StatusNotFound)
	outOfBudget     = int32(stagehost.StatusOutOfBudget)
	fault           = int32(stagehost.StatusFault)
	badHandle       = int32(stagehost.StatusBadHandle)
	staleHandle     = int32(stagehost.StatusStaleHandle)
	foreignHandle   = int32(stagehost.StatusForeignHandle)
	outOfBounds     = int32(stagehost.StatusOutOfBounds)
	outputTooLarge  = int32(stagehost.StatusOutputTooLarge)
)

func (h *abiHost) inputSize() (uint32, int32) {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	return uint32(len(e.input)), ok
}

func (h *abiHost) inputRead(offset uint32, dst []byte) (uint32, int32) {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	if uint64(offset) > uint64(len(e.input)) {
		return 0, e.failLocked(invalidArgument, "offset %d is beyond the input's %d bytes", offset, len(e.input))
	}
	return uint32(copy(dst, e.input[offset:])), ok
}

func (h *abiHost) outputWrite(src []byte) int32 {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.output)+len(src) > e.outLimit {
		return e.failLocked(outputTooLarge, "%d more bytes would take the output past its limit of %d bytes: output larger than its limit", len(src), e.outLimit)
	}
	e.output = append(e.output, src...)
	return ok
}

func (h *abiHost) entryName(dst []byte) (uint32, int32) {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	n := uint32(len(e.entry))
	if len(dst) < len(e.entry) {
		return n, outOfBounds
	}
	copy(dst, e.entry)
	return n, ok
}

func (h *abiHost) errorSet(msg []byte) int32 {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(msg) > maxErrorMessage {
		msg = msg[:maxErrorMessage]
	}
	e.errMsg = string(msg)
	return ok
}

func (h *abiHost) log(level int32, msg []byte) int32 {
	e := (*Emulator)(h)
	if level < int32(stagehost.LevelDebug) || level > int32(stagehost.LevelError) {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.failLocked(invalidArgument, "log level %d is not one of 0 to 3", level)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.logLocked(stagehost.Level(level), string(msg))
	return ok
}

// lookup returns the handle of the declared resource name of kind, making
// it on first use.
func (e *Emulator) lookup(kind uint8, name []byte) (uint64, int32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.byName[nameKey(kind, string(name))]
	if o == nil {
		return 0, e.failLocked(notFound, "%s %q not found: the session %s", kindName(kind), name, notDeclared[kind])
	}
	if o.handle == 0 {
		e.issueLocked(o)
	}
	return o.handle, ok
}

// notDeclared says why a lookup by name found nothing, as the host does.
var notDeclared = map[uint8]string{
	kindStream:  "declares no stream of that name",
	kindBuffer:  "declares no buffer of that name",
	kindProgram: "may use no program of that name",
}

// issueLocked gives o the next serial.
func (e *Emulator) issueLocked(o *object) {
	e.serial++
	if e.serial == 0 {
		panic("emu: handle serials exhausted")
	}
	o.handle = uint64(o.kind)<<56 | uint64(e.tag)<<32 | uint64(e.serial)
	e.handles[e.serial] = o
}

// resolveLocked maps a handle of kind to its object, or to the status of
// a bad, foreign or stale handle.
func (e *Emulator) resolveLocked(h uint64, kind uint8) (*object, int32) {
	if h == 0 {
		return nil, badHandle
	}
	if uint32(h>>32)&maxTag != e.tag {
		return nil, foreignHandle
	}
	o := e.handles[uint32(h)]
	if o == nil || o.handle != h || o.kind != kind {
		return nil, badHandle
	}
	if o.buffer != nil && o.buffer.freed {
		return nil, staleHandle
	}
	return o, ok
}

func (h *abiHost) streamGet(name []byte) (uint64, int32) {
	return (*Emulator)(h).lookup(kindStream, name)
}
func (h *abiHost) bufferGet(name []byte) (uint64, int32) {
	return (*Emulator)(h).lookup(kindBuffer, name)
}
func (h *abiHost) programGet(name []byte) (uint64, int32) {
	return (*Emulator)(h).lookup(kindProgram, name)
}

func (h *abiHost) bufferAlloc(size uint32) (uint64, int32) {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	if size == 0 {
		return 0, e.failLocked(invalidArgument, "buffer size 0")
	}
	if e.budget > 0 && e.used+int64(size) > e.budget {
		// The host's words (hw.Budget), the emulator as the session.
		return 0, e.failLocked(outOfBudget, "budget %q: %d bytes requested, %d of %d in use", "emu", size, e.used, e.budget)
	}
	e.used += int64(size)
	o := &object{kind: kindBuffer, buffer: &buffer{mem: make([]byte, size), allocated: true}}
	e.issueLocked(o)
	return o.handle, ok
}

func (h *abiHost) bufferAllocNamed(name []byte, size uint32) (uint64, int32) {
	e := (*Emulator)(h)
	e.mu.Lock()
	if len(name) == 0 || len(name) > 256 {
		defer e.mu.Unlock()
		return 0, e.failLocked(invalidArgument, "a buffer name of %d bytes: 1 to 256", len(name))
	}
	if o := e.named[string(name)]; o != nil && !o.buffer.freed {
		defer e.mu.Unlock()
		if len(o.buffer.mem) != int(size) {
			return 0, e.failLocked(invalidArgument, "buffer %q has %d bytes, not %d", name, len(o.buffer.mem), size)
		}
		return o.handle, ok
	}
	e.mu.Unlock()
	hd, st := h.bufferAlloc(size)
	if st != ok {
		return 0, st
	}
	e.mu.Lock()
	e.named[string(name)] = e.handles[uint32(hd)]
	e.mu.Unlock()
	return hd, ok
}

func (h *abiHost) bufferFree(bh uint64) int32 {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	o, st := e.resolveLocked(bh, kindBuffer)
	if st != ok {
		return st
	}
	if o.buffer.weights != "" {
		return e.failLocked(invalidArgument, "buffer_free: buffer is the read-only weights %q, which cannot be freed", o.buffer.weights)
	}
	if !o.buffer.allocated {
		return e.failLocked(invalidArgument, "a declared buffer cannot be freed")
	}
	// Queued commands keep the memory; the handle is stale from now on.
	// The memory stays charged until the run's fence proves the drain.
	o.buffer.freed = true
	e.freeing += int64(len(o.buffer.mem))
	return ok
}

func (h *abiHost) bufferSize(bh uint64) (uint32, int32) {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	o, st := e.resolveLocked(bh, kindBuffer)
	if st != ok {
		return 0, st
	}
	return uint32(len(o.buffer.mem)), ok
}

// transferLocked checks a transfer's stream, buffer and range.
func (e *Emulator) transferLocked(sh, bh uint64, offset uint32, n int, write bool) (*stream, *buffer, int32) {
	so, st := e.resolveLocked(sh, kindStream)
	if st != ok {
		return nil, nil, st
	}
	bo, st := e.resolveLocked(bh, kindBuffer)
	if st != ok {
		return nil, nil, st
	}
	if write && bo.buffer.weights != "" {
		return nil, nil, e.failLocked(invalidArgument, "stream_write: buffer is the read-only weights %q, which cannot be written", bo.buffer.weights)
	}
	if uint64(offset)+uint64(n) > uint64(len(bo.buffer.mem)) {
		return nil, nil, e.rangeLocked(offset, uint64(n), bo.buffer)
	}
	return so.stream, bo.buffer, ok
}

func (h *abiHost) streamWrite(sh, bh uint64, offset uint32, src []byte) int32 {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	s, b, st := e.transferLocked(sh, bh, offset, len(src), true)
	if st != ok {
		return st
	}
	e.enqueueLocked(s, command{op: opWrite, buf: b, off: int(offset), data: append([]byte(nil), src...)})
	return ok
}

func (h *abiHost) streamRead(sh, bh uint64, offset uint32, dst []byte) int32 {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	s, b, st := e.transferLocked(sh, bh, offset, len(dst), false)
	if st != ok {
		return st
	}
	// A download waits for every earlier command; their failures are left
	// for stream_sync. It is a command of the stream, as on the host: it
	// takes the next command number.
	e.drainLocked(s)
	s.seq++
	copy(dst, b.mem[offset:])
	return ok
}

// rangeLocked is the host's refusal of a stream_write or stream_read
// range [off, off+n) outside b (stages, checkRange). An argument
// record's range is refused in parseArgsLocked, with its number.
func (e *Emulator) rangeLocked(off uint32, n uint64, b *buffer) int32 {
	return e.failLocked(invalidArgument, "range [%d,+%d) outside a buffer of %d bytes", off, n, len(b.mem))
}

// tooManyArgsLocked is the host's refusal of more than maxArgs argument
// records (stages, decodeArgs).
func (e *Emulator) tooManyArgsLocked(count uint32) int32 {
	return e.failLocked(invalidArgument, "%d arguments, at most %d", count, maxArgs)
}

// parseArgsLocked validates count argument records in rec, in the host's
// order and words (stages, decodeArgs).
func (e *Emulator) parseArgsLocked(prog *program, rec []byte, count uint32) ([]Arg, int32) {
	if count > maxArgs {
		return nil, e.tooManyArgsLocked(count)
	}
	if uint64(len(rec)) < uint64(count)*argRecordSize {
		return nil, outOfBounds
	}
	args := make([]Arg, count)
	for i := range args {
		r := rec[i*argRecordSize : (i+1)*argRecordSize]
		kind := binary.LittleEndian.Uint32(r[0:])
		off := binary.LittleEndian.Uint32(r[4:])
		length := binary.LittleEndian.Uint32(r[8:])
		reserved := binary.LittleEndian.Uint32(r[12:])
		value := binary.LittleEndian.Uint64(r[16:])
		if reserved != 0 {
			return nil, e.failLocked(invalidArgument, "argument %d: reserved field is not zero", i)
		}
		switch kind {
		case 0: // scalar
			args[i] = Arg{Value: value}
		case 1: // buffer range
			o, st := e.resolveLocked(value, kindBuffer)
			if st != ok {
				return nil, st
			}
			if o.buffer.weights != "" {
				if dir := argDir(prog, i); dir != "in" {
					if dir == "" {
						dir = "not described as read only"
					} else {
						dir = "written (direction " + dir + ")"
					}
					return nil, e.failLocked(invalidArgument, "%s: argument %d is the read-only weights %q, but the kernel's argument %d is %s", prog.name, i, o.buffer.weights, i, dir)
				}
			}
			size := uint64(len(o.buffer.mem))
			n := uint64(length)
			if length == toEnd {
				if uint64(off) > size {
					return nil, e.failLocked(invalidArgument, "argument %d: offset %d beyond a buffer of %d bytes", i, off, size)
				}
				n = size - uint64(off)
			}
			if uint64(off)+n > size {
				return nil, e.failLocked(invalidArgument, "argument %d: range [%d,+%d) outside a buffer of %d bytes", i, off, n, size)
			}
			end := uint64(off) + n
			args[i] = Arg{Bytes: o.buffer.mem[off:end:end], Offset: int(off), buffer: true, addr: address(o.buffer.mem, off)}
		default:
			return nil, e.failLocked(invalidArgument, "argument %d: unknown kind %d", i, kind)
		}
	}
	return args, ok
}

func (h *abiHost) streamSubmit(sh, ph uint64, rec []byte, count uint32) int32 {
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
	if po.program.vendor != nil {
		return e.needsLaunchLocked(po.program)
	}
	args, st := e.parseArgsLocked(po.program, rec, count)
	if st != ok {
		return st
	}
	if err := checkOp(po.program, args); err != nil {
		return e.failLocked(invalidArgument, "%s", err)
	}
	e.enqueueLocked(so.stream, command{op: opLaunch, prog: po.program, args: args})
	return ok
}

func (h *abiHost) streamSubmitBatch(sh uint64, cmds, args []byte, count uint32) int32 {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	so, st := e.resolveLocked(sh, kindStream)
	if st != ok {
		return st
	}
	if count > maxBatch {
		return e.failLocked(invalidArgument, "a batch of %d commands, at most %d", count, maxBatch)
	}
	if uint64(len(cmds)) < uint64(count)*batchRecordSize {
		return outOfBounds
	}
	// Validate every command before enqueuing any.
	launches := make([]command, count)
	for i := range launches {
		r := cmds[i*batchRecordSize : (i+1)*batchRecordSize]
		ph := binary.LittleEndian.Uint64(r[0:])
		ptr := uint64(binary.LittleEndian.Uint32(r[8:]))
		n := binary.LittleEndian.Uint32(r[12:])
		po, st := e.resolveLocked(ph, kindProgram)
		if st != ok {
			return st
		}
		if po.program.vendor != nil {
			// The host names the command (stages, decodeBatch).
			return e.failLocked(invalidArgument, "command %d: %s", i, needsLaunchText(po.program))
		}
		if n > maxArgs {
			return e.tooManyArgsLocked(n) // the host does not name the command
		}
		if ptr+uint64(n)*argRecordSize > uint64(len(args)) {
			return outOfBounds
		}
		a, st := e.parseArgsLocked(po.program, args[ptr:], n)
		if st != ok {
			return st
		}
		if err := checkOp(po.program, a); err != nil {
			return e.failLocked(invalidArgument, "command %d: %s", i, err)
		}
		launches[i] = command{op: opLaunch, prog: po.program, args: a}
	}
	for _, c := range launches {
		e.enqueueLocked(so.stream, c)
	}
	return ok
}

func (h *abiHost) streamSync(sh uint64) int32 {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	so, st := e.resolveLocked(sh, kindStream)
	if st != ok {
		return st
	}
	s := so.stream
	e.drainLocked(s)
	if len(s.failures) > 0 {
		// The host records every FAULT it reports (ABI.md §4.4): the run
		// fails even if the guest ignores it.
		e.failures = append(e.failures, s.failures[0])
		why := s.failures[0].Error()
		s.failures = s.failures[1:]
		return e.failLocked(fault, "%s", why)
	}
	return ok
}

func (h *abiHost) streamIdle(sh uint64) (uint32, int32) {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	so, st := e.resolveLocked(sh, kindStream)
	if st != ok {
		return 0, st
	}
	s := so.stream
	if len(s.queue) == 0 {
		return 1, ok
	}
	// Not idle; the device makes progress meanwhile.
	e.retireLocked(s)
	return 0, ok
}

// Device work.

func (e *Emulator) enqueueLocked(s *stream, c command) {
	if len(s.queue) >= queueDepth {
		e.retireLocked(s) // the device keeps up rather than reporting BUSY
	}
	s.seq++
	c.seq = s.seq
	s.queue = append(s.queue, c)
}

func (e *Emulator) drainLocked(s *stream) {
	for len(s.queue) > 0 {
		e.retireLocked(s)
	}
}

// retireLocked runs the oldest command of s.
func (e *Emulator) retireLocked(s *stream) {
	c := s.queue[0]
	s.queue[0] = command{}
	s.queue = s.queue[1:]
	var err error
	switch c.op {
	case opWrite:
		copy(c.buf.mem[c.off:], c.data)
	case opLaunch:
		if c.prog.vendor != nil {
			err = runVendor(c.prog, c.args)
		} else {
			err = runKernel(c.prog, c.args)
		}
	}
	if err != nil {
		err = fmt.Errorf("stream %q: command %d: %w", s.name, c.seq, err)
		s.failures = append(s.failures, err)
		e.logLocked(stagehost.LevelError, "emu: "+err.Error())
	}
}

func runKernel(p *program, args []Arg) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("kernel %q panicked: %v", p.name, r)
		}
	}()
	if err := p.kernel(args); err != nil {
		return fmt.Errorf("kernel %q: %w", p.name, err)
	}
	return nil
}

// runVendor runs a vendor kernel as the host runs one on sim (ABI.md
// §3.6): the kernel gets a copy of its own of each buffer range, an in
// or inout range's bytes, an out range zeroed (two arguments bound to
// one buffer get two copies); if it returns nil, every out and inout
// copy is copied back into the device buffer, in argument order; if it
// fails, nothing is.
func runVendor(p *program, args []Arg) error {
	scratch := make([]Arg, len(args))
	copies := make([][]byte, len(args))
	for i, a := range args {
		scratch[i] = a
		if !a.buffer {
			continue
		}
		copies[i] = make([]byte, len(a.Bytes))
		if p.vendor[i].Dir != "out" {
			copy(copies[i], a.Bytes)
		}
		scratch[i].Bytes = copies[i]
		scratch[i].addr = address(copies[i], 0)
	}
	if err := runKernel(p, scratch); err != nil {
		return err
	}
	for i, a := range args {
		if a.buffer && p.vendor[i].Dir != "in" {
			copy(a.Bytes, copies[i])
		}
	}
	return nil
}

// builtinDirs are the argument directions of the built-in kernels that
// are not of the op library, as hw/sim describes them; noop, variadic,
// has none (so it takes no weights, as on the host).
var builtinDirs = map[string][]string{
	"fill":        {"out", "in"},
	"copy":        {"out", "in"},
	"saxpy":       {"in", "in", "inout"},
	"matmul":      {"in", "in", "out", "in", "in", "in"},
	"bias":        {"inout", "in", "in", "in"},
	"relu":        {"inout"},
	"argmax":      {"in", "out"},
	"mlp_forward": {"in", "in", "in", "in", "in", "out", "out", "in", "in", "in"},
}

// argDir is the direction of argument i of prog ("" when its kernel has
// no description of it: a kernel added with Kernel, noop, an argument
// past the described ones).
func argDir(prog *program, i int) string {
	if prog.vendor != nil {
		if i >= len(prog.vendor) {
			return ""
		}
		if prog.vendor[i].Kind != "buffer" {
			// A scalar's direction is "in", as the host's (hw.KernelScalar):
			// weights bound to it are refused as a buffer where a scalar
			// is declared.
			return "in"
		}
		return prog.vendor[i].Dir
	}
	if prog.op != nil {
		if args := prog.op.Info().Args; i < len(args) {
			return args[i].Dir
		}
		return ""
	}
	if prog.kernel == nil || builtins[prog.name] == nil {
		return ""
	}
	if dirs := builtinDirs[prog.name]; i < len(dirs) {
		return dirs[i]
	}
	return ""
}

// weightsGet is weights_get.
func (h *abiHost) weightsGet(name []byte) (uint64, int32) {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.weights[string(name)]
	if o == nil {
		return 0, e.failLocked(notFound, "weights %q not found: the session lists no weights of that name", name)
	}
	if o.handle == 0 {
		e.issueLocked(o)
	}
	return o.handle, ok
}

// tensorGet is tensor_get: the 96-byte record of "<weights>/<tensor>".
func (h *abiHost) tensorGet(name, rec []byte) int32 {
	if len(rec) < tensorRecordSize {
		return outOfBounds
	}
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	wname, tname, cut := strings.Cut(string(name), "/")
	if !cut {
		return e.failLocked(notFound, "tensor %q not found: a tensor is named \"<weights>/<tensor>\"", name)
	}
	o := e.weights[wname]
	if o == nil {
		return e.failLocked(notFound, "tensor %q not found: the session lists no weights %q", name, wname)
	}
	t, found := o.tensors[tname]
	if !found {
		return e.failLocked(notFound, "tensor %q not found: the weights %q have no tensor %q", name, wname, tname)
	}
	if o.handle == 0 {
		e.issueLocked(o)
	}
	le := binary.LittleEndian
	clear(rec[:tensorRecordSize])
	le.PutUint64(rec[0:], o.handle)
	le.PutUint64(rec[8:], t.off)
	le.PutUint64(rec[16:], t.n)
	le.PutUint32(rec[24:], t.dtype)
	le.PutUint32(rec[28:], uint32(len(t.dims)))
	for i, d := range t.dims {
		le.PutUint64(rec[32+8*i:], d)
	}
	return ok
}
