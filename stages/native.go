package stages

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
)

// Stage is the body of one native stage. It runs synchronously on the
// caller's goroutine while the session holds the compute lane. ctx
// carries the caller's deadline and marks the call path as inside a stage
// (so a nested stage of the same runtime returns [hw.ErrBusy]); it is
// valid only until the stage returns. A returned error is a client error:
// it reaches the caller, and a session whose fence then drains stays
// healthy.
type Stage[T any] func(ctx context.Context, state *T) error

// Fence drains a session's work after every stage. ctx has the fence's
// own deadline ([NativeOption] WithFenceTimeout), independent of the
// stage's. A nil fence means the built-in fence, [host.Owner.Drain].
type Fence[T any] func(ctx context.Context, state *T) error

// NativeOption configures a [NativeSession].
type NativeOption func(*nativeConfig)

type nativeConfig struct {
	fenceTimeout time.Duration
	device       string
	cost         int
}

// WithFenceTimeout bounds each fence run. A fence still running then is
// treated as failed and the owner is quarantined. Default 10s.
func WithFenceTimeout(d time.Duration) NativeOption {
	return func(c *nativeConfig) { c.fenceTimeout = d }
}

// WithDevice labels the session's trace records with a device name.
// Default: the device of the owner's first stream, or "" when it has none.
func WithDevice(name string) NativeOption {
	return func(c *nativeConfig) { c.device = name }
}

// WithAdmissionCost sets the capacity units a stage holds. Default 1.
func WithAdmissionCost(units int) NativeOption {
	return func(c *nativeConfig) { c.cost = units }
}

// NativeSession owns a stage's private device state and runs stages on it,
// each one wrapped by the host:
//
//  1. admission and a native lease on the runtime's compute lane (earlier
//     compute drains first; later compute waits; other lanes keep flowing);
//  2. the stage, on the caller's goroutine;
//  3. the fence, on every exit path: success, client error, panic, and the
//     stage's deadline, with a deadline of its own;
//  4. a check that every owned stream is idle, whatever the fence said;
//  5. quarantine of the owner when the fence fails, panics, times out or
//     lies: nothing is freed, budget charges stay, every later stage gets
//     [hw.ErrDeviceLost];
//  6. a trace record of the occupancy.
//
// A panic in the stage is re-raised after the fence; so is a panic in the
// fence, after quarantine.
//
// A session runs one stage at a time; a concurrent Run returns
// [hw.ErrBusy].
type NativeSession[T any] struct {
	rt    *host.Runtime
	owner *host.Owner
	fence Fence[T]
	cfg   nativeConfig
	state T

	running    atomic.Bool
	lease      host.Lease
	mu         sync.Mutex
	quarantine error // why the owner was quarantined, nil while healthy
}

// NewNative creates a session over owner's resources and state. The owner
// must have no pending work; from now on its work goes through Run.
//
//	owner := host.host.NewOwner("mlp", hw.NewBudget("mlp", 64<<20))
//	stream, _ := owner.NewStream(gpu)
//	sess := stages.NewNative(rt, owner, myState{stream: stream}, nil)
//	err := sess.Run(ctx, func(ctx context.Context, s *myState) error { ... })
func NewNative[T any](rt *host.Runtime, owner *host.Owner, state T, fence Fence[T], opts ...NativeOption) *NativeSession[T] {
	cfg := nativeConfig{fenceTimeout: 10 * time.Second, cost: 1}
	for _, o := range opts {
		o(&cfg)
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
// [hw.ErrDeviceLost] once the session is quarantined; [hw.ErrBusy] while a
// stage runs.
func (s *NativeSession[T]) State() (*T, error) {
	if err := s.Quarantined(); err != nil {
		return nil, err
	}
	if s.running.Load() {
		return nil, hw.Errorf(hw.ErrBusy, "session %q is running a stage", s.owner.Name())
	}
	return &s.state, nil
}

// Quarantined returns nil for a healthy session, or the [hw.ErrDeviceLost]
// error that says why it was quarantined.
func (s *NativeSession[T]) Quarantined() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quarantine
}

// Run executes one stage under the host's wrapping (see [NativeSession]).
//
// # Errors
//
//   - [hw.ErrDeviceLost] if the session is quarantined, before or because
//     of this run (then wrapping the fence's failure; a client error from
//     the same run is named in the message).
//   - [hw.ErrBusy] for a recursive stage of the same runtime or a
//     concurrent Run of this session.
//   - [hw.ErrDeadlineExceeded] if ctx ends while waiting for admission.
//   - Otherwise the stage's own error (a client error), or nil.
func (s *NativeSession[T]) Run(ctx context.Context, stage Stage[T]) error {
	if err := s.Quarantined(); err != nil {
		return err
	}
	if !s.running.CompareAndSwap(false, true) {
		return hw.Errorf(hw.ErrBusy, "session %q is already running a stage", s.owner.Name())
	}
	defer s.running.Store(false)
	if err := s.rt.AcquireCompute(ctx, host.Op{Owner: s.owner.Name(), Device: s.cfg.device, Cost: s.cfg.cost}, &s.lease); err != nil {
		return err
	}

	stagePanic, stageErr := s.callStage(stage)
	fencePanic, fenceErr := s.callFence()
	if fenceErr == nil && fencePanic == nil {
		fenceErr = s.owner.VerifyIdle()
	}
	fenceFailed := fenceErr != nil || fencePanic != nil
	s.lease.Release(fenceFailed || stageErr != nil || stagePanic != nil)

	if fenceFailed {
		s.quarantineOwner(fenceErr, fencePanic, stageErr)
	}
	if stagePanic != nil {
		panic(stagePanic.value)
	}
	if fencePanic != nil {
		panic(fencePanic.value)
	}
	if fenceFailed {
		return s.Quarantined()
	}
	return stageErr
}

type recovered struct{ value any }

func (s *NativeSession[T]) callStage(stage Stage[T]) (p *recovered, err error) {
	defer func() {
		if v := recover(); v != nil {
			p = &recovered{v}
		}
	}()
	return nil, stage(s.lease.Context(), &s.state)
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
	if err == nil && ctx.Err() != nil {
		err = hw.ContextError(ctx, "fence outlived its deadline")
	}
	return nil, err
}

func (s *NativeSession[T]) quarantineOwner(fenceErr error, fencePanic *recovered, stageErr error) {
	bytes := s.owner.Quarantine()
	reason := fenceErr
	if fencePanic != nil {
		reason = fmt.Errorf("fence panicked: %v", fencePanic.value)
	}
	msg := "session %q quarantined: fence could not be proven: %w"
	args := []any{s.owner.Name(), reason}
	if stageErr != nil {
		msg += " (the stage had failed with: %v)"
		args = append(args, stageErr)
	}
	s.mu.Lock()
	s.quarantine = hw.Errorf(hw.ErrDeviceLost, msg, args...)
	s.mu.Unlock()
	s.rt.NoteQuarantine(s.owner.Name(), bytes)
}

// Close releases the owner's resources (see [host.Owner.Close]). A quarantined
// session keeps them and returns its quarantine error.
func (s *NativeSession[T]) Close(ctx context.Context) error {
	if s.running.Load() {
		return hw.Errorf(hw.ErrBusy, "session %q is running a stage", s.owner.Name())
	}
	if err := s.Quarantined(); err != nil {
		return err
	}
	return s.owner.Close(ctx)
}
