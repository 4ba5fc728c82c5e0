package host

import (
	"context"
	"errors"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
)

// A reservation waits for capacity in the same FIFO as lane occupants:
// it waits behind earlier holders, a later submission does not overtake
// it, and its release lets the later one in.
func TestReserveIsFIFOWithLaneOccupants(t *testing.T) {
	rt := newTestRuntime(t, 2)
	q := queued(rt)
	ctx := context.Background()
	first := hold(rt, ctx, Op{Lane: LaneUpload, Owner: "first", Cost: 1})
	mustRecv(t, first.started, "first")

	got := make(chan *Reservation, 1)
	go func() {
		v, err := rt.Reserve(ctx, Op{Owner: "resident#1", Cost: 2})
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	recvQueued(t, q, NumLanes, true)

	later := hold(rt, ctx, Op{Lane: LaneDownload, Owner: "later", Cost: 1})
	recvQueued(t, q, LaneDownload, true) // 1 unit is free, yet it queues behind the reservation
	mustNotRecv(t, later.started, "a later submission overtaking the reservation")

	close(first.release)
	mustRecv(t, first.done, "first's release")
	var v *Reservation
	select {
	case v = <-got:
	case <-later.started:
		t.Fatal("the later submission was admitted before the reservation")
	}
	if st := rt.Stats(); st.CapacityUsed != 2 {
		t.Fatalf("capacity used %d while the reservation holds 2", st.CapacityUsed)
	}
	mustNotRecv(t, later.started, "a submission while the reservation holds all capacity")
	v.Release()
	v.Release() // a second release does nothing
	mustRecv(t, later.started, "the later submission after the release")
	close(later.release)
	mustRecv(t, later.done, "later's release")
	if st := rt.Stats(); st.CapacityUsed != 0 {
		t.Fatalf("capacity used %d after every release", st.CapacityUsed)
	}
}

// A reservation that cannot be admitted before its deadline fails with
// ErrDeadlineExceeded and leaves nothing held or queued.
func TestReserveDeadline(t *testing.T) {
	rt := newTestRuntime(t, 1)
	q := queued(rt)
	h := hold(rt, context.Background(), Op{Lane: LaneCompute, Owner: "holder"})
	mustRecv(t, h.started, "holder")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := rt.Reserve(ctx, Op{Owner: "resident#1"})
		errc <- err
	}()
	recvQueued(t, q, NumLanes, true)
	cancel()
	if err := <-errc; !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("Reserve after its context ended: %v, want ErrDeadlineExceeded", err)
	}
	close(h.release)
	mustRecv(t, h.done, "holder's release")
	if st := rt.Stats(); st.CapacityUsed != 0 {
		t.Fatalf("capacity used %d after a cancelled reservation", st.CapacityUsed)
	}
	if _, err := rt.Reserve(context.Background(), Op{Cost: 2}); !errors.Is(err, errdefs.ErrOutOfBudget) {
		t.Fatalf("Reserve of 2 units in a capacity of 1: %v, want ErrOutOfBudget", err)
	}
	v, err := rt.Reserve(context.Background(), Op{})
	if err != nil {
		t.Fatal(err)
	}
	v.Release()
}

// A reservation does not overtake a submission already waiting for
// capacity, even when its own cost would fit.
func TestReserveDoesNotBarge(t *testing.T) {
	rt := newTestRuntime(t, 2)
	q := queued(rt)
	ctx := context.Background()
	first := hold(rt, ctx, Op{Lane: LaneCompute, Owner: "first", Cost: 1})
	mustRecv(t, first.started, "first")
	big := hold(rt, ctx, Op{Lane: LaneUpload, Owner: "big", Cost: 2})
	recvQueued(t, q, LaneUpload, true)
	got := make(chan *Reservation, 1)
	go func() {
		v, err := rt.Reserve(ctx, Op{Owner: "resident#1", Cost: 1})
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	recvQueued(t, q, NumLanes, true) // one unit is free, yet it queues
	close(first.release)
	mustRecv(t, big.started, "the earlier submission")
	select {
	case <-got:
		t.Fatal("the reservation was admitted while the earlier submission holds all capacity")
	default:
	}
	close(big.release)
	(<-got).Release()
}
