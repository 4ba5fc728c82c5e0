package sessions

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
)

// DefaultCloseTimeout is how long [ResidentSession.Close] waits for both
// participants to retire unless [ResidentConfig.WithCloseTimeout] says otherwise.
const DefaultCloseTimeout = 10 * time.Second

// Participant is one prepared resident invocation: a command and the
// stream it will be submitted on. [NewResidentSession] copies it, so the
// caller cannot change the command after the session validated it.
//
// The command's program must read WAIT/RUN/ABORT from the startup line
// (one of its arguments must be the startup's view for the stream's
// device, starting at offset 0), never write that line, and retire without
// waiting for its peer after ABORT. Every buffer it addresses is kept by
// the session until the participant is known to have retired.
type Participant struct {
	Stream  hw.Stream
	Command hw.Command
}

// ResidentConfig configures a [ResidentSession]. It is immutable: every
// WithX method returns a modified copy, so a ResidentConfig can be shared
// and reused. A zero ResidentConfig means [NewResidentConfig]'s defaults. A WithX method called on a zero value starts from
// those defaults.
//
//	sess, err := sessions.NewResidentSession(startup, g, n, sessions.NewResidentConfig().WithOwner(owner))
type ResidentConfig struct {
	set          bool // made by NewResidentConfig; false: the zero value
	rt           *host.Runtime
	name         string
	owner        *host.Owner
	closeTimeout time.Duration
}

// NewResidentConfig returns the default configuration:
//
//   - no runtime: the session is not traced (see [ResidentConfig.WithRuntime]);
//   - name: the owner's name, else "resident" (see [ResidentConfig.WithName]);
//   - no owner: the caller keeps the participants' resources (see
//     [ResidentConfig.WithOwner]);
//   - close timeout [DefaultCloseTimeout] (see [ResidentConfig.WithCloseTimeout]).
func NewResidentConfig() ResidentConfig {
	return ResidentConfig{set: true, closeTimeout: DefaultCloseTimeout}
}

// orDefaults is c, or [NewResidentConfig]'s defaults when c is the zero value, so
// that a WithX method called on a zero ResidentConfig keeps the other defaults.
func (c ResidentConfig) orDefaults() ResidentConfig {
	if !c.set {
		return NewResidentConfig()
	}
	return c
}

// WithRuntime traces the session in rt: each participant's occupancy, from
// its submission to its retirement as observed by [ResidentSession.Wait]
// or [ResidentSession.Close], is recorded in rt's tracer (the GPU
// participant on [host.LaneCompute], the NPU participant on
// [host.LaneNPU], Owner the session's name, Device the device's name). A
// participant that never retired is recorded as failed when the session is
// quarantined, and the quarantine is noted with [host.Runtime.NoteQuarantine].
// Default: none, nothing is traced.
func (c ResidentConfig) WithRuntime(rt *host.Runtime) ResidentConfig {
	c = c.orDefaults()
	c.rt = rt
	return c
}

// WithName names the session in traces, quarantine notes and errors.
// Default: the owner's name (see [ResidentConfig.WithOwner]), else "resident".
func (c ResidentConfig) WithName(name string) ResidentConfig {
	c = c.orDefaults()
	c.name = name
	return c
}

// WithOwner hands the session an owner whose resources (typically the
// participants' streams, programs and payload) live exactly as long as the
// session: a healthy [ResidentSession.Close] closes the owner, releasing
// them and their budget charges; a quarantined session never closes it, so
// nothing a device may still touch is freed. The caller must not close the
// owner or free its buffers itself. Default: none, the caller keeps and
// frees the participants' resources.
func (c ResidentConfig) WithOwner(o *host.Owner) ResidentConfig {
	c = c.orDefaults()
	c.owner = o
	return c
}

// WithCloseTimeout bounds how long [ResidentSession.Close] waits for the
// participants to retire before it quarantines the session. Default
// [DefaultCloseTimeout]; 0 means "only look at what has already retired".
// A negative value makes [NewResidentSession] fail. Closing the owner
// afterwards (see [ResidentConfig.WithOwner]) gets a deadline of its own,
// of the same length but at least one second.
func (c ResidentConfig) WithCloseTimeout(d time.Duration) ResidentConfig {
	c = c.orDefaults()
	c.closeTimeout = d
	return c
}

// participant is the session's private copy of a Participant plus its
// submission state.
type participant struct {
	role      string // "GPU" or "NPU", for messages
	lane      host.Lane
	stream    hw.Stream
	cmd       hw.Command
	submitted bool
	done      hw.Completion
	at        time.Time // submission time
	recorded  bool      // its occupancy is in the tracer
}

// sessionCore is the whole session state. It is separate from
// ResidentSession so that a cleanup attached to the ResidentSession can
// reach it (see abandon).
type sessionCore struct {
	startup *ResidentStartup
	gpu     participant
	npu     participant
	cfg     ResidentConfig

	mu          sync.Mutex
	decision    uint32
	decided     bool
	poisoned    bool
	poison      error // why, for the quarantine message
	closed      bool
	quarantined bool
	closeErr    error // what Close returned, for a second Close
}

// ResidentSession is one resident GPU–NPU exchange, including rollback of
// a partial admission. It is not a stage session (stage sessions are
// stages.Session for Wasm and stages.NativeSession for Go) and runs no
// guest code; a manifest's [[resident]] table is served by a
// deploy.Resident, each of whose runs is one ResidentSession. Submit both participants, in either order; publish
// [ResidentSession.Start]; then join both completions with
// [ResidentSession.Wait]. The host performs no action between device
// rounds: once RUN is published, every exchange round, credit and drain
// happens inside the two invocations.
//
// Each participant is submitted at most once. A rejected submission
// publishes ABORT for the peer. At most one decision (RUN or ABORT) is ever
// published; a failed publication poisons the session. [ResidentSession.Close]
// publishes ABORT if nothing was decided, waits for both participants, and
// quarantines the session (keeping the startup line, the owner and every
// buffer the commands address) if a participant did not retire or the
// session is poisoned. A session that becomes unreachable without Close
// publishes ABORT if it was undecided, and keeps everything.
//
// A ResidentSession is safe for concurrent use; decisions and
// submissions are serialised.
type ResidentSession struct {
	c *sessionCore
}

// NewResidentSession takes ownership of startup and of the two prepared
// participants. gpu must be submitted on a stream of startup's GPU device
// (a GPU engine: only a GPU engine may be the GPU participant), npu on a
// stream of startup's peer device. Both commands are copied.
//
// The host checks what it can of the seed's contract: the devices and
// engines, that each command addresses its own device's view of the
// startup line from offset 0 (so it can observe ABORT), and that each
// program belongs to its stream's device. It cannot check that a program
// only reads the line, that it retires after ABORT, or that it keeps its
// exchange inside the invocation: those stay the program author's promise
// (see docs/security.md), and Close's quarantine contains a program that
// breaks them.
//
// # Errors
//
//   - [errdefs.ErrInvalidArgument] for a nil startup or stream, a nil program
//     or one of another device, more than [hw.MaxArgs] arguments, a
//     participant on the wrong device or engine, a command that does not
//     address the startup line, or a negative close timeout.
//   - [errdefs.ErrBusy] when startup already belongs to a session.
//   - [errdefs.ErrClosed] when startup was closed.
//
// On error, nothing is owned: the caller keeps startup and may Close it.
func NewResidentSession(startup *ResidentStartup, gpu, npu Participant, cfg ResidentConfig) (*ResidentSession, error) {
	if !cfg.set {
		cfg = NewResidentConfig()
	}
	if startup == nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "resident session: nil startup")
	}
	if cfg.closeTimeout < 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "resident session: negative close timeout %v", cfg.closeTimeout)
	}
	if cfg.name == "" {
		cfg.name = "resident"
		if cfg.owner != nil {
			cfg.name = cfg.owner.Name()
		}
	}
	c := &sessionCore{startup: startup, cfg: cfg}
	var err error
	if c.gpu, err = newParticipant("GPU", host.LaneCompute, gpu, startup, startup.gpu, cfg.name); err != nil {
		return nil, err
	}
	if c.npu, err = newParticipant("NPU", host.LaneNPU, npu, startup, startup.npu, cfg.name); err != nil {
		return nil, err
	}
	if !startup.state.CompareAndSwap(startupFree, startupBound) {
		if startup.state.Load() == startupClosed {
			return nil, errdefs.Errorf(errdefs.ErrClosed, "resident session %q: startup was closed", cfg.name)
		}
		return nil, errdefs.Errorf(errdefs.ErrBusy, "resident session %q: startup already belongs to a session", cfg.name)
	}
	s := &ResidentSession{c: c}
	// Dropping an undecided session publishes ABORT, as the seed's Drop
	// does; it frees nothing (an unreachable session is never closed, so
	// its owners stay allocated: the conservative outcome).
	runtime.AddCleanup(s, (*sessionCore).abandon, c)
	return s, nil
}

func newParticipant(role string, lane host.Lane, p Participant, startup *ResidentStartup, want hw.Device, name string) (participant, error) {
	bad := func(format string, args ...any) (participant, error) {
		return participant{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "resident session %q: %s participant: "+format, append([]any{name, role}, args...)...)
	}
	if p.Stream == nil {
		return bad("nil stream")
	}
	dev := p.Stream.Device()
	if role == "GPU" && dev.Engine() != hw.EngineGPU {
		return bad("stream is on %s device %q; only a GPU engine may be the GPU participant", dev.Engine(), dev.Name())
	}
	if dev != want {
		return bad("stream is on device %q, but the startup line was made for %q", dev.Name(), want.Name())
	}
	if p.Command.Program == nil {
		return bad("nil program")
	}
	if pd := p.Command.Program.Device(); pd != dev {
		return bad("program %q belongs to device %q, not the stream's %q", p.Command.Program.Name(), pd.Name(), dev.Name())
	}
	if len(p.Command.Args) > hw.MaxArgs {
		return bad("%d arguments, at most %d", len(p.Command.Args), hw.MaxArgs)
	}
	view, err := startup.shared.View(dev)
	if err != nil {
		return participant{}, err
	}
	polls := false
	for _, a := range p.Command.Args {
		if a.Buffer == view && a.Offset == 0 && a.Length >= 4 {
			polls = true
		}
	}
	if !polls {
		return bad("command %q does not address the startup line (its view for %q from offset 0)", p.Command.Program.Name(), dev.Name())
	}
	cmd := p.Command
	cmd.Args = append([]hw.Arg(nil), p.Command.Args...) // the caller keeps no handle on our copy
	return participant{role: role, lane: lane, stream: p.Stream, cmd: cmd}, nil
}

// Name is the session's name (see [ResidentConfig.WithName]).
func (s *ResidentSession) Name() string { return s.c.cfg.name }

// readyLocked refuses anything once a decision exists, the session is
// poisoned or it is closed.
func (c *sessionCore) readyLocked() error {
	switch {
	case c.closed:
		return errdefs.Errorf(errdefs.ErrClosed, "resident session %q is closed", c.cfg.name)
	case c.poisoned || c.decided:
		return errdefs.Errorf(errdefs.ErrBusy, "resident session %q: startup is already decided or failed", c.cfg.name)
	}
	return nil
}

// SubmitGPU submits the GPU participant. It may be called once, before or
// after [ResidentSession.SubmitNPU]. If the submission fails (the device
// rejects it, or the stream is closed, full or lost), ABORT is published so
// that an already-submitted peer retires, and the session is decided:
// nothing more can be submitted.
//
// # Errors
//
//   - [errdefs.ErrBusy] when the GPU participant was already submitted, or a
//     decision was already made or failed.
//   - [errdefs.ErrClosed] after [ResidentSession.Close].
//   - The stream's submission error (for example [errdefs.ErrRejected]); the
//     message also names a failure to publish the ABORT that followed,
//     which poisons the session.
func (s *ResidentSession) SubmitGPU() error { return s.c.submit(&s.c.gpu) }

// SubmitNPU submits the NPU participant; see [ResidentSession.SubmitGPU],
// whose rules and errors it shares.
//
// # Errors
//
// As for [ResidentSession.SubmitGPU].
func (s *ResidentSession) SubmitNPU() error { return s.c.submit(&s.c.npu) }

func (c *sessionCore) submit(p *participant) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.readyLocked(); err != nil {
		return err
	}
	if p.submitted {
		return errdefs.Errorf(errdefs.ErrBusy, "resident session %q: %s participant already submitted", c.cfg.name, p.role)
	}
	at := time.Now()
	done, err := p.stream.Submit(&p.cmd)
	if err != nil {
		// The peer may already be polling: tell it to retire.
		if abortErr := c.decideLocked(Abort); abortErr != nil {
			return fmt.Errorf("resident session %q: %s participant: %w (publishing ABORT for its peer then failed: %w)", c.cfg.name, p.role, err, abortErr)
		}
		return fmt.Errorf("resident session %q: %s participant (ABORT published for its peer): %w", c.cfg.name, p.role, err)
	}
	p.submitted, p.done, p.at = true, done, at
	return nil
}

// decideLocked publishes the one decision of the session. The decision is
// recorded before publishing, so a failed publication can never be
// followed by another one.
func (c *sessionCore) decideLocked(v uint32) error {
	if err := c.readyLocked(); err != nil {
		return err
	}
	c.decision, c.decided = v, true
	if err := c.startup.publish(v); err != nil {
		c.poisonLocked(fmt.Errorf("publishing %s: %w", decisionName(v), err))
		return fmt.Errorf("resident session %q: publishing %s failed, session poisoned: %w", c.cfg.name, decisionName(v), err)
	}
	return nil
}

func (c *sessionCore) poisonLocked(why error) {
	if !c.poisoned {
		c.poisoned, c.poison = true, why
	}
}

func decisionName(v uint32) string {
	switch v {
	case Wait:
		return "WAIT"
	case Run:
		return "RUN"
	case Abort:
		return "ABORT"
	}
	return fmt.Sprintf("decision(%d)", v)
}

// Start publishes RUN. It is allowed only once both participants have
// been accepted, and only as the session's one decision.
//
// # Errors
//
//   - [errdefs.ErrBusy] when a participant has not been accepted yet, or a
//     decision was already made or failed; nothing is published then.
//   - [errdefs.ErrClosed] after [ResidentSession.Close].
//   - The visibility action's error when publishing fails (for example
//     [errdefs.ErrFault]): the session is then poisoned, and RUN stays its
//     decision; no other decision will ever be published.
func (s *ResidentSession) Start() error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.readyLocked(); err != nil {
		return err
	}
	if !c.gpu.submitted || !c.npu.submitted {
		return errdefs.Errorf(errdefs.ErrBusy, "resident session %q: both participants must be accepted before RUN", c.cfg.name)
	}
	return c.decideLocked(Run)
}

// Abort publishes ABORT before start: participants that were submitted
// retire without touching their payload. It is not cancellation: once RUN
// is published the exchange runs to completion, and Abort is refused.
//
// # Errors
//
//   - [errdefs.ErrBusy] when a decision (RUN or ABORT) was already made or
//     failed; nothing is published then.
//   - [errdefs.ErrClosed] after [ResidentSession.Close].
//   - The visibility action's error when publishing fails: the session is
//     then poisoned.
func (s *ResidentSession) Abort() error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.decideLocked(Abort)
}

// Decision returns the session's decision ([Run] or [Abort]) and whether
// one was made. A decision whose publication failed is still the
// decision (see [ResidentSession.Poisoned]).
func (s *ResidentSession) Decision() (uint32, bool) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.decision, s.c.decided
}

// Poisoned reports whether publishing a decision or joining a participant
// failed. A poisoned session accepts no submission or decision, and Close
// quarantines it.
func (s *ResidentSession) Poisoned() bool {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.poisoned
}

// Quarantined reports whether Close quarantined the session: its startup
// line, owner and every buffer its commands address are kept, with their
// budget charges, because a device may still touch them.
func (s *ResidentSession) Quarantined() bool {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.quarantined
}

// Retired reports, from cached retirement only (like
// [ResidentSession.IsComplete]), whether each participant has retired; a
// participant never submitted counts as retired. A quarantined session
// whose GPU participant retired no longer occupies its GPU, though it
// keeps its memory.
func (s *ResidentSession) Retired() (gpu, npu bool) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	gpu = !c.gpu.submitted || c.gpu.done.Done()
	npu = !c.npu.submitted || c.npu.done.Done()
	return gpu, npu
}

// IsComplete reports whether a decision was made and every submitted
// participant has retired. It reads cached retirement only
// ([hw.Completion.Done]): it never waits, makes no progress and changes
// no state (a failure it sees does not poison the session and is not
// traced; [ResidentSession.Wait] does that).
//
// # Errors
//
// The cached failure of a participant that retired unsuccessfully (then
// the bool is false).
func (s *ResidentSession) IsComplete() (bool, error) {
	c := s.c
	c.mu.Lock()
	decided := c.decided
	parts := [2]struct {
		submitted bool
		done      hw.Completion
	}{{c.gpu.submitted, c.gpu.done}, {c.npu.submitted, c.npu.done}}
	c.mu.Unlock()
	if !decided {
		return false, nil
	}
	complete := true
	var errs []error
	for _, p := range parts {
		if !p.submitted {
			continue
		}
		if !p.done.Done() {
			complete = false
		} else if err := p.done.Err(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return false, errors.Join(errs...)
	}
	return complete, nil
}

// Wait joins both participants under one deadline, ctx's. It always
// attempts both joins, even when the first fails or the deadline has
// already passed (a retired participant is then still observed). It
// reports true when every submitted participant has retired successfully,
// and (false, nil) when ctx ends first: the session keeps ownership of
// everything, and Wait or Close may be called again.
//
// # Errors
//
//   - [errdefs.ErrBusy] while no decision has been made.
//   - A participant's failure ([errdefs.ErrFault] for a failed command,
//     [errdefs.ErrDeviceLost] for a lost device), both joined if both failed.
//     Any such error poisons the session, so Close will quarantine it.
func (s *ResidentSession) Wait(ctx context.Context) (bool, error) { return s.c.wait(ctx) }

// WaitTimeout is [ResidentSession.Wait] with a deadline d from now.
//
// # Errors
//
// As for [ResidentSession.Wait].
func (s *ResidentSession) WaitTimeout(d time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return s.c.wait(ctx)
}

func (c *sessionCore) wait(ctx context.Context) (bool, error) {
	c.mu.Lock()
	if !c.decided {
		c.mu.Unlock()
		return false, errdefs.Errorf(errdefs.ErrBusy, "resident session %q: startup remains undecided", c.cfg.name)
	}
	gs, gd := c.gpu.submitted, c.gpu.done
	ns, nd := c.npu.submitted, c.npu.done
	c.mu.Unlock()

	gRetired, gAt, gErr := join(ctx, gs, gd)
	// Always attempt both joins, even when the GPU join failed.
	nRetired, nAt, nErr := join(ctx, ns, nd)

	c.mu.Lock()
	c.observeLocked(&c.gpu, gs && gRetired, gErr, gAt)
	c.observeLocked(&c.npu, ns && nRetired, nErr, nAt)
	var errs []error
	if gErr != nil {
		errs = append(errs, fmt.Errorf("GPU participant: %w", gErr))
	}
	if nErr != nil {
		errs = append(errs, fmt.Errorf("NPU participant: %w", nErr))
	}
	if len(errs) > 0 {
		err := fmt.Errorf("resident session %q: %w", c.cfg.name, errors.Join(errs...))
		c.poisonLocked(err)
		c.mu.Unlock()
		return false, err
	}
	c.mu.Unlock()
	return gRetired && nRetired, nil
}

// join waits for one participant. It reports whether it retired (an
// unsubmitted participant counts as retired), its failure, and when that
// was observed.
func join(ctx context.Context, submitted bool, done hw.Completion) (bool, time.Time, error) {
	if !submitted {
		return true, time.Time{}, nil
	}
	err := done.Wait(ctx)
	at := time.Now()
	if err != nil && ctx.Err() != nil && errors.Is(err, errdefs.ErrDeadlineExceeded) {
		if !done.Done() {
			return false, at, nil // timed out: still running, still owned
		}
		err = done.Err() // it retired just as the deadline passed
	}
	return true, at, err
}

// observeLocked records a participant's occupancy once it is seen retired.
func (c *sessionCore) observeLocked(p *participant, retired bool, err error, at time.Time) {
	if !retired || p.recorded {
		return
	}
	p.recorded = true
	c.record(p, at, err != nil)
}

func (c *sessionCore) record(p *participant, end time.Time, failed bool) {
	if c.cfg.rt == nil {
		return
	}
	c.cfg.rt.Tracer().Record(host.Record{
		Start: p.at, Dur: end.Sub(p.at), Lane: p.lane,
		Owner: c.cfg.name, Device: p.stream.Device().Name(), Failed: failed,
	})
}

// Close ends the session. If no decision was made it publishes ABORT; it
// then waits up to the close timeout (see [ResidentConfig.WithCloseTimeout]) for both
// participants to retire.
//
// If both retired and the session is not poisoned, Close frees the
// startup line and closes the owner given with [ResidentConfig.WithOwner], releasing
// their budget charges, and returns nil (or the owner's close error).
// Without an owner, the payload and the streams stay the caller's to
// release.
//
// Otherwise it quarantines the session: the startup line, the owner, the
// streams and every buffer the commands address are kept, with their
// budget charges, because a device may still touch them; the session is
// noted in the runtime given with [ResidentConfig.WithRuntime]. Nothing of it is ever
// freed.
//
// # Errors
//
//   - [errdefs.ErrDeviceLost] when the session is quarantined; it says why and
//     how many bytes are kept. A later Close returns the same error.
//   - [errdefs.ErrClosed] when a healthy session is closed twice.
//   - The owner's close error.
func (s *ResidentSession) Close() error {
	c := s.c
	c.mu.Lock()
	if c.closed {
		err := c.closeErr
		c.mu.Unlock()
		if err != nil {
			return err
		}
		return errdefs.Errorf(errdefs.ErrClosed, "resident session %q closed twice", c.cfg.name)
	}
	if !c.decided {
		_ = c.decideLocked(Abort) // a failure poisons the session
	}
	c.closed = true
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.closeTimeout)
	defer cancel()
	retired, _ := c.wait(ctx) // an error poisons, which is checked below

	c.mu.Lock()
	if !retired || c.poisoned {
		c.closeErr = c.quarantineLocked(retired)
		c.mu.Unlock()
		return c.closeErr
	}
	c.mu.Unlock()
	// Both retired: nothing on the devices touches the session's memory.
	if o := c.cfg.owner; o != nil {
		// The owner gets a deadline of its own: the participants' wait may
		// have used up the close timeout, and an expired context would
		// fail even a drained stream's close.
		octx, ocancel := context.WithTimeout(context.Background(), max(c.cfg.closeTimeout, time.Second))
		err := o.Close(octx)
		ocancel()
		if err != nil {
			if o.Quarantined() {
				// The owner's own streams would not drain: other work on
				// them may still run, so keep the startup line as well.
				c.mu.Lock()
				defer c.mu.Unlock()
				c.poisonLocked(err)
				c.closeErr = c.quarantineLocked(true)
				return c.closeErr
			}
			_ = c.startup.shared.Free()
			return err
		}
	}
	return c.startup.shared.Free()
}

// quarantineLocked keeps every owner and reports it.
func (c *sessionCore) quarantineLocked(retired bool) error {
	c.quarantined = true
	now := time.Now()
	var why []string
	for _, p := range []*participant{&c.gpu, &c.npu} {
		if p.submitted && !p.recorded && !p.done.Done() {
			p.recorded = true
			c.record(p, now, true)
			why = append(why, p.role+" participant did not retire")
		}
	}
	if c.poisoned {
		why = append(why, "poisoned: "+c.poison.Error())
	} else if !retired && len(why) == 0 {
		why = append(why, "participants did not retire")
	}
	bytes := c.retainedBytes()
	if c.cfg.owner != nil {
		c.cfg.owner.Quarantine() // nobody may free what a device may still touch
	}
	if c.cfg.rt != nil {
		c.cfg.rt.NoteQuarantine(c.cfg.name, bytes)
	}
	return errdefs.Errorf(errdefs.ErrDeviceLost, "resident session %q quarantined (%s): startup line, owner and %d bytes kept", c.cfg.name, strings.Join(why, "; "), bytes)
}

// retainedBytes is the memory a quarantine keeps: the startup line plus
// every distinct allocation the two commands address. Views of one shared
// allocation on both devices count once (they share a host mapping).
func (c *sessionCore) retainedBytes() int64 {
	total := int64(c.startup.shared.Size())
	seen := map[any]bool{}
	for _, p := range []*participant{&c.gpu, &c.npu} {
		view, _ := c.startup.shared.View(p.stream.Device())
		for _, a := range p.cmd.Args {
			if a.Buffer == nil || a.Buffer == view {
				continue
			}
			var key any = a.Buffer
			if b, err := a.Buffer.HostBytes(); err == nil && len(b) > 0 {
				key = unsafe.SliceData(b)
			}
			if !seen[key] {
				seen[key] = true
				total += int64(a.Buffer.Size())
			}
		}
	}
	return total
}

// abandon runs when an unclosed session becomes unreachable: like the
// seed's Drop before RUN, it publishes ABORT if nothing was decided. It
// waits for nothing and frees nothing.
func (c *sessionCore) abandon() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed && !c.decided {
		_ = c.decideLocked(Abort)
	}
}
