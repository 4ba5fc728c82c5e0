package sim

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/internal/testutil"
)

// waiting reports whether some goroutine is asleep in waitFor on s (past
// its spin).
func (s *Stream) waiting() bool { return s.rec.Sleepers() > 0 }

// untilWaiting yields until n waiters are asleep on s. It is not a
// sleep: it only lets the waiter goroutines run, and gives up after a
// generous deadline.
func untilWaiting(t *testing.T, s *Stream, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for s.rec.Sleepers() < n {
		if time.Now().After(deadline) {
			t.Fatal("waiter never registered")
		}
		runtime.Gosched()
	}
}

// TestLoseWakesRegisteredWaiter loses the device while a waiter is
// certainly blocked (registered on the broadcast channel), on a hung
// stream.
func TestLoseWakesRegisteredWaiter(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	p := New()
	d, _ := p.AddDevice("d", hw.EngineGPU, NewDeviceConfig())
	hs, _ := d.NewStream()
	s := hs.(*Stream)
	s.Inject(Fault{Kind: Hang})
	noop, _ := d.Prepare("noop")
	c, err := s.Submit(&hw.Command{Program: noop})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- c.Wait(callCtx) }()
	untilWaiting(t, s, 1)
	d.Lose("while waiting")
	select {
	case err := <-got:
		if !errors.Is(err, errdefs.ErrDeviceLost) {
			t.Fatalf("Wait returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("waiter not woken by the loss")
	}
	// The worker exits on a loss.
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		t.Fatal("worker still running after the loss")
	}
}

// TestRetireWakesAllWaiters checks the broadcast: several waiters on
// each of several commands, all asleep (past their spin), all wake, and
// none is left asleep afterwards.
func TestRetireWakesAllWaiters(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	p := New()
	d, _ := p.AddDevice("d", hw.EngineGPU, NewDeviceConfig())
	hs, _ := d.NewStream()
	s := hs.(*Stream)
	release := s.Inject(Fault{Kind: Hang})
	noop, _ := d.Prepare("noop")
	var cs []hw.Completion
	for range 4 {
		c, _ := s.Submit(&hw.Command{Program: noop})
		cs = append(cs, c)
	}
	// Two waiters per command: more sleepers than retirements, so that
	// only a broadcast wakes them all.
	const per = 2
	got := make(chan error, per*len(cs))
	for _, c := range cs {
		for range per {
			go func() { got <- c.Wait(callCtx) }()
		}
	}
	untilWaiting(t, s, per*len(cs))
	release()
	for range per * len(cs) {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("waiter not woken")
		}
	}
	if s.waiting() {
		t.Fatal("a waiter is still asleep")
	}
	if err := s.Close(callCtx); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}
