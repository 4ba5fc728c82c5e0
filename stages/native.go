package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
)

// Stage is the body of one native stage. It runs synchronously on the
// caller's goroutine while the session holds the compute lane. ctx
// carries the caller's deadline and marks the call path as inside a stage
// (so a nested stage of the same runtime returns [errdefs.ErrBusy]); it is
// valid only until the stage returns. A returned error is a client error:
// it reaches the caller, and a session whose fence then drains stays
// healthy.
type Stage[T any] func(ctx context.Context, state *T) error

// Fence drains a session's work after every stage. ctx has the fence's
// own deadline ([NativeConfig.WithFenceTimeout]), independent of the
// stage's. A nil fence means the built-in fence, [host.Owner.Drain].
type Fence[T any] func(ctx context.Context, state *T) error

// NativeConfig configures a [NativeSession]. It is immutable: every WithX
// method returns a modified copy, so a NativeConfig can be shared and
// reused. A zero NativeConfig means [NewNativeConfig]'s defaults. A WithX method called on a zero value starts from
// those defaults.
//
//	sess := stages.NewNative(rt, owner, state, nil, stages.NewNativeConfig().WithFenceTimeout(time.Second))
type NativeConfig struct {
	set          bool // made by NewNativeConfig; false: the zero value
	fenceTimeout time.Duration
	device       string
	cost         int
	laneTimeout  time.Duration // bounds the wait for the compute lane; 0: only ctx does
}

// NewNativeConfig returns the default configuration:
//
//   - fence timeout 10s (see [NativeConfig.WithFenceTimeout]);
//   - device label: the device of the owner's first stream (see
//     [NativeConfig.WithDevice]);
//   - admission cost 1 (see [NativeConfig.WithAdmissionCost]).
func NewNativeConfig() NativeConfig {
	return NativeConfig{set: true, fenceTimeout: 10 * time.Second, cost: 1}
}

// orDefaults is c, or [NewNativeConfig]'s defaults when c is the zero value, so
// that a WithX method called on a zero NativeConfig keeps the other defaults.
func (c NativeConfig) orDefaults() NativeConfig {
	if !c.set {
		return NewNativeConfig()
	}
	return c
}

// withLaneTimeout bounds each call's wait for admission and the compute
// lane (host.Op.Timeout): a [Session] gives its deadline, which covers
// that wait.
func (c NativeConfig) withLaneTimeout(d time.Duration) NativeConfig {
	c = c.orDefaults()
	c.laneTimeout = d
	return c
}

// WithFenceTimeout bounds each fence run. A fence still running then is
// treated as failed and the owner is quarantined. Default 10s.
func (c NativeConfig) WithFenceTimeout(d time.Duration) NativeConfig {
	c = c.orDefaults()
	c.fenceTimeout = d
	return c
}

// WithDevice labels the session's trace records with a device name.
// Default: the device of the owner's first stream, or "" when it has none.
func (c NativeConfig) WithDevice(name string) NativeConfig {
	c = c.orDefaults()
	c.device = name
	return c
}

// WithAdmissionCost sets the capacity units a stage holds. Default 1; 0
// means 1. A cost above the runtime's capacity makes every Run fail with
// [errdefs.ErrOutOfBudget], a negative one with
// [errdefs.ErrInvalidArgument].
func (c NativeConfig) WithAdmissionCost(units int) NativeConfig {
	c = c.orDefaults()
	c.cost = units
	return c
}

// NativeSession owns a stage's private device state and runs Go stages on
// it (a [Session] runs Wasm stages, each call inside a NativeSession; a
// resident GPU–NPU session is sessions.ResidentSession), each one wrapped
// by the host:
//
//  1. admission and a native lease on the runtime's compute lane (earlier
//     compute drains first; later compute waits; other lanes keep flowing);
//  2. the stage, on the caller's goroutine;
//  3. the fence, on every exit path: success, client error, panic,
//     [runtime.Goexit] and the stage's deadline, with a deadline of its
//     own;
//  4. a check that every owned stream is idle, whatever the fence said;
//  5. quarantine of the owner when the fence fails, panics, times out or
//     lies: nothing is freed, budget charges stay, every later stage gets
//     [errdefs.ErrDeviceLost];
//  6. the failures of device work that the drain found or that were noted
//     on the owner ([host.Owner.TakeFaults]): a call whose device work
//     failed fails with [errdefs.ErrFault], never succeeds;
//  7. the release of the lease and a trace record of the occupancy.
//
// Steps 3 to 7 run in deferred calls, so a stage that panics or calls
// [runtime.Goexit] (as t.Fatal does) is fenced and releases the lane like
// any other. A panic in the stage is re-raised after the fence; so is a
// panic in the fence, after quarantine; a Goexit goes on exiting the
// goroutine after the fence.
//
// A session runs one stage at a time; a concurrent Run, or a Close while a
// stage runs, returns [errdefs.ErrBusy]. The checks for quarantine and Close
// and the mark that a stage runs are made under one lock, so a stage never
// starts on a quarantined or closed session.
type NativeSession[T any] struct {
	rt    *host.Runtime
	owner *host.Owner
	fence Fence[T]
	cfg   NativeConfig
	state T
	lease host.Lease // used by the one running stage

	mu         sync.Mutex
	running    bool  // a stage is running (between enter and leave)
	closed     bool  // Close was called on a healthy session
	quarantine error // why the owner was quarantined, nil while healthy
}

// NewNative creates a session over owner's resources and state, configured
// by cfg (a zero NativeConfig means [NewNativeConfig]'s defaults). The owner
// must have no pending work; from now on its work goes through Run.
//
//	owner := host.NewOwner("mlp", hw.NewBudget("mlp", 64<<20))
//	stream, _ := owner.NewStream(gpu)
//	sess := stages.NewNative(rt, owner, myState{stream: stream}, nil, stages.NewNativeConfig())
//	err := sess.Run(ctx, func(ctx context.Context, s *myState) error { ... })
func NewNative[T any](rt *host.Runtime, owner *host.Owner, state T, fence Fence[T], cfg NativeConfig) *NativeSession[T] {
	if !cfg.set {
		cfg = NewNativeConfig()
	}
	if cfg.device == "" {
		if s := owner.Streams(); len(s) > 0 {
			cfg.device = s[0].Device().Name()
		}
	}
	return &NativeSession[T]{rt: rt, owner: owner, fence: fence, cfg: cfg, state: state}
}

// Owner returns the session's owner.
func (s *NativeSession[T]) Owner() *host.Owner { return s.owner }

// Name is the owner's name.
func (s *NativeSession[T]) Name() string { return s.owner.Name() }

// State returns the idle session state for inspection.
//
// # Errors
//
// [errdefs.ErrDeviceLost] once the session is quarantined; [errdefs.ErrBusy] while a
// stage runs.
func (s *NativeSession[T]) State() (*T, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quarantine != nil {
		return nil, s.quarantine
	}
	if s.running {
		return nil, errdefs.Errorf(errdefs.ErrBusy, "session %q is running a stage", s.owner.Name())
	}
	return &s.state, nil
}

// Quarantined returns nil for a healthy session, or the [errdefs.ErrDeviceLost]
// error that says why it was quarantined.
func (s *NativeSession[T]) Quarantined() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quarantine
}

// enter marks the session as running a stage, after checking, under the
// same lock, that it may: not quarantined, not running, not closed, and
// its owner neither quarantined nor closed.
func (s *NativeSession[T]) enter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.quarantine != nil:
		return s.quarantine
	case s.running:
		return errdefs.Errorf(errdefs.ErrBusy, "session %q is already running a stage", s.owner.Name())
	case s.closed:
		return errdefs.Errorf(errdefs.ErrClosed, "session %q is closed", s.owner.Name())
	}
	if err := s.owner.Err(); err != nil {
		return err
	}
	s.running = true
	return nil
}

func (s *NativeSession[T]) leave() {
	s.mu.Lock()
	s.running = false
	s.mu.Unlock()
}

// Run executes one stage under the host's wrapping (see [NativeSession]).
//
// Device work of the call that failed ([errdefs.ErrFault]) makes the call fail,
// whichever fence ran: the built-in fence records the failures it drains,
// a custom fence may return one (an [errdefs.ErrFault] error means "drained,
// but device work failed"), and code that saw one may note it with
// [host.Owner.NoteFault]. Failures noted before the call started are not
// the call's: Run forgets them.
//
// # Errors
//
//   - [errdefs.ErrDeviceLost] if the session or its owner is quarantined,
//     before or because of this run (then wrapping the fence's failure; a
//     client error or failed device work of the same run is named in the
//     message). The fence's failure is any error of a class other than
//     [errdefs.ErrFault] (one that also matches [errdefs.ErrDeviceLost] or
//     [errdefs.ErrDeadlineExceeded] counts as such), a panic, its deadline, or
//     a stream still busy after it.
//   - [errdefs.ErrBusy] for a recursive stage of the same runtime or a
//     concurrent Run of this session.
//   - [errdefs.ErrClosed] after Close, or when the owner was closed.
//   - [errdefs.ErrDeadlineExceeded] if ctx ends while waiting for admission.
//   - [errdefs.ErrOutOfBudget] or [errdefs.ErrInvalidArgument] for an
//     admission cost that can never be admitted ([NativeConfig.WithAdmissionCost]).
//   - The stage's own error (a client error). If device work of the call
//     failed as well, the error wraps both: [errors.Is] matches the
//     stage's error and [errdefs.ErrFault].
//   - [errdefs.ErrFault] when the stage returned nil but device work of the
//     call failed and the fence proved the drain: the session stays
//     healthy.
//   - Otherwise nil.
func (s *NativeSession[T]) Run(ctx context.Context, stage Stage[T]) (err error) {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	_ = s.owner.TakeFaults() // faults from before this call are not this call's
	// A call that never gets the lane never runs: nothing to fence.
	if err := s.rt.AcquireCompute(ctx, host.Op{Owner: s.owner.Name(), Device: s.cfg.device, Cost: s.cfg.cost, Timeout: s.cfg.laneTimeout}, &s.lease); err != nil {
		return err
	}
	returned := false
	var stageErr error
	// Fence, check, quarantine and release run here, on every way out of
	// the stage: return, panic, and runtime.Goexit (which recover does
	// not stop, but which runs deferred calls).
	defer func() {
		var stagePanic *recovered
		if !returned {
			if v := recover(); v != nil {
				stagePanic = &recovered{v}
			}
		}
		err = s.finish(stageErr, stagePanic, !returned && stagePanic == nil)
	}()
	stageErr = stage(s.lease.Context(), &s.state)
	returned = true
	return nil
}

type recovered struct{ value any }

// finish runs the fence after a stage that returned stageErr, panicked
// (stagePanic) or exited its goroutine (exited), checks the owner is idle,
// quarantines it if the drain is not proven, releases the lease, and
// re-raises a panic; otherwise it returns the call's error.
func (s *NativeSession[T]) finish(stageErr error, stagePanic *recovered, exited bool) error {
	fencePanic, fenceErr := s.callFence()
	var unproven, faultErr error
	switch {
	case fencePanic != nil:
		unproven = fmt.Errorf("fence panicked: %v", fencePanic.value)
	case fenceErr != nil && !onlyFault(fenceErr):
		unproven = fenceErr
	default:
		// The fence reports a drain, perhaps with failed work: the
		// streams must say the same.
		if idleErr := s.owner.VerifyIdle(); idleErr != nil {
			unproven = idleErr
			if fenceErr != nil {
				unproven = fmt.Errorf("%w (the fence had reported: %v)", idleErr, fenceErr)
			}
		} else {
			faultErr = fenceErr
		}
	}
	if noted := s.owner.TakeFaults(); noted != nil {
		faultErr = joinFaults(faultErr, noted)
	}
	s.lease.Release(unproven != nil || faultErr != nil || stageErr != nil || stagePanic != nil || exited)

	if unproven != nil {
		s.quarantineOwner(fmt.Errorf("fence could not be proven: %w", unproven), stageErr, faultErr)
	}
	if stagePanic != nil {
		panic(stagePanic.value)
	}
	if fencePanic != nil {
		panic(fencePanic.value)
	}
	if unproven != nil {
		return s.Quarantined()
	}
	if faultErr != nil {
		if stageErr != nil {
			return fmt.Errorf("%w (device work of the call also failed: %w)", stageErr, faultErr)
		}
		return faultErr
	}
	return stageErr
}

// onlyFault reports whether a fence's error means "drained, but device
// work failed": of class [errdefs.ErrFault], and matching neither
// [errdefs.ErrDeviceLost] nor [errdefs.ErrDeadlineExceeded] (a joined error that
// also carries a loss or a deadline does not prove the drain).
func onlyFault(err error) bool {
	return errdefs.ClassOf(err) == errdefs.ErrFault && !errors.Is(err, errdefs.ErrDeviceLost) && !errors.Is(err, errdefs.ErrDeadlineExceeded)
}

// joinFaults joins two failures of device work, either of them nil.
func joinFaults(a, b error) error {
	if a == nil {
		return b
	}
	return errors.Join(a, b)
}

func (s *NativeSession[T]) callFence() (p *recovered, err error) {
	defer func() {
		if v := recover(); v != nil {
			p = &recovered{v}
		}
	}()
	ctx := s.lease.FenceContext(s.cfg.fenceTimeout)
	if s.fence == nil {
		err = s.owner.Drain(ctx)
	} else {
		err = s.fence(ctx, &s.state)
	}
	// A fence that reports a drain after its deadline has failed all the
	// same: it was treated as failed from the deadline on.
	if over := s.lease.FenceOverran(); over != nil && (err == nil || onlyFault(err)) {
		err = over
	}
	return nil, err
}

// quarantineOwner quarantines the owner, whose work cannot be proven
// finished (reason), and notes it in the runtime, once per session
// however often it is called.
func (s *NativeSession[T]) quarantineOwner(reason, stageErr, faultErr error) {
	bytes := s.owner.Quarantine()
	msg := "session %q quarantined: %w"
	args := []any{s.owner.Name(), reason}
	if stageErr != nil {
		msg += " (the stage had failed with: %v)"
		args = append(args, stageErr)
	}
	if faultErr != nil {
		msg += " (device work had failed: %v)"
		args = append(args, faultErr)
	}
	s.mu.Lock()
	first := s.quarantine == nil
	if first {
		s.quarantine = errdefs.Errorf(errdefs.ErrDeviceLost, msg, args...)
	}
	s.mu.Unlock()
	if first {
		s.rt.NoteQuarantine(s.owner.Name(), bytes)
	}
}

// Close releases the owner's resources (see [host.Owner.Close]). Later
// Runs return [errdefs.ErrClosed]; closing a closed session does nothing.
//
// # Errors
//
//   - [errdefs.ErrBusy] while a stage runs; nothing is closed then.
//   - [errdefs.ErrDeviceLost] for a quarantined session, which keeps its
//     resources, or when the owner's streams did not drain on close: the
//     session is quarantined then, and keeps them too.
//   - The owner's other close errors.
func (s *NativeSession[T]) Close(ctx context.Context) error {
	s.mu.Lock()
	switch {
	case s.running:
		s.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrBusy, "session %q is running a stage", s.owner.Name())
	case s.quarantine != nil:
		err := s.quarantine
		s.mu.Unlock()
		return err
	case s.closed:
		s.mu.Unlock()
		return nil
	}
	s.closed = true // from now on no stage starts
	s.mu.Unlock()
	err := s.owner.Close(ctx)
	if err != nil && s.owner.Quarantined() {
		s.quarantineOwner(fmt.Errorf("its streams did not drain on close: %w", err), nil, nil)
		return s.Quarantined()
	}
	return err
}
