package sim_test

import (
	"errors"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

func TestBudget(t *testing.T) {
	p := sim.New()
	d, _ := p.AddDevice("d", hw.EngineGPU, sim.NewDeviceConfig())
	bud := hw.NewBudget("test", 100)
	a, err := d.Alloc(60, 0, bud) // flags ignored: still host-visible
	if err != nil {
		t.Fatal(err)
	}
	if bud.Used() != 60 {
		t.Fatalf("used %d after 60-byte alloc", bud.Used())
	}
	if m := host(t, a); len(m) != 60 || a.Size() != 60 || a.Device() != hw.Device(d) {
		t.Fatalf("HostBytes len %d size %d", len(m), a.Size())
	}
	_, err = d.Alloc(41, 0, bud)
	wantClass(t, err, errdefs.ErrOutOfBudget)
	if bud.Used() != 60 {
		t.Fatalf("failed alloc left %d used", bud.Used())
	}
	sh, err := p.AllocShared(40, []hw.Device{d}, bud)
	if err != nil {
		t.Fatal(err)
	}
	if bud.Used() != 100 {
		t.Fatalf("used %d after shared alloc", bud.Used())
	}
	if err := a.Free(); err != nil {
		t.Fatal(err)
	}
	wantClass(t, a.Free(), errdefs.ErrClosed)
	_, err = a.HostBytes()
	wantClass(t, err, errdefs.ErrClosed)
	if err := sh.Free(); err != nil {
		t.Fatal(err)
	}
	wantClass(t, sh.Free(), errdefs.ErrClosed)
	if bud.Used() != 0 {
		t.Fatalf("used %d after freeing everything", bud.Used())
	}
	for _, size := range []int{0, -1} {
		_, err := d.Alloc(size, 0, nil)
		wantClass(t, err, errdefs.ErrInvalidArgument)
	}
	_, err = d.Alloc(8, 1<<7, nil)
	wantClass(t, err, errdefs.ErrInvalidArgument)
	// A nil budget is unlimited.
	b, err := d.Alloc(1<<20, hw.AllocHostVisible, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := host(t, b)
	m[0], m[len(m)-1] = 1, 2 // real, writable memory
	b.Free()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// Freeing a buffer that queued work still uses keeps the memory (and the
// charge) until that work retires.
func TestFreeWhileInUse(t *testing.T) {
	r := newRig(t)
	bud := hw.NewBudget("b", 0)
	b, err := r.dev.Alloc(16, 0, bud)
	if err != nil {
		t.Fatal(err)
	}
	release := r.st.Inject(sim.Fault{Kind: sim.Hang})
	defer release()
	c := r.submit(r.st, r.prog(r.dev, "fill"), hw.BufferArg(b, 0, -1), hw.Float32(1))
	out := make([]byte, 16)
	rd, err := r.st.Read(b, 0, out)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if bud.Used() != 16 {
		t.Fatalf("charge released while commands use the buffer: %d", bud.Used())
	}
	_, err = r.st.Write(b, 0, out)
	wantClass(t, err, errdefs.ErrClosed)
	release()
	if err := c.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := rd.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	equalF32(t, "read after free", getF32(out), []float32{1, 1, 1, 1})
	if bud.Used() != 0 {
		t.Fatalf("charge %d after the last user retired", bud.Used())
	}
}

func TestAllocSharedErrors(t *testing.T) {
	p, q := sim.New(), sim.New()
	d, _ := p.AddDevice("d", hw.EngineGPU, sim.NewDeviceConfig())
	e, _ := q.AddDevice("e", hw.EngineGPU, sim.NewDeviceConfig())
	for _, tc := range []struct {
		size int
		devs []hw.Device
	}{
		{8, nil},
		{0, []hw.Device{d}},
		{8, []hw.Device{e}},
		{8, []hw.Device{d, d}},
		{8, []hw.Device{nil}},
	} {
		_, err := p.AllocShared(tc.size, tc.devs, nil)
		wantClass(t, err, errdefs.ErrInvalidArgument)
	}
	bud := hw.NewBudget("tiny", 4)
	_, err := p.AllocShared(8, []hw.Device{d}, bud)
	wantClass(t, err, errdefs.ErrOutOfBudget)
}

func TestSharedView(t *testing.T) {
	p := sim.New()
	d0, _ := p.AddDevice("d0", hw.EngineGPU, sim.NewDeviceConfig())
	d1, _ := p.AddDevice("d1", hw.EngineNPU, sim.NewDeviceConfig())
	d2, _ := p.AddDevice("d2", hw.EngineCPU, sim.NewDeviceConfig())
	r := &rig{t: t, p: p, dev: d0}
	s0, s1 := r.stream(d0), r.stream(d1)
	sh, err := p.AllocShared(64, []hw.Device{d0, d1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Free()
	if sh.Size() != 64 || len(sh.Bytes()) != 64 || len(sh.Devices()) != 2 {
		t.Fatalf("size %d bytes %d devices %v", sh.Size(), len(sh.Bytes()), sh.Devices())
	}
	v0, err := sh.View(d0)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := sh.View(d1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sh.View(d2); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("View of an unlisted device: %v", err)
	}
	if v0.Device() != hw.Device(d0) || v0.Size() != 64 {
		t.Fatal("view of wrong device or size")
	}
	// d0 fills the first half through its view; the host sees it, and d1
	// copies it into the second half through its own view.
	if err := r.submit(s0, r.prog(d0, "fill"), hw.BufferArg(v0, 0, 32), hw.Float32(7)).Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := r.submit(s1, r.prog(d1, "copy"), hw.BufferArg(v1, 32, 32), hw.BufferArg(v1, 0, 32)).Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	equalF32(t, "shared", getF32(sh.Bytes()), []float32{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7})
	if err := v0.Free(); err != nil { // freeing a view is a no-op
		t.Fatal(err)
	}
	if _, err := v0.HostBytes(); err != nil {
		t.Fatal(err)
	}
	if got := sh.Load32Acquire(60); got != 0x40e00000 { // 7.0f
		t.Fatalf("Load32Acquire = %#x", got)
	}
}

// A resident-style kernel on the device spins on a startup word in shared
// memory until the host publishes it with Store32Release and runs the
// device's visibility action.
func TestSpinReleasedByStore(t *testing.T) {
	r := newRig(t)
	sh, err := r.p.AllocShared(4096, []hw.Device{r.dev}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Free()
	view, _ := sh.View(r.dev)
	act, err := sh.PrepareRelease(r.dev, 128, 4)
	if err != nil {
		t.Fatal(err)
	}
	spin := r.submit(r.st, r.prog(r.dev, "spin"), hw.BufferArg(view, 128, 64), hw.Uint(0), hw.Uint(42))
	after := r.submit(r.st, r.prog(r.dev, "noop"))
	sh.Store32Release(128, 41) // not yet
	if spin.Done() {
		t.Fatal("spin finished before its word was stored")
	}
	sh.Store32Release(128, 42)
	if err := act.Execute(); err != nil {
		t.Fatal(err)
	}
	if err := after.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if spin.Err() != nil || !spin.Done() {
		t.Fatal(spin.Err())
	}
	if r.dev.VisibilityReleases() != 1 {
		t.Fatalf("visibility releases %d", r.dev.VisibilityReleases())
	}
}

func TestSharedMisuse(t *testing.T) {
	p := sim.New()
	d, _ := p.AddDevice("d", hw.EngineGPU, sim.NewDeviceConfig())
	e, _ := p.AddDevice("e", hw.EngineGPU, sim.NewDeviceConfig())
	sh, _ := p.AllocShared(16, []hw.Device{d}, nil)
	for _, off := range []int{-4, 2, 16, 13} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Store32Release(%d) did not panic", off)
				}
			}()
			sh.Store32Release(off, 1)
		}()
	}
	sh.Store32Release(12, 5)
	if sh.Load32Acquire(12) != 5 {
		t.Fatal("store not visible")
	}
	for _, tc := range []struct {
		dev      hw.Device
		off, len int
	}{{e, 0, 4}, {d, -1, 4}, {d, 8, 9}, {d, 0, -1}} {
		if _, err := sh.PrepareRelease(tc.dev, tc.off, tc.len); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("PrepareRelease(%v, %d, %d): %v", tc.dev, tc.off, tc.len, err)
		}
	}
	act, _ := sh.PrepareRelease(d, 0, 16)
	if n := testing.AllocsPerRun(100, func() { act.Execute() }); n != 0 {
		t.Errorf("Execute allocates %v", n)
	}
	sh.Free()
	wantClass(t, act.Execute(), errdefs.ErrClosed)
	_, err := sh.View(d)
	wantClass(t, err, errdefs.ErrClosed)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Load32Acquire after Free did not panic")
			}
		}()
		sh.Load32Acquire(0)
	}()
}
