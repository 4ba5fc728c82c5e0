package retire

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/testutil"
)

// patience bounds every wait here: a test that would hang fails instead.
// Nothing is synchronised by sleeping.
const patience = 20 * time.Second

var (
	errLost = errdefs.Errorf(errdefs.ErrDeviceLost, "test: lost")
	errA    = errors.New("a failed")
	errB    = errors.New("b failed")
	errC    = errors.New("c failed")
)

func healthy() error { return nil }

// device is a loss that can happen, for the waits.
type device struct {
	lost   atomic.Bool
	lostCh chan struct{}
}

func newDevice() *device { return &device{lostCh: make(chan struct{})} }

func (d *device) err() error {
	if d.lost.Load() {
		return errLost
	}
	return nil
}

func (d *device) lose() {
	d.lost.Store(true)
	close(d.lostCh)
}

func (r *Record) wait(ctx context.Context, seq uint64) error {
	return r.Wait(ctx, seq, healthy, nil, "test", "s0")
}

// untilSleeping yields until n waiters sleep on r, or fails after patience.
func untilSleeping(t *testing.T, r *Record, n int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for r.Sleepers() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters asleep, want %d", r.Sleepers(), n)
		}
		runtime.Gosched()
	}
}

func TestZeroRecord(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	var r Record
	if r.Submitted() != 0 || r.Retired() != 0 || !r.Idle(nil) {
		t.Fatal("zero record is not empty and idle")
	}
	if done, err := r.State(1, nil); done || err != nil {
		t.Fatalf("State(1) = %v, %v", done, err)
	}
	if err := r.wait(context.Background(), 0); err != nil {
		t.Fatalf("Wait(0) = %v", err)
	}
	if err := r.Sync(callCtx, r.wait, healthy); err != nil {
		t.Fatalf("Sync = %v", err)
	}
	r.Wake() // nobody asleep: nothing to do
}

func TestWatermarks(t *testing.T) {
	var r Record
	r.SetSubmitted(3)
	r.Advance(2)
	if r.Idle(nil) {
		t.Fatal("idle with command 3 pending")
	}
	if !r.Idle(errLost) {
		t.Fatal("not idle on a lost device")
	}
	for seq, want := range map[uint64]bool{1: true, 2: true, 3: false} {
		if done, err := r.State(seq, nil); done != want || err != nil {
			t.Fatalf("State(%d) = %v, %v; want %v", seq, done, err, want)
		}
	}
	// A loss fails what has not retired, not what has.
	if done, err := r.State(3, errLost); !done || err != errLost {
		t.Fatalf("State(3) on a lost device = %v, %v", done, err)
	}
	if done, err := r.State(2, errLost); !done || err != nil {
		t.Fatalf("State(2) on a lost device = %v, %v", done, err)
	}
	r.Advance(3)
	if !r.Idle(nil) {
		t.Fatal("not idle after the last command retired")
	}
}

func TestFailures(t *testing.T) {
	var r Record
	r.SetSubmitted(10)
	// Recorded out of order (a later command's failure can be seen first);
	// the first record of a seq wins.
	r.Fail(7, errC)
	r.Fail(3, errA)
	r.Fail(5, errB)
	r.Fail(5, errC)
	r.Advance(10)
	for seq, want := range map[uint64]error{1: nil, 3: errA, 4: nil, 5: errB, 7: errC, 10: nil} {
		if err := r.FailureOf(seq); err != want {
			t.Errorf("FailureOf(%d) = %v, want %v", seq, err, want)
		}
		if _, err := r.State(seq, nil); err != want {
			t.Errorf("State(%d) = %v, want %v", seq, err, want)
		}
	}
}

// TestSyncReportsEachFailureOnce: each failure is returned by one Sync, in
// order, and only once Sync covers its command; a loss comes first.
func TestSyncReportsEachFailureOnce(t *testing.T) {
	ctx := context.Background()
	var r Record
	r.SetSubmitted(4)
	r.Fail(2, errA)
	r.Fail(4, errB)
	r.Fail(6, errC) // recorded early: command 6 is not covered by these Syncs
	r.Advance(4)
	for i, want := range []error{errA, errB, nil, nil} {
		if err := r.Sync(ctx, r.wait, healthy); err != want {
			t.Fatalf("Sync %d = %v, want %v", i, err, want)
		}
	}
	r.SetSubmitted(6)
	r.Advance(6)
	if err := r.Sync(ctx, r.wait, healthy); err != errC {
		t.Fatalf("Sync after command 6 = %v, want %v", err, errC)
	}
	if err := r.Sync(ctx, r.wait, healthy); err != nil {
		t.Fatalf("last Sync = %v", err)
	}
	r.SetSubmitted(7)
	r.Fail(7, errA)
	r.Advance(7)
	lost := func() error { return errLost }
	if err := r.Sync(ctx, r.wait, lost); err != errLost {
		t.Fatalf("Sync on a lost device = %v", err)
	}
	// The wait's error is Sync's.
	failing := func(context.Context, uint64) error { return errB }
	if err := r.Sync(ctx, failing, healthy); err != errB {
		t.Fatalf("Sync with a failing wait = %v", err)
	}
}

func TestWaitWakesOnAdvance(t *testing.T) {
	for _, spin := range []time.Duration{time.Nanosecond, DefaultSpin} {
		r := &Record{Spin: spin}
		r.SetSubmitted(3)
		const waiters = 3
		errs := make(chan error, waiters)
		for seq := uint64(1); seq <= waiters; seq++ {
			go func() { errs <- r.wait(context.Background(), seq) }()
		}
		untilSleeping(t, r, waiters)
		for seq := uint64(1); seq <= waiters; seq++ {
			r.Advance(seq)
			select {
			case err := <-errs:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(patience):
				t.Fatalf("waiter not woken by Advance(%d)", seq)
			}
		}
		untilSleeping(t, r, 0)
	}
}

// TestWaitWakesOnLoss: a sleeping waiter returns the loss, woken either by
// the lost channel or by Wake (how a stream that marks itself dead wakes
// its waiters before the device's channel closes).
func TestWaitWakesOnLoss(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	for _, how := range []string{"lost channel", "Wake"} {
		d := newDevice()
		r := &Record{Spin: time.Nanosecond}
		r.SetSubmitted(1)
		errs := make(chan error, 1)
		go func() { errs <- r.Wait(callCtx, 1, d.err, d.lostCh, "test", "s0") }()
		untilSleeping(t, r, 1)
		if how == "Wake" {
			d.lost.Store(true)
			r.Wake()
		} else {
			d.lose()
		}
		select {
		case err := <-errs:
			if err != errLost {
				t.Fatalf("%s: Wait = %v, want the loss", how, err)
			}
		case <-time.After(patience):
			t.Fatalf("%s: waiter not woken by the loss", how)
		}
	}
	// Lost before the wait: it returns at once, unless the command retired.
	d := newDevice()
	d.lose()
	var r Record
	r.SetSubmitted(2)
	r.Advance(1)
	if err := r.Wait(callCtx, 1, d.err, d.lostCh, "test", "s0"); err != nil {
		t.Fatalf("Wait on a retired command of a lost device = %v", err)
	}
	if err := r.Wait(callCtx, 2, d.err, d.lostCh, "test", "s0"); err != errLost {
		t.Fatalf("Wait on a lost device = %v", err)
	}
}

func TestWaitContext(t *testing.T) {
	for _, spin := range []time.Duration{time.Nanosecond, time.Hour} {
		r := &Record{Spin: spin}
		r.SetSubmitted(5)
		ctx, cancel := context.WithCancel(context.Background())
		errs := make(chan error, 1)
		go func() { errs <- r.Wait(ctx, 5, healthy, nil, "test", "s0") }()
		if spin < time.Hour {
			untilSleeping(t, r, 1)
		}
		cancel()
		select {
		case err := <-errs:
			if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !errors.Is(err, context.Canceled) ||
				!strings.Contains(err.Error(), "test: s0: waiting for command 5") {
				t.Fatalf("spin %v: Wait = %v", spin, err)
			}
		case <-time.After(patience):
			t.Fatalf("spin %v: waiter not woken by its context", spin)
		}
	}
}

func TestQuiesce(t *testing.T) {
	var r Record
	r.SetSubmitted(2)
	r.Advance(1)
	if !r.Quiesce(context.Background(), 1, time.Millisecond) {
		t.Fatal("Quiesce on a retired command")
	}
	done := make(chan bool, 1)
	go func() { done <- r.Quiesce(context.Background(), 2, time.Hour) }()
	untilSleeping(t, &r, 1)
	r.Advance(2)
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("Quiesce = false")
		}
	case <-time.After(patience):
		t.Fatal("Quiesce not woken by Advance")
	}
	r.SetSubmitted(3)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r.Quiesce(ctx, 3, time.Hour) {
		t.Fatal("Quiesce with a finished context = true")
	}
}

// TestConcurrentWaiters runs many waiters against an advancer, with every
// spin setting; under -race it checks the record's synchronisation.
func TestConcurrentWaiters(t *testing.T) {
	for _, spin := range []time.Duration{time.Nanosecond, DefaultSpin} {
		r := &Record{Spin: spin}
		const n = 2000
		r.SetSubmitted(n)
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for seq := uint64(w + 1); seq <= n; seq += 97 {
					if err := r.wait(context.Background(), seq); err != nil {
						t.Error(err)
						return
					}
					if done, _ := r.State(seq, nil); !done {
						t.Errorf("command %d woke its waiter before it retired", seq)
						return
					}
				}
			})
		}
		wg.Go(func() {
			for seq := uint64(1); seq <= n; seq++ {
				if seq%10 == 0 {
					r.Fail(seq, errA)
				}
				r.Advance(seq)
				if seq%100 == 0 {
					runtime.Gosched()
				}
			}
		})
		wg.Wait()
		if err := r.FailureOf(n); err != errA || r.Sleepers() != 0 {
			t.Fatalf("after the run: FailureOf(%d) = %v, %d asleep", n, err, r.Sleepers())
		}
	}
}

// TestHotPathAllocatesNothing: what a stream asks per command allocates
// nothing while no waiter has to sleep.
func TestHotPathAllocatesNothing(t *testing.T) {
	var r Record
	d := newDevice()
	ctx := context.Background()
	seq := uint64(0)
	for name, f := range map[string]func(){
		"SetSubmitted+Advance": func() { seq++; r.SetSubmitted(seq); r.Advance(seq) },
		"State":                func() { r.State(seq, nil) },
		"Idle":                 func() { r.Idle(nil) },
		"FailureOf":            func() { r.FailureOf(seq) },
		"Wait(retired)":        func() { r.Wait(ctx, seq, d.err, d.lostCh, "test", "s0") },
		"Sync(idle)":           func() { r.Sync(ctx, r.wait, d.err) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s allocates %v times per call", name, n)
		}
	}
}
