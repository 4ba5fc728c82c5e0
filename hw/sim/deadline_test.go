package sim_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// TestLaunchSeesTheCommandsDeadline: a kernel reads the deadline its
// command carries (hw.Command.Deadline) through Launch.Deadline, the zero
// time for a command without one, whether the command was submitted
// alone or in a batch, and across a ring that grew while the commands
// waited (a ring of 2 slots, 9 commands queued behind a blocked one): the
// copy into the ring keeps the field, and a reused slot keeps nothing of
// its earlier command.
func TestLaunchSeesTheCommandsDeadline(t *testing.T) {
	r := newRig(t, sim.NewDeviceConfig().WithInitialQueueDepth(2).WithQueueDepth(64))
	var mu sync.Mutex
	var seen []time.Time
	rec, err := r.dev.PrepareKernel(hw.KernelInfo{Name: "test.deadline"}, func(l *sim.Launch) error {
		mu.Lock()
		seen = append(seen, l.Deadline())
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	hold, err := r.dev.PrepareKernel(hw.KernelInfo{Name: "test.hold"}, func(l *sim.Launch) error {
		select {
		case <-open:
		case <-time.After(patience):
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(time.Hour)
	var want []time.Time
	if _, err := r.st.Submit(&hw.Command{Program: hold, Deadline: base}); err != nil {
		t.Fatal(err)
	}
	// One reused Command, as stream_launch reuses its call state's: a
	// deadline set for one submission and cleared for the next.
	cmd := &hw.Command{Program: rec}
	for i := range 9 {
		cmd.Deadline = time.Time{}
		if i%3 != 2 {
			cmd.Deadline = base.Add(time.Duration(i) * time.Millisecond)
		}
		want = append(want, cmd.Deadline)
		if _, err := r.st.Submit(cmd); err != nil {
			t.Fatal(err)
		}
	}
	batch := []hw.Command{{Program: rec, Deadline: base.Add(time.Second)}, {Program: rec}, {Program: rec, Deadline: base.Add(2 * time.Second)}}
	for _, c := range batch {
		want = append(want, c.Deadline)
	}
	if _, err := r.st.SubmitBatch(batch); err != nil {
		t.Fatal(err)
	}
	close(open)
	if err := r.st.Sync(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// The slots the batch used are free again: a command without a
	// deadline in one of them sees none.
	cmd.Deadline = time.Time{}
	for range 4 {
		want = append(want, time.Time{})
		if _, err := r.st.Submit(cmd); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.st.Sync(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != len(want) {
		t.Fatalf("%d launches seen, want %d", len(seen), len(want))
	}
	for i := range want {
		if !seen[i].Equal(want[i]) || seen[i].IsZero() != want[i].IsZero() {
			t.Errorf("command %d: the kernel saw deadline %v, want %v", i, seen[i], want[i])
		}
	}
}
