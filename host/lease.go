package host

import (
	"context"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/deadline"
	"github.com/stagehost/stagehost/internal/monotime"
)

// Lease is a native lease on the compute lane, filled in by
// [Runtime.AcquireCompute]. Keep one per session and reuse it: a Lease
// must not be copied while held.
type Lease struct {
	rt    *Runtime
	op    Op
	lane  *laneState
	cost  int
	start time.Time
	asked time.Time // when AcquireCompute was called
	stage stageContext
	fence deadline.Context
	// fenceDeadline and end are monotime offsets: the fence's deadline,
	// and when FenceOverran read the clock (0: not yet).
	fenceDeadline, end time.Duration
	now                time.Duration // the stage's last clock reading (NoteTime), or 0
}

// Started returns when the lease was granted.
func (l *Lease) Started() time.Time { return l.start }

// Asked returns when the lease was asked for: [Lease.Started] less the
// wait for the lane and capacity. A call's deadline that counts from it
// covers that wait.
func (l *Lease) Asked() time.Time { return l.asked }

// Held reports whether the lease is held.
func (l *Lease) Held() bool { return l.rt != nil }

// Context returns the context for the stage that runs under this lease. It
// carries the caller's deadline, cancellation and values, and marks the
// call path as inside a native stage of the runtime, so that a recursive
// stage or a compute submission through it returns [errdefs.ErrBusy]. It is
// valid until Release.
func (l *Lease) Context() context.Context { return &l.stage }

// FenceContext returns a context for the fence that runs under this lease:
// it keeps the caller's values and the stage marker but not its
// cancellation (the fence must run even after the stage's deadline), and
// it has its own deadline timeout from now. It is valid until Release.
func (l *Lease) FenceContext(timeout time.Duration) context.Context {
	now := l.now
	if now == 0 {
		now = monotime.Since()
	}
	l.now = 0
	l.fenceDeadline = now + timeout
	l.fence.ArmAt(&l.stage, l.fenceDeadline)
	return &l.fence
}

// NoteTime records a clock reading (a [monotime] offset) that the stage
// took as it ended, so that FenceContext need not read the clock again.
// Only the goroutine that holds the lease may call it; on a lease not held
// it does nothing.
func (l *Lease) NoteTime(now time.Duration) {
	if l.rt != nil {
		l.now = now
	}
}

// FenceOverran reports, after the fence returned, whether it ran past the
// deadline of [Lease.FenceContext], as a [errdefs.ErrDeadlineExceeded] error.
// The clock reading it takes also ends the occupancy that Release
// records, so a stage call reads the clock once less.
func (l *Lease) FenceOverran() error {
	l.end = monotime.Since()
	if l.end >= l.fenceDeadline {
		return errdefs.ContextError(&l.fence, "fence outlived its deadline")
	}
	return nil
}

// Release ends the lease and records its occupancy in the tracer, marked
// failed if failed is true. Releasing an idle lease does nothing.
func (l *Lease) Release(failed bool) {
	rt := l.rt
	if rt == nil {
		return
	}
	end := l.end
	if end == 0 {
		end = monotime.Since()
	}
	l.end, l.now = 0, 0
	l.fence.Disarm()
	rt.sched.release(l.lane, true, l.cost)
	rt.tracer.Record(Record{Start: l.start, Dur: end - monotime.Offset(l.start), Wait: l.start.Sub(l.asked),
		Lane: LaneCompute, Owner: l.op.Owner, Device: l.op.Device, Failed: failed})
	l.rt = nil
	l.stage.parent = context.Background() // a stage context used after its stage ended sees no deadline, never a nil parent
}

// stageContext wraps the caller's context and answers the stage marker.
// Reused across leases, so a stage costs no context allocation.
type stageContext struct {
	parent context.Context
	rt     *Runtime
}

func (c *stageContext) init(parent context.Context, rt *Runtime) {
	c.parent, c.rt = parent, rt
}

func (c *stageContext) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c *stageContext) Done() <-chan struct{}       { return c.parent.Done() }
func (c *stageContext) Err() error                  { return c.parent.Err() }
func (c *stageContext) Value(key any) any {
	if k, ok := key.(stageKey); ok && k.rt == c.rt {
		return c.rt
	}
	return c.parent.Value(key)
}
