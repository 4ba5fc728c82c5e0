package sim_test

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// gates[tag] holds the channels of a "test.gate" command (scalar arg 0 =
// tag): the kernel closes started, waits for open to be closed, and only
// then reads its other arguments and fills arg 1 (a buffer) with arg 2 (a
// float32). A ring that grew under it while it waited must leave its slot
// intact.
var gates sync.Map // uint64 → gate

type gate struct{ started, open chan struct{} }

func init() {
	sim.Register("test.gate", func(l *sim.Launch) error {
		g, _ := gates.Load(l.Uint(0))
		close(g.(gate).started)
		<-g.(gate).open
		v, fs := l.Float32(2), l.Float32s(1)
		for i := range fs {
			fs[i] = v
		}
		return nil
	})
}

func newGate(t *testing.T) (uint64, gate) {
	t.Helper()
	tag := tags.Add(1)
	g := gate{make(chan struct{}), make(chan struct{})}
	gates.Store(tag, g)
	t.Cleanup(func() { gates.Delete(tag) })
	return tag, g
}

func TestRingStartsSmall(t *testing.T) {
	p := sim.New()
	defer p.Close()
	for i, tc := range []struct {
		cfg         sim.DeviceConfig
		depth, init int
	}{
		{sim.NewDeviceConfig(), sim.DefaultQueueDepth, sim.DefaultInitialQueueDepth},
		{sim.NewDeviceConfig().WithQueueDepth(4), 4, 4},
		{sim.NewDeviceConfig().WithInitialQueueDepth(100).WithQueueDepth(64), 64, 64},
		{sim.NewDeviceConfig().WithInitialQueueDepth(1), sim.DefaultQueueDepth, 1},
	} {
		d, err := p.AddDevice(fmt.Sprint("d", i), hw.EngineGPU, tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if d.QueueDepth() != tc.depth || d.InitialQueueDepth() != tc.init {
			t.Errorf("%+v: depth %d initial %d, want %d and %d", tc.cfg, d.QueueDepth(), d.InitialQueueDepth(), tc.depth, tc.init)
		}
	}
	for _, n := range []int{0, -1, sim.MaxQueueDepth + 1} {
		if _, err := p.AddDevice("bad", hw.EngineGPU, sim.NewDeviceConfig().WithInitialQueueDepth(n)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("WithInitialQueueDepth(%d): %v, want invalid argument", n, err)
		}
	}
}

// TestRingGrowsUnderHeldSlot fills a stream far past its initial ring
// while the worker is inside a kernel that reads its own slot only after
// the growth: the grown ring must keep every queued command, in order, and
// leave the executing one alone. Under -race this also checks that
// growing never touches the slot the worker holds.
func TestRingGrowsUnderHeldSlot(t *testing.T) {
	r := newRig(t, sim.NewDeviceConfig().WithInitialQueueDepth(2).WithQueueDepth(1000))
	gtag, g := newGate(t)
	log, fill := r.prog(r.dev, "test.log"), r.prog(r.dev, "fill")
	first := r.alloc(r.dev, 16)
	buf := r.alloc(r.dev, 4)
	r.submit(r.st, r.prog(r.dev, "test.gate"), hw.Uint(gtag), hw.BufferArg(first, 0, -1), hw.Float32(42))
	<-g.started // the worker holds slot 1 and is running its kernel
	tag := tags.Add(1)
	const n = 999 // 1 + 999 = the whole queue depth
	var last hw.Completion
	for i := range n {
		switch i % 3 {
		case 0:
			last = r.submit(r.st, log, hw.Uint(tag), hw.Uint(uint64(i)))
		case 1:
			var w [4]byte
			putF32(w[:], -1)
			c, err := r.st.Write(buf, 0, w[:])
			if err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
			last = c
		case 2:
			last = r.submit(r.st, fill, hw.BufferArg(buf, 0, -1), hw.Float32(float32(i)))
		}
	}
	_, err := r.st.Submit(&hw.Command{Program: log, Args: []hw.Arg{hw.Uint(tag), hw.Uint(n)}})
	wantClass(t, err, errdefs.ErrBusy, "queue full (1000 commands)")
	close(g.open)
	if err := last.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	equalF32(t, "the held command", getF32(host(t, first)), []float32{42, 42, 42, 42})
	got := logged(tag)
	if len(got) != (n+2)/3 {
		t.Fatalf("%d logged commands ran, want %d", len(got), (n+2)/3)
	}
	for i, v := range got {
		if v != uint64(3*i) {
			t.Fatalf("logged command %d ran at position %d", v, i)
		}
	}
	equalF32(t, "last fill", getF32(host(t, buf)), []float32{n - 1})
	if r.st.Submitted() != n+1 || r.st.RetiredCount() != n+1 {
		t.Fatalf("submitted %d retired %d", r.st.Submitted(), r.st.RetiredCount())
	}
	// The full ring is reused round and round.
	next := uint64(n)
	for range 3 {
		for range n {
			r.submit(r.st, log, hw.Uint(tag), hw.Uint(next))
			next++
		}
		r.sync(r.st)
	}
	if got := logged(tag); len(got) != (n+2)/3+3*n || got[len(got)-1] != next-1 {
		t.Fatalf("after wrapping: %d logged, last %d", len(got), got[len(got)-1])
	}
}

// TestRingGrowsWhileRunning grows rings while the worker retires commands
// concurrently (no hang, no gate), from several submitters.
func TestRingGrowsWhileRunning(t *testing.T) {
	r := newRig(t, sim.NewDeviceConfig().WithInitialQueueDepth(1).WithQueueDepth(4096))
	log := r.prog(r.dev, "test.log")
	const submitters, each = 4, 1000
	var wg sync.WaitGroup
	tagsOf := make([]uint64, submitters)
	for s := range submitters {
		tagsOf[s] = tags.Add(1)
		wg.Go(func() {
			st := r.st
			for i := range each {
				if _, err := st.Submit(&hw.Command{Program: log, Args: []hw.Arg{hw.Uint(tagsOf[s]), hw.Uint(uint64(i))}}); err != nil {
					t.Errorf("submitter %d, command %d: %v", s, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	r.sync(r.st)
	for s, tag := range tagsOf {
		got := logged(tag)
		if len(got) != each {
			t.Fatalf("submitter %d: %d commands ran, want %d", s, len(got), each)
		}
		for i, v := range got {
			if v != uint64(i) {
				t.Fatalf("submitter %d: command %d ran at position %d", s, v, i)
			}
		}
	}
}

// TestQueueFullAtMaxDepth: the queue depth, not the ring's current size,
// is the ErrBusy limit, also when it is not a power of two.
func TestQueueFullAtMaxDepth(t *testing.T) {
	for _, depth := range []int{1, 3, 100, sim.DefaultQueueDepth} {
		r := newRig(t, sim.NewDeviceConfig().WithQueueDepth(depth))
		noop := r.prog(r.dev, "noop")
		release := r.st.Inject(sim.Fault{Kind: sim.Hang})
		var cs []hw.Completion
		for i := range depth {
			c, err := r.st.Submit(&hw.Command{Program: noop})
			if err != nil {
				t.Fatalf("depth %d: command %d: %v", depth, i, err)
			}
			cs = append(cs, c)
		}
		_, err := r.st.Submit(&hw.Command{Program: noop})
		wantClass(t, err, errdefs.ErrBusy, fmt.Sprintf("queue full (%d commands)", depth))
		_, err = r.st.SubmitBatch([]hw.Command{{Program: noop}})
		wantClass(t, err, errdefs.ErrBusy)
		release()
		for _, c := range cs {
			if err := c.Wait(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestBatchLargerThanRing submits batches larger than the ring's current
// size: the ring grows to take them whole.
func TestBatchLargerThanRing(t *testing.T) {
	r := newRig(t, sim.NewDeviceConfig().WithQueueDepth(600))
	log := r.prog(r.dev, "test.log")
	release := r.st.Inject(sim.Fault{Kind: sim.Hang})
	tag := tags.Add(1)
	seq := uint64(0)
	batch := func(n int) []hw.Command {
		cmds := make([]hw.Command, n)
		for i := range cmds {
			cmds[i] = hw.Command{Program: log, Args: []hw.Arg{hw.Uint(tag), hw.Uint(seq)}}
			seq++
		}
		return cmds
	}
	r.submit(r.st, log, hw.Uint(tag), hw.Uint(seq)) // held by the hung worker
	seq++
	for range 4 {
		r.submit(r.st, log, hw.Uint(tag), hw.Uint(seq))
		seq++
	}
	if _, err := r.st.SubmitBatch(batch(100)); err != nil { // 105 queued: 8 → 128 slots
		t.Fatal(err)
	}
	if _, err := r.st.SubmitBatch(make([]hw.Command, 601)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("batch deeper than the queue: %v", err)
	}
	over := batch(496) // 105 + 496 = 601 > 600
	seq -= 496
	if _, err := r.st.SubmitBatch(over); !errors.Is(err, errdefs.ErrBusy) || r.st.Submitted() != 105 {
		t.Fatalf("batch past the queue depth: %v, %d submitted", err, r.st.Submitted())
	}
	c, err := r.st.SubmitBatch(batch(495)) // exactly full: 128 → 600 slots
	if err != nil {
		t.Fatal(err)
	}
	release()
	if err := c.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// A fresh stream takes a batch of the whole depth at once.
	st := r.stream(r.dev)
	c, err = st.SubmitBatch(batch(600))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	got := logged(tag)
	if uint64(len(got)) != seq {
		t.Fatalf("%d commands ran, want %d", len(got), seq)
	}
	for i, v := range got {
		if v != uint64(i) {
			t.Fatalf("command %d ran at position %d", v, i)
		}
	}
}

// TestRingGrowthAllocations: a stream allocates a few KiB when created and
// only when its ring doubles after that.
func TestRingGrowthAllocations(t *testing.T) {
	r := newRig(t)
	const maxBytes = 8 << 10
	ctx := ctxT(t)
	const streams = 100
	n, b := allocated(func() {
		for range streams {
			s, err := r.dev.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Logf("a new stream: %d allocations, %d bytes", n/streams, b/streams)
	if b/streams > maxBytes {
		t.Errorf("a new stream allocates %d bytes, want at most %d", b/streams, maxBytes)
	}
	noop := r.prog(r.dev, "noop")
	cmd := &hw.Command{Program: noop}
	// From 8 slots to the whole depth of 1024: 7 doublings, no more.
	release := r.st.Inject(sim.Fault{Kind: sim.Hang})
	n, b = allocated(func() {
		for range sim.DefaultQueueDepth {
			if _, err := r.st.Submit(cmd); err != nil {
				t.Fatal(err)
			}
		}
	})
	release()
	r.sync(r.st)
	t.Logf("filling the queue: %d allocations, %d bytes", n, b)
	if n > 7 {
		t.Errorf("filling the queue allocated %d times, want at most 7 (one per doubling)", n)
	}
}

// allocated reports how many heap allocations, and how many bytes, f made
// (and any goroutine meanwhile: the tests run one at a time).
func allocated(f func()) (n, bytes uint64) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.Mallocs - before.Mallocs, after.TotalAlloc - before.TotalAlloc
}
