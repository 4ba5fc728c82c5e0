// Package deadline provides a reusable context with its own deadline, for
// hot paths that would otherwise allocate a context and a timer per call.
package deadline

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/internal/monotime"
)

// Context is a reusable context that ends at its own deadline (and, when
// armed with [Context.ArmWithCancel], when its parent ends), and carries
// the parent's values.
// Re-arming it costs no allocation: its Done channel, its timer and its
// watch on the parent are made only when someone actually waits on Done.
//
// Until someone calls Done, a Context is used by one goroutine at a time,
// the one that arms it, and takes no lock (an uncontended lock pair costs
// tens of nanoseconds on some hosts, and a stage call arms two contexts).
// The first Done makes it shared for good: from then on every method
// locks, and the context methods may be called from any goroutine at any
// time. Arm and Disarm must not race with each other.
type Context struct {
	shared   atomic.Bool // Done was called once: every access locks
	parent   context.Context
	cancel   bool // the parent's cancellation ends this context too
	mu       sync.Mutex
	gen      uint64        // incremented by every Arm, so stale callbacks are ignored
	deadline time.Duration // a monotime offset
	done     chan struct{} // nil until someone waits
	err      error         // set once the context ended
	timer    *time.Timer   // made on the first Done, then reset
	stop     func() bool   // stops the watch on the parent, if any
}

// Arm starts a new use with the parent's values, but not its deadline or
// cancellation, and the given deadline.
func (c *Context) Arm(parent context.Context, deadline time.Time) {
	c.arm(parent, monotime.Offset(deadline), false)
}

// ArmAt is [Context.Arm] with the deadline given as a [monotime] offset.
func (c *Context) ArmAt(parent context.Context, deadline time.Duration) {
	c.arm(parent, deadline, false)
}

// ArmWithCancel starts a new use with the parent's values and
// cancellation, ending at the given deadline or the parent's, whichever
// is earlier. A parent that is itself a *Context armed with [Context.Arm]
// ends only at its deadline, so it is not watched (watching would make
// its channel and timer).
func (c *Context) ArmWithCancel(parent context.Context, deadline time.Time) {
	c.ArmWithCancelAt(parent, monotime.Offset(deadline))
}

// ArmWithCancelAt is [Context.ArmWithCancel] with the deadline given as a
// [monotime] offset, which saves converting times on hot paths. It
// returns the deadline armed: the earlier of deadline and the parent's.
func (c *Context) ArmWithCancelAt(parent context.Context, deadline time.Duration) time.Duration {
	if d, ok := parent.Deadline(); ok {
		deadline = min(deadline, monotime.Offset(d))
	}
	cancel := true
	if p, ok := parent.(*Context); ok {
		if p.shared.Load() {
			p.mu.Lock()
			cancel = p.cancel
			p.mu.Unlock()
		} else {
			cancel = p.cancel
		}
	}
	c.arm(parent, deadline, cancel && parent.Done() != nil)
	return deadline
}

func (c *Context) arm(parent context.Context, deadline time.Duration, cancel bool) {
	if !c.shared.Load() {
		c.gen++
		c.parent, c.cancel, c.deadline, c.err = parent, cancel, deadline, nil
		return
	}
	c.mu.Lock()
	c.gen++
	c.parent, c.cancel = parent, cancel
	c.deadline = deadline
	c.unwatchLocked()
	if c.err != nil || c.done != nil { // the last use's channel may be closed or watched
		c.done, c.err = nil, nil
	}
	c.mu.Unlock()
}

// Disarm ends a use: it stops the timer and the watch on the parent.
func (c *Context) Disarm() {
	if !c.shared.Load() {
		c.gen++
		return
	}
	c.mu.Lock()
	c.gen++
	if c.timer != nil {
		c.timer.Stop()
	}
	c.unwatchLocked()
	c.mu.Unlock()
}

func (c *Context) unwatchLocked() {
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
}

// endLocked records err (once) and closes Done if it was made.
func (c *Context) endLocked(err error) {
	if c.err == nil {
		c.err = err
		if c.done != nil {
			close(c.done)
		}
	}
}

// checkLocked ends the context if its deadline passed or its parent ended.
func (c *Context) checkLocked() {
	if c.err != nil {
		return
	}
	if c.cancel {
		if err := c.parent.Err(); err != nil {
			c.endLocked(err)
			return
		}
	}
	if monotime.Since() >= c.deadline {
		c.endLocked(context.DeadlineExceeded)
	}
}

func (c *Context) onTimer() {
	c.mu.Lock()
	c.checkLocked()
	if c.err == nil && c.done != nil { // a stale timer of an earlier arm
		c.timer.Reset(c.deadline - monotime.Since())
	}
	c.mu.Unlock()
}

// WatchesParent reports whether the parent's cancellation ends this use
// (see [Context.ArmWithCancel]). Only the goroutine that armed it may call
// it.
func (c *Context) WatchesParent() bool { return c.cancel }

// Deadline returns the armed deadline.
func (c *Context) Deadline() (time.Time, bool) {
	if !c.shared.Load() {
		return monotime.At(c.deadline), true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return monotime.At(c.deadline), true
}

// Done returns a channel closed when the context ends.
func (c *Context) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shared.Store(true)
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	c.checkLocked()
	if c.err != nil {
		close(c.done)
		return c.done
	}
	if c.timer == nil {
		c.timer = time.AfterFunc(c.deadline-monotime.Since(), c.onTimer)
	} else {
		c.timer.Reset(c.deadline - monotime.Since())
	}
	if c.cancel {
		gen := c.gen
		c.stop = context.AfterFunc(c.parent, func() {
			c.mu.Lock()
			if c.gen == gen {
				c.checkLocked()
			}
			c.mu.Unlock()
		})
	}
	return c.done
}

// Err returns nil while the context runs, context.DeadlineExceeded once its
// deadline passed, or the parent's error once the parent ended.
func (c *Context) Err() error {
	if !c.shared.Load() {
		c.checkLocked()
		return c.err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checkLocked()
	return c.err
}

// Value returns the parent's value for key.
func (c *Context) Value(key any) any {
	if !c.shared.Load() {
		if c.parent == nil {
			return nil
		}
		return c.parent.Value(key)
	}
	c.mu.Lock()
	p := c.parent
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Value(key)
}
