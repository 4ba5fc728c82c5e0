package sim_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

var tags atomic.Uint64

func TestPlatformDevices(t *testing.T) {
	p := sim.New()
	a, err := p.AddDevice("a", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.AddDevice("b", hw.EngineNPU, sim.NewDeviceConfig().WithQueueDepth(4).WithLatency(0))
	if err != nil {
		t.Fatal(err)
	}
	if a.QueueDepth() != sim.DefaultQueueDepth || b.QueueDepth() != 4 || a.Latency() != 0 {
		t.Fatalf("options: depth %d/%d latency %v", a.QueueDepth(), b.QueueDepth(), a.Latency())
	}
	for _, tc := range []struct {
		name string
		cfg  sim.DeviceConfig
	}{
		{"", sim.NewDeviceConfig()},
		{"a", sim.NewDeviceConfig()},
		{"c", sim.NewDeviceConfig().WithQueueDepth(0)},
		{"c", sim.NewDeviceConfig().WithQueueDepth(sim.MaxQueueDepth + 1)},
		{"c", sim.NewDeviceConfig().WithLatency(-1)},
	} {
		if _, err := p.AddDevice(tc.name, hw.EngineCPU, tc.cfg); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("AddDevice(%q): got %v, want invalid argument", tc.name, err)
		}
	}
	devs := p.Devices()
	if len(devs) != 2 || devs[0] != hw.Device(a) || devs[1] != hw.Device(b) {
		t.Fatalf("Devices() = %v", devs)
	}
	if d, err := p.Device("b"); err != nil || d != hw.Device(b) || d.Engine() != hw.EngineNPU || d.Name() != "b" {
		t.Fatalf("Device(b) = %v, %v", d, err)
	}
	if _, err := p.Device("zz"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Device(zz): %v", err)
	}
	if _, err := a.Prepare("no-such-kernel"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Prepare(unknown): %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	wantClass(t, p.Close(), errdefs.ErrClosed)
	_, err = p.AddDevice("c", hw.EngineCPU, sim.NewDeviceConfig())
	wantClass(t, err, errdefs.ErrClosed)
	_, err = a.NewStream()
	wantClass(t, err, errdefs.ErrClosed)
	_, err = a.Alloc(8, 0, nil)
	wantClass(t, err, errdefs.ErrClosed)
	_, err = a.Prepare("noop")
	wantClass(t, err, errdefs.ErrClosed)
}

func TestInOrderExecution(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  sim.DeviceConfig
	}{
		{"latency0", sim.NewDeviceConfig()},
		{"latency1us", sim.NewDeviceConfig().WithLatency(1000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.cfg)
			log := r.prog(r.dev, "test.log")
			fill := r.prog(r.dev, "fill")
			buf := r.alloc(r.dev, 4)
			tag := tags.Add(1)
			const n = 300
			var last hw.Completion
			for i := range n {
				r.submit(r.st, log, hw.Uint(tag), hw.Uint(uint64(i)))
				// A write then a fill of the same word: only the order
				// write → fill leaves the fill's value.
				var w [4]byte
				putF32(w[:], -1)
				if _, err := r.st.Write(buf, 0, w[:]); err != nil {
					t.Fatal(err)
				}
				last = r.submit(r.st, fill, hw.BufferArg(buf, 0, -1), hw.Float32(float32(i)))
			}
			if err := last.Wait(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			got := logged(tag)
			if len(got) != n {
				t.Fatalf("%d commands ran, want %d", len(got), n)
			}
			for i, v := range got {
				if v != uint64(i) {
					t.Fatalf("command %d ran at position %d", v, i)
				}
			}
			equalF32(t, "last fill", getF32(host(t, buf)), []float32{n - 1})
			if !r.st.Idle() || r.st.Submitted() != 3*n || r.st.RetiredCount() != 3*n {
				t.Fatalf("idle %v submitted %d retired %d", r.st.Idle(), r.st.Submitted(), r.st.RetiredCount())
			}
		})
	}
}

func TestWriteRead(t *testing.T) {
	r := newRig(t)
	buf := r.alloc(r.dev, 16)
	src := []byte("0123456789abcdef")
	if _, err := r.st.Write(buf, 0, src[:8]); err != nil {
		t.Fatal(err)
	}
	if _, err := r.st.Write(buf, 8, src[8:]); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 6)
	c, err := r.st.Read(buf, 5, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if string(dst) != "56789a" || string(host(t, buf)) != string(src) {
		t.Fatalf("read %q, buffer %q", dst, host(t, buf))
	}
	// Empty transfers at the end are in range.
	if _, err := r.st.Write(buf, 16, nil); err != nil {
		t.Fatal(err)
	}
	r.sync(r.st)
}

func TestConcurrentSubmitters(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	r := newRig(t, sim.NewDeviceConfig().WithQueueDepth(64))
	log := r.prog(r.dev, "test.log")
	tag := tags.Add(1)
	const workers, each = 4, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				for {
					c, err := r.st.Submit(&hw.Command{Program: log, Args: []hw.Arg{hw.Uint(tag), hw.Uint(uint64(w*each + i))}})
					if errors.Is(err, errdefs.ErrBusy) {
						// Queue full: wait for some room by syncing.
						if err := r.st.Sync(callCtx); err != nil {
							t.Error(err)
							return
						}
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					if i%50 == 0 {
						if err := c.Wait(callCtx); err != nil {
							t.Error(err)
						}
					}
					break
				}
			}
		})
	}
	within(t, "concurrent submitters", wg.Wait)
	r.sync(r.st)
	got := logged(tag)
	if len(got) != workers*each {
		t.Fatalf("%d commands ran, want %d", len(got), workers*each)
	}
	// Each submitter's own commands ran in its order.
	next := make([]uint64, workers)
	for _, v := range got {
		w, i := v/each, v%each
		if i != next[w] {
			t.Fatalf("submitter %d: command %d ran before %d", w, i, next[w])
		}
		next[w]++
	}
}

func TestValidation(t *testing.T) {
	p := sim.New()
	d0, _ := p.AddDevice("d0", hw.EngineGPU, sim.NewDeviceConfig())
	d1, _ := p.AddDevice("d1", hw.EngineGPU, sim.NewDeviceConfig())
	r := &rig{t: t, p: p, dev: d0}
	st := r.stream(d0)
	buf := r.alloc(d0, 64)
	other := r.alloc(d1, 64)
	fill := r.prog(d0, "fill")
	fill1 := r.prog(d1, "fill")
	sh, err := p.AllocShared(64, []hw.Device{d1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Free()
	view1, _ := sh.View(d1)

	submit := func(cmd *hw.Command) error {
		_, err := st.Submit(cmd)
		return err
	}
	tooMany := make([]hw.Arg, hw.MaxArgs+1)
	for _, tc := range []struct {
		name  string
		cmd   *hw.Command
		class error
		words []string
	}{
		{"nil command", nil, errdefs.ErrInvalidArgument, nil},
		{"nil program", &hw.Command{}, errdefs.ErrInvalidArgument, nil},
		{"program of other device", &hw.Command{Program: fill1, Args: []hw.Arg{hw.BufferArg(buf, 0, -1), hw.Float32(1)}}, errdefs.ErrInvalidArgument, []string{"d1"}},
		{"too many args", &hw.Command{Program: fill, Args: tooMany}, errdefs.ErrInvalidArgument, []string{"17"}},
		{"buffer of other device", &hw.Command{Program: fill, Args: []hw.Arg{hw.Float32(1), hw.BufferArg(other, 0, -1)}}, errdefs.ErrInvalidArgument, []string{"argument 1", "d1"}},
		{"view of other device", &hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(view1, 0, -1)}}, errdefs.ErrInvalidArgument, []string{"argument 0"}},
		{"negative offset", &hw.Command{Program: fill, Args: []hw.Arg{hw.Uint(0), hw.Uint(0), {Buffer: buf, Offset: -4, Length: 4}}}, errdefs.ErrInvalidArgument, []string{"argument 2"}},
		{"negative length", &hw.Command{Program: fill, Args: []hw.Arg{{Buffer: buf, Offset: 0, Length: -1}}}, errdefs.ErrInvalidArgument, []string{"argument 0"}},
		{"past the end", &hw.Command{Program: fill, Args: []hw.Arg{{Buffer: buf, Offset: 60, Length: 8}}}, errdefs.ErrInvalidArgument, []string{"argument 0"}},
		{"offset past the end", &hw.Command{Program: fill, Args: []hw.Arg{{Buffer: buf, Offset: 65, Length: 0}}}, errdefs.ErrInvalidArgument, []string{"argument 0"}},
		{"overflowing range", &hw.Command{Program: fill, Args: []hw.Arg{{Buffer: buf, Offset: 8, Length: int(^uint(0) >> 1)}}}, errdefs.ErrInvalidArgument, []string{"argument 0"}},
		{"foreign buffer", &hw.Command{Program: fill, Args: []hw.Arg{{Buffer: fakeBuffer{}, Length: 1}}}, errdefs.ErrInvalidArgument, []string{"argument 0"}},
		{"foreign program", &hw.Command{Program: fakeProgram{}}, errdefs.ErrInvalidArgument, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantClass(t, submit(tc.cmd), tc.class, tc.words...)
		})
	}
	if _, err := st.Write(buf, 60, make([]byte, 8)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("write past the end: %v", err)
	}
	if _, err := st.Write(buf, -1, make([]byte, 1)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("write at -1: %v", err)
	}
	if _, err := st.Read(other, 0, make([]byte, 1)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("read from other device: %v", err)
	}
	if _, err := st.Read(nil, 0, make([]byte, 1)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("read from nil: %v", err)
	}
	// A valid command at the exact end still goes through, and nothing
	// was queued by the failures.
	if _, err := st.Submit(&hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(buf, 60, 4), hw.Float32(1)}}); err != nil {
		t.Fatal(err)
	}
	if st.Submitted() != 1 {
		t.Fatalf("submitted %d, want 1", st.Submitted())
	}
	// A freed buffer is refused.
	b2, _ := d0.Alloc(8, 0, nil)
	b2.Free()
	_, err = st.Submit(&hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(b2, 0, 8), hw.Float32(1)}})
	wantClass(t, err, errdefs.ErrClosed, "argument 0")
	r.sync(st)
}

type fakeBuffer struct{ hw.Buffer }

type fakeProgram struct{ hw.Program }

func TestQueueFullBusy(t *testing.T) {
	r := newRig(t, sim.NewDeviceConfig().WithQueueDepth(2))
	noop := r.prog(r.dev, "noop")
	release := r.st.Inject(sim.Fault{Kind: sim.Hang})
	defer release()
	a := r.submit(r.st, noop)
	b := r.submit(r.st, noop)
	_, err := r.st.Submit(&hw.Command{Program: noop})
	wantClass(t, err, errdefs.ErrBusy)
	_, err = r.st.Write(r.alloc(r.dev, 4), 0, make([]byte, 4))
	wantClass(t, err, errdefs.ErrBusy)
	if a.Done() || b.Done() || r.st.Idle() {
		t.Fatal("hung stream made progress")
	}
	release()
	if err := b.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if !a.Done() || a.Err() != nil {
		t.Fatal("a not retired before b")
	}
	r.submit(r.st, noop) // room again
	r.sync(r.st)
}

func TestWaitDeadline(t *testing.T) {
	r := newRig(t)
	release := r.st.Inject(sim.Fault{Kind: sim.Hang})
	defer release()
	c := r.submit(r.st, r.prog(r.dev, "noop"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := c.Wait(ctx)
	wantClass(t, err, errdefs.ErrDeadlineExceeded)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v does not match context.Canceled", err)
	}
	wantClass(t, r.st.Sync(ctx), errdefs.ErrDeadlineExceeded)
	release()
	if err := c.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// A never-submitted sequence number is refused rather than waited on.
	wantClass(t, r.st.WaitRetired(ctxT(t), 1000), errdefs.ErrInvalidArgument)
	// The zero completion is done.
	var zero hw.Completion
	if !zero.Done() || zero.Wait(ctx) != nil {
		t.Fatal("zero completion not done")
	}
}

func TestSyncReportsEachFailureOnce(t *testing.T) {
	r := newRig(t)
	noop := r.prog(r.dev, "noop")
	bad := r.prog(r.dev, "test.fail")
	ok1 := r.submit(r.st, noop)
	f1 := r.submit(r.st, bad)
	ok2 := r.submit(r.st, noop)
	f2 := r.submit(r.st, r.prog(r.dev, "test.panic"))
	err := r.st.Sync(ctxT(t))
	wantClass(t, err, errdefs.ErrFault, "test.fail always fails")
	if got := f1.Err(); got != err {
		t.Fatalf("f1.Err() = %v, want the error Sync returned", got)
	}
	if ok1.Err() != nil || ok2.Err() != nil || !ok2.Done() {
		t.Fatal("successful commands report errors")
	}
	wantClass(t, f2.Wait(ctxT(t)), errdefs.ErrFault, "boom")
	wantClass(t, r.st.Sync(ctxT(t)), errdefs.ErrFault, "boom")
	if err := r.st.Sync(ctxT(t)); err != nil {
		t.Fatalf("third Sync: %v", err)
	}
	// Failures stay attached to their completions.
	wantClass(t, f1.Wait(ctxT(t)), errdefs.ErrFault)
	// A failure after the reported ones is reported by the next Sync.
	r.submit(r.st, bad)
	wantClass(t, r.st.Sync(ctxT(t)), errdefs.ErrFault)
}

func TestClose(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	r := newRig(t)
	noop := r.prog(r.dev, "noop")
	s, _ := r.dev.NewStream()
	st := s.(*sim.Stream)
	release := st.Inject(sim.Fault{Kind: sim.Hang})
	var cs []hw.Completion
	for range 5 {
		cs = append(cs, r.submit(st, noop))
	}
	// Close with a finished context: the stream stays closing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	wantClass(t, st.Close(ctx), errdefs.ErrDeadlineExceeded)
	_, err := st.Submit(&hw.Command{Program: noop})
	wantClass(t, err, errdefs.ErrClosed)
	// Device.Close refuses while the stream is open.
	wantClass(t, r.dev.Close(), errdefs.ErrBusy)
	closed := make(chan error, 1)
	go func() { closed <- st.Close(callCtx) }()
	release()
	within(t, "Close", func() {
		if err := <-closed; err != nil {
			t.Error(err)
		}
	})
	for i, c := range cs {
		if !c.Done() || c.Err() != nil {
			t.Fatalf("command %d not drained by Close", i)
		}
	}
	wantClass(t, st.Close(callCtx), errdefs.ErrClosed)
	wantClass(t, st.Sync(callCtx), errdefs.ErrClosed)
	_, err = st.Write(r.alloc(r.dev, 4), 0, nil)
	wantClass(t, err, errdefs.ErrClosed)
}

func TestDeviceCloseNeedsEverythingReleased(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	p := sim.New()
	d, _ := p.AddDevice("d", hw.EngineCPU, sim.NewDeviceConfig())
	s, _ := d.NewStream()
	b, _ := d.Alloc(8, 0, nil)
	sh, _ := p.AllocShared(8, []hw.Device{d}, nil)
	wantClass(t, d.Close(), errdefs.ErrBusy)
	if err := s.Close(callCtx); err != nil {
		t.Fatal(err)
	}
	wantClass(t, d.Close(), errdefs.ErrBusy)
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	// Shared allocations do not keep a device open.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	wantClass(t, d.Close(), errdefs.ErrClosed)
	if err := sh.Free(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestZeroAllocSubmission(t *testing.T) {
	// The whole ring up front: growing it allocates (see
	// TestRingGrowthAllocations); submitting into it does not.
	r := newRig(t, sim.NewDeviceConfig().WithQueueDepth(4096).WithInitialQueueDepth(4096))
	noop := r.prog(r.dev, "noop")
	fill := r.prog(r.dev, "fill")
	buf := r.alloc(r.dev, 256)
	src := make([]byte, 64)
	dst := make([]byte, 64)
	cmd := &hw.Command{Program: noop}
	full := &hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(buf, 0, 256), hw.Float32(2)}}
	ctx := ctxT(t)
	for name, f := range map[string]func(){
		"Submit(noop)": func() { r.st.Submit(cmd) },
		"Submit(fill)": func() { r.st.Submit(full) },
		"Write":        func() { r.st.Write(buf, 64, src) },
		"Read":         func() { r.st.Read(buf, 128, dst) },
		"Done":         func() { c, _ := r.st.Submit(cmd); c.Done() },
		"Sync(idle)":   func() { r.st.Sync(ctx) },
	} {
		if n := testing.AllocsPerRun(500, f); n != 0 {
			t.Errorf("%s allocates %v times per call", name, n)
		}
		r.sync(r.st)
	}
	if got := r.st.Submitted(); got != r.st.RetiredCount() {
		t.Fatalf("submitted %d retired %d", got, r.st.RetiredCount())
	}
}
