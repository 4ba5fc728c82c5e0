package stages

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
)

// TestDeadlineCoversTheWaitForTheComputeLane: a call whose session's
// deadline passes while another session's stage holds the device's
// compute lane is answered DeadlineExceeded at its deadline, not when the
// lane frees (the holder releases it only after the call returned). It
// never ran: no fence, no trace record, no replacement, and the next call
// runs normally. ABI.md §4.2.
func TestDeadlineCoversTheWaitForTheComputeLane(t *testing.T) {
	ctx := context.Background()
	f := newWasmFixture(t)
	const deadline = 40 * time.Millisecond
	s := f.session(t, f.mustLoad(t, "good_stage"), f.defaultConfig("bounded").WithDeadline(deadline))
	defer s.Close(ctx)

	// A native stage on the same device holds its compute lane until
	// released.
	blocker := NewNative(f.rt, host.NewOwner("blocker", hw.NewBudget("blocker", 1<<20)), struct{}{}, nil, NewNativeConfig().WithDevice(f.gpu.Name()))
	holding, release, blocked := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		blocked <- blocker.Run(ctx, func(context.Context, *struct{}) error {
			close(holding)
			<-release
			return nil
		})
	}()
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking stage never started")
	}
	traced := f.rt.Stats().OccupanciesTraced

	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := s.Run(ctx, nil, nil)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatalf("the call still waits for the lane 10 s after its deadline of %v", deadline)
	}
	took := time.Since(start)
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "compute lane") {
		t.Fatalf("got %v, want DeadlineExceeded naming the compute lane", err)
	}
	if took < deadline {
		t.Fatalf("answered after %v, before its deadline of %v", took, deadline)
	}
	if n := f.rt.Stats().OccupanciesTraced; n != traced {
		t.Fatalf("%d trace records for a call that never held the lane", n-traced)
	}
	if s.Replacements() != 0 || s.Quarantined() != nil {
		t.Fatalf("replacements %d, quarantine %v after a call that never ran", s.Replacements(), s.Quarantined())
	}

	close(release)
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
	if out, err := s.Run(ctx, nil, nil); err != nil || string(out) != "ok" {
		t.Fatalf("the next call: %q, %v", out, err)
	}
}
