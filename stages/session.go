package stages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tetratelabs/wazero/api"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/monotime"
	"github.com/stagehost/stagehost/stages/internal/wasmbin"
)

// SessionConfig declares a Wasm session's device resources and limits. It
// is immutable: every WithX method returns a modified copy.
type SessionConfig struct {
	name         string
	device       hw.Device
	streams      []string
	buffers      []bufferDecl
	programs     []string
	kernels      []*WasmKernel
	vendorProgs  []vendorProgram
	budget       int64
	outputLimit  int
	deadline     time.Duration
	fenceTimeout time.Duration
	initTimeout  time.Duration
	fence        *Module
	drain        bool
	stagingLimit int
	resetPerCall bool
	weights      []*Weights
}

type bufferDecl struct {
	name string
	size int
}

// NewSessionConfig returns a configuration for a session named name on
// device, with the defaults:
//
//   - no declared streams, buffers or programs;
//   - a memory budget of 64 MiB for declared and allocated buffers;
//   - an output limit of 16 MiB;
//   - a deadline of 5 s per stage call and 10 s per fence, and 5 s to make
//     each instance (see [SessionConfig.WithInitTimeout]);
//   - 64 MiB of host memory to stage uploads (see [SessionConfig.WithStagingLimit]);
//   - the module's own stagehost_fence if it has one, else the built-in
//     fence that syncs every stream;
//   - instances that keep their memory from call to call (see
//     [SessionConfig.WithResetPerCall]).
func NewSessionConfig(name string, device hw.Device) SessionConfig {
	return SessionConfig{name: name, device: device, budget: 64 << 20, outputLimit: 16 << 20,
		deadline: 5 * time.Second, fenceTimeout: 10 * time.Second, initTimeout: 5 * time.Second, stagingLimit: 64 << 20}
}

// WithStreams declares streams the guest can look up by name.
func (c SessionConfig) WithStreams(names ...string) SessionConfig {
	c.streams = append(append([]string(nil), c.streams...), names...)
	return c
}

// WithBuffer declares a buffer of size bytes the guest can look up by
// name. It is charged to the session's budget.
func (c SessionConfig) WithBuffer(name string, size int) SessionConfig {
	c.buffers = append(append([]bufferDecl(nil), c.buffers...), bufferDecl{name, size})
	return c
}

// WithWeights lists weights the guest can look up by name with
// weights_get and tensor_get (ABI.md §3): each is a read-only buffer
// over the one device copy that every session listing it shares. The
// weights must be on the session's device. The session holds a
// reference to each ([Weights.Retain]) from its creation until it
// closes; a quarantined session keeps it. Weights are not charged to
// the session's budget (their upload charged the budget it was given
// once). Default none.
func (c SessionConfig) WithWeights(w ...*Weights) SessionConfig {
	c.weights = append(append([]*Weights(nil), c.weights...), w...)
	return c
}

// WithKernels gives the session vendor kernels ([Engine.LoadKernel]):
// a name in [SessionConfig.WithPrograms] that is one of theirs is
// prepared from the kernel (on a sim device: [sim.Device.PrepareKernel])
// rather than looked up in the device's registry. Default none.
func (c SessionConfig) WithKernels(k ...*WasmKernel) SessionConfig {
	c.kernels = append(append([]*WasmKernel(nil), c.kernels...), k...)
	return c
}

// WithVendorProgram gives the session a vendor kernel of any backend: a
// name in [SessionConfig.WithPrograms] equal to info.Name is prepared by
// prepare on the session's device (a cuda device's
// Device.PrepareVendor of hw/cuda, for instance) and launched only with
// stream_launch, checked against info. Default none.
func (c SessionConfig) WithVendorProgram(info hw.KernelInfo, prepare func(hw.Device) (hw.Program, error)) SessionConfig {
	c.vendorProgs = append(append([]vendorProgram(nil), c.vendorProgs...), vendorProgram{info, prepare})
	return c
}

// vendorProgram is one WithVendorProgram.
type vendorProgram struct {
	info    hw.KernelInfo
	prepare func(hw.Device) (hw.Program, error)
}

// vendorInfo returns the declaration of the vendor kernel called name,
// or nil.
func (c *SessionConfig) vendorInfo(name string) *hw.KernelInfo {
	for _, k := range c.kernels {
		if k.spec.Name == name {
			info := k.spec.Info()
			return &info
		}
	}
	for _, v := range c.vendorProgs {
		if v.info.Name == name {
			info := v.info
			return &info
		}
	}
	return nil
}

// WithPrograms names the programs the guest may look up; each is prepared
// on the session's device when the session is created.
func (c SessionConfig) WithPrograms(names ...string) SessionConfig {
	c.programs = append(append([]string(nil), c.programs...), names...)
	return c
}

// WithStagingLimit bounds the host memory that holds a call's uploads
// (stream_write copies the guest's bytes before it returns, and they stay
// until the upload ran). When the staged bytes would pass the limit, the
// host drains the session's streams and reuses the memory; one upload
// larger than the limit gets OUT_OF_BUDGET. Default 64 MiB.
//
// The staging memory grows as uploads need it (64 KiB at first, then
// doubling, up to the limit) and is kept for later calls. It is
// host-visible memory of the session's device where the device has some
// (page-locked on CUDA: the driver uploads from it directly, with no copy
// into its own staging), else Go memory; it is not charged to the
// session's budget. Memory it outgrew is freed after the call's fence
// proved the uploads from it retired, the rest when the session closes; a
// quarantined session keeps it, as it keeps its buffers. While a call
// grows it, outgrown and current memory together stay under twice the
// limit.
func (c SessionConfig) WithStagingLimit(bytes int) SessionConfig { c.stagingLimit = bytes; return c }

// WithBudget sets the session's memory budget in bytes. Default 64 MiB.
func (c SessionConfig) WithBudget(bytes int64) SessionConfig { c.budget = bytes; return c }

// WithOutputLimit bounds the output of one call. Default 16 MiB.
func (c SessionConfig) WithOutputLimit(bytes int) SessionConfig { c.outputLimit = bytes; return c }

// WithDeadline bounds each stage call, counted from when the call asks
// for the compute lane: the wait for the lane (behind other sessions'
// calls on the same device) and the stage together. A call still waiting
// for the lane at its deadline gets [errdefs.ErrDeadlineExceeded] then,
// without running (nothing to fence; its instance is kept); a stage that
// runs past it is interrupted, its instance replaced, and the caller gets
// [errdefs.ErrDeadlineExceeded] after the fence. The fence has its own
// timeout ([SessionConfig.WithFenceTimeout]). Default 5 s.
func (c SessionConfig) WithDeadline(d time.Duration) SessionConfig { c.deadline = d; return c }

// WithInitTimeout bounds the making of each instance of the session's
// modules: instantiation with its start function, _initialize and
// stagehost_init together. It applies when the session is created and
// whenever an instance is replaced after a trap or a deadline. An
// instance that is not ready in time is discarded and the session fails
// with [errdefs.ErrDeadlineExceeded]. Default 5 s.
func (c SessionConfig) WithInitTimeout(d time.Duration) SessionConfig { c.initTimeout = d; return c }

// WithResetPerCall starts every call from the module's pristine state:
// after each call whose fence proved the session's work drained, the
// stage instance's memory and globals return to the module's snapshot
// (ABI.md §4.3) and stagehost_init runs again, so nothing one call
// leaves in guest memory reaches the next, which may come from another
// tenant. An instance whose memory grew is replaced instead, and so is
// every instance of a module without a snapshot (at the cost of a full
// initialisation). A fence module's instance is reset the same way.
// Default false: an instance keeps its memory from call to call.
func (c SessionConfig) WithResetPerCall(on bool) SessionConfig { c.resetPerCall = on; return c }

// WithFenceTimeout bounds each fence. A fence that runs longer has failed:
// the session is quarantined. Default 10 s.
func (c SessionConfig) WithFenceTimeout(d time.Duration) SessionConfig { c.fenceTimeout = d; return c }

// WithFenceModule uses a separate fence module (loaded with
// [FenceModule]); it shares the session's handles. Default: the stage
// module's own fence, or the built-in one.
func (c SessionConfig) WithFenceModule(m *Module) SessionConfig {
	c.fence, c.drain = m, false
	return c
}

// WithDrainFence always uses the built-in fence that syncs every stream,
// even if the stage module exports its own stagehost_fence.
func (c SessionConfig) WithDrainFence() SessionConfig { c.fence, c.drain = nil, true; return c }

// ClientError is a stage's own failure: stagehost_run returned a non-zero
// code. It does not harm a session whose fence then drained.
type ClientError struct {
	Session string
	Code    int32
	Message string // from error_set
}

func (e *ClientError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("stage %q failed with code %d", e.Session, e.Code)
	}
	return fmt.Sprintf("stage %q failed with code %d: %s", e.Session, e.Code, e.Message)
}

// callState is the session state host functions act on.
type callState struct {
	sess        *Session
	table       *handleTable
	input       []byte
	output      []byte // the caller's dst, the call's output appended to it
	outputBase  int    // len(dst): output_write's limit counts from here
	spare       []byte // an output buffer of earlier calls, for a dst that overlaps the input
	outputLimit int
	entry       string
	shape       hw.LaunchShape // stream_launch's, reused
	errMsg      string
	logs        int
	// lastErr is the call's last error (ABI.md §3, last_error): the
	// message of the last non-OK status a host function returned to the
	// session's guest code since the call began. failure is the error
	// behind the status the running host function is about to return.
	lastErr     []byte
	failure     error
	cmd         hw.Command
	args        [abi.MaxArgs]hw.Arg
	batch       batchArena  // the decoded batch of stream_submit_batch
	arena       []byte      // staged upload bytes of this call
	arenaBuf    hw.Buffer   // the host-visible buffer arena lies in; nil: Go memory
	oldArenas   []hw.Buffer // arenas outgrown, freed after a proven fence
	pendingFree []hw.Buffer // freed by the guest, released after a proven fence
	calls       int         // calls started, so a failed replacement is told from a failed creation
}

// stage returns n bytes of upload staging that stay untouched until the
// upload copying them has retired: until the next call (whose fence has
// proven every upload retired), or until the session's staging limit is
// reached, when it first drains every stream of the session and starts
// the arena over. The staging memory of a session is thus bounded by its
// limit, however many uploads a guest queues.
//
// # Errors
//
// [errdefs.ErrOutOfBudget] for one upload larger than the limit; the drain's
// error when the streams could not be drained.
func (st *callState) stage(ctx context.Context, n int) ([]byte, error) {
	limit := st.sess.cfg.stagingLimit
	if n > limit {
		return nil, errdefs.Errorf(errdefs.ErrOutOfBudget, "an upload of %d bytes is larger than the session's staging limit of %d bytes", n, limit)
	}
	if len(st.arena)+n > limit {
		if err := st.sess.owner.Drain(ctx); err != nil {
			return nil, err
		}
		st.arena = st.arena[:0] // every staged upload has retired
	}
	if len(st.arena)+n > cap(st.arena) {
		st.growArena(min(max(2*cap(st.arena), n, 64<<10), limit))
	}
	b := st.arena[len(st.arena) : len(st.arena)+n]
	st.arena = st.arena[:len(st.arena)+n]
	return b, nil
}

// growArena replaces the arena with an empty one of size bytes:
// host-visible memory of the session's device when it has some (on CUDA
// page-locked memory, which the driver uploads from directly: no copy of
// its own into its staging memory, and the upload is asynchronous), else
// Go memory. The outgrown arena may still hold uploads in flight: a
// host-visible one is freed only after a fence has proven them retired
// (releaseArenas), never by a quarantined session. The arena is not
// charged to the session's budget, as Go memory was not.
func (st *callState) growArena(size int) {
	if st.arenaBuf != nil {
		st.oldArenas = append(st.oldArenas, st.arenaBuf)
		st.arenaBuf = nil
	}
	if b, err := st.sess.cfg.device.Alloc(size, hw.AllocHostVisible, nil); err == nil {
		if h, err := b.HostBytes(); err == nil && len(h) >= size {
			st.arenaBuf, st.arena = b, h[:0:size]
			return
		}
		_ = b.Free()
	}
	st.arena = make([]byte, 0, size)
}

// releaseArenas frees the outgrown arenas, once a fence (or Close) has
// proven that no upload from them is in flight; with all, the current
// one too.
func (st *callState) releaseArenas(all bool) {
	for _, b := range st.oldArenas {
		_ = b.Free()
	}
	clear(st.oldArenas)
	st.oldArenas = st.oldArenas[:0]
	if all && st.arenaBuf != nil {
		_ = st.arenaBuf.Free()
		st.arenaBuf, st.arena = nil, nil
	}
}

// instance is one instantiation of a module, with its exports looked up
// once.
type instance struct {
	mod    api.Module
	module *Module
	entry  api.Function // stagehost_run or stagehost_fence
	fence  api.Function // the stage module's own fence, if any
	init   api.Function // stagehost_init, if any
	mem    *snapMemory  // the memory, for an instance made from a snapshot
	stack  [1]uint64
}

// Session is one Wasm stage session: a stage module instantiated with
// its own device resources (a [host.Owner]), handle table and limits. It
// is the Wasm counterpart of [NativeSession], which it runs every call
// in. The other types named "session" are other concepts: a
// manifest.Session is the declaration a Session may be made from; a
// deploy.Pool serves one declared session with one or more Sessions as
// its instances; a sessions.ResidentSession is a resident GPU–NPU
// exchange, with no Wasm in it.
//
// Every call runs in this order: re-entrancy guard, admission, compute
// lease, the stage call under its deadline and the module's memory limit,
// the fence under its own deadline, the check that every stream is idle,
// quarantine if the fence cannot be proven, and the trace record.
//
// Every entry into guest code — the start function and _initialize and
// stagehost_init when an instance is made, stagehost_run and
// stagehost_fence — goes through one guarded path (see [Session.RunEntry]):
// it arms a deadline, classifies the outcome as ok, client error, trap or
// deadline, and discards the instance after a trap or an interruption. A
// discarded instance is replaced, under the init timeout, before the next
// entry into the module; the session's resources and handles stay. A
// session whose instance cannot be replaced has failed: every later call
// returns the error that failed it.
type Session struct {
	name    string
	engine  *Engine
	module  *Module
	cfg     SessionConfig
	owner   *host.Owner
	logger  *slog.Logger
	native  *NativeSession[callState]
	callCtx callContext // the context of every entry into guest code; entries never nest
	who     string      // `session "name"`, for errors

	// mu is held across a whole call (stage, fence, release of freed
	// buffers), across Close, and whenever instances change.
	mu      sync.Mutex
	inst    *instance             // nil when discarded
	fenceIn *instance             // the fence module's instance
	failed  error                 // why no instance can be made any more; nil while one can
	failedA atomic.Pointer[error] // failed, for Failed to read without waiting for a call
	closed  bool
	replace atomic.Int64 // instances discarded after a trap or interruption
	// retired holds the memories of discarded instances made from a
	// snapshot until a fence proves that no device command of the
	// session still writes into them (a stream_read whose wait was cut
	// short by a deadline may).
	retired []*snapMemory
	resets  atomic.Int64 // instances returned to their snapshot (WithResetPerCall)
}

// NewSession creates the session's resources (streams, declared buffers,
// prepared programs, charged to its budget), registers them in a new
// handle table, and makes the module's instance under the init timeout:
// from the module's snapshot, running only stagehost_init, or, for a
// module without a snapshot, running its start function, _initialize and
// stagehost_init. A fence module's instance is made the same way.
//
// # Errors
//
//   - [errdefs.ErrInvalidArgument]: no module, a module that is not a stage
//     module, a fence module of the wrong kind, no device.
//   - [errdefs.ErrOutOfBudget]: the declared buffers exceed the budget.
//   - [errdefs.ErrDeadlineExceeded]: the module's start function, _initialize
//     or stagehost_init did not finish within the init timeout; the
//     message names which.
//   - [errdefs.ErrFault]: one of them trapped, or stagehost_init returned
//     non-zero.
//   - Errors of the device.
func (e *Engine) NewSession(ctx context.Context, rt *host.Runtime, m *Module, cfg SessionConfig) (*Session, error) {
	if m == nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "session %q: no module", cfg.name)
	}
	if m.kind != StageModule {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "session %q: module %q is a %s module, not a stage module", cfg.name, m.name, m.kind)
	}
	if cfg.fence != nil && cfg.fence.kind != FenceModule {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "session %q: fence module %q is a %s module", cfg.name, cfg.fence.name, cfg.fence.kind)
	}
	if cfg.device == nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "session %q: no device", cfg.name)
	}
	s := &Session{name: cfg.name, engine: e, module: m, cfg: cfg, logger: e.cfg.logger, who: fmt.Sprintf("session %q", cfg.name)}
	s.owner = host.NewOwner(cfg.name, hw.NewBudget(cfg.name, cfg.budget))
	st := callState{sess: s, table: newHandleTable(nextTag()), outputLimit: cfg.outputLimit}
	if err := s.retainWeights(); err != nil {
		_ = s.owner.Close(ctx)
		return nil, err
	}
	if err := s.declare(st.table); err != nil {
		if s.owner.Close(ctx) == nil {
			s.releaseWeights()
		}
		return nil, err
	}
	s.native = NewNative(rt, s.owner, st, s.fence, NewNativeConfig().WithFenceTimeout(cfg.fenceTimeout).WithDevice(cfg.device.Name()).withLaneTimeout(cfg.deadline))
	s.callCtx.st = &s.native.state
	if err := s.ensureInstances(ctx); err != nil {
		if s.owner.Close(ctx) == nil {
			s.releaseRetired()
			s.releaseWeights()
		}
		return nil, err
	}
	return s, nil
}

// retainWeights takes the session's reference to each of its weights,
// after checking they are on its device; on an error it holds none.
func (s *Session) retainWeights() error {
	for i, w := range s.cfg.weights {
		err := error(nil)
		switch {
		case w == nil:
			err = errdefs.Errorf(errdefs.ErrInvalidArgument, "session %q: weights %d: nil", s.name, i)
		case slices.ContainsFunc(s.cfg.weights[:i], func(o *Weights) bool { return o.name == w.name }):
			err = errdefs.Errorf(errdefs.ErrInvalidArgument, "session %q: weights %q given twice", s.name, w.name)
		case w.Device() != s.cfg.device:
			err = errdefs.Errorf(errdefs.ErrInvalidArgument, "session %q: weights %q are on device %q, the session on %q", s.name, w.name, w.Device().Name(), s.cfg.device.Name())
		default:
			err = w.Retain()
		}
		if err != nil {
			for _, r := range s.cfg.weights[:i] {
				r.Release()
			}
			return err
		}
	}
	return nil
}

// releaseWeights drops the session's references to its weights, once
// nothing of the session runs on the device any more.
func (s *Session) releaseWeights() {
	for _, w := range s.cfg.weights {
		w.Release()
	}
	s.cfg.weights = nil
}

// prepare prepares a program: a vendor kernel of the session's, else one
// of the device's registry.
func (s *Session) prepare(dev hw.Device, name string) (hw.Program, error) {
	for _, k := range s.cfg.kernels {
		if k.spec.Name != name {
			continue
		}
		sd, ok := dev.(*sim.Device)
		if !ok {
			return nil, errdefs.Errorf(errdefs.ErrUnsupported, "vendor kernel %q: its Wasm module runs on sim devices only, not on %s", name, dev.Name())
		}
		return sd.PrepareKernel(k.spec.Info(), k.SimKernel())
	}
	for _, v := range s.cfg.vendorProgs {
		if v.info.Name == name {
			return v.prepare(dev)
		}
	}
	return s.owner.Prepare(dev, name)
}

func (s *Session) declare(t *handleTable) error {
	dev := s.cfg.device
	for _, name := range s.cfg.streams {
		str, err := s.owner.NewStream(dev)
		if err != nil {
			return fmt.Errorf("session %q: stream %q: %w", s.name, name, err)
		}
		t.declare(handleEntry{kind: abi.KindStream, stream: str}, name)
	}
	for _, b := range s.cfg.buffers {
		buf, err := s.owner.Alloc(dev, b.size, 0)
		if err != nil {
			return fmt.Errorf("session %q: buffer %q: %w", s.name, b.name, err)
		}
		t.declare(handleEntry{kind: abi.KindBuffer, buffer: buf}, b.name)
	}
	for _, name := range s.cfg.programs {
		p, err := s.prepare(dev, name)
		if err != nil {
			return fmt.Errorf("session %q: program %q: %w", s.name, name, err)
		}
		e := handleEntry{kind: abi.KindProgram, program: p}
		e.vendor = s.cfg.vendorInfo(name)
		if d, ok := p.(hw.Describer); ok {
			if info, ok := d.KernelInfo(); ok && !info.Variadic {
				e.dirs = make([]string, len(info.Args))
				for i, a := range info.Args {
					e.dirs[i] = a.Dir
				}
			}
		}
		t.declare(e, name)
	}
	for _, w := range s.cfg.weights {
		t.declare(handleEntry{kind: abi.KindBuffer, buffer: w.buf, weights: w}, w.name)
	}
	return nil
}

// Name is the session's name.
func (s *Session) Name() string { return s.name }

// Owner returns the session's device resources.
func (s *Session) Owner() *host.Owner { return s.owner }

// Quarantined returns nil while the session is healthy, else the
// [errdefs.ErrDeviceLost] error that says why it was quarantined.
func (s *Session) Quarantined() error { return s.native.Quarantined() }

// Failed returns why the session has failed (an instance could not be
// replaced: every call returns this error), or nil. It never waits for a
// call in progress.
func (s *Session) Failed() error {
	if p := s.failedA.Load(); p != nil {
		return *p
	}
	return nil
}

// Replacements counts instances discarded after a trap or an
// interruption.
func (s *Session) Replacements() int { return int(s.replace.Load()) }

// ensureInstances makes the stage instance and the fence module's
// instance if they are missing. It runs with s.mu held (or at creation).
// A failure after creation fails the session, unless the caller's own
// context ended it.
func (s *Session) ensureInstances(ctx context.Context) error {
	if s.failed != nil {
		return s.failed
	}
	err := s.makeInstances(ctx)
	if err != nil && s.native.state.calls > 0 && !callerEnded(ctx) {
		s.failed = fmt.Errorf("session %q failed: an instance could not be replaced: %w", s.name, err)
		s.failedA.Store(&s.failed)
		return s.failed
	}
	return err
}

// callerEnded reports whether the caller's context ended, or its
// deadline passed although its timer has not yet said so: an entry
// interrupted at the caller's deadline may return before the context
// reports it (callContext.enter), and a replacement cut short so was
// cut short by the caller, not by the module.
func callerEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

func (s *Session) makeInstances(ctx context.Context) error {
	if s.inst == nil {
		in, err := s.instantiate(ctx, s.module, abi.ExportRun)
		if err != nil {
			return err
		}
		s.inst = in
	}
	if s.cfg.fence != nil && s.fenceIn == nil {
		in, err := s.instantiate(ctx, s.cfg.fence, abi.ExportFence)
		if err != nil {
			return err
		}
		s.fenceIn = in
	}
	return nil
}

// instantiate makes an instance of m and initialises it, all under one
// deadline of the init timeout: from m's snapshot, when it has one, and
// then stagehost_init; otherwise the start function (inside
// instantiation), then _initialize and stagehost_init.
func (s *Session) instantiate(ctx context.Context, m *Module, entry string) (*instance, error) {
	deadline := monotime.Since() + s.cfg.initTimeout
	fail := func(err error) (*instance, error) {
		return nil, fmt.Errorf("session %q: module %q: %w", s.name, m.name, err)
	}
	var mod api.Module
	var mem *snapMemory
	var err error
	if m.snap != nil {
		var si *snapInstance
		if si, err = m.spares.take(ctx); err == nil {
			mod, mem = si.mod, si.mem
			if si.out != nil {
				si.out.session = s.name
			}
		}
	} else {
		mc := s.engine.guestConfig
		if m.wasi {
			w := &guestLogWriter{logger: s.logger, session: s.name}
			mc = mc.WithStdout(w).WithStderr(w)
		}
		what := "start function"
		if !m.hasStart {
			what = "instantiation" // its segments, with no start function
		}
		err = s.enter(ctx, deadline, s.cfg.initTimeout, what, nil, func(c context.Context) error {
			var err error
			mod, err = s.engine.runtimeOf(m.compiled).InstantiateModule(c, m.compiled, mc)
			// The engine names a failed start function by its index,
			// which the instrumentation moved: name the guest's own.
			return wasmbin.RenameStart(err, m.startDesc[0], m.startDesc[1])
		})
	}
	if err != nil {
		if mod != nil {
			_ = mod.Close(context.Background())
		}
		return fail(err)
	}
	in := &instance{mod: mod, module: m, entry: mod.ExportedFunction(entry), mem: mem}
	if m.hasFence && entry == abi.ExportRun {
		in.fence = mod.ExportedFunction(abi.ExportFence)
	}
	if m.hasInit {
		in.init = mod.ExportedFunction(abi.ExportInit)
	}
	if m.hasInitialize && m.snap == nil {
		f := mod.ExportedFunction(abi.ExportInitialize)
		err := s.enter(ctx, deadline, s.cfg.initTimeout, abi.ExportInitialize, nil, func(c context.Context) error {
			return f.CallWithStack(c, in.stack[:])
		})
		if err != nil {
			s.dropInstance(in)
			return fail(err)
		}
	}
	if err := s.runInit(ctx, in, deadline); err != nil {
		s.dropInstance(in)
		return fail(err)
	}
	if !s.cfg.resetPerCall {
		in.init = nil // only a reset calls it again; its call engine holds a few KiB
	}
	return in, nil
}

// runInit runs the instance's stagehost_init, if it has one, under the
// given deadline.
func (s *Session) runInit(ctx context.Context, in *instance, deadline time.Duration) error {
	if in.init == nil {
		return nil
	}
	in.stack[0] = 0
	err := s.enter(ctx, deadline, s.cfg.initTimeout, abi.ExportInit, nil, func(c context.Context) error {
		return in.init.CallWithStack(c, in.stack[:])
	})
	if err == nil && int32(in.stack[0]) != 0 {
		err = errdefs.Errorf(errdefs.ErrFault, "%s returned %d", abi.ExportInit, int32(in.stack[0]))
	}
	return err
}

// dropInstance closes an instance that guest code ran in; its memory, if
// it is a snapshot's mapping, is retired (see Session.retired).
func (s *Session) dropInstance(in *instance) {
	_ = in.mod.Close(context.Background())
	if in.mem != nil {
		s.retired = append(s.retired, in.mem)
		in.mem = nil
	}
}

// releaseRetired releases the memories of discarded instances. It runs
// once the session's streams are proven idle.
func (s *Session) releaseRetired() {
	for _, m := range s.retired {
		m.release()
	}
	clear(s.retired)
	s.retired = s.retired[:0]
}

// enter is the one path into guest code. It arms the session's call
// context with the caller's values and cancellation and the given
// deadline (a [monotime] offset), runs fn (which calls into the guest with that context), and
// classifies how it ended:
//
//   - nil: fn returned before the deadline;
//   - [errdefs.ErrDeadlineExceeded] naming what: the deadline passed, whether
//     the guest was interrupted or returned by itself afterwards (a guest
//     never reports success past its deadline);
//   - [errdefs.ErrDeadlineExceeded] wrapping the caller's context error, when
//     the caller's own deadline or cancellation ended it;
//   - [errdefs.ErrFault]: the guest trapped.
//
// After a trap or an interruption, *in (if in is not nil) is discarded,
// to be replaced before the next entry.
func (s *Session) enter(parent context.Context, deadline, timeout time.Duration, what string, in **instance, fn func(context.Context) error) error {
	now, trapped, err := s.callCtx.enter(parent, deadline, timeout, what, s.who, fn)
	// One clock reading decides the deadline, and the lease reuses it to
	// start the fence's deadline (entries run under the lease).
	s.native.lease.NoteTime(now)
	if trapped && in != nil {
		s.discard(in)
	}
	return err
}

// enter arms c with the caller's values and cancellation and the given
// deadline, runs fn, and classifies how it ended (see [Session.enter]);
// who names the guest in errors. It returns the clock reading that
// decided the deadline, and whether fn itself failed (the guest trapped
// or was interrupted).
func (c *callContext) enter(parent context.Context, deadline, timeout time.Duration, what, who string, fn func(context.Context) error) (time.Duration, bool, error) {
	// armed is the earlier of the entry's deadline and the caller's: the
	// caller's may pass before its context says so (its timer fires
	// late), and the guest must not report success past either.
	armed := c.ArmWithCancelAt(parent, deadline)
	c.slice = 0
	err := fn(c)
	now := monotime.Since()
	var ended error
	if now >= armed {
		ended = context.DeadlineExceeded
	} else if c.WatchesParent() {
		ended = parent.Err()
	}
	c.Disarm()
	if err == nil && ended == nil {
		return now, false, nil
	}
	var intr *interruption
	if ended != nil || errors.As(err, &intr) {
		if parent.Err() != nil { // the caller's own deadline or cancellation
			return now, err != nil, errdefs.ContextError(parent, fmt.Sprintf("%s of %s interrupted", what, who))
		}
		if armed < deadline && now >= armed { // the caller's deadline, before its context ended
			return now, err != nil, errdefs.Errorf(errdefs.ErrDeadlineExceeded, "%s of %s interrupted: the caller's deadline passed: %w", what, who, context.DeadlineExceeded)
		}
		return now, err != nil, errdefs.Errorf(errdefs.ErrDeadlineExceeded, "%s of %s exceeded its deadline of %v: %w", what, who, timeout, context.DeadlineExceeded)
	}
	return now, true, errdefs.Errorf(errdefs.ErrFault, "%s of %s trapped: %w", what, who, err)
}

func (s *Session) discard(in **instance) {
	if *in != nil {
		s.dropInstance(*in)
		*in = nil
		s.replace.Add(1)
	}
}

// Run calls the stage's default entry ("main") with input and appends the
// output to dst. See [Session.RunEntry].
func (s *Session) Run(ctx context.Context, input, dst []byte) ([]byte, error) {
	return s.RunEntry(ctx, abi.DefaultEntryName, input, dst)
}

// RunEntry calls the stage with the given entry name and input, and
// appends what the stage wrote to dst (also when the stage fails, so no
// partial output is lost). The bytes are appended as the stage writes
// them (output_write), in dst's spare capacity when it has room, so a
// caller that passes a dst with room gets the output with no further
// copy or allocation; the output limit counts the stage's bytes, not
// those dst held. When dst's spare capacity shares memory with input, the
// output is collected apart and appended when the stage returns, so the
// stage never sees its input change.
//
//	out, err := sess.Run(ctx, input, nil)
//
// # Errors
//
//   - *[ClientError]: the stage returned a non-zero code.
//   - [errdefs.ErrFault]: the stage trapped (its instance was discarded), or
//     device work of this call failed (whether or not the stage looked),
//     or the instance could not be made.
//   - [errdefs.ErrDeadlineExceeded]: the stage ran past its deadline (its
//     instance was discarded if it had to be interrupted), or the
//     caller's context ended.
//   - [errdefs.ErrDeviceLost]: the session is quarantined, before or because
//     of this call.
//   - [errdefs.ErrBusy]: a concurrent call of this session, or a nested call
//     of this runtime.
//   - [errdefs.ErrClosed]: the session was closed.
//   - Once the session has failed (its instance could not be replaced),
//     the error that failed it, with that error's class.
func (s *Session) RunEntry(ctx context.Context, entry string, input, dst []byte) ([]byte, error) {
	if !s.mu.TryLock() {
		return dst, errdefs.Errorf(errdefs.ErrBusy, "session %q is already running a stage", s.name)
	}
	defer s.mu.Unlock()
	if s.closed {
		return dst, errdefs.Errorf(errdefs.ErrClosed, "session %q is closed", s.name)
	}
	if s.failed != nil {
		return dst, s.failed
	}
	var out []byte
	ran, direct := false, false
	err := s.native.Run(ctx, func(lctx context.Context, st *callState) error {
		ran = true
		st.calls++
		st.input, st.entry, st.errMsg, st.logs = input, entry, "", 0
		st.lastErr, st.failure = st.lastErr[:0], nil // a call starts with no last error
		// The output is appended to dst as the stage writes it (no copy
		// afterwards), unless dst's spare room holds the input, which
		// the stage may still be reading: then it collects apart.
		direct = !overlaps(dst[len(dst):cap(dst)], input)
		if direct {
			st.output, st.outputBase = dst, len(dst)
		} else {
			st.output, st.outputBase = st.spare[:0], 0
		}
		st.arena = st.arena[:0]
		defer func() {
			out = st.output
			if !direct {
				st.spare = st.output[:0]
			}
			st.output, st.outputBase, st.input = nil, 0, nil // keep none of the caller's memory
		}()
		// A missing instance is made under the init timeout alone, not
		// the caller's deadline or cancellation (ABI.md §4.2): a caller
		// that gives up early would otherwise cut short every attempt,
		// and the instance would never be made.
		// (Only then: a context of its own costs an allocation a call.)
		if s.failed != nil || s.inst == nil || s.cfg.fence != nil && s.fenceIn == nil {
			if err := s.ensureInstances(context.WithoutCancel(lctx)); err != nil {
				return err
			}
		}
		in := s.inst
		in.stack[0] = 0
		// The deadline counts from when the call asked for the compute
		// lane, so it covers the wait for it (ABI.md §4.2); the lease
		// was granted before it (host.Op.Timeout).
		deadline := monotime.Offset(s.native.lease.Asked()) + s.cfg.deadline
		err := s.enter(lctx, deadline, s.cfg.deadline, "stage", &s.inst, func(c context.Context) error {
			return in.entry.CallWithStack(c, in.stack[:])
		})
		if err != nil {
			return err
		}
		if code := int32(in.stack[0]); code != 0 {
			return &ClientError{Session: s.name, Code: code, Message: st.errMsg}
		}
		return nil
	})
	if direct {
		dst = out
	} else {
		dst = append(dst, out...)
	}
	if ran && errors.Is(err, errdefs.ErrFault) {
		// A trap, or device work that failed: the host log gets the
		// reason (a kernel's own, for a command that failed on the
		// device) as the caller does.
		s.logger.Warn("stage call failed", "session", s.name, "error", err)
	}
	// The quarantine check takes a lock: only a call that left something
	// to do after a proven fence pays for it.
	if ran && s.afterCallWork() && s.native.Quarantined() == nil {
		// The fence proved every stream of the session idle.
		if len(s.native.state.pendingFree) > 0 {
			s.releaseFreed()
		}
		if len(s.native.state.oldArenas) > 0 {
			s.native.state.releaseArenas(false)
		}
		if len(s.retired) > 0 {
			s.releaseRetired()
		}
		s.afterCall(ctx)
	}
	return dst, err
}

// overlaps reports whether a and b share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}

// afterCallWork reports whether a call left work for after its fence:
// freed buffers or discarded memories to release, an instance to reset
// or to replace.
func (s *Session) afterCallWork() bool {
	return len(s.native.state.pendingFree) > 0 || len(s.native.state.oldArenas) > 0 || len(s.retired) > 0 || s.cfg.resetPerCall ||
		s.inst == nil || (s.cfg.fence != nil && s.fenceIn == nil)
}

// afterCall readies the instances for the next call, once a call's fence
// proved the session's work drained: with [SessionConfig.WithResetPerCall]
// it returns them to the snapshot, and it replaces an instance discarded
// during the call, so that the next call pays no instantiation. A
// replacement that fails fails the session, as at the next call.
func (s *Session) afterCall(ctx context.Context) {
	if s.cfg.resetPerCall {
		for _, in := range []**instance{&s.inst, &s.fenceIn} {
			if *in != nil {
				s.reset(ctx, in)
			}
		}
	}
	if s.inst == nil || (s.cfg.fence != nil && s.fenceIn == nil) {
		_ = s.ensureInstances(ctx)
		if len(s.retired) > 0 { // an instantiation failed after guest code ran in it
			s.releaseRetired()
		}
	}
}

// reset returns *in to its module's snapshot (its written pages copied
// back, its globals set) and runs its stagehost_init again. An instance
// that cannot be reset is discarded, to be replaced: one of a module
// without a snapshot, one whose memory grew (wazero cannot shrink a
// memory), or one whose reset failed.
func (s *Session) reset(ctx context.Context, in **instance) {
	i := *in
	if i.mem != nil && !i.mem.grown() {
		err := i.mem.reset()
		if err == nil {
			err = applySnapshot(i.mod, i.module.snap)
		}
		if err == nil {
			err = s.runInit(ctx, i, monotime.Since()+s.cfg.initTimeout)
		}
		if err == nil {
			s.resets.Add(1)
			return
		}
		s.logger.Warn("an instance could not be reset; replacing it", "session", s.name, "error", err)
	}
	s.dropInstance(i)
	*in = nil
	s.releaseRetired()
}

// Resets counts the times an instance was returned to its module's
// snapshot after a call ([SessionConfig.WithResetPerCall]).
func (s *Session) Resets() int { return int(s.resets.Load()) }

// fence is the session's fence: the fence module, the stage module's own
// stagehost_fence, or the built-in drain. A guest fence returns 0 when it
// drained the session's work, or the FAULT status when it drained it but
// device work had failed; anything else, a trap or its deadline means it
// failed.
func (s *Session) fence(ctx context.Context, st *callState) error {
	var in **instance
	switch {
	case s.cfg.fence != nil:
		in = &s.fenceIn
	case s.module.hasFence && !s.cfg.drain:
		in = &s.inst
	default:
		return s.owner.Drain(ctx)
	}
	if err := s.makeInstances(ctx); err != nil {
		// The module's fence cannot run (its instance could not be
		// made): the built-in drain proves the fence instead.
		s.logger.Warn("the module's fence could not run; draining every stream instead", "session", s.name, "error", err)
		return s.owner.Drain(ctx)
	}
	fi := *in
	f := fi.entry
	if in == &s.inst {
		f = fi.fence
	}
	fi.stack[0] = 0
	deadline, _ := ctx.Deadline() // ctx is the lease's fence context: it ends at the fence deadline
	err := s.enter(ctx, monotime.Offset(deadline), s.cfg.fenceTimeout, "fence", in, func(c context.Context) error {
		return f.CallWithStack(c, fi.stack[:])
	})
	if err != nil {
		// Not of class ErrFault: a fence that trapped or ran out of time
		// proved nothing.
		return fmt.Errorf("fence failed: %v", err)
	}
	switch code := int32(fi.stack[0]); code {
	case 0:
		return nil
	case int32(abi.StatusFault):
		return errdefs.Errorf(errdefs.ErrFault, "fence of session %q drained its work and reported failed device work", s.name)
	default:
		return fmt.Errorf("fence of session %q returned %d", s.name, code)
	}
}

// releaseFreed frees the buffers the guest freed during the call, now
// that the fence proved the device no longer touches them. It runs with
// s.mu held.
func (s *Session) releaseFreed() {
	st := &s.native.state
	for _, b := range st.pendingFree {
		_ = s.owner.FreeBuffer(b)
	}
	clear(st.pendingFree)
	st.pendingFree = st.pendingFree[:0]
}

// Close closes the module instances and releases the session's device
// resources. A quarantined session keeps its resources and returns its
// quarantine error.
//
// # Errors
//
// [errdefs.ErrBusy] while a call runs (nothing is closed); the quarantine
// error of a quarantined session.
func (s *Session) Close(ctx context.Context) error {
	if !s.mu.TryLock() {
		return errdefs.Errorf(errdefs.ErrBusy, "session %q is running a stage", s.name)
	}
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for _, in := range []*instance{s.inst, s.fenceIn} {
		if in != nil {
			s.dropInstance(in)
		}
	}
	s.inst, s.fenceIn = nil, nil
	err := s.native.Close(ctx)
	if err == nil {
		// The streams drained and closed: no device command writes into
		// guest memory, reads an upload's staging or reads the weights any
		// more. A quarantined session keeps all three.
		s.releaseRetired()
		s.native.state.releaseArenas(true)
		s.releaseWeights()
	}
	return err
}

// guestLogWriter sends guest stdout/stderr to the log, one record per
// write.
type guestLogWriter struct {
	logger  *slog.Logger
	session string
}

func (w *guestLogWriter) Write(p []byte) (int, error) {
	w.logger.Info(string(p), "session", w.session, "stream", "guest")
	return len(p), nil
}
