package sim_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

func TestRejectSubmit(t *testing.T) {
	r := newRig(t)
	other := r.stream(r.dev)
	noop := r.prog(r.dev, "noop")
	buf := r.alloc(r.dev, 4)
	if rel := r.st.Inject(sim.Fault{Kind: sim.RejectSubmit, Count: 3}); rel == nil {
		t.Fatal("nil release")
	}
	_, err := r.st.Submit(&hw.Command{Program: noop})
	wantClass(t, err, errdefs.ErrRejected)
	_, err = r.st.Write(buf, 0, make([]byte, 4))
	wantClass(t, err, errdefs.ErrRejected)
	r.submit(other, noop) // stream faults stay on their stream
	_, err = r.st.Read(buf, 0, make([]byte, 4))
	wantClass(t, err, errdefs.ErrRejected)
	if r.st.Submitted() != 0 {
		t.Fatalf("rejected commands were queued: %d", r.st.Submitted())
	}
	r.submit(r.st, noop)

	// Device-wide: the next two submissions on any stream.
	r.dev.Inject(sim.Fault{Kind: sim.RejectSubmit, Count: 2})
	_, err = other.Submit(&hw.Command{Program: noop})
	wantClass(t, err, errdefs.ErrRejected)
	_, err = r.st.Submit(&hw.Command{Program: noop})
	wantClass(t, err, errdefs.ErrRejected)
	r.submit(r.st, noop)
	r.submit(other, noop)
	// Count 0 counts as 1.
	r.dev.Inject(sim.Fault{Kind: sim.RejectSubmit})
	_, err = other.Submit(&hw.Command{Program: noop})
	wantClass(t, err, errdefs.ErrRejected)
	r.submit(other, noop)
	r.sync(r.st)
	r.sync(other)
}

func TestFailCompletion(t *testing.T) {
	r := newRig(t)
	other := r.stream(r.dev)
	fill := r.prog(r.dev, "fill")
	buf := r.alloc(r.dev, 4)
	r.st.Inject(sim.Fault{Kind: sim.FailCompletion, Count: 2})
	c1 := r.submit(r.st, fill, hw.BufferArg(buf, 0, 4), hw.Float32(1))
	c2, err := r.st.Write(buf, 0, make([]byte, 4))
	if err != nil {
		t.Fatal(err)
	}
	c3 := r.submit(r.st, fill, hw.BufferArg(buf, 0, 4), hw.Float32(3))
	o := r.submit(other, fill, hw.BufferArg(buf, 0, 4), hw.Float32(3))
	wantClass(t, c1.Wait(ctxT(t)), errdefs.ErrFault, "injected")
	wantClass(t, c2.Wait(ctxT(t)), errdefs.ErrFault)
	if err := c3.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := o.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// The failed fill did not run: only the successful one did.
	equalF32(t, "buf", getF32(host(t, buf)), []float32{3})
	wantClass(t, r.st.Sync(ctxT(t)), errdefs.ErrFault)
	wantClass(t, r.st.Sync(ctxT(t)), errdefs.ErrFault)
	if err := r.st.Sync(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if r.dev.Err() != nil {
		t.Fatal("a failed completion lost the device")
	}
	// Device-wide.
	r.dev.Inject(sim.Fault{Kind: sim.FailCompletion, Count: 1})
	wantClass(t, r.submit(other, fill, hw.BufferArg(buf, 0, 4), hw.Float32(4)).Wait(ctxT(t)), errdefs.ErrFault)
	if err := r.submit(r.st, fill, hw.BufferArg(buf, 0, 4), hw.Float32(4)).Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	other.Sync(ctxT(t))
}

func TestHang(t *testing.T) {
	r := newRig(t)
	other := r.stream(r.dev)
	noop := r.prog(r.dev, "noop")

	release := r.st.Inject(sim.Fault{Kind: sim.Hang, Count: 99})
	a := r.submit(r.st, noop)
	b := r.submit(r.st, noop)
	// Another stream is not affected.
	if err := r.submit(other, noop).Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	wantClass(t, a.Wait(ctx), errdefs.ErrDeadlineExceeded)
	if a.Done() || b.Done() || r.st.Idle() {
		t.Fatal("hung stream retired commands")
	}
	release()
	release() // idempotent
	if err := b.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if !a.Done() {
		t.Fatal("b retired before a")
	}

	// Device-wide hangs stop every stream, and two hangs need two
	// releases.
	rel1 := r.dev.Inject(sim.Fault{Kind: sim.Hang})
	rel2 := r.dev.Inject(sim.Fault{Kind: sim.Hang})
	c := r.submit(r.st, noop)
	d := r.submit(other, noop)
	rel1()
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel2()
	wantClass(t, c.Wait(ctx2), errdefs.ErrDeadlineExceeded)
	if d.Done() {
		t.Fatal("other stream ran under a device hang")
	}
	rel2()
	if err := c.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if rel := r.st.Inject(sim.Fault{Kind: sim.FailCompletion}); rel == nil {
		t.Fatal("nil release for a counted fault")
	} else {
		rel() // no-op
	}
}

func TestFailVisibility(t *testing.T) {
	r := newRig(t)
	sh, _ := r.p.AllocShared(8, []hw.Device{r.dev}, nil)
	defer sh.Free()
	act, err := sh.PrepareRelease(r.dev, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	r.dev.Inject(sim.Fault{Kind: sim.FailVisibility, Count: 2})
	wantClass(t, act.Execute(), errdefs.ErrFault)
	wantClass(t, act.Execute(), errdefs.ErrFault)
	if err := act.Execute(); err != nil {
		t.Fatal(err)
	}
	r.st.Inject(sim.Fault{Kind: sim.FailVisibility}) // device-wide anyway
	wantClass(t, act.Execute(), errdefs.ErrFault)
	if err := act.Execute(); err != nil {
		t.Fatal(err)
	}
	if r.dev.VisibilityReleases() != 2 {
		t.Fatalf("%d releases", r.dev.VisibilityReleases())
	}
}

func TestInjectUnknownKindPanics(t *testing.T) {
	r := newRig(t)
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	r.dev.Inject(sim.Fault{})
}

// TestLoseWithQueuedWork loses a device with a command executing (a spin
// that never gets its word), commands queued behind it, a hung stream
// and waiters blocked on all of them: every wait must return the loss.
func TestLoseWithQueuedWork(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	r := newRig(t)
	hung := r.stream(r.dev)
	noop, spin := r.prog(r.dev, "noop"), r.prog(r.dev, "spin")
	buf := r.alloc(r.dev, 64)
	done := r.submit(r.st, noop)
	if err := done.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	var pending []hw.Completion
	pending = append(pending, r.submit(r.st, spin, hw.BufferArg(buf, 0, 4), hw.Uint(0), hw.Uint(1)))
	for range 10 {
		pending = append(pending, r.submit(r.st, noop))
	}
	hung.Inject(sim.Fault{Kind: sim.Hang}) // never released by the test
	for range 3 {
		pending = append(pending, r.submit(hung, noop))
	}
	errs := make(chan error, len(pending)+2)
	var wg sync.WaitGroup
	for _, c := range pending {
		wg.Go(func() { errs <- c.Wait(callCtx) })
	}
	wg.Go(func() { errs <- r.st.Sync(callCtx) })
	wg.Go(func() { errs <- hung.Sync(callCtx) })

	r.dev.Inject(sim.Fault{Kind: sim.Lose})
	r.dev.Lose("second cause") // ignored: the first cause wins
	within(t, "waiters after loss", wg.Wait)
	close(errs)
	for err := range errs {
		wantClass(t, err, errdefs.ErrDeviceLost)
	}
	wantClass(t, r.dev.Err(), errdefs.ErrDeviceLost, "injected", "dev0")
	for i, c := range pending {
		if !c.Done() {
			t.Fatalf("pending %d not done after loss", i)
		}
		wantClass(t, c.Err(), errdefs.ErrDeviceLost)
	}
	// Retired before the loss: keeps its result.
	if !done.Done() || done.Err() != nil || done.Wait(ctxT(t)) != nil {
		t.Fatalf("command retired before the loss reports %v", done.Err())
	}
	if !r.st.Idle() || !hung.Idle() {
		t.Fatal("lost streams not idle")
	}
	checkFailsFast(t, r, noop, buf)
	// Cleanup still works after a loss.
	wantClass(t, hung.Close(ctxT(t)), errdefs.ErrDeviceLost)
	wantClass(t, hung.Close(ctxT(t)), errdefs.ErrClosed)
}

// checkFailsFast checks that every call on r's lost device fails at once;
// prog was prepared before the loss.
func checkFailsFast(t *testing.T, r *rig, prog hw.Program, buf hw.Buffer) {
	t.Helper()
	_, err := r.dev.NewStream()
	wantClass(t, err, errdefs.ErrDeviceLost)
	_, err = r.dev.Alloc(8, 0, nil)
	wantClass(t, err, errdefs.ErrDeviceLost)
	_, err = r.dev.Prepare("noop")
	wantClass(t, err, errdefs.ErrDeviceLost)
	_, err = r.st.Submit(&hw.Command{Program: prog})
	wantClass(t, err, errdefs.ErrDeviceLost)
	_, err = r.st.Write(buf, 0, make([]byte, 4))
	wantClass(t, err, errdefs.ErrDeviceLost)
	_, err = r.st.Read(buf, 0, make([]byte, 4))
	wantClass(t, err, errdefs.ErrDeviceLost)
	wantClass(t, r.st.Sync(context.Background()), errdefs.ErrDeviceLost)
	if rel := r.dev.Inject(sim.Fault{Kind: sim.Hang}); rel == nil {
		t.Fatal("nil release")
	}
	// A hang injected after the loss does not hang anything.
	within(t, "Sync after loss", func() { r.st.Sync(context.Background()) })
}

func TestLoseInterruptsLatency(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	r := newRig(t, sim.NewDeviceConfig().WithLatency(time.Hour))
	noop := r.prog(r.dev, "noop")
	buf := r.alloc(r.dev, 8)
	c := r.submit(r.st, noop)
	c2 := r.submit(r.st, noop)
	r.dev.Lose("test")
	within(t, "Wait during latency", func() { wantClass(t, c.Wait(callCtx), errdefs.ErrDeviceLost) })
	wantClass(t, c2.Err(), errdefs.ErrDeviceLost)
	checkFailsFast(t, r, noop, buf)
}

func TestLoseReleasesVisibility(t *testing.T) {
	r := newRig(t)
	sh, _ := r.p.AllocShared(8, []hw.Device{r.dev}, nil)
	defer sh.Free()
	act, _ := sh.PrepareRelease(r.dev, 0, 8)
	r.st.Inject(sim.Fault{Kind: sim.Lose})
	wantClass(t, act.Execute(), errdefs.ErrDeviceLost)
	_, err := r.p.AllocShared(8, []hw.Device{r.dev}, nil)
	wantClass(t, err, errdefs.ErrDeviceLost)
	if !errors.Is(r.dev.Err(), errdefs.ErrDeviceLost) {
		t.Fatal("stream-injected loss did not lose the device")
	}
}

// A command that is executing when the device is lost fails with the
// loss, even if its kernel then returns success.
func TestLoseInFlight(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	r := newRig(t)
	tag := tags.Add(1)
	started := make(chan struct{})
	blockStarted.Store(tag, started)
	defer blockStarted.Delete(tag)
	buf := r.alloc(r.dev, 4)
	c := r.submit(r.st, r.prog(r.dev, "test.block"), hw.Uint(tag), hw.BufferArg(buf, 0, 4))
	queued := r.submit(r.st, r.prog(r.dev, "noop"))
	within(t, "kernel start", func() { <-started })
	r.dev.Lose("in flight")
	within(t, "Wait", func() { wantClass(t, c.Wait(callCtx), errdefs.ErrDeviceLost, "in flight") })
	wantClass(t, queued.Err(), errdefs.ErrDeviceLost)
	if r.st.RetiredCount() != 0 {
		t.Fatalf("retired %d commands", r.st.RetiredCount())
	}
	// The buffer can still be freed; its memory goes once the kernel
	// has returned (the budget is nil here, so just check it works).
	within(t, "Close", func() { wantClass(t, r.st.Close(callCtx), errdefs.ErrDeviceLost) })
}
