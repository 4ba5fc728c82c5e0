package cuda

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/internal/testutil"
)

func init() {
	RegisterHostProgram("test_fail", func(*HostLaunch) error { return errors.New("told to fail") })
	RegisterHostProgram("test_panic", func(*HostLaunch) error { panic("told to panic") })
	RegisterHostProgram("test_add", func(l *HostLaunch) error { // (buf f32s, v f32): buf[i] += v
		b := l.Bytes(0)
		x := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
		for i := range x {
			x[i] += l.Float32(1)
		}
		return nil
	})
	RegisterHostProgram("test_npu_exchange", testNPUExchange)
}

// testNPUExchange is the NPU side of the resident exchange (package
// sessions has the real one), for the fake GPU's resident kernel.
func testNPUExchange(l *HostLaunch) error {
	line, pay, rounds := l.Bytes(0), l.Bytes(1), uint32(l.Uint(2))
	word := func(b []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	await := func(w *uint32, want uint32) bool {
		for atomic.LoadUint32(w) != want {
			select {
			case <-l.Lost():
				return false
			default:
			}
		}
		return true
	}
	d := atomic.LoadUint32(word(line, 0))
	for ; d == 0; d = atomic.LoadUint32(word(line, 0)) {
		select {
		case <-l.Lost():
			return l.Device().Err()
		default:
		}
	}
	if d != 1 {
		return nil
	}
	atomic.StoreUint32(word(pay, 64), 1)
	x := unsafe.Slice((*float32)(unsafe.Pointer(&pay[128])), 16)
	for r := range rounds {
		if !await(word(pay, 4), r+1) {
			return l.Device().Err()
		}
		for i := range x {
			x[i] = x[i] - 1
		}
		atomic.StoreUint32(word(pay, 68), r+1)
	}
	return nil
}

func hostRig(t *testing.T, p *Platform) (*HostDevice, hw.Stream, context.Context) {
	t.Helper()
	h := p.Host()
	s, err := h.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil && !errors.Is(err, errdefs.ErrClosed) && h.Err() == nil {
			t.Errorf("host stream Close: %v", err)
		}
	})
	return h, s, testCtx(t)
}

func TestFakeHostDevice(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	h, s, ctx := hostRig(t, p)
	if h.Name() != "host0" || h.Engine() != hw.EngineCPU || h.Err() != nil {
		t.Fatalf("host device %s %v %v", h.Name(), h.Engine(), h.Err())
	}
	if _, err := h.Prepare("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Prepare(nope) = %v", err)
	}
	budget := hw.NewBudget("b", 64)
	b, err := h.Alloc(64, hw.AllocHostVisible, budget)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Alloc(4, 0, budget); !errors.Is(err, errdefs.ErrOutOfBudget) {
		t.Fatalf("over budget: %v", err)
	}
	add, _ := h.Prepare("test_add")
	src := f32bytes([]float32{1, 2, 3, 4})
	if _, err := s.Write(b, 0, src); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(&hw.Command{Program: add, Args: []hw.Arg{hw.BufferArg(b, 0, 16), hw.Float32(0.5)}}); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 16)
	c, err := s.Read(b, 0, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx); err != nil || !s.Idle() {
		t.Fatalf("wait %v idle %v", err, s.Idle())
	}
	if got := bytesF32(dst); got[0] != 1.5 || got[3] != 4.5 {
		t.Fatalf("host program result %v", got)
	}

	// Validation at submission: other devices' buffers, ranges, programs.
	gpuBuf, _ := p.devices[0].Alloc(16, 0, nil)
	defer gpuBuf.Free()
	for _, cmd := range []hw.Command{
		{Program: add, Args: []hw.Arg{hw.BufferArg(gpuBuf, 0, 16), hw.Float32(1)}},
		{Program: add, Args: []hw.Arg{{Buffer: b, Offset: 60, Length: 8}, hw.Float32(1)}},
		{Program: p.devices[0].progs["noop"]},
		{},
	} {
		if _, err := s.Submit(&cmd); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Submit(%v) = %v, want ErrInvalidArgument", cmd.Program, err)
		}
	}
	if _, err := s.Write(b, 62, src); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Write past the end = %v", err)
	}

	// A failing or panicking program fails its completion with ErrFault,
	// reported once by Sync; the device stays healthy.
	for _, name := range []string{"test_fail", "test_panic"} {
		prog, _ := h.Prepare(name)
		c, err := s.Submit(&hw.Command{Program: prog})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Wait(ctx); !errors.Is(err, errdefs.ErrFault) {
			t.Fatalf("%s: completion %v, want ErrFault", name, err)
		}
		if err := s.Sync(ctx); !errors.Is(err, errdefs.ErrFault) {
			t.Fatalf("%s: first Sync %v", name, err)
		}
		if err := s.Sync(ctx); err != nil {
			t.Fatalf("%s: second Sync %v", name, err)
		}
	}
	if h.Err() != nil {
		t.Fatal(h.Err())
	}

	// A parked program: Done/Idle make no progress, waits honour ctx.
	spin, _ := h.Prepare("spin")
	c, err = s.Submit(&hw.Command{Program: spin, Args: []hw.Arg{hw.BufferArg(b, 0, 64), hw.Uint(8), hw.Uint(7)}})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := c.Wait(short); !errors.Is(err, errdefs.ErrDeadlineExceeded) || c.Done() || s.Idle() {
		t.Fatalf("parked: wait %v done %v idle %v", err, c.Done(), s.Idle())
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if budget.Used() != 64 {
		t.Fatal("freed while a queued program uses the buffer")
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b.(*hostBuffer).mem[8])), 7)
	if err := c.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return budget.Used() == 0 }, "free never released the budget")
	if _, err := s.Submit(&hw.Command{Program: add, Args: []hw.Arg{hw.BufferArg(b, 0, 16), hw.Float32(1)}}); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("freed buffer: %v", err)
	}
	if err := h.Close(); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("Close with an open stream = %v", err)
	}
}

func TestFakeHostDeviceLost(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	h, s, ctx := hostRig(t, p)
	b, _ := h.Alloc(8, 0, nil)
	spin, _ := h.Prepare("spin")
	c, err := s.Submit(&hw.Command{Program: spin, Args: []hw.Arg{hw.BufferArg(b, 0, 8), hw.Uint(0), hw.Uint(1)}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		h.Lose("test")
	}()
	if err := c.Wait(ctx); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("wait across a loss = %v", err)
	}
	if err := s.Sync(ctx); !errors.Is(err, errdefs.ErrDeviceLost) || !s.Idle() {
		t.Fatalf("Sync %v Idle %v", err, s.Idle())
	}
	if _, err := s.Submit(&hw.Command{Program: spin}); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("Submit after loss = %v", err)
	}
	if p.devices[0].Err() != nil {
		t.Fatal("the host device's loss lost the GPU")
	}
	if err := s.Close(ctx); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("Close on a lost device = %v", err)
	}
	b.Free()
	waitLive(t, h)
}

// waitLive waits until everything of h was released (frees complete
// asynchronously once the work queued before them retired).
func waitLive(t *testing.T, h *HostDevice) {
	t.Helper()
	if !testutil.Poll(5*time.Second, func() bool { return h.live.Load() == 0 }) {
		t.Fatalf("host device still has %d live objects", h.live.Load())
	}
}

// TestFakeHostResidentExchange runs the resident exchange's two sides,
// the fake GPU's resident_gpu_exchange and a host program, over one
// startup line and one payload shared by cuda0 and host0.
func TestFakeHostResidentExchange(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	scenarioHostExchange(t, p)
}

func scenarioHostExchange(t *testing.T, p *Platform) {
	gpu, host := p.devices[0], p.Host()
	r := newRig(t, p)
	_, hs, ctx := hostRig(t, p)
	for _, decision := range []uint32{1, 2} {
		budget := hw.NewBudget("b", 0)
		line, err := p.AllocShared(64, []hw.Device{gpu, host}, budget)
		if err != nil {
			t.Fatal(err)
		}
		pay, err := p.AllocShared(residentPayloadBytes, []hw.Device{gpu, host}, budget)
		if err != nil {
			t.Fatal(err)
		}
		if budget.Used() != 64+residentPayloadBytes || len(line.Devices()) != 2 || line.Devices()[1] != host {
			t.Fatalf("budget %d devices %v", budget.Used(), line.Devices())
		}
		x := unsafe.Slice((*float32)(unsafe.Pointer(&pay.Bytes()[128])), 16)
		for i := range x {
			x[i] = float32(i)
		}
		const rounds = 50
		view := func(s hw.Shared, d hw.Device) hw.Buffer {
			v, err := s.View(d)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		if hv := view(line, host); hv.Device() != host || hv.Size() != 64 {
			t.Fatalf("host view %v %d", hv.Device(), hv.Size())
		}
		npu, _ := host.Prepare("test_npu_exchange")
		nc, err := hs.Submit(&hw.Command{Program: npu, Args: []hw.Arg{hw.BufferArg(view(line, host), 0, 64), hw.BufferArg(view(pay, host), 0, -1), hw.Uint(rounds)}})
		if err != nil {
			t.Fatal(err)
		}
		gc := r.submit("resident_gpu_exchange", 0, hw.BufferArg(view(line, gpu), 0, 64), hw.BufferArg(view(pay, gpu), 0, -1), hw.Uint(rounds))
		for _, a := range []hw.VisibilityAction{mustRelease(t, line, gpu), mustRelease(t, line, host)} {
			line.Store32Release(0, decision)
			if err := a.Execute(); err != nil {
				t.Fatal(err)
			}
		}
		if err := gc.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if err := nc.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, 16)
		for i := range want {
			want[i] = float32(i)
		}
		if decision == 1 {
			for r := range rounds {
				for i := range want {
					want[i] = float32(want[i]*0.5) + float32(r)
					want[i] -= 1
				}
			}
		}
		for i := range x {
			if x[i] != want[i] || math.IsNaN(float64(x[i])) {
				t.Fatalf("decision %d: x = %v, want %v", decision, x, want)
			}
		}
		observed := pay.Load32Acquire(0) + pay.Load32Acquire(64)
		if (decision == 1) != (observed == 2) || (decision == 2) != (observed == 0) {
			t.Fatalf("decision %d: observed words sum %d", decision, observed)
		}
		if err := line.Free(); err != nil {
			t.Fatal(err)
		}
		if err := pay.Free(); err != nil {
			t.Fatal(err)
		}
	}
}

func mustRelease(t *testing.T, s hw.Shared, d hw.Device) hw.VisibilityAction {
	t.Helper()
	a, err := s.PrepareRelease(d, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestFakeSharedHostOnly(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	sh, err := p.AllocShared(64, []hw.Device{p.Host()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sh.View(p.devices[0]); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("GPU view of a host-only allocation = %v", err)
	}
	if err := p.devices[0].Close(); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("closing the allocating GPU under a live allocation = %v", err)
	}
	if err := sh.Free(); err != nil {
		t.Fatal(err)
	}
}

// TestFakeSubmitBatch: all-or-nothing validation, one completion, and the
// graph cache (captured on the second sighting, then replayed).
func TestFakeSubmitBatch(t *testing.T) {
	for _, graphs := range []int{DefaultBatchGraphs, 0} {
		p, f := newFakePlatform(t, 1, NewConfig().WithBatchGraphs(graphs))
		r := newRig(t, p)
		st := r.s.(*Stream)
		x := r.upload([]float32{1, 2, 3, 4})
		y := r.upload([]float32{10, 20, 30, 40})
		fill, saxpy := r.prog("fill"), r.prog("saxpy")
		batch := []hw.Command{
			{Program: fill, Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.Float32(2)}},
			{Program: saxpy, Args: []hw.Arg{hw.Float32(3), hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1)}},
		}
		bad := append(append([]hw.Command(nil), batch...), hw.Command{Program: saxpy, Args: []hw.Arg{hw.Float32(1)}})
		r.sync()
		before := st.rec.Submitted()
		if _, err := st.SubmitBatch(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("bad batch = %v", err)
		}
		if st.rec.Submitted() != before {
			t.Fatal("an invalid batch enqueued something")
		}
		if c, err := st.SubmitBatch(nil); err != nil || !c.Done() {
			t.Fatalf("empty batch: %v", err)
		}
		for i := range 5 {
			c, err := st.SubmitBatch(batch)
			if err != nil {
				t.Fatal(err)
			}
			if st.rec.Submitted() != before+uint64(i)+1 {
				t.Fatal("a batch is not one queued command")
			}
			if err := c.Wait(r.ctx); err != nil {
				t.Fatal(err)
			}
		}
		got := r.download(y)
		for i, v := range got {
			if want := float32(10*(i+1)) + 5*6; v != want {
				t.Fatalf("graphs %d: y[%d] = %v, want %v", graphs, i, v, want)
			}
		}
		direct, replays, captures := st.batchDirect.Load(), st.batchReplays.Load(), st.batchCapture.Load()
		if graphs > 0 && (direct != 1 || replays != 4 || captures != 1) {
			t.Fatalf("graph cache: %d direct, %d replays, %d captures; want 1, 4, 1", direct, replays, captures)
		}
		if graphs == 0 && (direct != 5 || replays != 0) {
			t.Fatalf("no graph cache: %d direct, %d replays", direct, replays)
		}
		f.mu.Lock()
		runs := f.kernelsRun["saxpy"]
		f.mu.Unlock()
		if runs != 5 {
			t.Fatalf("saxpy ran %d times, want 5", runs)
		}
		// A batch naming a freed buffer is refused whole.
		z := r.alloc(16, 0)
		z.Free()
		if _, err := st.SubmitBatch([]hw.Command{batch[0], {Program: fill, Args: []hw.Arg{hw.BufferArg(z, 0, -1), hw.Float32(1)}}}); !errors.Is(err, errdefs.ErrClosed) {
			t.Fatalf("batch with a freed buffer = %v", err)
		}
	}
}

func TestFakeSubmitBatchEvictsAndStaysAllocationFree(t *testing.T) {
	p, f := newFakePlatform(t, 1, NewConfig().WithBatchGraphs(2).WithQueueDepth(4096))
	r := newRig(t, p)
	st := r.s.(*Stream)
	b := r.alloc(64, 0)
	fill := r.prog("fill")
	mk := func(v float32) []hw.Command {
		return []hw.Command{
			{Program: fill, Args: []hw.Arg{hw.BufferArg(b, 0, 32), hw.Float32(v)}},
			{Program: fill, Args: []hw.Arg{hw.BufferArg(b, 32, 32), hw.Float32(v)}},
		}
	}
	for range 3 {
		for _, v := range []float32{1, 2, 3} { // three batches through a two-entry cache
			if _, err := st.SubmitBatch(mk(v)); err != nil {
				t.Fatal(err)
			}
		}
		r.sync()
	}
	if got := r.download(b); got[0] != 3 || got[15] != 3 {
		t.Fatalf("after evictions: %v", got)
	}
	// The submitting side allocates nothing once batches are pooled:
	// fill the pool, park the driver thread, count. GOMAXPROCS is 1
	// throughout: AllocsPerRun sets it, and changing it empties every
	// sync.Pool.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	batch := mk(4)
	for range 600 {
		if _, err := st.SubmitBatch(batch); err != nil {
			t.Fatal(err)
		}
	}
	r.sync()
	release := parkDriverThread(t, f, r)
	allocs := testing.AllocsPerRun(500, func() {
		if _, err := st.SubmitBatch(batch); err != nil {
			t.Fatal(err)
		}
	})
	release()
	r.sync()
	if allocs > 0.05 && !raceEnabled {
		t.Fatalf("SubmitBatch allocates %v times per call", allocs)
	}
}

// TestFakeHostSubmitAllocatesNothing: submitting to a host stream copies
// the command into the queue and allocates nothing.
func TestFakeHostSubmitAllocatesNothing(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	h, s, ctx := hostRig(t, p)
	b, _ := h.Alloc(64, 0, nil)
	defer b.Free()
	add, _ := h.Prepare("test_add")
	cmd := &hw.Command{Program: add, Args: []hw.Arg{hw.BufferArg(b, 0, 16), hw.Float32(1)}}
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := s.Submit(cmd); err != nil {
			t.Fatal(err)
		}
	})
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Fatalf("host Submit allocates %v times", allocs)
	}
}
