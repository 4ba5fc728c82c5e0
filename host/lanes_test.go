package host

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/testutil"
)

func newTestRuntime(t testing.TB, capacity int) *Runtime {
	t.Helper()
	rt, err := NewRuntime(NewConfig().WithCapacity(capacity).WithTraceCapacity(1 << 16))
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// queued returns a channel that receives one value each time a request
// starts waiting in a lane queue (capacity=false) or the capacity queue.
func queued(rt *Runtime) chan [2]any {
	ch := make(chan [2]any, 1024)
	rt.sched.onQueue = func(l Lane, capacity bool) { ch <- [2]any{l, capacity} }
	return ch
}

func recvQueued(t *testing.T, ch chan [2]any, lane Lane, capacity bool) {
	t.Helper()
	select {
	case got := <-ch:
		if got[0] != lane || got[1] != capacity {
			t.Fatalf("queued %v (capacity %v), want %v (capacity %v)", got[0], got[1], lane, capacity)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("nothing queued on %v", lane)
	}
}

// holder runs a coordinated submission that holds its lane until released.
type holder struct {
	started, release, done chan struct{}
	err                    error
}

func hold(rt *Runtime, ctx context.Context, op Op) *holder {
	h := &holder{started: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		h.err = rt.Submit(ctx, op, func(context.Context) error {
			close(h.started)
			<-h.release
			return nil
		})
	}()
	return h
}

func mustRecv(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func mustNotRecv(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s happened too early", what)
	default:
	}
}

func TestCapacityNeverExceededUnderHammer(t *testing.T) {
	const capacity, goroutines, rounds = 5, 64, 200
	rt := newTestRuntime(t, capacity)
	var inUse, peak atomic.Int64
	var leaseHolders atomic.Int32
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var l Lease
			for range rounds {
				cost := 1 + rng.IntN(capacity)
				enter := func() {
					now := inUse.Add(int64(cost))
					for {
						p := peak.Load()
						if now <= p || peak.CompareAndSwap(p, now) {
							break
						}
					}
					if now > capacity {
						t.Errorf("capacity exceeded: %d > %d", now, capacity)
					}
				}
				leave := func() { inUse.Add(-int64(cost)) }
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(10) == 0 {
					cancel() // some requests give up at once or while queued
				}
				switch rng.IntN(3) {
				case 0:
					if err := rt.AcquireCompute(ctx, Op{Owner: "native", Cost: cost}, &l); err == nil {
						if leaseHolders.Add(1) != 1 {
							t.Error("two native leases held at once")
						}
						enter()
						leave()
						leaseHolders.Add(-1)
						l.Release(false)
					} else if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
						t.Error(err)
					}
				default:
					lane := Lane(rng.IntN(NumLanes))
					err := rt.Submit(ctx, Op{Lane: lane, Owner: "coord", Cost: cost}, func(context.Context) error {
						if lane == LaneCompute && leaseHolders.Load() != 0 {
							t.Error("compute submission ran during a native lease")
						}
						enter()
						leave()
						return nil
					})
					if err != nil && !errors.Is(err, errdefs.ErrDeadlineExceeded) {
						t.Error(err)
					}
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	st := rt.Stats()
	if st.CapacityUsed != 0 {
		t.Fatalf("capacity still in use after the hammer: %d", st.CapacityUsed)
	}
	for i := range NumLanes {
		if st.ActivePerLane[i] != 0 || st.LeasedPerLane[i] {
			t.Fatalf("lane %v still held: %+v", Lane(i), st)
		}
	}
	if peak.Load() == 0 {
		t.Fatal("nothing ran")
	}
	t.Logf("peak units in use %d of %d", peak.Load(), capacity)
}

func TestRequestThatCanNeverFitIsRejectedAtOnce(t *testing.T) {
	rt := newTestRuntime(t, 4)
	err := rt.Submit(context.Background(), Op{Lane: LaneUpload, Cost: 5}, func(context.Context) error {
		t.Fatal("ran")
		return nil
	})
	if !errors.Is(err, errdefs.ErrOutOfBudget) {
		t.Fatalf("got %v, want ErrOutOfBudget", err)
	}
	var l Lease
	if err := rt.AcquireCompute(context.Background(), Op{Cost: 9}, &l); !errors.Is(err, errdefs.ErrOutOfBudget) {
		t.Fatalf("lease: got %v, want ErrOutOfBudget", err)
	}
}

func TestDeadlineFiresWhileWaitingForAdmission(t *testing.T) {
	rt := newTestRuntime(t, 1)
	q := queued(rt)
	h := hold(rt, context.Background(), Op{Lane: LaneUpload, Owner: "holder"})
	mustRecv(t, h.started, "holder start")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := rt.Submit(ctx, Op{Lane: LaneDownload, Owner: "late"}, func(context.Context) error {
		t.Error("admitted past capacity")
		return nil
	})
	recvQueued(t, q, LaneDownload, true)
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want ErrDeadlineExceeded wrapping context.DeadlineExceeded", err)
	}
	// The same for a native lease waiting for the lane.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	var l Lease
	if err := rt.AcquireCompute(ctx2, Op{Owner: "stage"}, &l); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("lease: got %v", err)
	}
	close(h.release)
	mustRecv(t, h.done, "holder done")
	// Nothing leaked: the capacity is whole again.
	if err := rt.AcquireCompute(context.Background(), Op{Owner: "after"}, &l); err != nil {
		t.Fatal(err)
	}
	l.Release(false)
	if st := rt.Stats(); st.CapacityUsed != 0 {
		t.Fatalf("capacity used %d", st.CapacityUsed)
	}
}

func TestNativeLeaseWaitsForEarlierComputeAndBlocksLaterCompute(t *testing.T) {
	rt := newTestRuntime(t, 8)
	q := queued(rt)
	var order []string
	var mu sync.Mutex
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }

	early := hold(rt, context.Background(), Op{Lane: LaneCompute, Owner: "early"})
	mustRecv(t, early.started, "early compute")
	note("early")

	leased := make(chan struct{})
	var l Lease
	leaseDone := make(chan struct{})
	go func() {
		defer close(leaseDone)
		if err := rt.AcquireCompute(context.Background(), Op{Owner: "stage"}, &l); err != nil {
			t.Error(err)
			return
		}
		note("stage")
		close(leased)
	}()
	recvQueued(t, q, LaneCompute, false) // the stage waits for the drain

	late := hold(rt, context.Background(), Op{Lane: LaneCompute, Owner: "late"})
	recvQueued(t, q, LaneCompute, false) // later compute waits behind the stage

	// Other lanes keep flowing meanwhile.
	up := hold(rt, context.Background(), Op{Lane: LaneUpload, Owner: "upload"})
	mustRecv(t, up.started, "upload during waiting stage")
	close(up.release)

	mustNotRecv(t, leased, "stage admission before earlier compute drained")
	close(early.release)
	mustRecv(t, leased, "stage admission")
	mustNotRecv(t, late.started, "late compute overtaking the stage")
	note("release")
	l.Release(false)
	mustRecv(t, late.started, "late compute")
	note("late")
	close(late.release)
	mustRecv(t, late.done, "late done")
	<-leaseDone
	want := []string{"early", "stage", "release", "late"}
	if len(order) != len(want) {
		t.Fatalf("order %v", order)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order %v, want %v", order, want)
		}
	}
}

func TestCapacityQueueIsFIFOWithoutBarging(t *testing.T) {
	rt := newTestRuntime(t, 2)
	q := queued(rt)
	a := hold(rt, context.Background(), Op{Lane: LaneUpload, Owner: "a"})
	b := hold(rt, context.Background(), Op{Lane: LaneDownload, Owner: "b"})
	mustRecv(t, a.started, "a")
	mustRecv(t, b.started, "b")
	big := hold(rt, context.Background(), Op{Lane: LaneNPU, Owner: "big", Cost: 2})
	recvQueued(t, q, LaneNPU, true)
	small := hold(rt, context.Background(), Op{Lane: LaneCompute, Owner: "small", Cost: 1})
	recvQueued(t, q, LaneCompute, true)

	close(a.release) // one unit frees: small would fit, but big is first
	mustRecv(t, a.done, "a done")
	mustNotRecv(t, small.started, "small barging past big")
	mustNotRecv(t, big.started, "big with one unit")
	close(b.release)
	mustRecv(t, big.started, "big")
	mustNotRecv(t, small.started, "small while big holds everything")
	close(big.release)
	mustRecv(t, small.started, "small")
	close(small.release)
	mustRecv(t, small.done, "small done")
}

func TestCancelledQueueHeadUnblocksThoseBehind(t *testing.T) {
	rt := newTestRuntime(t, 4)
	q := queued(rt)
	early := hold(rt, context.Background(), Op{Lane: LaneCompute, Owner: "early"})
	mustRecv(t, early.started, "early")
	ctx, cancel := context.WithCancel(context.Background())
	leaseErr := make(chan error, 1)
	go func() {
		var l Lease
		leaseErr <- rt.AcquireCompute(ctx, Op{Owner: "stage"}, &l)
	}()
	recvQueued(t, q, LaneCompute, false)
	late := hold(rt, context.Background(), Op{Lane: LaneCompute, Owner: "late"})
	recvQueued(t, q, LaneCompute, false)
	mustNotRecv(t, late.started, "late past a waiting stage")
	cancel()
	if err := <-leaseErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	mustRecv(t, late.started, "late after the stage gave up")
	close(late.release)
	close(early.release)
	mustRecv(t, early.done, "early")
	mustRecv(t, late.done, "late")
}

func TestRecursiveLeaseAndComputeFromStageReturnBusy(t *testing.T) {
	rt := newTestRuntime(t, 4)
	var outer, inner Lease
	// With a deadline: a recursive admission that waits instead of
	// answering busy fails the test at once rather than hanging it.
	base := testutil.Context(t, 5*time.Second)
	if err := rt.AcquireCompute(base, Op{Owner: "outer"}, &outer); err != nil {
		t.Fatal(err)
	}
	ctx := outer.Context()
	if err := rt.AcquireCompute(ctx, Op{Owner: "inner"}, &inner); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("recursive lease: %v", err)
	}
	if err := rt.Submit(ctx, Op{Lane: LaneCompute}, func(context.Context) error { return nil }); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("compute from stage: %v", err)
	}
	if err := rt.Submit(ctx, Op{Lane: LaneUpload}, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("upload from stage: %v", err)
	}
	// Another runtime is independent.
	other := newTestRuntime(t, 1)
	if err := other.AcquireCompute(ctx, Op{Owner: "other"}, &inner); err != nil {
		t.Fatal(err)
	}
	inner.Release(false)
	outer.Release(false)
	if err := rt.AcquireCompute(base, Op{Owner: "again"}, &inner); err != nil {
		t.Fatal(err)
	}
	inner.Release(false)
}

func TestFenceContextHasItsOwnDeadlineAndIgnoresStageCancellation(t *testing.T) {
	rt := newTestRuntime(t, 1)
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	var l Lease
	if err := rt.AcquireCompute(ctx, Op{Owner: "s"}, &l); err != nil {
		t.Fatal(err)
	}
	cancel()
	if l.Context().Err() == nil {
		t.Fatal("stage context must follow the caller's cancellation")
	}
	for round := range 3 {
		fctx := l.FenceContext(5 * time.Millisecond)
		if fctx.Value(key{}) != "v" || !rt.inStage(fctx) {
			t.Fatal("fence context lost values or the stage marker")
		}
		if round == 0 && fctx.Err() != nil {
			t.Fatal("fence context inherited the stage cancellation")
		}
		mustRecv(t, fctx.Done(), "fence deadline")
		if !errors.Is(fctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("fence err %v", fctx.Err())
		}
	}
	fctx := l.FenceContext(time.Hour) // re-armed after expiry
	mustNotRecv(t, fctx.Done(), "re-armed fence deadline")
	if fctx.Err() != nil {
		t.Fatal(fctx.Err())
	}
	l.Release(false)
}

func TestPanickingSubmissionReleasesItsLane(t *testing.T) {
	rt := newTestRuntime(t, 1)
	func() {
		defer func() {
			if recover() != "boom" {
				t.Fatal("the panic did not reach the caller")
			}
		}()
		_ = rt.Submit(context.Background(), Op{Lane: LaneUpload, Owner: "p"}, func(context.Context) error { panic("boom") })
	}()
	if st := rt.Stats(); st.CapacityUsed != 0 || st.ActivePerLane[LaneUpload] != 0 {
		t.Fatalf("lane or capacity still held after a panic: %+v", st)
	}
	if recs := rt.Tracer().Records(); len(recs) != 1 || !recs[0].Failed {
		t.Fatalf("the panicking occupancy was not traced as failed: %+v", recs)
	}
}

func TestEachDeviceHasItsOwnLanesUnderOneCapacity(t *testing.T) {
	rt := newTestRuntime(t, 2)
	q := queued(rt)
	var gpu0, gpu1, again Lease
	ctx := testutil.Context(t, time.Minute)
	if err := rt.AcquireCompute(ctx, Op{Owner: "a", Device: "gpu0"}, &gpu0); err != nil {
		t.Fatal(err)
	}
	// Another device's compute lane is free: no waiting.
	if err := rt.AcquireCompute(ctx, Op{Owner: "b", Device: "gpu1"}, &gpu1); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-q:
		t.Fatalf("a lease on another device waited: %v", got)
	default:
	}
	// The capacity is shared: a third holder (any device, any lane) waits.
	up := hold(rt, ctx, Op{Lane: LaneUpload, Owner: "c", Device: "gpu2"})
	recvQueued(t, q, LaneUpload, true)
	mustNotRecv(t, up.started, "a third occupant past a capacity of 2")
	// The same device's compute lane is exclusive.
	done := make(chan error, 1)
	go func() { done <- rt.AcquireCompute(ctx, Op{Owner: "d", Device: "gpu0"}, &again) }()
	recvQueued(t, q, LaneCompute, false)
	gpu1.Release(false)
	mustRecv(t, up.started, "the upload once capacity freed")
	close(up.release)
	mustRecv(t, up.done, "upload done")
	gpu0.Release(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	again.Release(false)
	if st := rt.Stats(); st.CapacityUsed != 0 || st.LeasedPerLane[LaneCompute] {
		t.Fatalf("%+v", st)
	}
}

func TestLaneBusyReportsHoldersAndWaitersPerDevice(t *testing.T) {
	rt := newTestRuntime(t, 4)
	q := queued(rt)
	ctx := testutil.Context(t, time.Minute)
	if rt.LaneBusy("gpu0", LaneCompute) || rt.LaneBusy("never-seen", LaneUpload) || rt.LaneBusy("gpu0", Lane(NumLanes)) {
		t.Fatal("busy before any occupant")
	}
	var lease Lease
	if err := rt.AcquireCompute(ctx, Op{Owner: "a", Device: "gpu0"}, &lease); err != nil {
		t.Fatal(err)
	}
	if !rt.LaneBusy("gpu0", LaneCompute) {
		t.Fatal("a held lease is not busy")
	}
	if rt.LaneBusy("gpu1", LaneCompute) || rt.LaneBusy("gpu0", LaneUpload) {
		t.Fatal("another device's lane, or another lane, reads busy")
	}
	up := hold(rt, ctx, Op{Lane: LaneUpload, Owner: "b", Device: "gpu1"})
	mustRecv(t, up.started, "upload started")
	if !rt.LaneBusy("gpu1", LaneUpload) {
		t.Fatal("a coordinated occupant is not busy")
	}
	close(up.release)
	mustRecv(t, up.done, "upload done")
	if rt.LaneBusy("gpu1", LaneUpload) {
		t.Fatal("busy after its occupant left")
	}
	// The lane passes from a released lease to the one waiting for it.
	var again Lease
	done := make(chan error, 1)
	go func() { done <- rt.AcquireCompute(ctx, Op{Owner: "c", Device: "gpu0"}, &again) }()
	recvQueued(t, q, LaneCompute, false)
	lease.Release(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !rt.LaneBusy("gpu0", LaneCompute) {
		t.Fatal("the promoted waiter's lease is not busy")
	}
	again.Release(false)
	if rt.LaneBusy("gpu0", LaneCompute) {
		t.Fatal("busy after every lease was released")
	}
}

// TestOpTimeoutBoundsTheWaitForTheLane: a lease whose Op.Timeout passes
// while an earlier lease holds the compute lane gives up at its timeout,
// counted from when it asked, not when the lane frees; it holds nothing
// and leaves the queue, so the compute behind it still waits only for the
// holder, in order. The same timeout bounds the wait for capacity.
func TestOpTimeoutBoundsTheWaitForTheLane(t *testing.T) {
	rt := newTestRuntime(t, 2)
	q := queued(rt)
	var first Lease
	if err := rt.AcquireCompute(context.Background(), Op{Owner: "holder", Device: "gpu0"}, &first); err != nil {
		t.Fatal(err)
	}
	const timeout = 30 * time.Millisecond
	asked := time.Now()
	gaveUp := make(chan error, 1)
	go func() {
		var l Lease
		gaveUp <- rt.AcquireCompute(context.Background(), Op{Owner: "bounded", Device: "gpu0", Timeout: timeout}, &l)
	}()
	recvQueued(t, q, LaneCompute, false)
	late := hold(rt, context.Background(), Op{Lane: LaneCompute, Owner: "late", Device: "gpu0"})
	recvQueued(t, q, LaneCompute, false)
	var err error
	select {
	case err = <-gaveUp:
	case <-time.After(10 * time.Second):
		t.Fatal("the bounded lease still waits 10 s after its timeout of 30 ms")
	}
	waited := time.Since(asked)
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want ErrDeadlineExceeded", err)
	}
	if msg := err.Error(); !strings.Contains(msg, `compute lane of device "gpu0"`) {
		t.Fatalf("the error does not name the lane: %v", err)
	}
	if waited < timeout {
		t.Fatalf("gave up after %v, before its timeout of %v", waited, timeout)
	}
	// The holder still holds the lane: the compute behind the request
	// that gave up waits for it, and only for it.
	mustNotRecv(t, late.started, "late compute while the lane is held")
	if st := rt.Stats(); st.CapacityUsed != 1 {
		t.Fatalf("capacity used %d after the bounded lease gave up, want 1 (the holder's)", st.CapacityUsed)
	}
	first.Release(false)
	mustRecv(t, late.started, "late compute after the holder")
	close(late.release)
	mustRecv(t, late.done, "late done")

	// Capacity: both units held on other lanes, the lease's own lane free.
	a := hold(rt, context.Background(), Op{Lane: LaneUpload, Owner: "a", Cost: 2})
	mustRecv(t, a.started, "a")
	var l Lease
	err = rt.AcquireCompute(context.Background(), Op{Owner: "bounded", Device: "gpu0", Timeout: timeout}, &l)
	recvQueued(t, q, LaneCompute, true)
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("waiting for capacity: got %v, want ErrDeadlineExceeded naming the capacity", err)
	}
	close(a.release)
	mustRecv(t, a.done, "a done")
	// Nothing leaked: the lane and the capacity are whole again, and a
	// request that need not wait is admitted whatever its timeout.
	if err := rt.AcquireCompute(context.Background(), Op{Owner: "after", Device: "gpu0", Timeout: time.Nanosecond}, &l); err != nil {
		t.Fatal(err)
	}
	l.Release(false)
	if st := rt.Stats(); st.CapacityUsed != 0 || st.LeasedPerLane[LaneCompute] {
		t.Fatalf("after: %+v", st)
	}
}

// TestAGrantAtTheDeadlineIsGivenBack: a request whose lane is granted
// only as its deadline passes (the grant raced with its timer) gives the
// lane and capacity back and fails with ErrDeadlineExceeded: a request
// with a timeout holds its lane before the deadline or not at all. The
// scheduler's clock is moved past the deadline so that the grant, not
// the timer, comes first.
func TestAGrantAtTheDeadlineIsGivenBack(t *testing.T) {
	rt := newTestRuntime(t, 4)
	q := queued(rt)
	rt.sched.now = func() time.Time { return time.Now().Add(time.Hour) }
	var holder Lease
	if err := rt.AcquireCompute(context.Background(), Op{Owner: "holder", Device: "gpu0"}, &holder); err != nil {
		t.Fatal(err)
	}
	gaveUp := make(chan error, 1)
	var l Lease
	go func() {
		gaveUp <- rt.AcquireCompute(context.Background(), Op{Owner: "bounded", Device: "gpu0", Timeout: 30 * time.Minute}, &l)
	}()
	recvQueued(t, q, LaneCompute, false)
	late := hold(rt, context.Background(), Op{Lane: LaneCompute, Owner: "late", Device: "gpu0"})
	recvQueued(t, q, LaneCompute, false)
	holder.Release(false)
	var err error
	select {
	case err = <-gaveUp:
	case <-time.After(10 * time.Second):
		t.Fatal("the bounded lease was never granted")
	}
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "granted") || l.Held() {
		t.Fatalf("got %v (held %v), want ErrDeadlineExceeded for a grant at the deadline", err, l.Held())
	}
	mustRecv(t, late.started, "late compute after the lane was given back")
	close(late.release)
	mustRecv(t, late.done, "late done")
	if st := rt.Stats(); st.CapacityUsed != 0 || st.LeasedPerLane[LaneCompute] {
		t.Fatalf("after: %+v", st)
	}
}
