package deploy

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/stagehost/stagehost/hw"
)

// member is one instance of a session's pool: a Wasm stage session (with
// its own owner, streams and budget) on one device.
type member[T any] struct {
	val    T
	device string
	index  int
}

// pool hands out a session's instances, one call at a time each, to
// callers in arrival order. A caller takes a free instance at once
// (preferring one on a device whose compute lane is free) or waits in
// the session's queue; the queue is bounded in length (limit) and in
// time (timeout). An instance that is out of service (quarantined or
// failed, as down reports) is never handed out again: it stays in the
// pool for its accounting, and the others serve. When every instance is
// out of service, callers get down's reason at once.
//
// A pool is safe for concurrent use.
type pool[T any] struct {
	name    string
	limit   int           // callers that may wait; 0: none may
	timeout time.Duration // how long a caller may wait; 0: as long as its context allows
	busy    func(device string) bool
	down    func(T) error // nil when the instance may serve

	mu      sync.Mutex
	all     []*member[T]
	free    []*member[T]
	waiting []*poolWaiter[T]
	live    int // instances in service, free or lent

	onQueue func() // test hook: a caller started waiting (under mu)
}

type poolWaiter[T any] struct {
	ch chan *member[T] // receives the instance, or nil when none is left in service
}

// newPool makes a pool of vals, on devices (one per val). busy reports
// whether a device's compute lane is occupied; down whether an instance
// is out of service and why.
func newPool[T any](name string, vals []T, devices []string, limit int, timeout time.Duration,
	busy func(string) bool, down func(T) error) *pool[T] {
	p := &pool[T]{name: name, limit: limit, timeout: timeout, busy: busy, down: down}
	for i, v := range vals {
		m := &member[T]{val: v, device: devices[i], index: i}
		p.all = append(p.all, m)
		if down(v) == nil {
			p.free = append(p.free, m)
			p.live++
		}
	}
	return p
}

// acquire returns a free instance, waiting for one in arrival order.
//
// # Errors
//
//   - [hw.ErrBusy] when limit callers are already waiting (nothing was
//     queued), or after waiting the pool's timeout;
//   - [hw.ErrDeadlineExceeded] when ctx ends first;
//   - the reason an instance is out of service, when every instance is.
func (p *pool[T]) acquire(ctx context.Context) (*member[T], error) {
	p.mu.Lock()
	if p.live == 0 {
		p.mu.Unlock()
		return nil, p.allDown()
	}
	if len(p.waiting) == 0 && len(p.free) > 0 {
		m := p.pick()
		p.mu.Unlock()
		return m, nil
	}
	if len(p.waiting) >= p.limit {
		n := len(p.waiting)
		p.mu.Unlock()
		return nil, hw.Errorf(hw.ErrBusy, "session %q: queue full (%d calls waiting, queue_limit %d)", p.name, n, p.limit)
	}
	w := &poolWaiter[T]{ch: make(chan *member[T], 1)}
	p.waiting = append(p.waiting, w)
	if p.onQueue != nil {
		p.onQueue()
	}
	p.mu.Unlock()

	var expired <-chan time.Time
	if p.timeout > 0 {
		t := time.NewTimer(p.timeout)
		defer t.Stop()
		expired = t.C
	}
	var err error
	select {
	case m := <-w.ch:
		if m == nil {
			return nil, p.allDown()
		}
		return m, nil
	case <-ctx.Done():
		err = hw.ContextError(ctx, fmt.Sprintf("waiting for session %q", p.name))
	case <-expired:
		err = hw.Errorf(hw.ErrBusy, "session %q: no instance free within queue_timeout %v", p.name, p.timeout)
	}
	p.mu.Lock()
	for i, x := range p.waiting {
		if x == w {
			p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
			p.mu.Unlock()
			return nil, err
		}
	}
	p.mu.Unlock()
	// Handed an instance (or told none is left) as we gave up: pass it on.
	if m := <-w.ch; m != nil {
		p.release(m)
	}
	return nil, err
}

// pick takes a free instance, preferring one whose device's compute lane
// is free. Called under p.mu with p.free non-empty.
func (p *pool[T]) pick() *member[T] {
	at := 0
	if len(p.free) > 1 && p.busy != nil {
		for i, m := range p.free {
			if !p.busy(m.device) {
				at = i
				break
			}
		}
	}
	m := p.free[at]
	p.free = append(p.free[:at], p.free[at+1:]...)
	return m
}

// release gives an instance back after its call: to the first waiting
// caller, or to the free list. An instance that went out of service
// during the call leaves service; if it was the last one, every waiting
// caller is told.
func (p *pool[T]) release(m *member[T]) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down(m.val) != nil {
		p.live--
		if p.live == 0 {
			for _, w := range p.waiting {
				w.ch <- nil
			}
			p.waiting = nil
		}
		return
	}
	if len(p.waiting) > 0 {
		w := p.waiting[0]
		p.waiting = p.waiting[1:]
		w.ch <- m
		return
	}
	p.free = append(p.free, m)
}

// allDown returns why the pool cannot serve: the first instance's reason.
func (p *pool[T]) allDown() error {
	for _, m := range p.all {
		if err := p.down(m.val); err != nil {
			if len(p.all) == 1 {
				return err
			}
			return fmt.Errorf("session %q: all %d instances are out of service; instance %d: %w", p.name, len(p.all), m.index, err)
		}
	}
	return hw.Errorf(hw.ErrClosed, "session %q has no instance", p.name)
}

// stats reports the instances in service, free, and the callers waiting.
func (p *pool[T]) stats() (live, free, waiting int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.live, len(p.free), len(p.waiting)
}
