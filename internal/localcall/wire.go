package localcall

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The wire format: see the package doc.
const (
	wireVersion = 1
	kindCall    = 1
	kindAnswer  = 2

	statusOK    = 0
	statusError = 1
	flagCode    = 1

	callHeaderSize   = 26
	answerHeaderSize = 18

	// MaxSession is the longest session name a call carries, in bytes.
	MaxSession = 256
	// MaxField is the longest request id, traceparent or tracestate a
	// call carries, in bytes each.
	MaxField = 1 << 10
	maxClass = 64
)

// errFrame is a frame that breaks the wire format.
var errFrame = errors.New("localcall: malformed frame")

func frameErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errFrame, fmt.Sprintf(format, a...))
}

// inputTooLarge is a call frame whose input is larger than the worker's
// limit: the worker answers it out_of_budget, then ends the connection
// (the input is not read).
type inputTooLarge struct{ size, limit uint64 }

func (e *inputTooLarge) Error() string {
	return fmt.Sprintf("the input of %d bytes is larger than %d bytes", e.size, e.limit)
}

// callFrame is a decoded call.
type callFrame struct {
	Call
	deadline int64 // Unix ns; 0: none
}

// appendCallHeader appends the header and fields of a call (not its
// input) to b.
func appendCallHeader(b []byte, session, requestID, traceparent, tracestate string, deadline int64, inputLen int) []byte {
	b = append(b, wireVersion, kindCall)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(session)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(requestID)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(traceparent)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(tracestate)))
	b = binary.LittleEndian.AppendUint64(b, uint64(deadline))
	b = binary.LittleEndian.AppendUint64(b, uint64(inputLen))
	b = append(b, session...)
	b = append(b, requestID...)
	b = append(b, traceparent...)
	return append(b, tracestate...)
}

// readCall reads one call frame from r. It returns io.EOF when r ends
// before a frame begins, an *inputTooLarge when the input is over
// maxInput (having read only the header and fields), and an error that
// wraps errFrame for a malformed frame.
func readCall(r *bufio.Reader, maxInput int64) (callFrame, error) {
	var f callFrame
	h, err := r.Peek(callHeaderSize)
	if err != nil {
		if len(h) == 0 && err == io.EOF {
			return f, io.EOF
		}
		return f, cut(err)
	}
	if h[0] != wireVersion {
		return f, frameErr("version %d, want %d", h[0], wireVersion)
	}
	if h[1] != kindCall {
		return f, frameErr("kind %d, want a call (%d)", h[1], kindCall)
	}
	ns, nr := int(binary.LittleEndian.Uint16(h[2:])), int(binary.LittleEndian.Uint16(h[4:]))
	np, nt := int(binary.LittleEndian.Uint16(h[6:])), int(binary.LittleEndian.Uint16(h[8:]))
	f.deadline = int64(binary.LittleEndian.Uint64(h[10:]))
	nin := binary.LittleEndian.Uint64(h[18:])
	switch {
	case ns == 0 || ns > MaxSession:
		return f, frameErr("session of %d bytes (1 to %d)", ns, MaxSession)
	case nr > MaxField:
		return f, frameErr("request id of %d bytes (at most %d)", nr, MaxField)
	case np > MaxField:
		return f, frameErr("traceparent of %d bytes (at most %d)", np, MaxField)
	case nt > MaxField:
		return f, frameErr("tracestate of %d bytes (at most %d)", nt, MaxField)
	case f.deadline < 0:
		return f, frameErr("deadline %d before 1970", f.deadline)
	}
	_, _ = r.Discard(callHeaderSize)
	fields := make([]byte, ns+nr+np+nt)
	if _, err := io.ReadFull(r, fields); err != nil {
		return f, cut(err)
	}
	f.Session = string(fields[:ns])
	f.RequestID = string(fields[ns : ns+nr])
	f.Traceparent = string(fields[ns+nr : ns+nr+np])
	f.Tracestate = string(fields[ns+nr+np:])
	if maxInput < 0 || nin > uint64(maxInput) {
		return f, &inputTooLarge{nin, uint64(max(maxInput, 0))}
	}
	f.Input = make([]byte, nin)
	if _, err := io.ReadFull(r, f.Input); err != nil {
		return f, cut(err)
	}
	return f, nil
}

// cut is a frame that ended early.
func cut(err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// answer is a decoded answer.
type answer struct {
	ok    bool
	class string
	code  *int32
	body  []byte
}

// appendAnswerHeader appends the header and class of an answer (not its
// body) to b.
func appendAnswerHeader(b []byte, a *answer, bodyLen int) []byte {
	status, flags, code := byte(statusOK), byte(0), int32(0)
	if !a.ok {
		status = statusError
	}
	if a.code != nil {
		flags, code = flagCode, *a.code
	}
	b = append(b, wireVersion, kindAnswer, status, flags)
	b = binary.LittleEndian.AppendUint32(b, uint32(code))
	b = append(b, byte(len(a.class)), 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(bodyLen))
	return append(b, a.class...)
}

// tooLargeAnswer is an answer whose body is over the client's cap.
type tooLargeAnswer struct{ size, limit uint64 }

func (e *tooLargeAnswer) Error() string {
	return fmt.Sprintf("an answer of %d bytes, larger than the client's limit of %d bytes", e.size, e.limit)
}

// readAnswer reads one answer frame from r, with a body of at most
// maxBody bytes (over it: a *tooLargeAnswer, having read only the
// header and class). A malformed frame is an error that wraps errFrame;
// an answer cut short, the reader's error (io.ErrUnexpectedEOF for an
// end within the frame).
func readAnswer(r *bufio.Reader, maxBody int64) (answer, error) {
	var a answer
	h, err := r.Peek(answerHeaderSize)
	if err != nil {
		if len(h) > 0 {
			return a, cut(err)
		}
		return a, err
	}
	if h[0] != wireVersion {
		return a, frameErr("version %d, want %d", h[0], wireVersion)
	}
	if h[1] != kindAnswer {
		return a, frameErr("kind %d, want an answer (%d)", h[1], kindAnswer)
	}
	status, flags := h[2], h[3]
	code := int32(binary.LittleEndian.Uint32(h[4:]))
	nc, reserved := int(h[8]), h[9]
	nb := binary.LittleEndian.Uint64(h[10:])
	switch {
	case status != statusOK && status != statusError:
		return a, frameErr("status %d", status)
	case flags&^flagCode != 0:
		return a, frameErr("flags %#x", flags)
	case flags&flagCode == 0 && code != 0:
		return a, frameErr("a stage code %d without its flag", code)
	case reserved != 0:
		return a, frameErr("reserved byte %d", reserved)
	case status == statusOK && (nc != 0 || flags != 0):
		return a, frameErr("an ok answer with a class or a stage code")
	case status == statusError && (nc == 0 || nc > maxClass):
		return a, frameErr("an error's class of %d bytes (1 to %d)", nc, maxClass)
	}
	if maxBody < 0 || nb > uint64(maxBody) {
		return a, &tooLargeAnswer{nb, uint64(max(maxBody, 0))}
	}
	_, _ = r.Discard(answerHeaderSize)
	a.ok = status == statusOK
	if flags&flagCode != 0 {
		a.code = &code
	}
	if nc > 0 {
		cl := make([]byte, nc)
		if _, err := io.ReadFull(r, cl); err != nil {
			return a, cut(err)
		}
		a.class = string(cl)
		if !validClass(a.class) {
			return a, frameErr("class %q", a.class)
		}
	}
	a.body = make([]byte, nb)
	if _, err := io.ReadFull(r, a.body); err != nil {
		return a, cut(err)
	}
	return a, nil
}

// validClass: a class is lower-case letters and '_' (errdefs' classes).
func validClass(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && c != '_' {
			return false
		}
	}
	return s != ""
}
