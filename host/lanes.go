package host

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// Lane is one of the runtime's submission lanes.
type Lane uint8

const (
	// LaneCompute carries compute submissions and native stage leases.
	LaneCompute Lane = iota
	// LaneUpload carries host-to-device transfers.
	LaneUpload
	// LaneDownload carries device-to-host transfers.
	LaneDownload
	// LaneNPU carries NPU submissions.
	LaneNPU
	// NumLanes is the number of lanes.
	NumLanes = 4
)

var laneNames = [NumLanes]string{"compute", "upload", "download", "npu"}

func (l Lane) String() string {
	if int(l) < NumLanes {
		return laneNames[l]
	}
	return "lane(?)"
}

// parseLane is the inverse of [Lane.String].
func parseLane(s string) (Lane, error) {
	for i, n := range laneNames {
		if n == s {
			return Lane(i), nil
		}
	}
	return 0, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown lane %q", s)
}

// waiter is one blocked admission request. It waits first in its lane's
// FIFO, then in the runtime-wide capacity FIFO.
type waiter struct {
	ready     chan struct{} // buffered(1): signalled once per grant
	lane      *laneState
	exclusive bool
	cost      int
	granted   bool // set under scheduler.mu by whoever grants
	next      *waiter
}

type fifo struct{ head, tail *waiter }

func (q *fifo) empty() bool { return q.head == nil }

func (q *fifo) push(w *waiter) {
	w.next = nil
	if q.tail == nil {
		q.head, q.tail = w, w
		return
	}
	q.tail.next, q.tail = w, w
}

func (q *fifo) pop() *waiter {
	w := q.head
	q.head = w.next
	if q.head == nil {
		q.tail = nil
	}
	w.next = nil
	return w
}

// remove unlinks w; it reports whether w was queued.
func (q *fifo) remove(w *waiter) bool {
	var prev *waiter
	for cur := q.head; cur != nil; prev, cur = cur, cur.next {
		if cur != w {
			continue
		}
		if prev == nil {
			q.head = cur.next
		} else {
			prev.next = cur.next
		}
		if q.tail == cur {
			q.tail = prev
		}
		cur.next = nil
		return true
	}
	return false
}

type laneState struct {
	active int  // coordinated occupants now holding the lane
	leased bool // an exclusive (native) holder owns the lane
	queue  fifo // requests waiting for the lane, in arrival order
}

// admits reports whether a request may take the lane now, ignoring the
// queue (the caller checks the queue is empty or that it is at its head).
func (l *laneState) admits(exclusive bool) bool {
	if exclusive {
		return !l.leased && l.active == 0
	}
	return !l.leased
}

func (l *laneState) take(exclusive bool) {
	if exclusive {
		l.leased = true
	} else {
		l.active++
	}
}

func (l *laneState) give(exclusive bool) {
	if exclusive {
		l.leased = false
	} else {
		l.active--
	}
}

// scheduler implements lane FIFOs and the bounded capacity.
//
// Every device has its own four lanes (a stage on one GPU does not hold
// the compute lane of another); the capacity is one, across all of them.
//
// Admission has two phases. First the request takes its lane, in FIFO
// order per lane: a coordinated request passes unless an exclusive holder
// owns the lane; an exclusive request waits until every earlier occupant
// has left (drain) and blocks everything that arrives after it (no
// overtaking). Then it takes capacity units, in FIFO order across all
// lanes (no barging). A lane held while waiting for capacity is what keeps
// later requests of that lane behind it; other lanes are unaffected.
type scheduler struct {
	mu       sync.Mutex
	capacity int
	used     int
	capQueue fifo
	devices  map[string]*[NumLanes]laneState // lanes by device name
	lastDev  string                          // the device laneFor found last,
	lastSet  *[NumLanes]laneState            // and its lanes: most requests repeat it
	pool     sync.Pool
	onQueue  func(lane Lane, capacity bool) // test hook: a request started waiting (under mu); lane NumLanes: a reservation
	now      func() time.Time               // the clock a grant after a wait is checked against its deadline with
}

func newScheduler(capacity int) *scheduler {
	s := &scheduler{capacity: capacity, devices: map[string]*[NumLanes]laneState{}, now: time.Now}
	s.pool.New = func() any { return &waiter{ready: make(chan struct{}, 1)} }
	return s
}

// laneFor returns a device's lane, making the device's lanes on first
// use. Called under s.mu.
func (s *scheduler) laneFor(device string, lane Lane) *laneState {
	if s.lastSet != nil && device == s.lastDev {
		return &s.lastSet[lane]
	}
	set := s.devices[device]
	if set == nil {
		set = new([NumLanes]laneState)
		s.devices[device] = set
	}
	s.lastDev, s.lastSet = device, set
	return &set[lane]
}

// acquire blocks until the request holds its lane on device and cost
// units, or ctx ends, or the deadline passes (a zero deadline: none). It
// returns the lane to give back to release, and whether it had to wait.
// A request that gives up holds nothing and leaves no trace in the
// queues: whoever was behind it moves up.
func (s *scheduler) acquire(ctx context.Context, device string, lane Lane, exclusive bool, cost int, deadline time.Time) (l *laneState, waited bool, err error) {
	if int(lane) >= NumLanes {
		return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown lane %d", lane)
	}
	if cost < 1 {
		return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "admission cost %d must be at least 1", cost)
	}
	if cost > s.capacity {
		return nil, false, errdefs.Errorf(errdefs.ErrOutOfBudget, "admission cost %d can never fit the runtime capacity %d", cost, s.capacity)
	}
	if err := ctx.Err(); err != nil {
		return nil, false, errdefs.ContextError(ctx, "admission")
	}
	var tm waitTimer // made only if the request has to wait
	defer tm.stop()
	s.mu.Lock()
	l = s.laneFor(device, lane)
	// Phase 1: the lane.
	if l.queue.empty() && l.admits(exclusive) {
		l.take(exclusive)
	} else {
		waited = true
		w := s.getWaiter(l, exclusive, cost)
		l.queue.push(w)
		if s.onQueue != nil {
			s.onQueue(lane, false)
		}
		s.mu.Unlock()
		if err := s.wait(ctx, tm.until(deadline), w, &l.queue, func() { s.releaseLane(l, exclusive) }); err != nil {
			return nil, true, s.waitError(ctx, err, lane, device)
		}
		s.mu.Lock()
	}
	// Phase 2: capacity, holding the lane.
	if s.capQueue.empty() && s.used+cost <= s.capacity {
		s.used += cost
		s.mu.Unlock()
		if waited {
			return s.grantedInTime(l, exclusive, cost, deadline, lane, device)
		}
		return l, false, nil
	}
	w := s.getWaiter(l, exclusive, cost)
	s.capQueue.push(w)
	if s.onQueue != nil {
		s.onQueue(lane, true)
	}
	s.mu.Unlock()
	err = s.wait(ctx, tm.until(deadline), w, &s.capQueue, func() {
		s.used -= cost
		s.promoteCapacity()
	})
	if err != nil {
		s.mu.Lock()
		s.releaseLane(l, exclusive)
		s.mu.Unlock()
		return nil, true, s.waitError(ctx, err, NumLanes, device)
	}
	return s.grantedInTime(l, exclusive, cost, deadline, lane, device)
}

// grantedInTime returns a request that waited and was granted its lane
// and capacity, unless the grant came at or after its deadline (it raced
// with the timer): then it gives both back, so that a request with a
// deadline either holds its lane before the deadline or not at all.
func (s *scheduler) grantedInTime(l *laneState, exclusive bool, cost int, deadline time.Time, lane Lane, device string) (*laneState, bool, error) {
	if deadline.IsZero() || s.now().Before(deadline) {
		return l, true, nil
	}
	s.release(l, exclusive, cost)
	return nil, true, errdefs.Errorf(errdefs.ErrDeadlineExceeded, "admission: granted the %s lane of device %q only as the deadline passed: %w", lane, device, context.DeadlineExceeded)
}

// errWaitDeadline is what wait returns when the request's own deadline
// passed; waitError names the wait.
var errWaitDeadline = fmt.Errorf("the deadline passed: %w", context.DeadlineExceeded)

// waitError turns wait's error into the admission error: the request's
// deadline passed while it waited for its lane (lane < NumLanes) or for
// capacity, or ctx ended.
func (s *scheduler) waitError(ctx context.Context, err error, lane Lane, device string) error {
	if err != errWaitDeadline {
		return err
	}
	what := "capacity"
	if lane < NumLanes {
		what = fmt.Sprintf("the %s lane of device %q", lane, device)
	}
	return errdefs.Errorf(errdefs.ErrDeadlineExceeded, "admission: waited for %s until %w", what, err)
}

// waitTimer is the timer of one admission request's deadline, made on
// the request's first wait and reused for its second.
type waitTimer struct{ t *time.Timer }

// until returns a channel that fires at deadline, or nil (never) for a
// zero deadline.
func (w *waitTimer) until(deadline time.Time) <-chan time.Time {
	if deadline.IsZero() {
		return nil
	}
	if w.t == nil {
		w.t = time.NewTimer(time.Until(deadline))
	}
	return w.t.C
}

func (w *waitTimer) stop() {
	if w.t != nil {
		w.t.Stop()
	}
}

// acquireCapacity blocks until the request holds cost units, in the same
// FIFO as every lane's requests, or ctx ends. It takes no lane.
func (s *scheduler) acquireCapacity(ctx context.Context, cost int) (waited bool, err error) {
	if cost < 1 {
		return false, errdefs.Errorf(errdefs.ErrInvalidArgument, "admission cost %d must be at least 1", cost)
	}
	if cost > s.capacity {
		return false, errdefs.Errorf(errdefs.ErrOutOfBudget, "admission cost %d can never fit the runtime capacity %d", cost, s.capacity)
	}
	if err := ctx.Err(); err != nil {
		return false, errdefs.ContextError(ctx, "admission")
	}
	s.mu.Lock()
	if s.capQueue.empty() && s.used+cost <= s.capacity {
		s.used += cost
		s.mu.Unlock()
		return false, nil
	}
	w := s.getWaiter(nil, false, cost)
	s.capQueue.push(w)
	if s.onQueue != nil {
		s.onQueue(NumLanes, true) // no lane
	}
	s.mu.Unlock()
	return true, s.wait(ctx, nil, w, &s.capQueue, func() {
		s.used -= cost
		s.promoteCapacity()
	})
}

// releaseCapacity gives back cost units taken by acquireCapacity.
func (s *scheduler) releaseCapacity(cost int) {
	s.mu.Lock()
	s.used -= cost
	s.promoteCapacity()
	s.mu.Unlock()
}

// wait blocks on w until granted, ctx ends or timeout fires (nil:
// never). When it gives up it unqueues w, or, if a grant raced with it,
// undoes the grant with undo (called under s.mu); it then returns
// errWaitDeadline for the timeout, or ctx's error.
func (s *scheduler) wait(ctx context.Context, timeout <-chan time.Time, w *waiter, q *fifo, undo func()) error {
	timedOut := false
	select {
	case <-w.ready:
		s.putWaiter(w)
		return nil
	case <-ctx.Done():
	case <-timeout:
		timedOut = true
	}
	s.mu.Lock()
	if w.granted {
		<-w.ready // the grant's signal is buffered; consume it
		undo()
	} else {
		q.remove(w)
		// Leaving may unblock whoever was behind us.
		s.promoteCapacity()
		if w.lane != nil { // nil: a capacity-only request (acquireCapacity)
			s.promoteLane(w.lane)
		}
	}
	s.mu.Unlock()
	s.putWaiter(w)
	if timedOut {
		return errWaitDeadline
	}
	return errdefs.ContextError(ctx, "admission")
}

// release gives back a lane and cost units taken by acquire.
func (s *scheduler) release(l *laneState, exclusive bool, cost int) {
	s.mu.Lock()
	s.used -= cost
	l.give(exclusive)
	s.promoteCapacity()
	s.promoteLane(l)
	s.mu.Unlock()
}

// releaseLane gives back a lane only. Called under s.mu.
func (s *scheduler) releaseLane(l *laneState, exclusive bool) {
	l.give(exclusive)
	s.promoteLane(l)
}

// promoteLane grants the lane to queued requests, in order, while they
// fit. Called under s.mu.
func (s *scheduler) promoteLane(l *laneState) {
	for !l.queue.empty() && l.admits(l.queue.head.exclusive) {
		w := l.queue.pop()
		l.take(w.exclusive)
		s.grant(w)
	}
}

// promoteCapacity grants capacity to queued requests, in order, while
// they fit. Called under s.mu.
func (s *scheduler) promoteCapacity() {
	for !s.capQueue.empty() && s.used+s.capQueue.head.cost <= s.capacity {
		w := s.capQueue.pop()
		s.used += w.cost
		s.grant(w)
	}
}

func (s *scheduler) grant(w *waiter) {
	w.granted = true
	w.ready <- struct{}{}
}

func (s *scheduler) getWaiter(l *laneState, exclusive bool, cost int) *waiter {
	w := s.pool.Get().(*waiter)
	w.lane, w.exclusive, w.cost, w.granted = l, exclusive, cost, false
	return w
}

func (s *scheduler) putWaiter(w *waiter) {
	w.lane = nil
	s.pool.Put(w)
}

// snapshot reports the capacity in use and the holders of each lane,
// summed over devices (leased: on any device).
func (s *scheduler) snapshot() (used int, active [NumLanes]int, leased [NumLanes]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, set := range s.devices {
		for i := range set {
			active[i] += set[i].active
			leased[i] = leased[i] || set[i].leased
		}
	}
	return s.used, active, leased
}
