// Package emu is an in-process stagehost host for unit-testing stage logic
// with plain `go test`, without building Wasm.
//
// On every platform except wasip1 the SDK sends its ABI calls to an
// attached in-process host; an Emulator attaches itself for the duration of
// Run. It keeps a session's state the way the real host does: the declared
// streams, buffers and programs, a handle table with the real layout (kind,
// session tag, never-reused serial), a memory budget, an output limit and a
// log. It returns the host's status for every misuse (bad, stale and
// foreign handles, out-of-range arguments, malformed records), runs
// launches on the CPU with the simulated device's kernels and argument
// conventions, and after every run calls the fence and checks that every
// stream is idle, quarantining the session when that cannot be proven.
//
// Device work is deferred as on a real device: a command runs when
// something waits for it (Stream.Sync, Stream.Read, the fence), and each
// Stream.Idle that finds work retires one command. So a stage that forgets
// to drain its streams behaves as it would on the host.
//
// The built-in kernels include the device op library (softmax, gemm.bf16,
// conv2d, …; docs/kernels.md): a generated copy of the host's code, so its
// results are the simulator's bit for bit. Its launches are checked
// against their op's contract at submit, as on the host: a launch that
// does not fit returns INVALID_ARGUMENT from Stream.Submit or
// Stream.SubmitBatch, the op and argument named in the last error, and
// nothing is enqueued.
//
// A command fails on the device when its kernel returns an error or panics:
// a built-in kernel given arguments it cannot use (fill with one argument,
// say), or a kernel added with Kernel that returns an error. As on the host
// (ABI.md §4.4), device work that failed never reaches the caller as
// success: the emulator records every FAULT that Stream.Sync reports during
// a run, to the stage or to a fence, and every failure the built-in fence
// finds. A run with one fails with a *FaultError (the fence still proved
// the drain, so the session is not quarantined), or with the stage's own
// *ClientError or *TrapError, which names it.
//
// Runs are serialised process-wide (the SDK talks to one host at a time),
// so parallel tests may use separate emulators; a stage must not call Run.
// Go panics in a stage are recovered and reported as a *TrapError, as the
// host reports a trap. Unlike an instance replaced after a trap, Go globals
// survive: handles cached in globals from another Emulator are foreign
// there (each emulator is a session with its own tag).
package emu

import (
	"bytes"
	"fmt"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu/internal/ops"
	"github.com/stagehost/stagehost/guest-sdk/internal/host"
	"github.com/stagehost/stagehost/guest-sdk/internal/safetensors"
)

// ABI constants, written out: the emulator is a host of its own.
const (
	kindStream  = 1
	kindBuffer  = 2
	kindProgram = 3

	maxTag           = 1<<24 - 1
	maxArgs          = 16
	maxBatch         = 1024
	argRecordSize    = 24
	batchRecordSize  = 16
	tensorRecordSize = 96
	toEnd            = 0xFFFFFFFF
	maxErrorMessage  = 4096
)

// Defaults.
const (
	// DefaultBudget is the device-memory budget of an emulator made without
	// [Config.WithBudget]: bytes of buffers allocated with buffer_alloc. It is
	// larger than a host session's default budget (64 MiB, which declared
	// buffers share there): give [Config.WithBudget] the budget of the session the
	// stage will run in to see OUT_OF_BUDGET where the host would give it.
	DefaultBudget = 256 << 20
	// DefaultOutputLimit is the output limit without [Config.WithOutputLimit] (a
	// host session's default is 16 MiB).
	DefaultOutputLimit = 1 << 20
	// queueDepth is how many commands a stream holds before the emulated
	// device retires the oldest to make room (the simulator's default
	// depth).
	queueDepth = 1024
)

var lastTag atomic.Uint32

func nextTag() uint32 {
	for {
		t := lastTag.Add(1) & maxTag
		if t != 0 {
			return t
		}
	}
}

// Emulator is one emulated session. Configure it, then call Run. Its
// methods are safe for concurrent use.
type Emulator struct {
	mu sync.Mutex

	tag     uint32
	serial  uint32
	handles map[uint32]*object // by serial

	streams []*stream // in declaration order
	byName  map[string]*object
	named   map[string]*object // buffers from buffer_alloc_named
	weights map[string]*object // the weights (Config.WithWeights, WithSafetensors), by name
	budget  int64
	used    int64
	// freeing is the bytes of buffers freed during the current run: they
	// stay charged until its fence has proven the drain (ABI.md §3
	// buffer_free), and a quarantined session keeps them.
	freeing  int64
	outLimit int
	logFn    func(stagehost.Level, string)
	logs     []LogEntry
	fence    func() error
	stages   map[string]func(*stagehost.Call) error
	running  bool
	lost     error

	// failures are the device failures recorded during the current run:
	// FAULTs that stream_sync reported, and failures the built-in fence
	// found. Cleared when a run starts.
	failures []error

	// The current run.
	entry  string
	input  []byte
	output []byte
	errMsg string
	// lastErr is the run's last error (ABI.md §3 last_error): the message
	// of the last non-OK status a host function returned since the run
	// began. why is the detail the host function about to fail gives it.
	lastErr string
	why     string
}

// object is a session resource: a declared stream, buffer or program, or an
// allocated buffer. handle is 0 until the guest first looks it up.
type object struct {
	kind    uint8
	name    string
	handle  uint64
	stream  *stream
	buffer  *buffer
	program *program
	tensors map[string]tensor // weights from a safetensors file
}

type buffer struct {
	mem       []byte
	allocated bool
	freed     bool
	weights   string // the weights' name: a read-only buffer; "" for any other
}

// tensor is one tensor of safetensors weights, as tensor_get reports it.
type tensor struct {
	off, n uint64
	dtype  uint32
	dims   []uint64
}

type program struct {
	name   string
	kernel Kernel
	// op is the op library's program, whose launches are checked at
	// submit; nil for the other kernels.
	op *ops.Kernel
	// vendor is a vendor kernel's declared arguments (launched only
	// with stream_launch); nil for the other programs.
	vendor []VendorArg
}

type opKind uint8

const (
	opWrite opKind = iota
	opLaunch
)

type command struct {
	op   opKind
	seq  uint64
	buf  *buffer // opWrite
	off  int
	data []byte
	prog *program // opLaunch
	args []Arg
}

type stream struct {
	name     string
	queue    []command
	seq      uint64
	failures []error // not yet reported by a Sync
}

// LogEntry is one message of the log: the guest's log calls, and the
// emulator's own notes (prefixed "emu: "), such as failed commands.
type LogEntry struct {
	Level   stagehost.Level
	Message string
}

// Config configures [New]. It is immutable: every WithX method returns a
// modified copy, so a Config can be shared between tests. A zero Config
// means [NewConfig]'s defaults, and a WithX method called on a zero value
// starts from those defaults.
//
//	e := emu.New(emu.NewConfig().WithBudget(1 << 20)).Stream("s0").Programs("fill")
type Config struct {
	set      bool // made by NewConfig; false: the zero value
	budget   int64
	outLimit int
	logFn    func(level stagehost.Level, msg string)
	fence    func() error
	weights  []weightsSpec
}

// weightsSpec is one WithWeights or WithSafetensors.
type weightsSpec struct {
	name        string
	data        []byte
	safetensors bool
}

// NewConfig returns the default configuration:
//
//   - budget [DefaultBudget] (see [Config.WithBudget]);
//   - output limit [DefaultOutputLimit] (see [Config.WithOutputLimit]);
//   - log entries kept only in the log (see [Config.WithLog]);
//   - the registered fence, else the built-in one (see [Config.WithFence]);
//   - no weights (see [Config.WithWeights] and [Config.WithSafetensors]).
func NewConfig() Config {
	return Config{set: true, budget: DefaultBudget, outLimit: DefaultOutputLimit}
}

// orDefaults is c, or [NewConfig]'s defaults when c is the zero value.
func (c Config) orDefaults() Config {
	if !c.set {
		return NewConfig()
	}
	return c
}

// WithBudget sets the device-memory budget: the bytes that buffer_alloc may
// hold at once (declared buffers are the operator's and not charged). A
// budget ≤ 0 is unlimited. Default [DefaultBudget].
func (c Config) WithBudget(bytes int64) Config {
	c = c.orDefaults()
	c.budget = bytes
	return c
}

// WithOutputLimit sets the most output bytes one run may write. Default
// [DefaultOutputLimit].
func (c Config) WithOutputLimit(n int) Config {
	c = c.orDefaults()
	c.outLimit = n
	return c
}

// WithLog also sends every log entry to fn as it is made (t.Log, say).
// fn must not call back into the SDK. Default: none, entries are only
// kept ([Emulator.Logs]).
func (c Config) WithLog(fn func(level stagehost.Level, msg string)) Config {
	c = c.orDefaults()
	c.logFn = fn
	return c
}

// WithFence makes fn the session's fence, as a separate fence module would
// be. Default: the fence the test binary registered with package fence
// (the module's own stagehost_fence), or else the built-in fence, which
// syncs every stream and records every failure it finds.
//
// fn's result is read as the host reads the export's status (ABI.md §4.4):
// nil, or an error whose stagehost.StatusOf is FAULT (such as Stream.Sync's
// error for a command that failed on the device), with every stream idle
// afterwards, proves the drain, and a FAULT fails the run with a
// *FaultError; any other error, a panic, or a busy stream quarantines the
// session.
func (c Config) WithFence(fn func() error) Config {
	c = c.orDefaults()
	c.fence = fn
	return c
}

// WithWeights adds raw weights called name holding a copy of data, as a
// manifest's [[weights]] with format "raw" that the session lists: the
// stage finds them with stagehost.LookupWeights, as a read-only buffer
// (ABI.md §3, weights_get), with the host's statuses and last errors for
// what it may not do to them. Weights are not charged to the budget. [New]
// panics on an empty name or data, or a name given twice.
func (c Config) WithWeights(name string, data []byte) Config {
	c = c.orDefaults()
	c.weights = append(slices.Clone(c.weights), weightsSpec{name: name, data: slices.Clone(data)})
	return c
}

// WithSafetensors adds weights called name from a safetensors file's
// bytes, as [Config.WithWeights] does: the buffer holds the file's data
// section, and stagehost.LookupTensor finds its tensors
// ("<name>/<tensor>", ABI.md §3, tensor_get). [New] panics on a file the
// host would refuse (the header's checks of the manifest).
func (c Config) WithSafetensors(name string, file []byte) Config {
	c = c.orDefaults()
	c.weights = append(slices.Clone(c.weights), weightsSpec{name: name, data: slices.Clone(file), safetensors: true})
	return c
}

// New returns an emulator with no resources, configured by cfg (a zero
// Config means [NewConfig]'s defaults).
func New(cfg Config) *Emulator {
	cfg = cfg.orDefaults()
	e := &Emulator{
		tag:      nextTag(),
		handles:  make(map[uint32]*object),
		byName:   make(map[string]*object),
		named:    make(map[string]*object),
		weights:  make(map[string]*object),
		budget:   cfg.budget,
		outLimit: cfg.outLimit,
		logFn:    cfg.logFn,
		fence:    cfg.fence,
		stages:   make(map[string]func(*stagehost.Call) error),
	}
	for _, w := range cfg.weights {
		e.addWeights(w)
	}
	return e
}

// addWeights declares the weights of one WithWeights or WithSafetensors.
func (e *Emulator) addWeights(w weightsSpec) {
	if w.name == "" || e.weights[w.name] != nil {
		panic(fmt.Sprintf("emu: weights %q: an empty name, or given twice", w.name))
	}
	o := &object{kind: kindBuffer, name: w.name, buffer: &buffer{mem: w.data, weights: w.name}}
	if w.safetensors {
		h, err := safetensors.ReadHeader(bytes.NewReader(w.data), int64(len(w.data)))
		if err != nil {
			panic(fmt.Sprintf("emu: weights %q: %v", w.name, err))
		}
		// A copy of its own, as the device's: the data section starts at
		// 8 plus the header's length, which need not be aligned, and the
		// ops check their ranges' alignment by address.
		o.buffer.mem = bytes.Clone(w.data[h.DataOffset:])
		o.tensors = make(map[string]tensor, len(h.Tensors))
		for _, t := range h.Tensors {
			o.tensors[t.Name] = tensor{off: t.Begin, n: t.End - t.Begin, dtype: t.Code, dims: t.Shape}
		}
	}
	if len(o.buffer.mem) == 0 {
		panic(fmt.Sprintf("emu: weights %q hold no bytes", w.name))
	}
	e.weights[w.name] = o
}

func nameKey(kind uint8, name string) string { return string(rune('0'+kind)) + name }

func (e *Emulator) declare(kind uint8, name string, o *object) {
	e.mu.Lock()
	defer e.mu.Unlock()
	key := nameKey(kind, name)
	if _, dup := e.byName[key]; dup {
		panic(fmt.Sprintf("emu: %s %q declared twice", kindName(kind), name))
	}
	o.kind, o.name = kind, name
	e.byName[key] = o
	if o.stream != nil {
		e.streams = append(e.streams, o.stream)
	}
}

// Stream declares a stream called name, as the operator declares the
// session's streams. It returns e.
func (e *Emulator) Stream(name string) *Emulator {
	e.declare(kindStream, name, &object{stream: &stream{name: name}})
	return e
}

// Buffer declares a zeroed device buffer of size bytes called name.
func (e *Emulator) Buffer(name string, size int) *Emulator {
	if size <= 0 {
		panic("emu: Buffer: size must be positive")
	}
	return e.BufferData(name, make([]byte, size))
}

// BufferData declares a buffer called name holding a copy of data.
func (e *Emulator) BufferData(name string, data []byte) *Emulator {
	if len(data) == 0 {
		panic("emu: BufferData: empty buffer")
	}
	e.declare(kindBuffer, name, &object{buffer: &buffer{mem: slices.Clone(data)}})
	return e
}

// Programs allows the session to use the named built-in kernels (see
// Builtins). It panics on a name that is not built in; add other programs
// with Kernel.
func (e *Emulator) Programs(names ...string) *Emulator {
	for _, n := range names {
		k, ok := builtins[n]
		if !ok {
			panic(fmt.Sprintf("emu: Programs: no built-in kernel %q (built-ins: %s)", n, strings.Join(Builtins(), ", ")))
		}
		e.declare(kindProgram, n, &object{program: &program{name: n, kernel: k, op: opKernels[n]}})
	}
	return e
}

// Kernel allows a program called name that runs k.
func (e *Emulator) Kernel(name string, k Kernel) *Emulator {
	if k == nil {
		panic("emu: Kernel: nil kernel")
	}
	e.declare(kindProgram, name, &object{program: &program{name: name, kernel: k}})
	return e
}

// VendorKernel allows a vendor kernel called name (a manifest's
// [[kernel]]) with the declared args, run by k: the Go stand-in for the
// kernel's PTX or Wasm module, which the emulator cannot run. As on the
// host, the kernel is launched only with Stream.Launch (stream_launch);
// its shape is checked against [LaunchLimits] and its arguments against
// args (count, kinds, a buffer's length against its dtype, weights only
// as in arguments) before it is enqueued.
//
// k gets its buffers as the host gives a kernel on sim (abi/ABI.md
// §3.6): each buffer argument's Bytes is a copy of its own, not the
// device memory: an in or inout range's bytes, an out range zeroed (two
// arguments bound to the same buffer get two copies). If k returns nil,
// every out and inout copy is copied back into its buffer, in argument
// order; an in copy never is. If k fails (an error or a panic), nothing
// is copied back.
//
// VendorKernel refuses, with a panic, what a manifest refuses of a
// [[kernel]] (docs/manifest.md): a name that is not 1 to 64 of a-z, 0-9,
// '_', '.' and '-', or that is a program a backend of the host has built
// in ("fill", "softmax", "spin", …), or that is declared already; more
// than 16 args; an arg with an empty name or a name given twice; a
// buffer arg of an unknown dtype or direction; a scalar of another kind
// than u32, u64, i32 or f32, or with a DType or a Dir. It panics on a
// nil kernel too.
//
// What differs from the host: k runs in the test's process with Go's
// safety, not in a Wasm instance of its own memory (sim) or on a GPU
// (cuda); the shape is checked and then ignored, as on sim. The emulator
// has no call deadline ([Emulator.Run] does not emulate deadlines) and
// no time limit, so k is never interrupted: a k that loops hangs the
// test. On sim the host interrupts a vendor kernel's Wasm module at the
// earlier of its time limit (5 s) and the deadline of the call that
// launched it, and the command fails with FAULT ("interrupted at its
// call's deadline"; abi/ABI.md §3.6). A failed command's last error
// names the stream by the emulator's stream name (stream "s0"), where
// the host names its device stream (sim: sim:sim0/stream1); the command
// number is the host's (every write, read and launch of the stream
// counts).
func (e *Emulator) VendorKernel(name string, args []VendorArg, k Kernel) *Emulator {
	if k == nil {
		panic("emu: VendorKernel: nil kernel")
	}
	if err := checkVendorKernel(name, args); err != nil {
		panic("emu: VendorKernel: " + err.Error())
	}
	e.declare(kindProgram, name, &object{program: &program{name: name, kernel: k, vendor: slices.Clone(args)}})
	return e
}

// Budget sets the device-memory budget (see [Config.WithBudget]).
func (e *Emulator) Budget(bytes int64) *Emulator {
	e.mu.Lock()
	e.budget = bytes
	e.mu.Unlock()
	return e
}

// OutputLimit sets the output limit (see [Config.WithOutputLimit]).
func (e *Emulator) OutputLimit(n int) *Emulator {
	e.mu.Lock()
	e.outLimit = n
	e.mu.Unlock()
	return e
}

// Stage makes fn the stage for entry on this emulator only, taking
// precedence over what the test binary registered with stagehost.Register.
func (e *Emulator) Stage(entry string, fn func(c *stagehost.Call) error) *Emulator {
	e.mu.Lock()
	e.stages[entry] = fn
	e.mu.Unlock()
	return e
}

// Bytes returns a copy of the declared buffer name's contents, as the
// device holds them now (queued writes have not landed yet).
func (e *Emulator) Bytes(name string) ([]byte, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.byName[nameKey(kindBuffer, name)]
	if o == nil {
		return nil, false
	}
	return slices.Clone(o.buffer.mem), true
}

// Pending returns how many commands of the stream called name have not
// retired.
func (e *Emulator) Pending(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.byName[nameKey(kindStream, name)]
	if o == nil {
		return 0
	}
	return len(o.stream.queue)
}

// BudgetUsed returns the bytes charged to the budget: allocated buffers
// not freed, and those freed during a run until its fence has proven the
// drain (as on the host, ABI.md §3 buffer_free; a quarantined session
// keeps them charged).
func (e *Emulator) BudgetUsed() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.used
}

// Logs returns the log so far.
func (e *Emulator) Logs() []LogEntry {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.logs)
}

// Quarantined returns the error that quarantined the session, or nil.
func (e *Emulator) Quarantined() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lost
}

// Errors of Run.

// ClientError is a stage's non-zero result (ABI.md §4.1): the code it
// returned and the message it set with error_set. For a Go stage the code is
// stagehost.StatusOf of the returned error.
//
// If device work of the run failed as well, the client error is still what
// Run returns, with the failure in Failed: its message names the failure,
// and it unwraps to it, so errors.Is(err, stagehost.ErrFault) holds too, as
// for the host's error.
type ClientError struct {
	Code    int32
	Message string
	Failed  *FaultError // device work of the run that failed, or nil
}

func (e *ClientError) Error() string {
	s := "emu: stage failed with code " + strconv.Itoa(int(e.Code)) + ": " + e.Message
	if e.Failed != nil {
		s += " (device work of the run also failed: " + e.Failed.failures() + ")"
	}
	return s
}

// Unwrap returns Failed, or nil.
func (e *ClientError) Unwrap() error {
	if e.Failed == nil {
		return nil
	}
	return e.Failed
}

// FaultError is a run whose device work failed although the fence proved
// the drain (ABI.md §4.1, "device work failed"; §4.4): commands that failed
// on the device, reported by Stream.Sync (to the stage or to a fence) or
// found by the built-in fence, or a fence that returned an error of status
// FAULT. The session is not quarantined. It matches stagehost.ErrFault and
// unwraps to the failures and the fence's error.
type FaultError struct {
	Failures []error // the failed commands recorded during the run, in order
	Fence    error   // the fence's FAULT error, or nil
}

func (e *FaultError) Error() string { return "emu: device work failed: " + e.failures() }

// failures describes the failures, and the fence's report if there is no
// recorded failure.
func (e *FaultError) failures() string {
	if len(e.Failures) == 0 {
		if e.Fence == nil {
			return "no failure recorded"
		}
		return "the fence reported: " + e.Fence.Error()
	}
	msgs := make([]string, len(e.Failures))
	for i, f := range e.Failures {
		msgs[i] = f.Error()
	}
	return strings.Join(msgs, "; ")
}

// Is makes a FaultError match stagehost.ErrFault.
func (e *FaultError) Is(target error) bool { return target == stagehost.ErrFault }

// Unwrap returns the failures and the fence's error.
func (e *FaultError) Unwrap() []error {
	errs := slices.Clone(e.Failures)
	if e.Fence != nil {
		errs = append(errs, e.Fence)
	}
	return errs
}

// TrapError is a stage or fence that panicked: the host would see a trap
// and report a FAULT. It matches stagehost.ErrFault. A trapped stage's run
// whose device work failed as well names the failure in Failed.
type TrapError struct {
	Where  string      // "stage" or "fence"
	Value  any         // the panic value
	Stack  []byte      // the panicking goroutine's stack
	Failed *FaultError // device work of the run that failed, or nil
}

func (e *TrapError) Error() string {
	s := fmt.Sprintf("emu: %s trapped: panic: %v", e.Where, e.Value)
	if e.Failed != nil {
		s += " (device work of the run also failed: " + e.Failed.failures() + ")"
	}
	return s + "\n" + string(e.Stack)
}

// Is makes a TrapError match stagehost.ErrFault.
func (e *TrapError) Is(target error) bool { return target == stagehost.ErrFault }

// Unwrap returns the panic value if it is an error.
func (e *TrapError) Unwrap() error { err, _ := e.Value.(error); return err }

// QuarantineError is a failed fence (ABI.md §4.4): it returned an error
// whose status is not FAULT, trapped, or left a stream busy (whether it
// returned nil or a FAULT error). The session is quarantined: this and every
// later Run returns it. It matches stagehost.ErrDeviceLost and unwraps to
// the fence's failure and the stage's own error, if any; device work of the
// run that failed is named in the message, not unwrapped.
type QuarantineError struct {
	Reason error       // why the fence failed
	Stage  error       // the run's own error, if it had one
	Failed *FaultError // device work of the run that failed, or nil
}

func (e *QuarantineError) Error() string {
	s := "emu: session quarantined: fence could not be proven: " + e.Reason.Error()
	if e.Stage != nil {
		s += " (after stage error: " + e.Stage.Error() + ")"
	}
	if e.Failed != nil {
		s += " (device work had failed: " + e.Failed.failures() + ")"
	}
	return s
}

// Is makes a QuarantineError match stagehost.ErrDeviceLost.
func (e *QuarantineError) Is(target error) bool { return target == stagehost.ErrDeviceLost }

// Unwrap returns the fence failure and the stage error.
func (e *QuarantineError) Unwrap() []error {
	if e.Stage == nil {
		return []error{e.Reason}
	}
	return []error{e.Reason, e.Stage}
}

// errBusy is a re-entrant Run.
var errBusy = fmt.Errorf("emu: Run called while this emulator is running a stage: %w", stagehost.ErrBusy)

// Run runs the stage registered for entry ("" means "main") with input, as
// the host runs stagehost_run, then the fence, then the idle check. It
// returns, as the host's outcomes (ABI.md §4.1):
//   - the output on success;
//   - a *QuarantineError when the fence failed (then and for every later
//     call);
//   - a *TrapError when the stage panicked;
//   - a *ClientError when the stage returned an error;
//   - a *FaultError when the stage returned nil but device work of the run
//     failed: a FAULT that Stream.Sync reported during the run (whether or
//     not the stage or fence then ignored it), a failure the built-in fence
//     found, or a fence that returned an error of status FAULT. The
//     session is not quarantined.
//
// Run does not emulate deadlines.
func (e *Emulator) Run(entry string, input []byte) ([]byte, error) {
	if entry == "" {
		entry = stagehost.DefaultEntry
	}
	e.mu.Lock()
	if e.running {
		e.mu.Unlock()
		return nil, errBusy
	}
	if e.lost != nil {
		err := e.lost
		e.mu.Unlock()
		return nil, err
	}
	e.running = true
	stage := e.stages[entry]
	e.mu.Unlock()

	detach := host.Attach((*abiHost)(e))
	defer func() {
		detach()
		e.mu.Lock()
		e.running = false
		e.entry, e.input, e.output, e.errMsg = "", nil, nil, ""
		e.mu.Unlock()
	}()

	e.mu.Lock()
	e.entry, e.input, e.output, e.errMsg = entry, slices.Clone(input), nil, ""
	e.lastErr, e.why = "", "" // a run starts with no last error
	e.failures = nil
	e.mu.Unlock()

	var code int32
	stageErr := protect("stage", func() error {
		var override any
		if stage != nil {
			override = stage
		}
		code, _ = host.Run(override)
		return nil
	})
	if stageErr == nil && code != 0 {
		e.mu.Lock()
		stageErr = &ClientError{Code: code, Message: e.errMsg}
		e.mu.Unlock()
	}
	failed, q := e.fenceAndVerify(stageErr)
	if q != nil {
		return nil, q
	}
	if failed != nil {
		switch se := stageErr.(type) {
		case nil:
			return nil, failed
		case *ClientError:
			se.Failed = failed
		case *TrapError:
			se.Failed = failed
		}
	}
	if stageErr != nil {
		return nil, stageErr
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.output), nil
}

// RunFence runs only the fence and the idle check, as the host does after a
// stage: for testing a fence module. It returns nil, a *FaultError (the
// fence drained, but device work had failed), or a *QuarantineError.
func (e *Emulator) RunFence() error {
	e.mu.Lock()
	if e.running {
		e.mu.Unlock()
		return errBusy
	}
	if e.lost != nil {
		err := e.lost
		e.mu.Unlock()
		return err
	}
	e.running = true
	e.failures = nil
	e.lastErr, e.why = "", ""
	e.mu.Unlock()
	detach := host.Attach((*abiHost)(e))
	defer func() {
		detach()
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
	}()
	failed, q := e.fenceAndVerify(nil)
	switch {
	case q != nil:
		return q
	case failed != nil:
		return failed
	}
	return nil
}

// protect calls f, turning a panic into a *TrapError.
func protect(where string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &TrapError{Where: where, Value: r, Stack: debug.Stack()}
		}
	}()
	return f()
}

// fenceAndVerify runs the fence, then checks every stream is idle (ABI.md
// §4.4). A fence that returned nil or an error of status FAULT (as its
// stagehost_fence export would return: stagehost.StatusOf) and left every
// stream idle proved the drain; then failed is the run's device failures,
// if any. Any other error, a panic, or a busy stream is a failed fence: q
// is the quarantine, and the session is quarantined.
func (e *Emulator) fenceAndVerify(stageErr error) (failed *FaultError, q *QuarantineError) {
	e.mu.Lock()
	fn := e.fence
	e.mu.Unlock()
	if fn == nil {
		fn = host.Fence()
	}
	if fn == nil {
		fn = e.builtinFence
	}
	fenceErr := protect("fence", fn)
	_, trapped := fenceErr.(*TrapError)
	var reason, fenceFault error
	switch {
	case trapped, fenceErr != nil && stagehost.StatusOf(fenceErr) != stagehost.StatusFault:
		reason = fenceErr
	default:
		// The fence reports a drain, perhaps with failed work: the streams
		// must say the same.
		if reason = e.verifyIdle(); reason != nil && fenceErr != nil {
			reason = fmt.Errorf("%w (the fence had reported: %v)", reason, fenceErr)
		}
		fenceFault = fenceErr
	}
	e.mu.Lock()
	if len(e.failures) > 0 || fenceFault != nil {
		failed = &FaultError{Failures: slices.Clone(e.failures), Fence: fenceFault}
	}
	if reason == nil {
		// The drain is proven: what the run freed is released.
		e.used -= e.freeing
		e.freeing = 0
	}
	e.mu.Unlock()
	if reason == nil {
		return failed, nil
	}
	q = &QuarantineError{Reason: reason, Stage: stageErr, Failed: failed}
	e.mu.Lock()
	e.lost = q
	e.mu.Unlock()
	e.note(stagehost.LevelError, q.Error())
	return nil, q
}

// builtinFence is the host's built-in fence: it drains every stream,
// attempting all of them, and records every failure it finds. It proves
// the drain, so it returns nil; the recorded failures fail the run.
func (e *Emulator) builtinFence() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.streams {
		e.drainLocked(s)
		e.failures = append(e.failures, s.failures...)
		s.failures = nil
	}
	return nil
}

func (e *Emulator) verifyIdle() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.streams {
		if len(s.queue) > 0 {
			return fmt.Errorf("stream %q still has %d commands after the fence: %w", s.name, len(s.queue), stagehost.ErrDeviceLost)
		}
	}
	return nil
}

// note adds an emulator message to the log.
func (e *Emulator) note(level stagehost.Level, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.logLocked(level, "emu: "+msg)
}

func (e *Emulator) logLocked(level stagehost.Level, msg string) {
	e.logs = append(e.logs, LogEntry{level, msg})
	if e.logFn != nil {
		e.logFn(level, msg)
	}
}

func kindName(k uint8) string {
	switch k {
	case kindStream:
		return "stream"
	case kindBuffer:
		return "buffer"
	case kindProgram:
		return "program"
	}
	return "kind " + strconv.Itoa(int(k))
}
