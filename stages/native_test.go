package stages_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
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

type fixture struct {
	rt  *host.Runtime
	p   *sim.Platform
	gpu *sim.Device
	cpu *sim.Device
}

func newFixture(t testing.TB, cfgs ...sim.DeviceConfig) *fixture {
	devCfg := sim.NewDeviceConfig()
	if len(cfgs) > 0 {
		devCfg = cfgs[0]
	}
	t.Helper()
	rt, err := host.NewRuntime(host.NewConfig().WithCapacity(8))
	if err != nil {
		t.Fatal(err)
	}
	p := sim.New()
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, devCfg)
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := p.AddDevice("cpu0", hw.EngineCPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &fixture{rt: rt, p: p, gpu: gpu, cpu: cpu}
}

// state is the test model: a stream, a buffer, and counters.
type state struct {
	stream hw.Stream
	buf    hw.Buffer
	noop   hw.Program
	fences *atomic.Int32
	fail   bool
	panic  bool
}

func (f *fixture) session(t testing.TB, name string, fence stages.Fence[state], cfgs ...stages.NativeConfig) (*stages.NativeSession[state], *hw.Budget) {
	t.Helper()
	cfg := stages.NewNativeConfig()
	if len(cfgs) > 0 {
		cfg = cfgs[0]
	}
	budget := hw.NewBudget(name, 1<<20)
	owner := host.NewOwner(name, budget)
	stream, err := owner.NewStream(f.gpu)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := owner.Alloc(f.gpu, 4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	noop, err := owner.Prepare(f.gpu, "noop")
	if err != nil {
		t.Fatal(err)
	}
	st := state{stream: stream, buf: buf, noop: noop, fences: new(atomic.Int32)}
	return stages.NewNative(f.rt, owner, st, fence, cfg), budget
}

// countingFence is the seed's test fence: it counts, may panic or fail,
// and otherwise drains the stream.
func countingFence(ctx context.Context, s *state) error {
	s.fences.Add(1)
	if s.panic {
		panic("fence panic")
	}
	if s.fail {
		return errdefs.Errorf(errdefs.ErrDeviceLost, "fence failed")
	}
	return s.stream.Sync(ctx)
}

func catchPanic(f func()) (v any) {
	defer func() { v = recover() }()
	f()
	return nil
}

func TestStagesBorrowDrainErrorsAndPanicsThenReuse(t *testing.T) {
	f := newFixture(t)
	sess, budget := f.session(t, "model", countingFence)
	ctx := testutil.Context(t, time.Minute)
	clientErr := errors.New("client error")
	output := 0

	err := sess.Run(ctx, func(ctx context.Context, s *state) error {
		output = 42
		return clientErr
	})
	if !errors.Is(err, clientErr) || output != 42 {
		t.Fatalf("client error run: %v, output %d", err, output)
	}
	if v := catchPanic(func() {
		_ = sess.Run(ctx, func(context.Context, *state) error { panic("stage panic") })
	}); v != "stage panic" {
		t.Fatalf("panic not re-raised: %v", v)
	}
	if err := sess.Run(ctx, func(ctx context.Context, s *state) error {
		c, err := s.stream.Submit(&hw.Command{Program: s.noop})
		if err != nil {
			return err
		}
		output = 7
		_ = c
		return nil
	}); err != nil || output != 7 {
		t.Fatalf("reuse: %v", err)
	}
	st, err := sess.State()
	if err != nil {
		t.Fatal(err)
	}
	if n := st.fences.Load(); n != 3 {
		t.Fatalf("fences %d, want 3", n)
	}
	if !st.stream.Idle() {
		t.Fatal("fence returned with work pending")
	}
	if budget.Used() == 0 {
		t.Fatal("allocation not charged")
	}
	if err := sess.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if budget.Used() != 0 {
		t.Fatalf("close kept %d bytes charged", budget.Used())
	}
}

func TestUncertainFencesKeepOwnersAndRejectRetry(t *testing.T) {
	for _, panics := range []bool{false, true} {
		f := newFixture(t)
		sess, budget := f.session(t, "doomed", countingFence)
		st, _ := sess.State()
		fences := st.fences
		charged := budget.Used()
		ctx := testutil.Context(t, time.Minute)

		var err error
		v := catchPanic(func() {
			err = sess.Run(ctx, func(ctx context.Context, s *state) error {
				s.fail, s.panic = true, panics
				return nil
			})
		})
		if panics {
			if v != "fence panic" {
				t.Fatalf("fence panic not re-raised: %v", v)
			}
		} else if v != nil || !errors.Is(err, errdefs.ErrDeviceLost) {
			t.Fatalf("failing fence: err %v, panic %v", err, v)
		}
		ran := false
		if err := sess.Run(ctx, func(context.Context, *state) error { ran = true; return nil }); !errors.Is(err, errdefs.ErrDeviceLost) || ran {
			t.Fatalf("retry after quarantine: %v (ran %v)", err, ran)
		}
		if _, err := sess.State(); !errors.Is(err, errdefs.ErrDeviceLost) {
			t.Fatalf("State after quarantine: %v", err)
		}
		if err := sess.Close(ctx); !errors.Is(err, errdefs.ErrDeviceLost) {
			t.Fatalf("Close of a quarantined session: %v", err)
		}
		if fences.Load() != 1 {
			t.Fatalf("fences %d", fences.Load())
		}
		if budget.Used() != charged || charged == 0 {
			t.Fatalf("quarantine released charges: %d of %d", budget.Used(), charged)
		}
		stats := f.rt.Stats()
		if len(stats.Quarantined) != 1 || stats.Quarantined[0] != "doomed" || stats.QuarantinedBytes != 4096 {
			t.Fatalf("runtime stats %+v", stats)
		}
		// The failed owner is quarantined, not the runtime's lane.
		next, _ := f.session(t, "next", countingFence)
		if err := next.Run(ctx, func(context.Context, *state) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRecursiveAdmissionReturnsBusyInsteadOfDeadlocking(t *testing.T) {
	f := newFixture(t)
	outer, _ := f.session(t, "outer", countingFence)
	inner, _ := f.session(t, "inner", countingFence)
	// With a deadline: a recursive run that waits for the compute lane
	// instead of answering busy fails here rather than hanging the test.
	ctx := testutil.Context(t, 5*time.Second)
	var innerErr, selfErr error
	if err := outer.Run(ctx, func(ctx context.Context, _ *state) error {
		innerErr = inner.Run(ctx, func(context.Context, *state) error { return nil })
		selfErr = outer.Run(ctx, func(context.Context, *state) error { return nil })
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(innerErr, errdefs.ErrBusy) || !errors.Is(selfErr, errdefs.ErrBusy) {
		t.Fatalf("nested runs: %v, %v", innerErr, selfErr)
	}
	if err := inner.Run(ctx, func(context.Context, *state) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestFenceRunsOnEveryExitPath(t *testing.T) {
	f := newFixture(t)
	sess, _ := f.session(t, "paths", countingFence)
	st, _ := sess.State()
	ctx := testutil.Context(t, time.Minute)
	want := int32(0)
	check := func(path string) {
		t.Helper()
		want++
		if got := st.fences.Load(); got != want {
			t.Fatalf("%s: fences %d, want %d", path, got, want)
		}
	}
	if err := sess.Run(ctx, func(context.Context, *state) error { return nil }); err != nil {
		t.Fatal(err)
	}
	check("success")
	if err := sess.Run(ctx, func(context.Context, *state) error { return errors.New("bad input") }); err == nil {
		t.Fatal("client error lost")
	}
	check("client error")
	// The panic reaches the caller only after the fence ran.
	v := catchPanic(func() {
		_ = sess.Run(ctx, func(context.Context, *state) error { panic("trap") })
	})
	if v != "trap" {
		t.Fatalf("panic %v", v)
	}
	check("panic")
	dctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	err := sess.Run(dctx, func(ctx context.Context, s *state) error {
		<-ctx.Done() // the stage runs into its deadline
		return ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	check("deadline")
	// A client error or a deadline does not poison a drained session.
	if err := sess.Quarantined(); err != nil {
		t.Fatal(err)
	}
	if err := sess.Run(ctx, func(context.Context, *state) error { return nil }); err != nil {
		t.Fatal(err)
	}
	check("after")
}

func TestPanicIsReportedAfterFencingAndLeaseRelease(t *testing.T) {
	f := newFixture(t)
	sess, _ := f.session(t, "p", countingFence)
	st, _ := sess.State()
	v := catchPanic(func() {
		_ = sess.Run(context.Background(), func(context.Context, *state) error { panic("boom") })
	})
	if v != "boom" || st.fences.Load() != 1 {
		t.Fatalf("panic %v after %d fences", v, st.fences.Load())
	}
	if s := f.rt.Stats(); s.LeasedPerLane[host.LaneCompute] || s.CapacityUsed != 0 {
		t.Fatalf("lease still held after the panic: %+v", s)
	}
}

func TestFenceThatLiesIsAFailedFence(t *testing.T) {
	f := newFixture(t)
	liar := func(ctx context.Context, s *state) error { return nil } // returns OK without draining
	sess, _ := f.session(t, "liar", liar)
	st, _ := sess.State()
	release := st.stream.(*sim.Stream).Inject(sim.Fault{Kind: sim.Hang})
	defer release()
	err := sess.Run(context.Background(), func(ctx context.Context, s *state) error {
		_, err := s.stream.Submit(&hw.Command{Program: s.noop})
		return err
	})
	if !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("lying fence: %v", err)
	}
	if sess.Quarantined() == nil {
		t.Fatal("not quarantined")
	}
}

func TestFenceTimeoutQuarantinesOnlyThatOwner(t *testing.T) {
	f := newFixture(t)
	stuck, stuckBudget := f.session(t, "stuck", nil, stages.NewNativeConfig().WithFenceTimeout(10*time.Millisecond))
	healthy, _ := f.session(t, "healthy", nil)
	sst, _ := stuck.State()
	release := sst.stream.(*sim.Stream).Inject(sim.Fault{Kind: sim.Hang})
	defer release()
	ctx := testutil.Context(t, time.Minute)
	err := stuck.Run(ctx, func(ctx context.Context, s *state) error {
		_, err := s.stream.Submit(&hw.Command{Program: s.noop})
		return err
	})
	if !errors.Is(err, errdefs.ErrDeviceLost) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("timed-out fence: %v", err)
	}
	if stuckBudget.Used() == 0 {
		t.Fatal("quarantine dropped the charge")
	}
	// Other sessions and every lane keep working.
	for range 3 {
		if err := healthy.Run(ctx, func(ctx context.Context, s *state) error {
			c, err := s.stream.Submit(&hw.Command{Program: s.noop})
			if err != nil {
				return err
			}
			return c.Wait(ctx)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for l := range host.NumLanes {
		if err := f.rt.Submit(ctx, host.Op{Lane: host.Lane(l), Owner: "probe"}, func(context.Context) error { return nil }); err != nil {
			t.Fatalf("lane %v: %v", host.Lane(l), err)
		}
	}
	if err := stuck.Run(ctx, func(context.Context, *state) error { return nil }); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("stuck session ran again: %v", err)
	}
}

// TestFenceThatReturnsAfterItsDeadlineFails: a Go fence that reports a
// drain (nil, or only failed device work) after its deadline has passed
// is a failed fence all the same (N6): the call fails with
// errdefs.ErrDeviceLost wrapping the deadline, the session is quarantined
// and its owner keeps its charges, although every stream is idle.
func TestFenceThatReturnsAfterItsDeadlineFails(t *testing.T) {
	for _, c := range []struct {
		name string
		ret  error
	}{
		{"nil", nil},
		{"failed device work", errdefs.Errorf(errdefs.ErrFault, "a kernel failed")},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			late := func(ctx context.Context, s *state) error {
				<-ctx.Done() // the fence's own deadline
				if err := s.stream.Sync(context.Background()); err != nil {
					return err
				}
				return c.ret
			}
			sess, budget := f.session(t, "late", late, stages.NewNativeConfig().WithFenceTimeout(10*time.Millisecond))
			ctx := testutil.Context(t, 10*time.Second)
			err := sess.Run(ctx, func(context.Context, *state) error { return nil })
			if !errors.Is(err, errdefs.ErrDeviceLost) || !errors.Is(err, errdefs.ErrDeadlineExceeded) {
				t.Fatalf("a fence that returned %v after its deadline: Run = %v, want device_lost wrapping deadline_exceeded", c.ret, err)
			}
			if sess.Quarantined() == nil {
				t.Fatal("the session is not quarantined")
			}
			if budget.Used() == 0 {
				t.Fatal("the quarantine dropped the owner's charges")
			}
			if err := sess.Run(ctx, func(context.Context, *state) error { return nil }); !errors.Is(err, errdefs.ErrDeviceLost) {
				t.Fatalf("a later run: %v", err)
			}
		})
	}
}

func TestUploadFlowsWhileStageHoldsCompute(t *testing.T) {
	// The stage holds compute with a kernel in flight on the simulated GPU
	// (50ms per command, and held until the upload is done, so the overlap
	// does not depend on timing), and will not finish until an upload,
	// submitted meanwhile on the upload lane, has completed. If the lease
	// blocked uploads, this would time out.
	f := newFixture(t, sim.NewDeviceConfig().WithLatency(50*time.Millisecond))
	sess, _ := f.session(t, "stage", nil)
	upStream, err := f.cpu.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	upBuf, err := f.cpu.Alloc(1024, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 1024)
	ctx := testutil.Context(t, time.Minute)
	stageStarted := make(chan struct{})
	uploaded := make(chan error, 1)
	go func() {
		<-stageStarted
		uploaded <- f.rt.Submit(ctx, host.Op{Lane: host.LaneUpload, Owner: "loader", Device: "cpu0"}, func(ctx context.Context) error {
			c, err := upStream.Write(upBuf, 0, data)
			if err != nil {
				return err
			}
			return c.Wait(ctx)
		})
	}()
	err = sess.Run(ctx, func(ctx context.Context, s *state) error {
		release := s.stream.(*sim.Stream).Inject(sim.Fault{Kind: sim.Hang})
		defer release()
		c, err := s.stream.Submit(&hw.Command{Program: s.noop})
		if err != nil {
			return err
		}
		close(stageStarted)
		select {
		case err := <-uploaded:
			if err != nil {
				return err
			}
		case <-time.After(10 * time.Second):
			return errors.New("upload blocked by the compute lease")
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
	var stage, upload host.Record
	for _, r := range f.rt.Tracer().Records() {
		switch r.Owner {
		case "stage":
			stage = r
		case "loader":
			upload = r
		}
	}
	if upload.Start.Before(stage.Start) || upload.Start.Add(upload.Dur).After(stage.Start.Add(stage.Dur)) {
		t.Fatalf("upload %v+%v not inside stage %v+%v", upload.Start, upload.Dur, stage.Start, stage.Dur)
	}
	if stage.Dur < 50*time.Millisecond {
		t.Fatalf("the stage held compute for %v, less than its kernel's simulated latency", stage.Dur)
	}
}

func TestTracerRecordsEveryStage(t *testing.T) {
	f := newFixture(t)
	sess, _ := f.session(t, "traced", countingFence)
	ctx := testutil.Context(t, time.Minute)
	_ = sess.Run(ctx, func(context.Context, *state) error { return nil })
	_ = sess.Run(ctx, func(context.Context, *state) error { return errors.New("x") })
	recs := f.rt.Tracer().Records()
	if len(recs) != 2 {
		t.Fatalf("%d records", len(recs))
	}
	for i, r := range recs {
		if r.Lane != host.LaneCompute || r.Owner != "traced" || r.Device != "gpu0" || r.Start.IsZero() || r.Dur <= 0 {
			t.Fatalf("record %d: %+v", i, r)
		}
		if r.Failed != (i == 1) {
			t.Fatalf("record %d failed=%v", i, r.Failed)
		}
	}
}

func TestConcurrentRunOfOneSessionIsBusy(t *testing.T) {
	f := newFixture(t)
	sess, _ := f.session(t, "one", countingFence)
	ctx := testutil.Context(t, time.Minute)
	inside := make(chan struct{})
	leave := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sess.Run(ctx, func(context.Context, *state) error {
			close(inside)
			<-leave
			return nil
		})
	}()
	<-inside
	if err := sess.Run(ctx, func(context.Context, *state) error { return nil }); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("concurrent run: %v", err)
	}
	close(leave)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestDeviceLossFailsPendingAndLaterWorkAndQuarantines(t *testing.T) {
	f := newFixture(t, sim.NewDeviceConfig().WithLatency(time.Hour)) // nothing retires on its own
	lost, _ := f.session(t, "on-lost-device", nil)
	other, err := f.p.AddDevice("gpu1", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, time.Minute)
	var pending []hw.Completion
	err = lost.Run(ctx, func(ctx context.Context, s *state) error {
		for range 5 {
			c, err := s.stream.Submit(&hw.Command{Program: s.noop})
			if err != nil {
				return err
			}
			pending = append(pending, c)
		}
		f.gpu.Lose("test: device lost mid-stage")
		return nil
	})
	if !errors.Is(err, errdefs.ErrDeviceLost) || lost.Quarantined() == nil {
		t.Fatalf("stage on a lost device: %v", err)
	}
	for i, c := range pending {
		if err := c.Wait(ctx); !errors.Is(err, errdefs.ErrDeviceLost) {
			t.Fatalf("pending %d: %v", i, err)
		}
	}
	st, _ := f.gpu.NewStream()
	if st != nil {
		t.Fatal("new stream on a lost device")
	}
	// Another device and the runtime keep working.
	owner := host.NewOwner("survivor", nil)
	s2, err := owner.NewStream(other)
	if err != nil {
		t.Fatal(err)
	}
	noop, err := owner.Prepare(other, "noop")
	if err != nil {
		t.Fatal(err)
	}
	survivor := stages.NewNative(f.rt, owner, struct{}{}, nil, stages.NewNativeConfig())
	if err := survivor.Run(ctx, func(ctx context.Context, _ *struct{}) error {
		_, err := s2.Submit(&hw.Command{Program: noop})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// goroutineID parses the current goroutine's id from its stack header
// ("goroutine 7 [running]:"); tests only.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return strings.Fields(string(buf))[1]
}

func TestStageRunsSynchronouslyOnTheCallersGoroutine(t *testing.T) {
	f := newFixture(t)
	sess, _ := f.session(t, "sync", countingFence)
	caller := goroutineID()
	var inStage string
	if err := sess.Run(context.Background(), func(context.Context, *state) error {
		inStage = goroutineID()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if inStage != caller {
		t.Fatalf("the stage ran on goroutine %s, the caller is %s", inStage, caller)
	}
}
