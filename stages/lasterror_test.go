package stages

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

// The kernel's own reason for refusing saxpy's arguments (hw/sim).
const saxpyReason = "saxpy: x has 4 values, y 2"

// lastErrorOutput reads testdata/abi/last_error's output: u32 words,
// with message bytes where the module writes them.
type lastErrorOutput struct {
	t   *testing.T
	out []byte
}

func (o *lastErrorOutput) word() uint32 {
	o.t.Helper()
	if len(o.out) < 4 {
		o.t.Fatalf("output ends early")
	}
	v := binary.LittleEndian.Uint32(o.out)
	o.out = o.out[4:]
	return v
}

func (o *lastErrorOutput) bytes(n uint32) []byte {
	o.t.Helper()
	if uint32(len(o.out)) < n {
		o.t.Fatalf("output has %d bytes, want %d more", len(o.out), n)
	}
	b := o.out[:n]
	o.out = o.out[n:]
	return b
}

// message reads the status, the length word and the message of a
// last_error with room for it.
func (o *lastErrorOutput) message() string {
	o.t.Helper()
	if s := abi.Status(o.word()); s != abi.StatusOK {
		o.t.Fatalf("last_error with room: %v, want OK", s)
	}
	return string(o.bytes(o.word()))
}

func lastErrorConfig(f *wasmFixture, name string) SessionConfig {
	return NewSessionConfig(name, f.gpu).WithStreams("s0").WithPrograms("saxpy")
}

// syncLogs is a slog handler's output, safe to read while sessions log.
type syncLogs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestLastErrorGivesTheKernelsReason submits a saxpy whose x and y differ
// in length. The guest's stream_sync gets FAULT and last_error then gives
// the kernel's reason, naming the command and the program; a destination
// too small gets the length only. The caller's error, and the host log,
// carry the same reason.
func TestLastErrorGivesTheKernelsReason(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	var logs syncLogs
	eng, err := NewEngine(context.Background(), NewEngineConfig().WithCacheDir("").
		WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		t.Fatal(err)
	}
	f.eng = eng
	s := f.session(t, abiModule(t, f, "last_error"), lastErrorConfig(f, "bad_saxpy"))
	out, err := s.Run(callCtx, []byte{1}, nil)
	if !errors.Is(err, errdefs.ErrFault) || !strings.Contains(err.Error(), saxpyReason) {
		t.Errorf("the call's error = %v, want a Fault with the kernel's reason %q", err, saxpyReason)
	}
	if !strings.Contains(logs.String(), saxpyReason) {
		t.Errorf("the host log lacks the kernel's reason %q:\n%s", saxpyReason, logs.String())
	}
	o := &lastErrorOutput{t, out}
	if st := abi.Status(o.word()); st != abi.StatusFault {
		t.Fatalf("stream_sync = %v, want FAULT", st)
	}
	// A destination of 8 bytes is too small: the length, nothing else.
	st, n, dst := abi.Status(o.word()), o.word(), o.bytes(8)
	if st != abi.StatusOutOfBounds || n <= 8 || !bytes.Equal(dst, bytes.Repeat([]byte{0xBB}, 8)) {
		t.Errorf("last_error into 8 bytes: %v, length word %d, bytes % x; want OUT_OF_BOUNDS, the length, untouched bytes", st, n, dst)
	}
	msg := o.message()
	if uint32(len(msg)) != n {
		t.Errorf("the message has %d bytes, the too-small call said %d", len(msg), n)
	}
	for _, want := range []string{`kernel "saxpy": ` + saxpyReason, "command "} {
		if !strings.Contains(msg, want) {
			t.Errorf("last error %q lacks %q", msg, want)
		}
	}
}

// TestLastErrorIsClearedWhenACallStarts: after a call that failed, the
// next call of the session, and a call of another session on the same
// device, find no last error.
func TestLastErrorIsClearedWhenACallStarts(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	m := abiModule(t, f, "last_error")
	a := f.session(t, m, lastErrorConfig(f, "a"))
	b := f.session(t, m, lastErrorConfig(f, "b"))
	if _, err := a.Run(callCtx, []byte{1}, nil); !errors.Is(err, errdefs.ErrFault) {
		t.Fatalf("the failing call: %v, want Fault", err)
	}
	for _, s := range []*Session{b, a} {
		out, err := s.Run(callCtx, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		o := &lastErrorOutput{t, out}
		if msg := o.message(); msg != "" {
			t.Errorf("session %s: last error at the start of a call = %q, want none", s.Name(), msg)
		}
	}
}

// TestLastErrorNamesWhatWasNotFound: program_get of an unknown name
// leaves a last error naming it; an OK status after it and last_error's
// own failures (a destination or a length pointer outside memory, which
// write nothing) leave it as it was.
func TestLastErrorNamesWhatWasNotFound(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	s := f.session(t, abiModule(t, f, "last_error"), lastErrorConfig(f, "not_found"))
	out, err := s.Run(callCtx, []byte{2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := &lastErrorOutput{t, out}
	if st := abi.Status(o.word()); st != abi.StatusNotFound {
		t.Fatalf("program_get(nope) = %v, want NOT_FOUND", st)
	}
	if st := abi.Status(o.word()); st != abi.StatusOK {
		t.Fatalf("input_size = %v, want OK", st)
	}
	if st, n := abi.Status(o.word()), o.word(); st != abi.StatusOutOfBounds || n != 0xAAAAAAAA {
		t.Errorf("last_error into memory it does not have: %v, length word %#x; want OUT_OF_BOUNDS, untouched", st, n)
	}
	if st := abi.Status(o.word()); st != abi.StatusOutOfBounds {
		t.Errorf("last_error with its length pointer outside memory: %v, want OUT_OF_BOUNDS", st)
	}
	if msg := o.message(); !strings.Contains(msg, `program "nope" not found`) {
		t.Errorf("last error = %q, want the NOT_FOUND naming program \"nope\"", msg)
	}
}

// TestLastErrorMessageIsCutAtTheLimit: a message longer than
// abi.MaxErrorMessage bytes is cut to at most that many, at a character
// boundary.
func TestLastErrorMessageIsCutAtTheLimit(t *testing.T) {
	long := strings.Repeat("é", abi.MaxErrorMessage) // 2 bytes each
	got := appendMessage(nil, "x"+long)
	if len(got) > abi.MaxErrorMessage || len(got) < abi.MaxErrorMessage-3 || !utf8.Valid(got) {
		t.Errorf("a message of %d bytes became %d bytes (valid UTF-8: %v), want at most %d, cut at a character", 1+len(long), len(got), utf8.Valid(got), abi.MaxErrorMessage)
	}
	if got := appendMessage(nil, "short"); string(got) != "short" {
		t.Errorf("a short message became %q", got)
	}
}

// TestFaultBeforeAReadFailsTheCall: a kernel that failed before a
// stream_read fails the call with Fault and its reason, even when the
// guest ignores what the read returned and returns OK (ABI.md §4.4).
func TestFaultBeforeAReadFailsTheCall(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	s := f.session(t, abiModule(t, f, "last_error"), lastErrorConfig(f, "read"))
	out, err := s.Run(callCtx, []byte{3}, nil)
	if len(out) < 4 {
		t.Fatalf("output % x, err %v", out, err)
	}
	o := &lastErrorOutput{t, out}
	if st := abi.Status(o.word()); st != abi.StatusOK && st != abi.StatusFault {
		t.Fatalf("stream_read = %v, want OK or FAULT", st)
	}
	if !errors.Is(err, errdefs.ErrFault) || !strings.Contains(err.Error(), saxpyReason) {
		t.Fatalf("the call's error = %v, want a Fault with the kernel's reason %q", err, saxpyReason)
	}
	if q := s.Quarantined(); q != nil {
		t.Fatalf("quarantined: %v (the stream drained: a failure is no reason)", q)
	}
}

// TestFailedReadFailsTheCall: a download that fails on the device is
// FAULT to the guest and fails the call with Fault, even when the guest
// ignores it and returns OK: the stream reports a failure once, so the
// fence would not see it again (ABI.md §4.4).
func TestFailedReadFailsTheCall(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	s := f.session(t, abiModule(t, f, "last_error"), lastErrorConfig(f, "read-fails"))
	s.Owner().Streams()[0].(*sim.Stream).Inject(sim.Fault{Kind: sim.FailCompletion, Count: 1})
	out, err := s.Run(callCtx, []byte{4}, nil)
	if len(out) < 4 {
		t.Fatalf("output % x, err %v", out, err)
	}
	if st := abi.Status((&lastErrorOutput{t, out}).word()); st != abi.StatusFault {
		t.Fatalf("stream_read = %v, want FAULT", st)
	}
	if !errors.Is(err, errdefs.ErrFault) || errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("the call's error = %v, want Fault (and no quarantine)", err)
	}
	if _, err := s.Run(callCtx, []byte{4}, nil); err != nil {
		t.Fatalf("the next call, whose read succeeds: %v", err)
	}
}
