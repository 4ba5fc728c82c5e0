package localcall

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

// callFrameBytes is a call frame as a client writes it.
func callFrameBytes(session, rid, tp, ts string, deadline int64, input []byte) []byte {
	return append(appendCallHeader(nil, session, rid, tp, ts, deadline, len(input)), input...)
}

// answerFrameBytes is an answer frame as a worker writes it.
func answerFrameBytes(a answer) []byte {
	return append(appendAnswerHeader(nil, &a, len(a.body)), a.body...)
}

// FuzzDecodeCall: the worker's decoder of call frames never panics,
// never takes a field or an input over its limit, and what it takes is
// exactly the frame it read: encoded again, it is a prefix of the
// bytes.
func FuzzDecodeCall(f *testing.F) {
	f.Add(callFrameBytes("s", "r1", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k=v", 1764000000000000000, []byte("hi")))
	f.Add(callFrameBytes("echo", "", "", "", 0, nil))
	f.Add(callFrameBytes("s", "", "", "", 0, make([]byte, 100)))
	f.Add([]byte{1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 's'})
	f.Add([]byte{1, 1, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxInput = 64
		fr, err := readCall(bufio.NewReaderSize(bytes.NewReader(data), 32), maxInput)
		var big *inputTooLarge
		switch {
		case errors.As(err, &big):
			if big.size <= maxInput || big.limit != maxInput {
				t.Fatalf("input of %d bytes refused with limit %d", big.size, big.limit)
			}
			return
		case err != nil:
			if !errors.Is(err, errFrame) && err != io.EOF && err != io.ErrUnexpectedEOF {
				t.Fatalf("error %v", err)
			}
			return
		}
		if len(fr.Session) == 0 || len(fr.Session) > MaxSession || len(fr.RequestID) > MaxField || len(fr.Traceparent) > MaxField ||
			len(fr.Tracestate) > MaxField || len(fr.Input) > maxInput || fr.deadline < 0 {
			t.Fatalf("a call over its limits: %+v", fr)
		}
		enc := callFrameBytes(fr.Session, fr.RequestID, fr.Traceparent, fr.Tracestate, fr.deadline, fr.Input)
		if !bytes.HasPrefix(data, enc) {
			t.Fatalf("decoded %+v from %x, which encodes as %x", fr, data, enc)
		}
	})
}

// FuzzDecodeAnswer: the client's decoder of answers never panics,
// never takes a body over its cap, and what it takes is exactly the
// frame it read.
func FuzzDecodeAnswer(f *testing.F) {
	code := int32(7)
	f.Add(answerFrameBytes(answer{ok: true, body: []byte("out")}))
	f.Add(answerFrameBytes(answer{class: "client_error", code: &code, body: []byte("stage returned 7")}))
	f.Add(answerFrameBytes(answer{class: "deadline_exceeded"}))
	f.Add([]byte{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{1, 2, 1, 1, 7, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 'A', 'b', 'c'})
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxBody = 64
		a, err := readAnswer(bufio.NewReaderSize(bytes.NewReader(data), 32), maxBody)
		var big *tooLargeAnswer
		switch {
		case errors.As(err, &big):
			if big.size <= maxBody || big.limit != maxBody {
				t.Fatalf("body of %d bytes refused with limit %d", big.size, big.limit)
			}
			return
		case err != nil:
			if !errors.Is(err, errFrame) && err != io.EOF && err != io.ErrUnexpectedEOF {
				t.Fatalf("error %v", err)
			}
			return
		}
		if len(a.body) > maxBody || a.ok != (a.class == "") || !a.ok && !validClass(a.class) || a.ok && a.code != nil {
			t.Fatalf("an answer over its limits: %+v", a)
		}
		enc := answerFrameBytes(a)
		if !bytes.HasPrefix(data, enc) {
			t.Fatalf("decoded %+v from %x, which encodes as %x", a, data, enc)
		}
	})
}
