package deploy

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// member is one instance of a session's pool: a Wasm stage session (with
// its own owner, streams and budget) on one device.
type member[T any] struct {
	val    T
	device string
	index  int

	// Under the pool's mu:
	lent    bool // held by a caller (or handed to a waiter), not yet released
	counted bool // counted in the pool's live
	retired bool // replaced: never handed out again; disposed once not lent
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
// The member set can change while calls run ([pool.replaceAll] swaps
// every instance, [pool.replaceAt] one): a replaced instance is retired.
// It is never handed out again, and it is given to dispose exactly once,
// as soon as no caller holds it: at once when it was free, else when its
// call releases it (the drain). A waiting caller is served by the new
// instances in its turn.
//
// Lock discipline: mu guards the member set, each member's flags, the
// free list, the waiters and live; dispose, busy's callers' work and
// channel receives happen outside it (a send to a waiter's channel never
// blocks: it has room for one, and each waiter gets one send).
//
// A pool is safe for concurrent use.
type pool[T any] struct {
	name    string
	limit   int           // callers that may wait; 0: none may
	timeout time.Duration // how long a caller may wait; 0: as long as its context allows
	busy    func(device string) bool
	down    func(T) error    // nil when the instance may serve
	dispose func(*member[T]) // a retired instance no caller holds; nil: nothing to do

	mu       sync.Mutex
	all      []*member[T] // the current instances, by index
	free     []*member[T]
	waiting  []*poolWaiter[T]
	live     int                 // current instances in service, free or lent
	draining map[*member[T]]bool // retired instances still lent

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
		p.addLocked(m)
	}
	return p
}

// addLocked puts a new member in service, unless it is down: to the first
// waiting caller, or to the free list. Called under p.mu.
func (p *pool[T]) addLocked(m *member[T]) {
	if p.down(m.val) != nil {
		return
	}
	m.counted = true
	p.live++
	p.handLocked(m)
}

// handLocked gives an instance in service to the first waiting caller, or
// to the free list. Called under p.mu.
func (p *pool[T]) handLocked(m *member[T]) {
	if len(p.waiting) > 0 {
		w := p.waiting[0]
		p.waiting = p.waiting[1:]
		m.lent = true
		w.ch <- m
		return
	}
	m.lent = false
	p.free = append(p.free, m)
}

// retireLocked takes m out of the pool for good. It reports whether m is
// idle (no caller holds it), so that the caller disposes of it once p.mu
// is released; a lent m is disposed by its release. Called under p.mu.
func (p *pool[T]) retireLocked(m *member[T]) (idle bool) {
	m.retired = true
	if m.counted {
		m.counted = false
		p.live--
	}
	for i, f := range p.free {
		if f == m {
			p.free = append(p.free[:i], p.free[i+1:]...)
			break
		}
	}
	if m.lent {
		if p.draining == nil {
			p.draining = map[*member[T]]bool{}
		}
		p.draining[m] = true
		return false
	}
	return true
}

// settleLocked tells every waiting caller when no instance is left in
// service. Called under p.mu.
func (p *pool[T]) settleLocked() {
	if p.live == 0 {
		for _, w := range p.waiting {
			w.ch <- nil
		}
		p.waiting = nil
	}
}

// replaceAll retires every current instance and puts vals (on devices,
// one each) in their place, as one step: a caller acquires either an old
// instance (before) or a new one (after), never a mix. The old ones that
// are free are disposed of before replaceAll returns; a lent one when its
// call releases it. vals must not be empty.
func (p *pool[T]) replaceAll(vals []T, devices []string) {
	p.mu.Lock()
	var idle []*member[T]
	for _, m := range p.all {
		if p.retireLocked(m) {
			idle = append(idle, m)
		}
	}
	p.all = make([]*member[T], 0, len(vals))
	for i, v := range vals {
		m := &member[T]{val: v, device: devices[i], index: i}
		p.all = append(p.all, m)
		p.addLocked(m)
	}
	p.settleLocked()
	p.mu.Unlock()
	p.disposeAll(idle)
}

// replaceAt retires the instance at index and puts val (on device) in its
// place, with the same index. The old one is disposed of at once when no
// caller holds it, else when its call releases it. It reports false, and
// changes nothing, when the pool has no instance at index.
func (p *pool[T]) replaceAt(index int, val T, device string) bool {
	p.mu.Lock()
	if index < 0 || index >= len(p.all) {
		p.mu.Unlock()
		return false
	}
	var idle []*member[T]
	if old := p.all[index]; p.retireLocked(old) {
		idle = append(idle, old)
	}
	m := &member[T]{val: val, device: device, index: index}
	p.all[index] = m
	p.addLocked(m)
	p.settleLocked()
	p.mu.Unlock()
	p.disposeAll(idle)
	return true
}

func (p *pool[T]) disposeAll(ms []*member[T]) {
	if p.dispose == nil {
		return
	}
	for _, m := range ms {
		p.dispose(m)
	}
}

// members returns the current instances, by index.
func (p *pool[T]) members() []*member[T] {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*member[T](nil), p.all...)
}

// tryAcquire returns a free instance at once, or nil when none is free.
// (A free instance and a waiting caller never coexist: release hands an
// instance to the first waiter, so taking a free one passes nobody.)
func (p *pool[T]) tryAcquire() *member[T] {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live == 0 || len(p.free) == 0 {
		return nil
	}
	return p.pick()
}

// acquire returns a free instance, waiting for one in arrival order.
//
// # Errors
//
//   - [errdefs.ErrBusy] when limit callers are already waiting (nothing was
//     queued), or after waiting the pool's timeout;
//   - [errdefs.ErrDeadlineExceeded] when ctx ends first;
//   - the reason an instance is out of service, when every instance is.
func (p *pool[T]) acquire(ctx context.Context) (*member[T], error) {
	p.mu.Lock()
	if p.live == 0 {
		err := p.allDownLocked()
		p.mu.Unlock()
		return nil, err
	}
	if len(p.waiting) == 0 && len(p.free) > 0 {
		m := p.pick()
		p.mu.Unlock()
		return m, nil
	}
	if len(p.waiting) >= p.limit {
		n := len(p.waiting)
		p.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrBusy, "session %q: queue full (%d calls waiting, queue_limit %d)", p.name, n, p.limit)
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
			p.mu.Lock()
			defer p.mu.Unlock()
			return nil, p.allDownLocked()
		}
		return m, nil
	case <-ctx.Done():
		err = errdefs.ContextError(ctx, fmt.Sprintf("waiting for session %q", p.name))
	case <-expired:
		err = errdefs.Errorf(errdefs.ErrBusy, "session %q: no instance free within queue_timeout %v", p.name, p.timeout)
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
	m.lent = true
	return m
}

// release gives an instance back after its call: to the first waiting
// caller, or to the free list. An instance that went out of service
// during the call leaves service; if it was the last one, every waiting
// caller is told. A retired instance is disposed of (its drain is over).
func (p *pool[T]) release(m *member[T]) {
	p.mu.Lock()
	if m.retired {
		m.lent = false
		delete(p.draining, m)
		p.mu.Unlock()
		p.disposeAll([]*member[T]{m})
		return
	}
	defer p.mu.Unlock()
	if p.down(m.val) != nil {
		m.lent = false
		if m.counted {
			m.counted = false
			p.live--
		}
		p.settleLocked()
		return
	}
	p.handLocked(m)
}

// allDownLocked returns why the pool cannot serve: the first instance's
// reason. Called under p.mu.
func (p *pool[T]) allDownLocked() error {
	for _, m := range p.all {
		if err := p.down(m.val); err != nil {
			if len(p.all) == 1 {
				return err
			}
			return fmt.Errorf("session %q: all %d instances are out of service; instance %d: %w", p.name, len(p.all), m.index, err)
		}
	}
	return errdefs.Errorf(errdefs.ErrClosed, "session %q has no instance", p.name)
}

// stats reports the instances in service, free, and the callers waiting.
func (p *pool[T]) stats() (live, free, waiting int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.live, len(p.free), len(p.waiting)
}

// drainingMembers returns the retired instances whose call still runs.
func (p *pool[T]) drainingMembers() []*member[T] {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*member[T], 0, len(p.draining))
	for m := range p.draining {
		out = append(out, m)
	}
	return out
}
