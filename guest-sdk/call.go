package stagehost

import (
	"strconv"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// Call is one run of a stage: the host's call of stagehost_run. It gives
// the stage its input and output and the session's resources. A Call is
// valid only while the stage function runs.
type Call struct {
	entry    string
	input    []byte
	inputErr error
	haveIn   bool
	// The InputView of this call: a buffer of scratchPool, given back
	// when the stage returns.
	view     *[]byte
	viewData []byte
	viewErr  error
}

// scratchPool holds the SDK's reusable byte buffers (InputView,
// WriteFrom): a stage that uses them allocates nothing per call once the
// buffers have grown to its sizes. A Go guest runs one goroutine per
// call, so a buffer is rarely fetched twice; the pool also keeps
// concurrent emulated calls apart.
var scratchPool = sync.Pool{New: func() any { return new([]byte) }}

// Entry is the entry name the caller requested ("main" unless it asked for
// another).
func (c *Call) Entry() string { return c.entry }

// ReadInput returns the session's input for this call, reading it from the
// host the first time (input_size, input_read) and returning the same
// slice afterwards.
func (c *Call) ReadInput() ([]byte, error) {
	if !c.haveIn {
		c.input, c.inputErr = readInput()
		c.haveIn = true
	}
	return c.input, c.inputErr
}

// Input is ReadInput for stages that cannot do anything sensible when the
// host fails to deliver the input: it panics with the *Error then, which
// traps the instance. The returned slice belongs to the stage.
func (c *Call) Input() []byte {
	in, err := c.ReadInput()
	if err != nil {
		panic(err)
	}
	return in
}

// InputView is ReadInput for input that the stage only uses during the
// call (uploads, parses): the bytes are read into a buffer the SDK owns
// and reuses for later calls, so a steady stage allocates nothing per
// call for its input (a Go guest's per-call allocation of a large input
// costs zeroing and garbage collection in the guest). The slice is valid
// only until the stage function returns: do not keep it, or any part of
// it, past that. Calls in the same stage return the same slice; after
// ReadInput, InputView returns ReadInput's slice.
//
// # Errors
//
// As ReadInput.
func (c *Call) InputView() ([]byte, error) {
	if c.haveIn {
		return c.input, c.inputErr
	}
	if c.view == nil {
		c.view = scratchPool.Get().(*[]byte)
		c.viewData, c.viewErr = readInputInto(*c.view)
		if cap(c.viewData) > cap(*c.view) {
			*c.view = c.viewData[:0] // grown: keep the larger buffer
		}
	}
	return c.viewData, c.viewErr
}

// release gives back the call's SDK-owned buffers once the stage
// returned.
func (c *Call) release() {
	if c.view != nil {
		scratchPool.Put(c.view)
		c.view, c.viewData = nil, nil
	}
}

func readInput() ([]byte, error) { return readInputInto(make([]byte, 0)) }

// readInputInto reads the input into buf's storage when it has the room,
// else into a new slice.
func readInputInto(buf []byte) ([]byte, error) {
	var n uint32
	if err := check("input_size", hInputSize(&n)); err != nil {
		return nil, err
	}
	buf = grow(buf, int(n))
	for off := uint32(0); off < n; {
		var got uint32
		if err := check("input_read", hInputRead(off, buf[off:], &got)); err != nil {
			return nil, err
		}
		if got == 0 || got > n-off {
			// The host promised n bytes; a short or overlong read is a
			// host failure.
			return nil, &Error{Op: "input_read", Status: StatusFault}
		}
		off += got
	}
	return buf, nil
}

// Write appends p to the call's output (output_write). Beyond the
// session's output limit it appends nothing and returns an error matching
// ErrOutputTooLarge.
func (c *Call) Write(p []byte) error { return check("output_write", hOutputWrite(p)) }

// WriteFrom appends n bytes of device buffer b, from byte offset off, to
// the call's output: it downloads them on stream s (stream_read, which
// waits for the download and every earlier command on s) into a buffer
// the SDK owns and reuses for later calls, then writes them
// (output_write). A stage that returns device results this way allocates
// nothing per call for them. Failures of earlier launches are reported by
// Sync, as for Stream.Read.
//
// # Errors
//
// As Stream.Read and Write. Nothing is appended when the download fails.
// A negative n reads no bytes from offset 2^32 − 1, which the host refuses
// as it refuses Read's offsets that do not fit ("range [4294967295,+0)
// outside a buffer of 64 bytes"), so the error's Reason and LastError
// are the host's.
func (c *Call) WriteFrom(s Stream, b Buffer, off, n int) error {
	if n < 0 {
		off, n = -1, 0
	}
	bp := scratchPool.Get().(*[]byte)
	defer scratchPool.Put(bp)
	*bp = grow(*bp, n)
	if err := s.Read(b, off, *bp); err != nil {
		return err
	}
	return c.Write(*bp)
}

// Output is Write.
func (c *Call) Output(p []byte) error { return c.Write(p) }

// WriteString appends s to the output.
func (c *Call) WriteString(s string) error {
	return check("output_write", hOutputWrite(strBytesView(s)))
}

// Log sends msg to the host log at level (log). The host may drop or cut
// messages beyond its limits (stagehost keeps a call's first 64 messages
// and the first 4096 bytes of each); Log ignores failures.
func (c *Call) Log(level Level, msg string) { Log(level, msg) }

// Stream looks up the declared stream called name (see LookupStream).
func (c *Call) Stream(name string) (Stream, error) { return LookupStream(name) }

// Buffer looks up the declared buffer called name (see LookupBuffer).
func (c *Call) Buffer(name string) (Buffer, error) { return LookupBuffer(name) }

// Program looks up the program called name (see LookupProgram).
func (c *Call) Program(name string) (Program, error) { return LookupProgram(name) }

// Alloc allocates a device buffer of size bytes (see AllocBuffer).
func (c *Call) Alloc(size int) (Buffer, error) { return AllocBuffer(size) }

// AllocNamed finds or allocates a named buffer; see [AllocNamedBuffer].
func (c *Call) AllocNamed(name string, size int) (Buffer, error) { return AllocNamedBuffer(name, size) }

// Log sends msg to the host log at level; usable outside a Call, e.g. in a
// fence. Failures (a dropped message) are ignored.
func Log(level Level, msg string) { hLog(int32(level), msg) }

// Registration and dispatch.

var registry struct {
	sync.Mutex
	stages map[string]func(*Call) error
}

// Register makes fn the stage run for entry name entry. Call it from an
// init function: a Go guest built with -buildmode=c-shared runs package
// initialisation in _initialize and never calls main.main. Register panics
// on an empty entry, a nil fn or an entry registered twice.
func Register(entry string, fn func(c *Call) error) {
	if entry == "" || fn == nil {
		panic("stagehost: Register: empty entry or nil function")
	}
	registry.Lock()
	defer registry.Unlock()
	if registry.stages == nil {
		registry.stages = make(map[string]func(*Call) error)
	}
	if _, dup := registry.stages[entry]; dup {
		panic("stagehost: Register: entry " + quote(entry) + " registered twice")
	}
	registry.stages[entry] = fn
}

// Main registers fn for the default entry, "main".
func Main(fn func(c *Call) error) { Register(DefaultEntry, fn) }

func lookupStage(entry string) func(*Call) error {
	registry.Lock()
	defer registry.Unlock()
	return registry.stages[entry]
}

// dispatch is stagehost_run: it reads the entry name, runs the registered
// stage (or override, when non-nil) and turns a returned error into
// error_set plus a non-zero result. Panics are not recovered: they trap.
func dispatch(override func(*Call) error) Status {
	entry, err := entryName()
	if err != nil {
		return fail(err)
	}
	fn := override
	if fn == nil {
		fn = lookupStage(entry)
	}
	if fn == nil {
		setError("stagehost: no stage registered for entry " + quote(entry))
		return StatusNotFound
	}
	c := &Call{entry: entry}
	err = fn(c)
	c.release()
	if err != nil {
		return fail(err)
	}
	return StatusOK
}

func fail(err error) Status {
	msg := err.Error()
	if msg == "" {
		msg = "stage failed"
	}
	setError(msg)
	return StatusOf(err)
}

// setError reports msg with error_set, cut to MaxErrorMessage bytes at a
// UTF-8 boundary.
func setError(msg string) {
	if len(msg) > MaxErrorMessage {
		cut := MaxErrorMessage
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	hErrorSet(msg)
}

// LastError returns the call's last error (last_error): the host's message
// for the last failure a host function returned during this call, such as
// a failed kernel's own reason for a stream_sync FAULT, or "" when there
// is none (or no host to ask). The SDK's errors of failed host calls
// already carry it as Error.Reason.
func LastError() string {
	var small [256]byte
	buf := small[:]
	for {
		n := uint32(0)
		st := hLastError(buf, &n)
		switch {
		case st == StatusOK && int(n) <= len(buf):
			return string(buf[:n])
		case st == StatusOutOfBounds && int(n) > len(buf) && n <= 1<<20:
			// The host wrote the length it needs (ABI.md §3 last_error).
			buf = make([]byte, n)
		default:
			return ""
		}
	}
}

// entryName reads the requested entry name (entry_name), growing its buffer
// if the host reports OUT_OF_BOUNDS.
func entryName() (string, error) {
	var small [64]byte
	buf := small[:]
	for {
		n := uint32(0)
		st := hEntryName(buf, &n)
		switch {
		case st == StatusOK:
			if int(n) > len(buf) {
				return "", &Error{Op: "entry_name", Status: StatusFault}
			}
			return string(buf[:n]), nil
		case st != StatusOutOfBounds || len(buf) >= 1<<20:
			return "", &Error{Op: "entry_name", Status: st}
		case int(n) > len(buf) && n <= 1<<20:
			// The host wrote the length it needs (ABI.md §3 entry_name).
			buf = make([]byte, n)
		default:
			buf = make([]byte, 2*len(buf))
		}
	}
}

func quote(s string) string { return strconv.Quote(s) }

// strBytesView is s's bytes without a copy, for host calls that only read.
func strBytesView(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
