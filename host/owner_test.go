package host_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

// ownerRig is a platform with two simulated GPUs and an owner.
type ownerRig struct {
	p      *sim.Platform
	a, b   *sim.Device
	owner  *host.Owner
	budget *hw.Budget
}

func newOwnerRig(t *testing.T) *ownerRig {
	t.Helper()
	p := sim.New()
	t.Cleanup(func() { p.Close() })
	a, err := p.AddDevice("gpuA", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.AddDevice("gpuB", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	budget := hw.NewBudget("owner", 1<<20)
	return &ownerRig{p: p, a: a, b: b, owner: host.NewOwner("owner", budget), budget: budget}
}

// submitFailing submits n noop commands on a new owned stream of dev; the
// first fail of them fail on the device.
func (r *ownerRig) submitFailing(t *testing.T, dev *sim.Device, n, fail int) hw.Stream {
	t.Helper()
	st, err := r.owner.NewStream(dev)
	if err != nil {
		t.Fatal(err)
	}
	noop, err := r.owner.Prepare(dev, "noop")
	if err != nil {
		t.Fatal(err)
	}
	if fail > 0 {
		st.(*sim.Stream).Inject(sim.Fault{Kind: sim.FailCompletion, Count: fail})
	}
	for range n {
		if _, err := st.Submit(&hw.Command{Program: noop}); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

func TestDrainSyncsEveryStreamEvenAfterOneFails(t *testing.T) {
	r := newOwnerRig(t)
	// The first stream's device is lost: its Sync fails at once, and the
	// drain cannot be proven. Every later stream must be synced all the
	// same; the failed command on each shows that it was.
	if _, err := r.owner.NewStream(r.a); err != nil {
		t.Fatal(err)
	}
	r.a.Lose("test: the first stream's device is lost")
	later := []hw.Stream{r.submitFailing(t, r.b, 3, 1), r.submitFailing(t, r.b, 2, 1)}

	err := r.owner.Drain(context.Background())
	if !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("Drain = %v; want the lost stream's %v", err, errdefs.ErrDeviceLost)
	}
	if errors.Is(err, errdefs.ErrFault) {
		t.Fatalf("Drain = %v; a retired fault must not fail the drain", err)
	}
	for i, st := range later {
		if !st.Idle() {
			t.Fatalf("stream %d after the lost one was not drained", i+1)
		}
	}
	faults := r.owner.TakeFaults()
	if faults == nil || !strings.Contains(faults.Error(), "2 device command(s) failed") {
		t.Fatalf("faults %v; want the failed command of each of the two later streams, found by syncing them", faults)
	}
}

func TestDrainRecordsRetiredFaultsForTakeFaults(t *testing.T) {
	r := newOwnerRig(t)
	st := r.submitFailing(t, r.b, 3, 2)
	if err := r.owner.Drain(context.Background()); err != nil {
		t.Fatalf("Drain = %v; retired faults still count as drained", err)
	}
	if !st.Idle() {
		t.Fatal("not drained")
	}
	if err := r.owner.VerifyIdle(); err != nil {
		t.Fatal(err)
	}
	faults := r.owner.TakeFaults()
	if !errors.Is(faults, errdefs.ErrFault) || errdefs.ClassOf(faults) != errdefs.ErrFault {
		t.Fatalf("TakeFaults = %v; want class %v", faults, errdefs.ErrFault)
	}
	if msg := faults.Error(); !strings.Contains(msg, "2 device command(s) failed") || !strings.Contains(msg, "command 1 failed") || !strings.Contains(msg, "command 2 failed") {
		t.Fatalf("TakeFaults = %q; want both failed commands", msg)
	}
	if again := r.owner.TakeFaults(); again != nil {
		t.Fatalf("second TakeFaults = %v; TakeFaults must forget what it returned", again)
	}
	// A drain of idle streams finds nothing new.
	if err := r.owner.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if faults := r.owner.TakeFaults(); faults != nil {
		t.Fatalf("faults %v after a clean drain", faults)
	}
}

func TestNoteFaultKeepsABoundedListAndTheCount(t *testing.T) {
	o := host.NewOwner("noisy", nil)
	o.NoteFault(nil) // records nothing
	if err := o.TakeFaults(); err != nil {
		t.Fatalf("TakeFaults after a nil note = %v", err)
	}
	var noted []error
	for i := range 20 {
		err := fmt.Errorf("failure %d", i) // of no class: TakeFaults still reports ErrFault
		noted = append(noted, err)
		o.NoteFault(err)
	}
	faults := o.TakeFaults()
	if errdefs.ClassOf(faults) != errdefs.ErrFault {
		t.Fatalf("TakeFaults = %v; want class %v", faults, errdefs.ErrFault)
	}
	for i, err := range noted {
		if kept := errors.Is(faults, err); kept != (i < 8) {
			t.Fatalf("failure %d kept = %v; want the first 8 kept, the rest only counted", i, kept)
		}
	}
	if msg := faults.Error(); !strings.Contains(msg, "20 device command(s) failed") || !strings.Contains(msg, "12 more") {
		t.Fatalf("TakeFaults = %q; want the count of all 20 and of the 12 not kept", msg)
	}
	if o.TakeFaults() != nil {
		t.Fatal("TakeFaults did not clear the count")
	}
}

func TestOwnerErrSaysQuarantinedOrClosed(t *testing.T) {
	healthy := host.NewOwner("healthy", nil)
	if err := healthy.Err(); err != nil {
		t.Fatalf("healthy owner: %v", err)
	}
	quarantined := host.NewOwner("quarantined", nil)
	quarantined.Quarantine()
	if err := quarantined.Err(); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("quarantined owner: %v", err)
	}
	closed := host.NewOwner("closed", nil)
	if err := closed.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := closed.Err(); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("closed owner: %v", err)
	}
}

// TestCloseOfAQuarantinedOwnerFreesNothing: once an owner is quarantined
// (device work may still touch its memory, N6), Close keeps every stream,
// buffer and shared allocation and their budget charges, every time it is
// called, and says so with errdefs.ErrDeviceLost. The same holds for an
// owner that Close itself quarantines because a stream would not drain.
func TestCloseOfAQuarantinedOwnerFreesNothing(t *testing.T) {
	ctx := testutil.Context(t, 10*time.Second)
	for _, how := range []string{"quarantined before Close", "a stream that does not drain"} {
		t.Run(how, func(t *testing.T) {
			r := newOwnerRig(t)
			st, err := r.owner.NewStream(r.a)
			if err != nil {
				t.Fatal(err)
			}
			buf, err := r.owner.Alloc(r.a, 4096, 0)
			if err != nil {
				t.Fatal(err)
			}
			sh, err := r.owner.AllocShared(r.p, 64, []hw.Device{r.a, r.b})
			if err != nil {
				t.Fatal(err)
			}
			used := r.budget.Used()
			closeCtx := ctx
			if how == "quarantined before Close" {
				r.owner.Quarantine()
			} else {
				noop, err := r.owner.Prepare(r.a, "noop")
				if err != nil {
					t.Fatal(err)
				}
				release := st.(*sim.Stream).Inject(sim.Fault{Kind: sim.Hang})
				t.Cleanup(release)
				if _, err := st.Submit(&hw.Command{Program: noop}); err != nil {
					t.Fatal(err)
				}
				short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
				defer cancel()
				closeCtx = short
			}
			for i := range 2 {
				if err := r.owner.Close(closeCtx); !errors.Is(err, errdefs.ErrDeviceLost) {
					t.Fatalf("Close %d of a quarantined owner = %v, want device_lost", i+1, err)
				}
				if !r.owner.Quarantined() {
					t.Fatalf("Close %d: the owner is not quarantined", i+1)
				}
				if got := r.budget.Used(); got != used {
					t.Fatalf("Close %d: budget charge %d, want %d kept", i+1, got, used)
				}
				if _, err := buf.HostBytes(); err != nil {
					t.Fatalf("Close %d freed the buffer: %v", i+1, err)
				}
				if _, err := sh.View(r.a); err != nil {
					t.Fatalf("Close %d freed the shared allocation: %v", i+1, err)
				}
				if r.owner.Buffers() != 1 || len(r.owner.Streams()) != 1 {
					t.Fatalf("Close %d: the owner lists %d buffers and %d streams, want 1 and 1", i+1, r.owner.Buffers(), len(r.owner.Streams()))
				}
			}
		})
	}
}
