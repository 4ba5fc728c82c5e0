package stages_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/stages"
)

// guardPatience bounds a wait that only a broken guard would make long: it
// turns a hang into a failure. Nothing is synchronised by sleeping.
const guardPatience = 20 * time.Second

// bare is a session state with no streams: its fence fails on demand.
type bare struct{ fail bool }

func bareFence(ctx context.Context, s *bare) error {
	if s.fail {
		return errdefs.Errorf(errdefs.ErrDeviceLost, "fence failed")
	}
	return nil
}

// bareSession is a session whose owner holds one 4 KiB buffer and no
// stream, so that many can be made cheaply.
func (f *fixture) bareSession(t testing.TB, name string) (*stages.NativeSession[bare], *host.Owner) {
	t.Helper()
	owner := host.NewOwner(name, nil)
	if _, err := owner.Alloc(f.gpu, 4096, 0); err != nil {
		t.Fatal(err)
	}
	return stages.NewNative(f.rt, owner, bare{}, bareFence, stages.NewNativeConfig().WithDevice("gpu0")), owner
}

func noopStage(ctx context.Context, s *state) error {
	_, err := s.stream.Submit(&hw.Command{Program: s.noop})
	return err
}

// ---- the guard: quarantine, running and closed under one lock ----

func TestGuardNoStageRunsOnAQuarantinedSessionAndQuarantineCountsOnce(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	// Each trial: A's stage makes its fence fail, so A quarantines the
	// session; while A is inside its stage, B keeps calling Run (Busy)
	// until it gets another answer. B's stage must never run on the
	// quarantined owner, and the quarantine must be noted once. Every
	// interleaving has one right answer, so the test cannot flake. B spins
	// without yielding on purpose: contending for the session's lock is
	// what hands the processor over inside a Run that checks quarantine
	// apart from taking the running mark (a guard split that way fails
	// here within a few hundred trials).
	trials := 2000
	if testing.Short() {
		trials = 200
	}
	f := newFixture(t)
	for i := range trials {
		sess, owner := f.bareSession(t, fmt.Sprintf("q%d", i))
		inside := make(chan struct{})
		spinning := make(chan struct{})
		aDone := make(chan error, 1)
		go func() {
			aDone <- sess.Run(callCtx, func(ctx context.Context, s *bare) error {
				s.fail = true
				close(inside)
				<-spinning
				return nil
			})
		}()
		<-inside
		var bRan, bRanQuarantined bool
		bStage := func(ctx context.Context, s *bare) error {
			bRan = true
			bRanQuarantined = owner.Quarantined()
			return nil
		}
		err := sess.Run(callCtx, bStage)
		if !errors.Is(err, errdefs.ErrBusy) {
			t.Fatalf("trial %d: Run while a stage runs = %v; want %v", i, err, errdefs.ErrBusy)
		}
		close(spinning)
		for errors.Is(err, errdefs.ErrBusy) {
			err = sess.Run(callCtx, bStage)
		}
		if aErr := <-aDone; !errors.Is(aErr, errdefs.ErrDeviceLost) {
			t.Fatalf("trial %d: the failing fence's Run = %v", i, aErr)
		}
		if bRan || bRanQuarantined {
			t.Fatalf("trial %d: a stage ran after the session was quarantined (owner quarantined: %v); Run = %v", i, bRanQuarantined, err)
		}
		if !errors.Is(err, errdefs.ErrDeviceLost) {
			t.Fatalf("trial %d: Run after quarantine = %v; want %v", i, err, errdefs.ErrDeviceLost)
		}
	}
	st := f.rt.Stats()
	if len(st.Quarantined) != trials || st.QuarantinedBytes != int64(trials)*4096 {
		t.Fatalf("%d owners with %d bytes quarantined; want %d owners with %d bytes: each quarantine counted once",
			len(st.Quarantined), st.QuarantinedBytes, trials, int64(trials)*4096)
	}
}

func TestGuardStageNeverRunsOnAnOwnerQuarantinedElsewhere(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newFixture(t)
	sess, owner := f.bareSession(t, "shared")
	owner.Quarantine() // for example by a resident session sharing it
	ran := false
	err := sess.Run(callCtx, func(context.Context, *bare) error { ran = true; return nil })
	if ran || !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("Run on a quarantined owner = %v (stage ran: %v); want %v and no stage", err, ran, errdefs.ErrDeviceLost)
	}
	if n := len(f.rt.Stats().Quarantined); n != 0 {
		t.Fatalf("the refused Run noted %d quarantines", n)
	}
}

func TestGuardCloseWhileAStageRunsIsBusyAndRunAfterCloseIsClosed(t *testing.T) {
	f := newFixture(t)
	sess, _ := f.session(t, "closing", countingFence)
	st, _ := sess.State()
	ctx := testutil.Context(t, time.Minute)
	inside := make(chan struct{})
	leave := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sess.Run(ctx, func(ctx context.Context, s *state) error {
			close(inside)
			<-leave
			return noopStage(ctx, s)
		})
	}()
	<-inside
	if err := sess.Close(ctx); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("Close while a stage runs = %v; want %v", err, errdefs.ErrBusy)
	}
	close(leave)
	if err := <-done; err != nil {
		t.Fatalf("the stage Close refused to interrupt: %v", err)
	}
	if err := sess.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ran := false
	err := sess.Run(ctx, func(context.Context, *state) error { ran = true; return nil })
	if ran || !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("Run after Close = %v (stage ran: %v); want %v and no stage", err, ran, errdefs.ErrClosed)
	}
	if n := st.fences.Load(); n != 1 {
		t.Fatalf("fences %d; want 1", n)
	}
	if err := sess.Close(ctx); err != nil {
		t.Fatalf("second Close = %v", err)
	}
}

func TestGuardCloseNeverOverlapsAStage(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	// Each trial: one goroutine runs stages back to back until Run says
	// Closed, while the test calls Close until it is not Busy. Close must
	// never close the owner under a running stage, and once it succeeded
	// no stage may start. Both goroutines spin without yielding between
	// calls, so they contend for the session's lock: a Close that checks
	// for a running stage apart from marking the session closed is caught
	// that way, though not in every run: this race is sought, not forced.
	// Every interleaving has one right answer.
	trials := 250
	if testing.Short() {
		trials = 25
	}
	f := newFixture(t)
	for i := range trials {
		sess, owner := f.bareSession(t, fmt.Sprintf("c%d", i))
		var overlapped, startedAfterClose atomic.Bool
		var closeDone atomic.Bool
		runner := make(chan error, 1)
		first := make(chan struct{})
		go func() {
			var err error
			for n := 0; ; n++ {
				err = sess.Run(callCtx, func(context.Context, *bare) error {
					if closeDone.Load() {
						startedAfterClose.Store(true)
					}
					runtime.Gosched()
					if owner.Err() != nil {
						overlapped.Store(true)
					}
					return nil
				})
				if n == 0 {
					close(first)
				}
				if err != nil {
					break
				}
			}
			runner <- err
		}()
		<-first
		var err error
		for err = sess.Close(callCtx); errors.Is(err, errdefs.ErrBusy); err = sess.Close(callCtx) {
		}
		closeDone.Store(true)
		if err != nil {
			t.Fatalf("trial %d: Close = %v", i, err)
		}
		if runErr := <-runner; !errors.Is(runErr, errdefs.ErrClosed) {
			t.Fatalf("trial %d: Run after Close = %v; want %v", i, runErr, errdefs.ErrClosed)
		}
		if overlapped.Load() || startedAfterClose.Load() {
			t.Fatalf("trial %d: Close closed the owner under a running stage (%v) or a stage started after Close (%v)", i, overlapped.Load(), startedAfterClose.Load())
		}
	}
}

// ---- Goexit ----

func TestGuardGoexitInAStageFencesAndReleasesTheLane(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newFixture(t)
	sess, _ := f.session(t, "exits", countingFence)
	st, _ := sess.State()
	var wg sync.WaitGroup
	wg.Add(1)
	returned := false
	go func() {
		defer wg.Done()
		_ = sess.Run(callCtx, func(ctx context.Context, s *state) error {
			if err := noopStage(ctx, s); err != nil {
				return err
			}
			runtime.Goexit() // what t.Fatal does in a stage's test
			return nil
		})
		returned = true // never: Goexit goes on exiting after the fence
	}()
	wg.Wait()
	if returned {
		t.Fatal("Run returned to a goroutine that called runtime.Goexit")
	}
	if n := st.fences.Load(); n != 1 {
		t.Fatalf("fences %d after runtime.Goexit; want 1", n)
	}
	if !st.stream.Idle() {
		t.Fatal("the stage's work was not drained")
	}
	if s := f.rt.Stats(); s.LeasedPerLane[host.LaneCompute] || s.CapacityUsed != 0 {
		t.Fatalf("the lease outlived runtime.Goexit: %+v", s)
	}
	if err := sess.Quarantined(); err != nil {
		t.Fatalf("a drained session was quarantined: %v", err)
	}
	if _, err := sess.State(); err != nil {
		t.Fatalf("the session still reads as running: %v", err)
	}
	recs := f.rt.Tracer().Records()
	if len(recs) != 1 || !recs[0].Failed {
		t.Fatalf("records %+v; want the exited stage traced as failed", recs)
	}
	// Another session on the same device gets the compute lane, and this
	// one runs again.
	ctx, cancel := context.WithTimeout(context.Background(), guardPatience)
	defer cancel()
	next, _ := f.session(t, "next", countingFence)
	if err := next.Run(ctx, noopStage); err != nil {
		t.Fatalf("compute lane after runtime.Goexit: %v", err)
	}
	if err := sess.Run(ctx, noopStage); err != nil {
		t.Fatalf("the session after runtime.Goexit: %v", err)
	}
}

func TestGuardGoexitWithAFailingFenceQuarantinesAndReleases(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newFixture(t)
	sess, budget := f.session(t, "exits-badly", countingFence)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = sess.Run(callCtx, func(ctx context.Context, s *state) error {
			s.fail = true
			runtime.Goexit()
			return nil
		})
	}()
	wg.Wait()
	if err := sess.Quarantined(); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("Quarantined = %v", err)
	}
	if s := f.rt.Stats(); s.LeasedPerLane[host.LaneCompute] || s.CapacityUsed != 0 || s.QuarantinedBytes != 4096 {
		t.Fatalf("stats after a failed fence under runtime.Goexit: %+v", s)
	}
	if budget.Used() == 0 {
		t.Fatal("quarantine released the charges")
	}
}

// ---- failed device work is never OK ----

// faultySession is a session whose stream fails its next n commands.
func (f *fixture) faultySession(t *testing.T, name string, fence stages.Fence[state], n int) (*stages.NativeSession[state], *state) {
	t.Helper()
	sess, _ := f.session(t, name, fence)
	st, _ := sess.State()
	st.stream.(*sim.Stream).Inject(sim.Fault{Kind: sim.FailCompletion, Count: n})
	return sess, st
}

func TestGuardBuiltinFenceReportsFailedWorkAsFault(t *testing.T) {
	f := newFixture(t)
	sess, st := f.faultySession(t, "faulty", nil, 2)
	ctx := testutil.Context(t, time.Minute)
	err := sess.Run(ctx, func(ctx context.Context, s *state) error {
		for range 3 {
			if err := noopStage(ctx, s); err != nil {
				return err
			}
		}
		return nil // the stage never looked at its work
	})
	if !errors.Is(err, errdefs.ErrFault) || errdefs.ClassOf(err) != errdefs.ErrFault {
		t.Fatalf("Run whose device work failed = %v; want class %v", err, errdefs.ErrFault)
	}
	if !strings.Contains(err.Error(), "2 device command(s) failed") {
		t.Fatalf("Run = %q; want both failed commands", err)
	}
	if q := sess.Quarantined(); q != nil || !st.stream.Idle() {
		t.Fatalf("a proven drain quarantined (%v) or left work (idle %v)", q, st.stream.Idle())
	}
	if err := sess.Run(ctx, noopStage); err != nil {
		t.Fatalf("the next, clean call = %v; a fault belongs to its own call", err)
	}
	if recs := f.rt.Tracer().Records(); len(recs) != 2 || !recs[0].Failed || recs[1].Failed {
		t.Fatalf("records %+v; want the faulty call traced as failed", recs)
	}
}

func TestGuardClientErrorWinsButKeepsTheFault(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newFixture(t)
	sess, _ := f.faultySession(t, "faulty-client", nil, 1)
	clientErr := errors.New("bad input")
	err := sess.Run(callCtx, func(ctx context.Context, s *state) error {
		if err := noopStage(ctx, s); err != nil {
			return err
		}
		return clientErr
	})
	if !errors.Is(err, clientErr) || !errors.Is(err, errdefs.ErrFault) {
		t.Fatalf("Run = %v; want the client error, with the fault wrapped too", err)
	}
	if !strings.Contains(err.Error(), "command 1 failed") {
		t.Fatalf("Run = %q; the fault must be named", err)
	}
	if sess.Quarantined() != nil {
		t.Fatal("quarantined after a proven drain")
	}
}

func TestGuardCustomFenceFaultWithIdleStreamsIsFaultNotQuarantine(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newFixture(t)
	// countingFence returns what Sync returns: the failed command's fault,
	// after every command retired.
	sess, st := f.faultySession(t, "fence-fault", countingFence, 1)
	err := sess.Run(callCtx, noopStage)
	if errdefs.ClassOf(err) != errdefs.ErrFault {
		t.Fatalf("Run = %v; want class %v", err, errdefs.ErrFault)
	}
	if q := sess.Quarantined(); q != nil {
		t.Fatalf("a fence that drained and reported a fault quarantined: %v", q)
	}
	if st.fences.Load() != 1 {
		t.Fatalf("fences %d", st.fences.Load())
	}
	if err := sess.Run(callCtx, noopStage); err != nil {
		t.Fatalf("next call = %v", err)
	}
}

func TestGuardCustomFenceFaultWithBusyStreamsQuarantines(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newFixture(t)
	// The fence says "drained, but work failed" without draining.
	liar := func(ctx context.Context, s *state) error {
		return errdefs.Errorf(errdefs.ErrFault, "a command failed")
	}
	sess, _ := f.session(t, "fault-liar", liar)
	st, _ := sess.State()
	release := st.stream.(*sim.Stream).Inject(sim.Fault{Kind: sim.Hang})
	defer release()
	err := sess.Run(callCtx, noopStage)
	if !errors.Is(err, errdefs.ErrDeviceLost) || sess.Quarantined() == nil {
		t.Fatalf("a Fault from a fence that left work = %v; want quarantine", err)
	}
}

func TestGuardFenceFaultJoinedWithLossQuarantines(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newFixture(t)
	// The streams are idle, but the fence's error also says a device was
	// lost: that is not a proven drain.
	fence := func(ctx context.Context, s *state) error {
		return errors.Join(errdefs.Errorf(errdefs.ErrFault, "a command failed"), errdefs.Errorf(errdefs.ErrDeviceLost, "a device was lost"))
	}
	sess, _ := f.session(t, "fault-and-loss", fence)
	err := sess.Run(callCtx, func(context.Context, *state) error { return nil })
	if !errors.Is(err, errdefs.ErrDeviceLost) || sess.Quarantined() == nil {
		t.Fatalf("Run = %v; want quarantine", err)
	}
}

func TestGuardFaultNotedByTheStageFailsTheCall(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newFixture(t)
	// The stage syncs its own stream (as a guest's stream_sync does) and
	// notes the fault it saw; the fence's Sync then finds nothing new.
	sess, _ := f.faultySession(t, "noted", countingFence, 1)
	err := sess.Run(callCtx, func(ctx context.Context, s *state) error {
		if err := noopStage(ctx, s); err != nil {
			return err
		}
		if err := s.stream.Sync(ctx); err != nil {
			if errdefs.ClassOf(err) != errdefs.ErrFault {
				return err
			}
			sess.Owner().NoteFault(err)
		}
		return nil
	})
	if errdefs.ClassOf(err) != errdefs.ErrFault || sess.Quarantined() != nil {
		t.Fatalf("Run = %v; want class %v without quarantine", err, errdefs.ErrFault)
	}
}

func TestGuardStaleFaultsAreNotTheCallsFaults(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newFixture(t)
	sess, _ := f.session(t, "stale", nil)
	sess.Owner().NoteFault(errdefs.Errorf(errdefs.ErrFault, "from before the call"))
	if err := sess.Run(callCtx, noopStage); err != nil {
		t.Fatalf("Run = %v; a fault noted before the call is not the call's", err)
	}
}

// ---- N1: lanes of one device ----

func TestGuardUploadOnTheStagesOwnDeviceFlowsWhileItHoldsCompute(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	// The stage holds gpu0's compute lane with a kernel held in flight (a
	// Hang on its stream, released only after the upload). An upload on
	// gpu0's upload lane, to a gpu0 buffer through another gpu0 stream,
	// must complete meanwhile. Only a broken lane split makes the upload
	// wait; its admission then fails after guardPatience instead of
	// hanging the test.
	f := newFixture(t)
	sess, _ := f.session(t, "stage", nil)
	upStream, err := f.gpu.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = upStream.Close(callCtx) })
	upBuf, err := f.gpu.Alloc(1024, hw.AllocHostVisible, nil)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 1024)
	for i := range data {
		data[i] = byte(i)
	}
	stageStarted := make(chan struct{})
	uploaded := make(chan error, 1)
	go func() {
		<-stageStarted
		ctx, cancel := context.WithTimeout(context.Background(), guardPatience)
		defer cancel()
		uploaded <- f.rt.Submit(ctx, host.Op{Lane: host.LaneUpload, Owner: "loader", Device: "gpu0"}, func(ctx context.Context) error {
			c, err := upStream.Write(upBuf, 0, data)
			if err != nil {
				return err
			}
			return c.Wait(ctx)
		})
	}()
	err = sess.Run(callCtx, func(ctx context.Context, s *state) error {
		release := s.stream.(*sim.Stream).Inject(sim.Fault{Kind: sim.Hang})
		defer release()
		c, err := s.stream.Submit(&hw.Command{Program: s.noop})
		if err != nil {
			return err
		}
		if st := f.rt.Stats(); !st.LeasedPerLane[host.LaneCompute] {
			return errors.New("the stage does not hold the compute lane")
		}
		close(stageStarted)
		if err := <-uploaded; err != nil {
			return fmt.Errorf("upload on the stage's own device: %w", err)
		}
		if c.Done() {
			return errors.New("the stage's kernel retired before the upload although it was held")
		}
		release()
		return c.Wait(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := upBuf.HostBytes()
	if err != nil {
		t.Fatal(err)
	}
	for i := range data {
		if got[i] != data[i] {
			t.Fatalf("uploaded byte %d = %d; want %d", i, got[i], data[i])
		}
	}
	var stage, upload host.Record
	for _, r := range f.rt.Tracer().Records() {
		switch r.Owner {
		case "stage":
			stage = r
		case "loader":
			upload = r
		}
	}
	if upload.Device != "gpu0" || stage.Device != "gpu0" || upload.Lane != host.LaneUpload {
		t.Fatalf("records stage %+v, upload %+v; want both on gpu0", stage, upload)
	}
	if upload.Start.Before(stage.Start) || upload.Start.Add(upload.Dur).After(stage.Start.Add(stage.Dur)) {
		t.Fatalf("upload %v+%v not inside stage %v+%v", upload.Start, upload.Dur, stage.Start, stage.Dur)
	}
}

// ---- a panic still re-raises after the deferred fence ----

func TestGuardPanicInStageStillReRaisedAfterDeferredFence(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newFixture(t)
	sess, _ := f.session(t, "panics", countingFence)
	st, _ := sess.State()
	var fencesAtPanic int32
	v := catchPanic(func() {
		defer func() { fencesAtPanic = st.fences.Load() }()
		_ = sess.Run(callCtx, func(context.Context, *state) error { panic("boom") })
	})
	if v != "boom" || fencesAtPanic != 1 {
		t.Fatalf("panic %v with %d fences run before it reached the caller", v, fencesAtPanic)
	}
	if _, err := sess.State(); err != nil {
		t.Fatalf("the session still reads as running after a panic: %v", err)
	}
	var calls atomic.Int32
	if err := sess.Run(callCtx, func(context.Context, *state) error { calls.Add(1); return nil }); err != nil || calls.Load() != 1 {
		t.Fatalf("Run after a panic = %v", err)
	}
}
