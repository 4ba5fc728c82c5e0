package stages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
)

// SessionConfig declares a Wasm session's device resources and limits. It
// is immutable: every WithX method returns a modified copy.
type SessionConfig struct {
	name         string
	device       hw.Device
	streams      []string
	buffers      []bufferDecl
	programs     []string
	budget       int64
	outputLimit  int
	deadline     time.Duration
	fenceTimeout time.Duration
	initTimeout  time.Duration
	fence        *Module
	drain        bool
	stagingLimit int
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
//   - a deadline of 5 s per stage call and 10 s per fence;
//   - 64 MiB of host memory to stage uploads (see [SessionConfig.WithStagingLimit]);
//   - the module's own stagehost_fence if it has one, else the built-in
//     fence that syncs every stream.
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
func (c SessionConfig) WithStagingLimit(bytes int) SessionConfig { c.stagingLimit = bytes; return c }

// WithBudget sets the session's memory budget in bytes. Default 64 MiB.
func (c SessionConfig) WithBudget(bytes int64) SessionConfig { c.budget = bytes; return c }

// WithOutputLimit bounds the output of one call. Default 16 MiB.
func (c SessionConfig) WithOutputLimit(bytes int) SessionConfig { c.outputLimit = bytes; return c }

// WithDeadline bounds each stage call. A call that runs longer is
// interrupted, its instance replaced, and the caller gets
// [hw.ErrDeadlineExceeded]. Default 5 s.
func (c SessionConfig) WithDeadline(d time.Duration) SessionConfig { c.deadline = d; return c }

// WithInitTimeout bounds the making of each instance of the session's
// modules: instantiation with its start function, _initialize and
// stagehost_init together. It applies when the session is created and
// whenever an instance is replaced after a trap or a deadline. An
// instance that is not ready in time is discarded and the session fails
// with [hw.ErrDeadlineExceeded]. Default 5 s.
func (c SessionConfig) WithInitTimeout(d time.Duration) SessionConfig { c.initTimeout = d; return c }

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
	output      []byte
	outputLimit int
	entry       string
	errMsg      string
	logs        int
	cmd         hw.Command
	args        [abi.MaxArgs]hw.Arg
	batch       batchArena  // the decoded batch of stream_submit_batch
	arena       []byte      // staged upload bytes of this call
	pendingFree []hw.Buffer // freed by the guest, released after a proven fence
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
// [hw.ErrOutOfBudget] for one upload larger than the limit; the drain's
// error when the streams could not be drained.
func (st *callState) stage(ctx context.Context, n int) ([]byte, error) {
	limit := st.sess.cfg.stagingLimit
	if n > limit {
		return nil, hw.Errorf(hw.ErrOutOfBudget, "an upload of %d bytes is larger than the session's staging limit of %d bytes", n, limit)
	}
	if len(st.arena)+n > limit {
		if err := st.sess.owner.Drain(ctx); err != nil {
			return nil, err
		}
		st.arena = st.arena[:0] // every staged upload has retired
	}
	if len(st.arena)+n > cap(st.arena) {
		st.arena = make([]byte, 0, min(max(2*cap(st.arena), n, 64<<10), limit))
	}
	b := st.arena[len(st.arena) : len(st.arena)+n]
	st.arena = st.arena[:len(st.arena)+n]
	return b, nil
}

// instance is one instantiation of a module, with its exports looked up
// once.
type instance struct {
	mod   api.Module
	entry api.Function // stagehost_run or stagehost_fence
	fence api.Function // the stage module's own fence, if any
	stack [1]uint64
}

// Session is a Wasm stage module instantiated for one session, with its
// own device resources (an [host.Owner]), handle table and limits. Every call
// runs inside a [NativeSession], in this order: re-entrancy guard,
// admission, compute lease, the stage call under its deadline and the
// module's memory limit, the fence under its own deadline, the check that
// every stream is idle, quarantine if the fence cannot be proven, and the
// trace record.
//
// A trapped or timed-out instance is discarded and a new one made before
// the next call into the module; the session's resources and handles stay.
type Session struct {
	name    string
	engine  *Engine
	module  *Module
	cfg     SessionConfig
	owner   *host.Owner
	logger  *slog.Logger
	native  *NativeSession[callState]
	callCtx reusableCallContext
	inst    *instance // nil when discarded
	fenceIn *instance // the fence module's instance
	replace int       // instances replaced after a trap or timeout
}

// NewSession creates the session's resources (streams, declared buffers,
// prepared programs, charged to its budget), registers them in a new
// handle table, and instantiates the module (running _initialize and
// stagehost_init).
//
// # Errors
//
// [hw.ErrInvalidArgument] for a fence module of the wrong kind or a
// module that is not a stage module; [hw.ErrOutOfBudget] when the
// declared buffers exceed the budget; errors of the device; an
// instantiation failure of the module.
func (e *Engine) NewSession(ctx context.Context, rt *host.Runtime, m *Module, cfg SessionConfig) (*Session, error) {
	if m.kind != StageModule {
		return nil, hw.Errorf(hw.ErrInvalidArgument, "session %q: module %q is a %s module, not a stage module", cfg.name, m.name, m.kind)
	}
	if cfg.fence != nil && cfg.fence.kind != FenceModule {
		return nil, hw.Errorf(hw.ErrInvalidArgument, "session %q: fence module %q is a %s module", cfg.name, cfg.fence.name, cfg.fence.kind)
	}
	if cfg.device == nil {
		return nil, hw.Errorf(hw.ErrInvalidArgument, "session %q: no device", cfg.name)
	}
	s := &Session{name: cfg.name, engine: e, module: m, cfg: cfg, logger: e.cfg.logger}
	s.owner = host.NewOwner(cfg.name, hw.NewBudget(cfg.name, cfg.budget))
	st := callState{sess: s, table: newHandleTable(nextTag()), outputLimit: cfg.outputLimit}
	if err := s.declare(st.table); err != nil {
		_ = s.owner.Close(ctx)
		return nil, err
	}
	s.native = NewNative(rt, s.owner, st, s.fence, WithFenceTimeout(cfg.fenceTimeout), WithDevice(cfg.device.Name()))
	s.callCtx.st = &s.native.state
	if err := s.ensureInstances(ctx); err != nil {
		_ = s.owner.Close(ctx)
		return nil, err
	}
	return s, nil
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
		p, err := s.owner.Prepare(dev, name)
		if err != nil {
			return fmt.Errorf("session %q: program %q: %w", s.name, name, err)
		}
		t.declare(handleEntry{kind: abi.KindProgram, program: p}, name)
	}
	return nil
}

// Name is the session's name.
func (s *Session) Name() string { return s.name }

// Owner returns the session's device resources.
func (s *Session) Owner() *host.Owner { return s.owner }

// Quarantined returns nil while the session is healthy, else the
// [hw.ErrDeviceLost] error that says why it was quarantined.
func (s *Session) Quarantined() error { return s.native.Quarantined() }

// Replacements counts instances discarded after a trap or timeout.
func (s *Session) Replacements() int { return s.replace }

// ensureInstances makes the stage instance and the fence module's
// instance if they are missing. It runs inside a call (or at creation),
// never concurrently.
func (s *Session) ensureInstances(ctx context.Context) error {
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

func (s *Session) instantiate(ctx context.Context, m *Module, entry string) (*instance, error) {
	mc := wazero.NewModuleConfig().WithName("").WithStartFunctions()
	if m.wasi {
		w := guestLogWriter{logger: s.logger, session: s.name}
		mc = mc.WithStdout(w).WithStderr(w)
	}
	st := &s.native.state
	cctx := &callContext{Context: ctx, st: st}
	mod, err := s.engine.runtime.InstantiateModule(cctx, m.compiled, mc)
	if err != nil {
		return nil, hw.Errorf(hw.ErrFault, "session %q: instantiate module %q: %w", s.name, m.name, err)
	}
	in := &instance{mod: mod, entry: mod.ExportedFunction(entry)}
	if m.hasFence && entry == abi.ExportRun {
		in.fence = mod.ExportedFunction(abi.ExportFence)
	}
	for _, init := range []struct {
		name string
		has  bool
	}{{abi.ExportInitialize, m.hasInitialize}, {abi.ExportInit, m.hasInit}} {
		if !init.has {
			continue
		}
		res, err := mod.ExportedFunction(init.name).Call(cctx)
		if err == nil && len(res) == 1 && int32(res[0]) != 0 {
			err = fmt.Errorf("returned %d", int32(res[0]))
		}
		if err != nil {
			_ = mod.Close(ctx)
			return nil, hw.Errorf(hw.ErrFault, "session %q: module %q: %s failed: %w", s.name, m.name, init.name, err)
		}
	}
	return in, nil
}

func (s *Session) discard(in **instance) {
	if *in != nil {
		_ = (*in).mod.Close(context.Background())
		*in = nil
		s.replace++
	}
}

// Run calls the stage's default entry ("main") with input and appends the
// output to dst. See [Session.RunEntry].
func (s *Session) Run(ctx context.Context, input, dst []byte) ([]byte, error) {
	return s.RunEntry(ctx, abi.DefaultEntryName, input, dst)
}

// RunEntry calls the stage with the given entry name and input, and
// appends what the stage wrote to dst (also when the stage fails, so no
// partial output is lost).
//
//	out, err := sess.Run(ctx, input, nil)
//
// # Errors
//
//   - *[ClientError]: the stage returned a non-zero code.
//   - [hw.ErrFault]: the stage trapped (or its instance could not be
//     made); its instance was discarded.
//   - [hw.ErrDeadlineExceeded]: the stage ran past its deadline; its
//     instance was discarded.
//   - [hw.ErrDeviceLost]: the session is quarantined, before or because
//     of this call.
//   - [hw.ErrBusy]: a concurrent or nested call of this runtime.
func (s *Session) RunEntry(ctx context.Context, entry string, input, dst []byte) ([]byte, error) {
	var out []byte
	err := s.native.Run(ctx, func(lctx context.Context, st *callState) error {
		st.input, st.entry, st.errMsg, st.logs = input, entry, "", 0
		st.output, st.arena = st.output[:0], st.arena[:0]
		defer func() {
			out = st.output
			st.input = nil
		}()
		if err := s.ensureInstances(lctx); err != nil {
			return err
		}
		var cctx context.Context
		if lctx.Done() == nil { // nothing but our deadline can end the call
			s.callCtx.Arm(lctx, time.Now().Add(s.cfg.deadline))
			defer s.callCtx.Disarm()
			cctx = &s.callCtx
		} else {
			c, cancel := context.WithTimeout(lctx, s.cfg.deadline)
			defer cancel()
			cctx = &callContext{Context: c, st: st}
		}
		code, err := s.call(lctx, cctx, &s.inst, s.inst.entry, s.cfg.deadline, "stage")
		if err != nil {
			return err
		}
		if code != 0 {
			return &ClientError{Session: s.name, Code: code, Message: st.errMsg}
		}
		return nil
	})
	dst = append(dst, out...)
	if s.native.Quarantined() == nil {
		s.releaseFreed()
	}
	return dst, err
}

// call calls fn of *in with cctx, a call context (see state) that ends at
// the call's deadline, timeout after the call started. It discards the
// instance on a trap or timeout. ctx is the caller's context.
func (s *Session) call(ctx, cctx context.Context, in **instance, fn api.Function, timeout time.Duration, what string) (int32, error) {
	stack := (*in).stack[:]
	stack[0] = 0
	err := fn.CallWithStack(cctx, stack)
	if err == nil {
		return int32(stack[0]), nil
	}
	s.discard(in)
	var exit *sys.ExitError
	if errors.As(err, &exit) && (exit.ExitCode() == sys.ExitCodeDeadlineExceeded || exit.ExitCode() == sys.ExitCodeContextCanceled) || cctx.Err() != nil {
		if ctx.Err() != nil { // the caller's own deadline or cancellation
			return 0, hw.ContextError(ctx, fmt.Sprintf("%s of session %q interrupted", what, s.name))
		}
		return 0, hw.Errorf(hw.ErrDeadlineExceeded, "%s of session %q exceeded its deadline of %v: %w", what, s.name, timeout, context.DeadlineExceeded)
	}
	return 0, hw.Errorf(hw.ErrFault, "%s of session %q trapped: %v", what, s.name, err)
}

// fence is the session's fence: the fence module, the stage module's own
// stagehost_fence, or the built-in drain.
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
	if err := s.ensureInstances(ctx); err != nil { // after a trap, a new instance runs the fence
		return fmt.Errorf("fence could not run: %w", err)
	}
	f := (*in).entry
	if in == &s.inst {
		f = (*in).fence
	}
	deadline, _ := ctx.Deadline()
	// ctx is the lease's fence context: it already ends at the fence deadline.
	code, err := s.call(ctx, &callContext{Context: ctx, st: st}, in, f, time.Until(deadline), "fence")
	if err != nil {
		return err
	}
	if code != 0 {
		return hw.Errorf(hw.ErrFault, "fence of session %q returned %d", s.name, code)
	}
	return nil
}

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
func (s *Session) Close(ctx context.Context) error {
	s.discard(&s.inst)
	s.discard(&s.fenceIn)
	return s.native.Close(ctx)
}

// guestLogWriter sends guest stdout/stderr to the log, one record per
// write.
type guestLogWriter struct {
	logger  *slog.Logger
	session string
}

func (w guestLogWriter) Write(p []byte) (int, error) {
	w.logger.Info(string(p), "session", w.session, "stream", "guest")
	return len(p), nil
}
