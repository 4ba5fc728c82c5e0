package emu

import (
	"fmt"
	"unicode/utf8"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

// The ABI methods of the SDK's in-process host: each runs its host
// function (host.go) and makes a non-OK status the run's last error
// (ABI.md §3 last_error), as the host does.

func (h *abiHost) InputSize() (uint32, int32) { n, st := h.inputSize(); return n, h.note(st) }
func (h *abiHost) InputRead(offset uint32, dst []byte) (uint32, int32) {
	n, st := h.inputRead(offset, dst)
	return n, h.note(st)
}
func (h *abiHost) OutputWrite(src []byte) int32 { return h.note(h.outputWrite(src)) }
func (h *abiHost) EntryName(dst []byte) (uint32, int32) {
	n, st := h.entryName(dst)
	return n, h.note(st)
}
func (h *abiHost) ErrorSet(msg []byte) int32         { return h.note(h.errorSet(msg)) }
func (h *abiHost) Log(level int32, msg []byte) int32 { return h.note(h.log(level, msg)) }
func (h *abiHost) StreamGet(name []byte) (uint64, int32) {
	v, st := h.streamGet(name)
	return v, h.note(st)
}
func (h *abiHost) BufferGet(name []byte) (uint64, int32) {
	v, st := h.bufferGet(name)
	return v, h.note(st)
}
func (h *abiHost) ProgramGet(name []byte) (uint64, int32) {
	v, st := h.programGet(name)
	return v, h.note(st)
}
func (h *abiHost) BufferAlloc(size uint32) (uint64, int32) {
	v, st := h.bufferAlloc(size)
	return v, h.note(st)
}
func (h *abiHost) BufferAllocNamed(name []byte, size uint32) (uint64, int32) {
	v, st := h.bufferAllocNamed(name, size)
	return v, h.note(st)
}
func (h *abiHost) BufferFree(buffer uint64) int32 { return h.note(h.bufferFree(buffer)) }
func (h *abiHost) BufferSize(buffer uint64) (uint32, int32) {
	v, st := h.bufferSize(buffer)
	return v, h.note(st)
}
func (h *abiHost) StreamWrite(stream, buffer uint64, offset uint32, src []byte) int32 {
	return h.note(h.streamWrite(stream, buffer, offset, src))
}
func (h *abiHost) StreamRead(stream, buffer uint64, offset uint32, dst []byte) int32 {
	return h.note(h.streamRead(stream, buffer, offset, dst))
}
func (h *abiHost) StreamSubmit(stream, program uint64, args []byte, count uint32) int32 {
	return h.note(h.streamSubmit(stream, program, args, count))
}
func (h *abiHost) StreamSubmitBatch(stream uint64, cmds, args []byte, count uint32) int32 {
	return h.note(h.streamSubmitBatch(stream, cmds, args, count))
}
func (h *abiHost) StreamSync(stream uint64) int32 { return h.note(h.streamSync(stream)) }
func (h *abiHost) StreamIdle(stream uint64) (uint32, int32) {
	v, st := h.streamIdle(stream)
	return v, h.note(st)
}

func (h *abiHost) WeightsGet(name []byte) (uint64, int32) {
	v, st := h.weightsGet(name)
	return v, h.note(st)
}
func (h *abiHost) TensorGet(name, rec []byte) int32 { return h.note(h.tensorGet(name, rec)) }

// LastError is last_error: entry_name's rule applied to the run's last
// error. Its own OUT_OF_BOUNDS does not change the last error.
func (h *abiHost) LastError(dst []byte) (uint32, int32) {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	n := uint32(len(e.lastErr))
	if len(dst) < len(e.lastErr) {
		return n, outOfBounds
	}
	copy(dst, e.lastErr)
	return n, ok
}

// note makes a non-OK status st the run's last error: the detail the host
// function gave (e.why), or the status's own text.
func (h *abiHost) note(st int32) int32 {
	e := (*Emulator)(h)
	e.mu.Lock()
	defer e.mu.Unlock()
	if st != ok {
		msg := e.why
		if msg == "" {
			msg = statusText(st)
		}
		e.lastErr = cutMessage(msg)
	}
	e.why = ""
	return st
}

// failLocked gives the failing host function's detail and returns st.
// Call it with e.mu held.
func (e *Emulator) failLocked(st int32, format string, a ...any) int32 {
	e.why = fmt.Sprintf(format, a...)
	return st
}

// statusText is the message of a failure without detail: the host's text
// for its status (package abi's errors and the errdefs classes).
func statusText(st int32) string {
	switch st {
	case badHandle:
		return "bad handle"
	case staleHandle:
		return "stale handle"
	case foreignHandle:
		return "handle of another session"
	case outOfBounds:
		return "pointer or length outside guest memory"
	case outputTooLarge:
		return "output larger than its limit"
	case invalidArgument:
		return "invalid argument"
	case notFound:
		return "not found"
	case outOfBudget:
		return "out of budget"
	case fault:
		return "device fault"
	}
	return stagehost.Status(st).String()
}

// cutMessage cuts msg to maxErrorMessage bytes at a UTF-8 boundary.
func cutMessage(msg string) string {
	if len(msg) <= maxErrorMessage {
		return msg
	}
	cut := maxErrorMessage
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut]
}
