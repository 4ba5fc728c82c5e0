package host

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// Runtime coordinates submissions to devices through four lanes per device
// (compute, upload, download, npu; the device is [Op.Device]) under one
// bounded submission capacity, and traces every lane occupancy. A stage on
// one GPU holds that GPU's compute lane, not another's.
//
// Two kinds of occupant use a lane:
//
//   - A coordinated submission ([Runtime.Submit]) shares its lane with
//     other coordinated submissions; admission is FIFO per lane.
//   - A native lease ([Runtime.AcquireCompute]) holds the compute lane
//     alone. It waits until every earlier compute occupant has left, and
//     every compute request that arrives after it waits behind it. The
//     other lanes keep flowing.
//
// Every occupant holds capacity units from admission to release; requests
// wait for capacity in FIFO order across all lanes.
//
// A Runtime is safe for concurrent use.
type Runtime struct {
	sched  *scheduler
	tracer *Tracer
	clock  func() time.Time

	mu          sync.Mutex
	quarantined map[string]int64 // owner → bytes kept charged
}

// NewRuntime creates a runtime. A zero Config means [NewConfig]'s
// defaults.
//
//	rt, err := host.NewRuntime(host.NewConfig())
//
// # Errors
//
// [errdefs.ErrInvalidArgument] for a capacity or trace capacity below 1.
func NewRuntime(cfg Config) (*Runtime, error) {
	if cfg.clock == nil {
		cfg = NewConfig()
	}
	if cfg.capacity < 1 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "runtime capacity %d: must be at least 1", cfg.capacity)
	}
	if cfg.traceCapacity < 1 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "trace capacity %d: must be at least 1", cfg.traceCapacity)
	}
	now := cfg.clock()
	return &Runtime{
		sched:       newScheduler(cfg.capacity),
		tracer:      newTracer(cfg.traceCapacity, now),
		clock:       cfg.clock,
		quarantined: map[string]int64{},
	}, nil
}

// Tracer returns the runtime's tracer.
func (r *Runtime) Tracer() *Tracer { return r.tracer }

// Capacity returns the bounded submission capacity.
func (r *Runtime) Capacity() int { return r.sched.capacity }

// Op describes one admission request.
type Op struct {
	Lane   Lane
	Owner  string // who submits; shown in traces
	Device string // which device the work targets: its lanes, and its trace track
	Cost   int    // capacity units; 0 means 1
	// Timeout, if positive, bounds the wait for admission, counted from
	// when the request is made: a request still waiting for its lane or
	// for capacity then gives up with [errdefs.ErrDeadlineExceeded],
	// holding nothing; one granted only as the timeout passes (the grant
	// raced with it) gives the grant back and fails the same way, so a
	// request that waits holds its lane before its timeout or not at all.
	// A request that need not wait is admitted at once.
	// 0: only the context bounds the wait.
	Timeout time.Duration
}

// deadline is when a request made at asked gives up waiting (zero:
// never).
func (op *Op) deadline(asked time.Time) time.Time {
	if op.Timeout <= 0 {
		return time.Time{}
	}
	return asked.Add(op.Timeout)
}

// Submit runs fn as a coordinated submission on op.Lane: it waits for
// admission, holds the lane and op.Cost capacity units while fn runs, then
// releases them and records the occupancy. fn runs on the caller's
// goroutine and typically enqueues device work and waits for it.
//
//	err := rt.Submit(ctx, host.Op{Lane: host.LaneUpload, Owner: "loader"}, func(ctx context.Context) error {
//		c, err := stream.Write(buf, 0, data)
//		if err != nil {
//			return err
//		}
//		return c.Wait(ctx)
//	})
//
// # Errors
//
//   - [errdefs.ErrBusy] for a compute submission made from inside a native
//     stage of this runtime (it would wait for its own lease).
//   - [errdefs.ErrOutOfBudget] if op.Cost exceeds the capacity: it never fits.
//   - [errdefs.ErrDeadlineExceeded] if ctx ends, or op.Timeout passes,
//     while waiting for admission; fn did not run.
//   - [errdefs.ErrInvalidArgument] for an unknown lane or negative cost.
//   - Otherwise, whatever fn returns.
func (r *Runtime) Submit(ctx context.Context, op Op, fn func(ctx context.Context) error) error {
	if op.Lane == LaneCompute && r.inStage(ctx) {
		return errdefs.Errorf(errdefs.ErrBusy, "compute submission by %q from inside a native stage of this runtime", op.Owner)
	}
	cost := max(op.Cost, 1)
	if op.Cost < 0 {
		cost = op.Cost
	}
	asked := r.clock()
	lane, waited, err := r.sched.acquire(ctx, op.Device, op.Lane, false, cost, op.deadline(asked))
	if err != nil {
		return err
	}
	start := asked
	if waited {
		start = r.clock()
	}
	failed := true // until fn returns: a panic in fn still releases the lane
	defer func() {
		r.sched.release(lane, false, cost)
		r.tracer.Record(Record{Start: start, Dur: r.clock().Sub(start), Wait: start.Sub(asked),
			Lane: op.Lane, Owner: op.Owner, Device: op.Device, Failed: failed})
	}()
	err = fn(ctx)
	failed = err != nil
	return err
}

// AcquireCompute takes a native lease on the compute lane for op.Owner and
// stores it in l, which must be idle (zero, or released). The lease waits
// for earlier compute to drain and blocks later compute until
// [Lease.Release]; upload, download and npu keep flowing. The wait ends
// at ctx's end or after op.Timeout, whichever is first; [Lease.Asked]
// says when it began, so that a stage's deadline can count from there. l is reusable so
// that a session can take a lease per stage without allocating.
//
// op.Lane is ignored: native leases are always on the compute lane.
//
// # Errors
//
//   - [errdefs.ErrBusy] if ctx comes from a lease of this runtime (a recursive
//     or re-entrant stage), instead of deadlocking, or if l is still held.
//   - [errdefs.ErrDeadlineExceeded] if ctx ends, or op.Timeout passes,
//     while waiting; nothing is held, and the request has left the queue,
//     so compute behind it moves up.
//   - [errdefs.ErrOutOfBudget] if op.Cost exceeds the capacity.
//   - [errdefs.ErrInvalidArgument] for a negative cost.
func (r *Runtime) AcquireCompute(ctx context.Context, op Op, l *Lease) error {
	if l.rt != nil {
		return errdefs.Errorf(errdefs.ErrBusy, "lease for %q is already held", l.op.Owner)
	}
	if r.inStage(ctx) {
		return errdefs.Errorf(errdefs.ErrBusy, "recursive native stage for %q in the same runtime", op.Owner)
	}
	op.Lane = LaneCompute
	cost := op.Cost
	if cost == 0 {
		cost = 1
	}
	asked := r.clock()
	lane, waited, err := r.sched.acquire(ctx, op.Device, LaneCompute, true, cost, op.deadline(asked))
	if err != nil {
		return err
	}
	start := asked
	if waited {
		start = r.clock()
	}
	// Field by field: the lease's fence context may still be read by a
	// goroutine of an earlier use (it synchronises itself), so the Lease
	// is never overwritten whole.
	l.rt, l.op, l.lane, l.cost, l.start, l.asked = r, op, lane, cost, start, asked
	l.now, l.end = 0, 0
	l.stage.init(ctx, r)
	return nil
}

// Reservation is capacity held by [Runtime.Reserve] until
// [Reservation.Release].
type Reservation struct {
	rt   *Runtime
	cost int
	once sync.Once
}

// Reserve holds op.Cost capacity units (0 means 1) until the returned
// reservation is released, taking no lane. It waits in the same FIFO as
// every lane occupant's capacity. It is for device work that lives longer
// than any call, whose occupancy its owner traces itself on the lanes it
// uses: a resident run (package sessions) holds a reservation from its
// submission until it ends, and records its participants on the compute
// and npu lanes. op.Lane and op.Device are not used.
//
// # Errors
//
//   - [errdefs.ErrDeadlineExceeded] if ctx ends while waiting for capacity.
//   - [errdefs.ErrOutOfBudget] if op.Cost exceeds the capacity.
//   - [errdefs.ErrInvalidArgument] for a negative cost.
func (r *Runtime) Reserve(ctx context.Context, op Op) (*Reservation, error) {
	cost := op.Cost
	if cost == 0 {
		cost = 1
	}
	if _, err := r.sched.acquireCapacity(ctx, cost); err != nil {
		return nil, err
	}
	return &Reservation{rt: r, cost: cost}, nil
}

// Release gives the reservation's capacity back. Only the first call
// does anything.
func (v *Reservation) Release() {
	v.once.Do(func() { v.rt.sched.releaseCapacity(v.cost) })
}

// LaneBusy reports whether device's lane has an occupant or a waiter
// right now. It is a placement hint (a pool prefers an instance whose
// device's compute lane is free): the answer may change as soon as it is
// returned. A device the runtime has not seen is not busy.
func (r *Runtime) LaneBusy(device string, lane Lane) bool {
	if int(lane) >= NumLanes {
		return false
	}
	s := r.sched
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.devices[device]
	if set == nil {
		return false
	}
	l := &set[lane]
	return l.leased || l.active > 0 || !l.queue.empty()
}

// LaneHolders is what holds one device's lanes at one moment.
type LaneHolders struct {
	Active [NumLanes]int  // coordinated occupants per lane
	Leased [NumLanes]bool // a native lease holds the lane
}

// DeviceLanes returns the holders of every device's lanes now, by device
// name ("" for ops that named no device), for every device the runtime
// has seen; [Stats] sums them over devices.
func (r *Runtime) DeviceLanes() map[string]LaneHolders {
	s := r.sched
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]LaneHolders, len(s.devices))
	for dev, set := range s.devices {
		var h LaneHolders
		for i := range set {
			h.Active[i], h.Leased[i] = set[i].active, set[i].leased
		}
		out[dev] = h
	}
	return out
}

type stageKey struct{ rt *Runtime }

func (r *Runtime) inStage(ctx context.Context) bool {
	return ctx.Value(stageKey{r}) != nil
}

// NoteQuarantine records that owner was quarantined with bytes of memory
// left charged; it shows in [Runtime.Stats].
func (r *Runtime) NoteQuarantine(owner string, bytes int64) {
	r.mu.Lock()
	r.quarantined[owner] += bytes
	r.mu.Unlock()
}

// Stats is a snapshot of the runtime's state.
type Stats struct {
	CapacityUsed      int
	Capacity          int
	ActivePerLane     [NumLanes]int  // coordinated occupants per lane, over all devices
	LeasedPerLane     [NumLanes]bool // a native lease held on the lane of some device
	Quarantined       []string       // quarantined owners, sorted
	QuarantinedBytes  int64          // memory they keep charged
	OccupanciesTraced uint64
}

// Stats returns a snapshot of capacity, lane holders and quarantines.
func (r *Runtime) Stats() Stats {
	used, active, leased := r.sched.snapshot()
	st := Stats{CapacityUsed: used, Capacity: r.sched.capacity, ActivePerLane: active, LeasedPerLane: leased,
		OccupanciesTraced: r.tracer.Total()}
	r.mu.Lock()
	for o, b := range r.quarantined {
		st.Quarantined = append(st.Quarantined, o)
		st.QuarantinedBytes += b
	}
	r.mu.Unlock()
	sort.Strings(st.Quarantined)
	return st
}
