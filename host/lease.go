package host

import (
	"context"
	"sync"
	"time"
)

// Lease is a native lease on the compute lane, filled in by
// [Runtime.AcquireCompute]. Keep one per session and reuse it: a Lease
// must not be copied while held.
type Lease struct {
	rt    *Runtime
	op    Op
	cost  int
	start time.Time
	wait  time.Duration
	stage stageContext
	fence fenceContext
}

// Held reports whether the lease is held.
func (l *Lease) Held() bool { return l.rt != nil }

// Context returns the context for the stage that runs under this lease. It
// carries the caller's deadline, cancellation and values, and marks the
// call path as inside a native stage of the runtime, so that a recursive
// stage or a compute submission through it returns [hw.ErrBusy]. It is
// valid until Release.
func (l *Lease) Context() context.Context { return &l.stage }

// FenceContext returns a context for the fence that runs under this lease:
// it keeps the caller's values and the stage marker but not its
// cancellation (the fence must run even after the stage's deadline), and
// it has its own deadline timeout from now. It is valid until Release.
func (l *Lease) FenceContext(timeout time.Duration) context.Context {
	l.fence.arm(&l.stage, l.rt.clock().Add(timeout))
	return &l.fence
}

// Release ends the lease and records its occupancy in the tracer, marked
// failed if failed is true. Releasing an idle lease does nothing.
func (l *Lease) Release(failed bool) {
	rt := l.rt
	if rt == nil {
		return
	}
	end := rt.clock()
	l.fence.disarm()
	rt.sched.release(LaneCompute, true, l.cost)
	rt.tracer.Record(Record{Start: l.start, Dur: end.Sub(l.start), Wait: l.wait,
		Lane: LaneCompute, Owner: l.op.Owner, Device: l.op.Device, Failed: failed})
	l.rt = nil
	l.stage.parent = nil
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

// fenceContext is a reusable context with its own deadline and the values
// of a stage context. Its Done channel and timer are made only if a fence
// actually waits on Done, and the timer is reused across leases.
type fenceContext struct {
	values   *stageContext
	mu       sync.Mutex
	deadline time.Time
	done     chan struct{} // nil until a fence asks for it
	err      error         // set once the deadline passed
	timer    *time.Timer   // made on the first Done, then reset
}

func (c *fenceContext) arm(values *stageContext, deadline time.Time) {
	c.mu.Lock()
	c.values = values
	c.deadline = deadline
	if c.err != nil { // the last fence expired and its channel is closed
		c.done, c.err = nil, nil
	}
	if c.done != nil {
		c.timer.Reset(time.Until(deadline))
	}
	c.mu.Unlock()
}

func (c *fenceContext) disarm() {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
}

// expireLocked closes Done if the deadline has passed.
func (c *fenceContext) expireLocked() {
	if c.err == nil && !time.Now().Before(c.deadline) {
		c.err = context.DeadlineExceeded
		if c.done != nil {
			close(c.done)
		}
	}
}

func (c *fenceContext) onTimer() {
	c.mu.Lock()
	c.expireLocked()
	if c.err == nil && c.done != nil { // a stale timer of an earlier arm
		c.timer.Reset(time.Until(c.deadline))
	}
	c.mu.Unlock()
}

func (c *fenceContext) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

func (c *fenceContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil { // expired through Err before anyone asked for Done
			close(c.done)
			return c.done
		}
		c.expireLocked()
		if c.err == nil {
			if c.timer == nil {
				c.timer = time.AfterFunc(time.Until(c.deadline), c.onTimer)
			} else {
				c.timer.Reset(time.Until(c.deadline))
			}
		}
	}
	return c.done
}

func (c *fenceContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked()
	return c.err
}

func (c *fenceContext) Value(key any) any { return c.values.Value(key) }
