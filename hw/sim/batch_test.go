package sim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

func TestSubmitBatchRunsInOrderAsOneUnit(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	r := newRig(t)
	x := r.alloc(r.dev, 16)
	fill, saxpy := r.prog(r.dev, "fill"), r.prog(r.dev, "saxpy")
	y := r.alloc(r.dev, 16)
	whole := func(b hw.Buffer) hw.Arg { return hw.BufferArg(b, 0, -1) }
	cmds := []hw.Command{
		{Program: fill, Args: []hw.Arg{whole(x), hw.Float32(2)}},
		{Program: fill, Args: []hw.Arg{whole(y), hw.Float32(1)}},
		{Program: saxpy, Args: []hw.Arg{hw.Float32(3), whole(x), whole(y)}}, // y = 3*2 + 1
	}
	c, err := r.st.SubmitBatch(cmds)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(callCtx); err != nil {
		t.Fatal(err)
	}
	if r.st.Submitted() != 3 || !r.st.Idle() {
		t.Fatalf("submitted %d, idle %v", r.st.Submitted(), r.st.Idle())
	}
	equalF32(t, "y", getF32(host(t, y)), []float32{7, 7, 7, 7})
}

func TestSubmitBatchIsAllOrNothing(t *testing.T) {
	r := newRig(t, sim.NewDeviceConfig().WithQueueDepth(4))
	x := r.alloc(r.dev, 16)
	noop := r.prog(r.dev, "noop")
	bad := []hw.Command{
		{Program: noop},
		{Program: noop, Args: []hw.Arg{hw.BufferArg(x, 8, 16)}}, // out of range
	}
	_, err := r.st.SubmitBatch(bad)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || r.st.Submitted() != 0 {
		t.Fatalf("invalid batch: %v, %d submitted", err, r.st.Submitted())
	}
	release := r.st.Inject(sim.Fault{Kind: sim.Hang})
	for range 3 {
		if _, err := r.st.Submit(&hw.Command{Program: noop}); err != nil {
			t.Fatal(err)
		}
	}
	two := []hw.Command{{Program: noop}, {Program: noop}}
	if _, err := r.st.SubmitBatch(two); !errors.Is(err, errdefs.ErrBusy) || r.st.Submitted() != 3 {
		t.Fatalf("batch larger than the room left: %v, %d submitted", err, r.st.Submitted())
	}
	release()
	r.sync(r.st)
	if _, err := r.st.SubmitBatch(make([]hw.Command, 5)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("batch deeper than the queue: %v", err)
	}
	if c, err := r.st.SubmitBatch(nil); err != nil || !c.Done() {
		t.Fatalf("empty batch: %v", err)
	}
}
