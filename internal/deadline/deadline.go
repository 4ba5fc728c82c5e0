// Package deadline provides a reusable context with its own deadline, for
// hot paths that would otherwise allocate a context and a timer per call.
package deadline

import (
	"context"
	"sync"
	"time"
)

// Context is a reusable context with its own deadline and the values of
// another context, but not that context's cancellation. Re-arming it costs
// no allocation: its Done channel and timer are made only when someone
// actually waits on Done, and the timer is reused. Arm and Disarm must not
// race with each other; the context methods may be called from any
// goroutine at any time.
type Context struct {
	values   context.Context
	mu       sync.Mutex
	deadline time.Time
	done     chan struct{} // nil until a fence asks for it
	err      error         // set once the deadline passed
	timer    *time.Timer   // made on the first Done, then reset
}

// Arm starts a new use with values from values and the given deadline.
func (c *Context) Arm(values context.Context, deadline time.Time) {
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

// Disarm stops the timer at the end of a use.
func (c *Context) Disarm() {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
}

// expireLocked closes Done if the deadline has passed.
func (c *Context) expireLocked() {
	if c.err == nil && !time.Now().Before(c.deadline) {
		c.err = context.DeadlineExceeded
		if c.done != nil {
			close(c.done)
		}
	}
}

func (c *Context) onTimer() {
	c.mu.Lock()
	c.expireLocked()
	if c.err == nil && c.done != nil { // a stale timer of an earlier arm
		c.timer.Reset(time.Until(c.deadline))
	}
	c.mu.Unlock()
}

func (c *Context) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

func (c *Context) Done() <-chan struct{} {
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

func (c *Context) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked()
	return c.err
}

func (c *Context) Value(key any) any { return c.values.Value(key) }
