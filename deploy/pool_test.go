package deploy

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// fakeInst is a pool member whose health the test sets.
type fakeInst struct {
	name string
	down atomic.Pointer[error]
}

func (f *fakeInst) fail(err error) { f.down.Store(&err) }

func fakeDown(f *fakeInst) error {
	if p := f.down.Load(); p != nil {
		return *p
	}
	return nil
}

func newFakePool(t *testing.T, n, limit int, timeout time.Duration, busy func(string) bool) (*pool[*fakeInst], []*fakeInst, chan struct{}) {
	t.Helper()
	insts := make([]*fakeInst, n)
	devs := make([]string, n)
	for i := range insts {
		insts[i] = &fakeInst{name: string(rune('a' + i))}
		devs[i] = "gpu" + string(rune('0'+i))
	}
	p := newPool("s", insts, devs, limit, timeout, busy, fakeDown)
	queued := make(chan struct{}, 64)
	p.onQueue = func() { queued <- struct{}{} }
	return p, insts, queued
}

func recvWithin(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestPoolPrefersAnInstanceWhoseDeviceIsFree(t *testing.T) {
	busy := map[string]bool{"gpu0": true, "gpu1": true}
	p, insts, _ := newFakePool(t, 3, 0, 0, func(d string) bool { return busy[d] })
	m, err := p.acquire(context.Background())
	if err != nil || m.val != insts[2] {
		t.Fatalf("got %v, %v; want the instance on the idle gpu2", m, err)
	}
	// Every device busy: the first free instance.
	busy["gpu2"] = true
	if m2, err := p.acquire(context.Background()); err != nil || m2.val != insts[0] {
		t.Fatalf("got %v, %v; want the first free instance", m2, err)
	}
}

func TestPoolQueueIsFIFOAndBounded(t *testing.T) {
	p, insts, queued := newFakePool(t, 1, 2, 0, nil)
	ctx := context.Background()
	held, err := p.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 2)
	for i := range 2 {
		go func() {
			m, err := p.acquire(ctx)
			if err != nil {
				t.Error(err)
				got <- -1
				return
			}
			got <- i
			p.release(m)
		}()
		recvWithin(t, queued, "a caller queued") // in order: 0, then 1
	}
	// A third caller finds the queue full and is refused at once (were it
	// queued, it would wait for the bound and fail otherwise).
	bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := p.acquire(bounded); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("third waiter: %v, want ErrBusy", err)
	}
	if live, free, waiting := p.stats(); live != 1 || free != 0 || waiting != 2 {
		t.Fatalf("stats %d %d %d", live, free, waiting)
	}
	p.release(held)
	if a, b := <-got, <-got; a != 0 || b != 1 {
		t.Fatalf("served %d then %d, want 0 then 1", a, b)
	}
	if live, free, waiting := p.stats(); live != 1 || free != 1 || waiting != 0 {
		t.Fatalf("after: stats %d %d %d", live, free, waiting)
	}
	if m, err := p.acquire(ctx); err != nil || m.val != insts[0] {
		t.Fatal(m, err)
	}
}

func TestPoolWaitEndsWithTheTimeoutOrTheContext(t *testing.T) {
	p, _, queued := newFakePool(t, 1, 4, time.Millisecond, nil)
	held, err := p.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.acquire(context.Background()); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("after the queue timeout: %v, want ErrBusy", err)
	}
	<-queued
	p.timeout = 0 // as long as the context allows
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := p.acquire(ctx); done <- err }()
	recvWithin(t, queued, "the caller queued")
	cancel()
	if err := <-done; !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("cancelled: %v, want ErrDeadlineExceeded", err)
	}
	// Nobody is left waiting: the released instance goes back to the free list.
	p.release(held)
	if live, free, waiting := p.stats(); live != 1 || free != 1 || waiting != 0 {
		t.Fatalf("stats %d %d %d", live, free, waiting)
	}
}

func TestPoolOutOfServiceInstancesLeaveAndTheLastOneFailsWaiters(t *testing.T) {
	p, insts, queued := newFakePool(t, 2, 4, 0, nil)
	ctx := context.Background()
	a, _ := p.acquire(ctx)
	b, _ := p.acquire(ctx)
	errQ := errdefs.Errorf(errdefs.ErrDeviceLost, "quarantined: fence timed out")
	insts[0].fail(errQ)
	p.release(a) // leaves service
	if live, free, _ := p.stats(); live != 1 || free != 0 {
		t.Fatalf("a quarantined instance came back: live %d free %d", live, free)
	}
	done := make(chan error, 1)
	go func() { _, err := p.acquire(ctx); done <- err }()
	recvWithin(t, queued, "the caller queued")
	insts[1].fail(errQ)
	p.release(b) // the last one: the waiter is told at once
	if err := <-done; !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("waiter: %v, want the quarantine's ErrDeviceLost", err)
	}
	if _, err := p.acquire(ctx); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("after: %v", err)
	}
	// A pool made of out-of-service instances refuses from the start.
	if _, err := newPool("t", insts[:1], []string{"gpu0"}, 1, 0, nil, fakeDown).acquire(ctx); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("single: %v", err)
	}
}

// TestPoolHammerLosesNoInstance: callers that give up at random moments,
// racing the hand-over, never lose or duplicate an instance.
func TestPoolHammerLosesNoInstance(t *testing.T) {
	const n = 3
	p, _, _ := newFakePool(t, n, 1000, 0, nil)
	p.onQueue = nil
	var inUse [n]atomic.Int32
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				// Bounded, so that a lost instance fails the test
				// instead of hanging it.
				limit := 10 * time.Second
				if r.IntN(3) == 0 {
					limit = time.Duration(r.IntN(30)) * time.Microsecond // gives up while queued, or as it is handed one
				}
				ctx, cancel := context.WithTimeout(context.Background(), limit)
				m, err := p.acquire(ctx)
				cancel()
				if err != nil {
					if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
						t.Error(err)
					}
					continue
				}
				if inUse[m.index].Add(1) != 1 {
					t.Error("an instance was lent twice")
				}
				for range r.IntN(4) {
					runtime.Gosched() // hold it a moment, so that others queue
				}
				inUse[m.index].Add(-1)
				p.release(m)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if live, free, waiting := p.stats(); live != n || free != n || waiting != 0 {
		t.Fatalf("after the hammer: live %d free %d waiting %d", live, free, waiting)
	}
}
