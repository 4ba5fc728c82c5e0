package cuda

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"slices"
	"sort"
	"testing"
	"time"
	"unsafe"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/internal/testutil"
)

func TestStagingRingAlloc(t *testing.T) {
	mem := make([]byte, 128)
	u := &stagingRing{host: unsafe.Pointer(&mem[0]), size: 128}
	take := func(n int, seq uint64) int {
		t.Helper()
		p := u.take(seq, uintptr(n))
		if p == nil {
			t.Fatalf("take(%d) refused with %d live", n, u.recs.len())
		}
		return int(uintptr(p) - uintptr(u.host))
	}
	if off := take(20, 1); off != 0 { // 32 bytes
		t.Fatalf("first at %d", off)
	}
	if off := take(64, 2); off != 32 {
		t.Fatalf("second at %d", off)
	}
	if _, ok := u.alloc(48); ok { // [96, 144) does not fit, [0, 0) neither
		t.Fatal("alloc past the end while the start is live")
	}
	u.release(1) // [0, 32) free again
	if off := take(32, 3); off != 96 {
		t.Fatalf("third at %d, want 96 (the tail)", off)
	}
	if off := take(16, 4); off != 0 { // wraps
		t.Fatalf("fourth at %d, want 0", off)
	}
	if _, ok := u.alloc(32); ok { // only [16, 32) is free
		t.Fatal("alloc overlapping the oldest live upload")
	}
	if off := take(16, 5); off != 16 {
		t.Fatalf("fifth at %d, want 16", off)
	}
	if _, ok := u.alloc(1); ok { // full: [32, 128) and [0, 32) live
		t.Fatal("alloc in a full ring")
	}
	u.release(5)
	if u.recs.len() != 0 {
		t.Fatalf("%d live after releasing everything", u.recs.len())
	}
	if off := take(128, 6); off != 0 {
		t.Fatalf("whole ring at %d", off)
	}
	if _, ok := u.alloc(129); ok {
		t.Fatal("alloc larger than the ring")
	}
}

var heapSink []byte

func TestPinnedRanges(t *testing.T) {
	var p pinnedRanges
	// On the heap (which does not move): the ranges hold addresses, as
	// they do for the driver's pinned memory.
	heapSink = make([]byte, 1024)
	mem := heapSink
	at := func(off int) unsafe.Pointer { return unsafe.Pointer(&mem[off]) }
	if p.overlaps(at(0), 1024) {
		t.Fatal("empty set overlaps")
	}
	p.add(at(512), 256) // [512, 768)
	p.add(at(100), 10)  // [100, 110)
	for _, c := range []struct {
		off, n int
		want   bool
	}{
		{0, 100, false}, {0, 101, true}, {109, 1, true}, {110, 402, false},
		{110, 403, true}, {767, 1, true}, {768, 256, false}, {600, 0, false},
	} {
		if got := p.overlaps(at(c.off), c.n); got != c.want {
			t.Errorf("overlaps(%d, %d) = %v, want %v", c.off, c.n, got, c.want)
		}
	}
	p.remove(at(512))
	if p.overlaps(at(600), 10) || !p.overlaps(at(105), 1) {
		t.Fatal("remove took the wrong range")
	}
}

// TestFakeStagedUploads: small uploads go through the pinned staging, are
// uploaded from there after the copies they follow, fall back to the
// pageable path when the staging is full, and free their space once
// retired.
func TestFakeStagedUploads(t *testing.T) {
	p, f := newFakePlatform(t, 1, NewConfig().WithCopyStaging(256))
	r := newRig(t, p)
	st := r.s.(*Stream)
	const n, size = 40, 32
	b := r.alloc(n*size, 0)
	srcs := make([][]byte, n)
	f.gate.Lock() // nothing runs: the staging fills up (256/32 = 8 uploads)
	for i := range srcs {
		srcs[i] = bytes.Repeat([]byte{byte(i + 1)}, size)
		r.write(b, i*size, srcs[i])
	}
	// The driver thread issues the copies while the device is held.
	if !testutil.Poll(5*time.Second, func() bool { return f.htod.Load() >= n }) {
		t.Fatalf("%d of %d uploads issued", f.htod.Load(), n)
	}
	if got := f.htodPinned.Load(); got != 8 {
		t.Fatalf("%d uploads from pinned memory, want 8 (the staging's capacity)", got)
	}
	f.gate.Unlock()
	r.sync()
	got := r.read(b, 0, n*size)
	for i := range srcs {
		if !bytes.Equal(got[i*size:(i+1)*size], srcs[i]) {
			t.Fatalf("upload %d landed as %x", i, got[i*size:(i+1)*size])
		}
	}
	// Retired: the space is free again.
	before := f.htodPinned.Load()
	for i := range 16 {
		r.write(b, 0, srcs[i])
		r.sync()
	}
	if got := f.htodPinned.Load() - before; got != 16 {
		t.Fatalf("%d of 16 uploads after retirement went through the staging", got)
	}
	if st.up.used.Load() != uint64(f.htodPinned.Load()) {
		t.Fatalf("staging counted %d, driver saw %d pinned uploads", st.up.used.Load(), f.htodPinned.Load())
	}
	// Larger than 4 KiB: pageable path.
	big := r.alloc(8<<10, 0)
	before = f.htodPinned.Load()
	r.write(big, 0, make([]byte, 8<<10))
	r.sync()
	if f.htodPinned.Load() != before {
		t.Fatal("an 8 KiB upload went through the staging")
	}
}

// TestFakeStagingOff: NewConfig().WithCopyStaging(0) copies from and into the
// caller's memory.
func TestFakeStagingOff(t *testing.T) {
	p, f := newFakePlatform(t, 1, NewConfig().WithCopyStaging(0))
	r := newRig(t, p)
	b := r.alloc(64, 0)
	r.write(b, 0, []byte("abc"))
	if got := r.read(b, 0, 3); string(got) != "abc" {
		t.Fatalf("%q", got)
	}
	if f.htodPinned.Load() != 0 || r.s.(*Stream).up != nil || f.dtohSync.Load() == 0 {
		t.Fatal("staging used although off")
	}
}

// TestFakePageableReadRetiresWithoutEvent: a download into pageable
// memory that is not staged retires the stream up to it when the driver
// call returns: no event is recorded or queried for it, and the earlier
// commands retire with it.
func TestFakePageableReadRetiresWithoutEvent(t *testing.T) {
	p, f := newFakePlatform(t, 1, NewConfig().WithCopyStaging(0))
	r := newRig(t, p)
	st := r.s.(*Stream)
	b := r.alloc(64, 0)
	r.write(b, 0, []byte("warm"))
	// Sync returns once the driver thread retired the event covering the
	// write: it then has nothing left to record (it records only past
	// its last event) or to query (it queries only pending events).
	r.sync()
	rec, q := f.records.Load(), f.queries.Load()
	got := r.read(b, 0, 4)
	if string(got) != "warm" {
		t.Fatalf("%q", got)
	}
	if f.records.Load() != rec || f.queries.Load() != q {
		t.Fatalf("a pageable read recorded %d and queried %d events", f.records.Load()-rec, f.queries.Load()-q)
	}
	if st.syncRetires.Load() == 0 || f.dtohSync.Load() == 0 {
		t.Fatal("the read did not retire synchronously")
	}

	// Behind held work: the earlier launch and upload retire with it.
	f.gate.Lock()
	c1 := r.submit("fill", 0, hw.BufferArg(b, 0, 16), hw.Float32(2))
	c2, err := r.s.Write(b, 16, []byte("tail"))
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 20)
	c3, err := r.s.Read(b, 0, dst)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	if c3.Done() || r.s.Idle() {
		t.Fatal("read retired while the device was held")
	}
	f.gate.Unlock()
	if err := c3.Wait(r.ctx); err != nil {
		t.Fatal(err)
	}
	if !c1.Done() || !c2.Done() || !r.s.Idle() || st.pending.len() != 0 {
		t.Fatalf("after the read: fill %v, write %v, idle %v, %d events pending", c1.Done(), c2.Done(), r.s.Idle(), st.pending.len())
	}
	if v := math.Float32frombits(binary.LittleEndian.Uint32(dst)); v != 2 || string(dst[16:]) != "tail" {
		t.Fatalf("read %x", dst)
	}
	if st.pins.len() != 0 {
		t.Fatalf("%d pins held", st.pins.len())
	}
	if err := r.s.Sync(r.ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFakeStagedDownloads: small downloads land in the download ring and
// reach the caller's memory only when they retire; with the ring full, a
// download takes the pageable path, and retiring it retires (and copies
// out) the staged ones before it.
func TestFakeStagedDownloads(t *testing.T) {
	p, f := newFakePlatform(t, 1, NewConfig().WithCopyStaging(64))
	r := newRig(t, p)
	st := r.s.(*Stream)
	b := r.alloc(96, 0)
	want := make([]byte, 96)
	for i := range want {
		want[i] = byte(i + 1)
	}
	r.write(b, 0, want)
	r.sync()
	f.gate.Lock()
	dsts := make([][]byte, 3)
	cs := make([]hw.Completion, 3)
	for i := range dsts[:2] {
		dsts[i] = make([]byte, 32)
		c, err := r.s.Read(b, 32*i, dsts[i])
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
	}
	// The driver thread stages both (it issues them while the device is
	// held); neither may retire or land before the device moves.
	if !testutil.Poll(5*time.Second, func() bool { return st.down.used.Load() == 2 }) {
		f.gate.Unlock()
		t.Fatalf("%d staged downloads, want 2", st.down.used.Load())
	}
	if cs[0].Done() || dsts[0][0] != 0 || dsts[1][0] != 0 {
		f.gate.Unlock()
		t.Fatal("a staged download retired or landed while the device was held")
	}
	// The ring (64 bytes) is full: the third takes the pageable path.
	dsts[2] = make([]byte, 32)
	c, err := r.s.Read(b, 64, dsts[2])
	if err != nil {
		f.gate.Unlock()
		t.Fatal(err)
	}
	cs[2] = c
	// The driver thread issues it while the device is held (the ring
	// full): wait for that before letting the device go, or the first
	// two could retire first and free the ring for it.
	if !testutil.Poll(5*time.Second, func() bool { return f.dtohSync.Load() == 1 }) {
		f.gate.Unlock()
		t.Fatalf("%d pageable downloads with the ring full, want 1", f.dtohSync.Load())
	}
	f.gate.Unlock()
	if err := cs[2].Wait(r.ctx); err != nil {
		t.Fatal(err)
	}
	for i, d := range dsts {
		if !cs[i].Done() || !bytes.Equal(d, want[32*i:32*(i+1)]) {
			t.Fatalf("download %d: done %v, %x", i, cs[i].Done(), d)
		}
	}
	if f.dtohSync.Load() != 1 || st.copyOuts.len() != 0 || st.down.recs.len() != 0 {
		t.Fatalf("%d pageable downloads, %d copy-outs and %d ring records left", f.dtohSync.Load(), st.copyOuts.len(), st.down.recs.len())
	}
	// Retired: the ring is free again.
	if got := r.read(b, 0, 32); !bytes.Equal(got, want[:32]) || st.down.used.Load() != 3 {
		t.Fatalf("%x, %d staged", got, st.down.used.Load())
	}
}

// TestFakeReadIntoPinnedMemoryWaitsForItsEvent: a download into memory
// the platform pinned is asynchronous in CUDA, so it must not retire when
// the call returns.
func TestFakeReadIntoPinnedMemoryWaitsForItsEvent(t *testing.T) {
	p, f := newFakePlatform(t, 1)
	r := newRig(t, p)
	b := r.alloc(64, 0)
	hv := r.alloc(64, hw.AllocHostVisible)
	host, err := hv.HostBytes()
	if err != nil {
		t.Fatal(err)
	}
	r.write(b, 0, []byte("pinned!"))
	r.sync()
	sync0 := f.dtohSync.Load()
	f.gate.Lock()
	c, err := r.s.Read(b, 0, host[:7])
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	if c.Done() {
		f.gate.Unlock()
		t.Fatal("a read into pinned memory retired before it ran")
	}
	f.gate.Unlock()
	if err := c.Wait(r.ctx); err != nil {
		t.Fatal(err)
	}
	if string(host[:7]) != "pinned!" || f.dtohSync.Load() != sync0 {
		t.Fatalf("%q, %d synchronous reads", host[:7], f.dtohSync.Load()-sync0)
	}
}

// TestFakeIdleStreamSyncMakesNoDriverCall: the fence's drain and the
// host's idle check on a stream whose work retired read cached state only.
func TestFakeIdleStreamSyncMakesNoDriverCall(t *testing.T) {
	p, f := newFakePlatform(t, 1)
	r := newRig(t, p)
	b := r.alloc(64, 0)
	r.write(b, 0, []byte("x"))
	r.submit("fill", 0, hw.BufferArg(b, 0, -1), hw.Float32(1))
	r.sync() // the driver thread has retired every event: nothing is left to record or query
	rec, q, s := f.records.Load(), f.queries.Load(), f.syncs.Load()
	for range 100 {
		if err := r.s.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !r.s.Idle() {
			t.Fatal("not idle")
		}
	}
	if f.records.Load() != rec || f.queries.Load() != q || f.syncs.Load() != s {
		t.Fatalf("Sync/Idle on an idle stream: %d records, %d queries, %d stream syncs",
			f.records.Load()-rec, f.queries.Load()-q, f.syncs.Load()-s)
	}
}

// TestFakeMLPCallShape: the MLP stage's call (upload, batch or fused
// launch, download, sync) gives the same bytes with the staging on and off
// and either launch shape, and retires at the download.
func TestFakeMLPCallShape(t *testing.T) {
	var outs [][]byte
	for _, c := range []struct {
		staging int
		fused   bool
	}{{DefaultCopyStaging, false}, {0, false}, {DefaultCopyStaging, true}, {0, true}} {
		staging := c.staging
		p, f := newFakePlatform(t, 1, NewConfig().WithCopyStaging(staging))
		m := newMLPCall(t, p)
		m.useFused, m.fusedAsBatch = c.fused, c.fused && staging == 0
		for i := range 3 {
			out := m.call(t, float32(i))
			outs = append(outs, out)
		}
		if staged := f.htodPinned.Load() > 0 && f.dtohSync.Load() == 0; staged != (staging > 0) {
			t.Fatalf("staging %d: %d pinned uploads, %d pageable downloads", staging, f.htodPinned.Load(), f.dtohSync.Load())
		}
	}
	for i := 1; i < len(outs); i++ {
		if !bytes.Equal(outs[i], outs[i%3]) {
			t.Fatalf("call %d: %x, want %x", i, outs[i], outs[i%3])
		}
	}
}

// mlpCall is the MLP stage's device work on a stream, without Wasm: the
// 8→16→4 model of examples/wasm/mlp with deterministic weights.
type mlpCall struct {
	ctx           context.Context
	s             *Stream
	work, weights hw.Buffer
	batch         []hw.Command
	fused         hw.Command   // mlp_forward: the batch in one launch
	fusedBatch    []hw.Command // fused alone, as a batch (a graph replay)
	useFused      bool         // submit fused instead of batch
	fusedAsBatch  bool         // ... as fusedBatch
	in            []byte
	out           []byte
}

const (
	mlpIn, mlpHidden, mlpOut = 8, 16, 4
	mlpWorkSize              = 4*(mlpIn+mlpHidden+mlpOut) + 8
	mlpScores                = 4 * (mlpIn + mlpHidden)
)

func newMLPCall(t testing.TB, p *Platform) *mlpCall {
	r := newRig(t, p)
	nw := mlpIn*mlpHidden + mlpHidden + mlpHidden*mlpOut + mlpOut
	w := make([]float32, nw)
	for i := range w {
		w[i] = float32(i%7-3) / 8
	}
	weights, work := r.alloc(4*nw, 0), r.alloc(mlpWorkSize, 0)
	r.write(weights, 0, f32bytes(w))
	r.sync()
	wa := func(off, n int) hw.Arg { return hw.BufferArg(weights, 4*off, 4*n) }
	x := hw.BufferArg(work, 0, 4*mlpIn)
	h := hw.BufferArg(work, 4*mlpIn, 4*mlpHidden)
	sc := hw.BufferArg(work, mlpScores, 4*mlpOut)
	u := func(v int) hw.Arg { return hw.Uint(uint64(v)) }
	ob1, ow2 := mlpIn*mlpHidden, mlpIn*mlpHidden+mlpHidden
	ob2 := ow2 + mlpHidden*mlpOut
	cmd := func(name string, args ...hw.Arg) hw.Command { return hw.Command{Program: r.prog(name), Args: args} }
	m := &mlpCall{
		ctx: r.ctx, s: r.s.(*Stream), work: work, weights: weights,
		batch: []hw.Command{
			cmd("matmul", x, wa(0, mlpIn*mlpHidden), h, u(1), u(mlpHidden), u(mlpIn)),
			cmd("bias", h, wa(ob1, mlpHidden), u(1), u(mlpHidden)),
			cmd("relu", h),
			cmd("matmul", h, wa(ow2, mlpHidden*mlpOut), sc, u(1), u(mlpOut), u(mlpHidden)),
			cmd("bias", sc, wa(ob2, mlpOut), u(1), u(mlpOut)),
			cmd("argmax", sc, hw.BufferArg(work, mlpScores+4*mlpOut, 8)),
		},
		fused: cmd("mlp_forward", x, wa(0, mlpIn*mlpHidden), wa(ob1, mlpHidden), wa(ow2, mlpHidden*mlpOut), wa(ob2, mlpOut),
			sc, hw.BufferArg(work, mlpScores+4*mlpOut, 8), u(mlpIn), u(mlpHidden), u(mlpOut)),
		in:  make([]byte, 4*mlpIn),
		out: make([]byte, 4*mlpOut+8),
	}
	m.fusedBatch = []hw.Command{m.fused}
	return m
}

// call runs one classification: upload, the batch, the download (which
// waits), then Sync for failures. syncFirst is the old shape (a Sync
// before the download: two waits).
func (m *mlpCall) callShape(syncFirst bool, x float32) error {
	for i := range mlpIn {
		binary.LittleEndian.PutUint32(m.in[4*i:], math.Float32bits(x+float32(i)/4))
	}
	if _, err := m.s.Write(m.work, 0, m.in); err != nil {
		return err
	}
	if m.useFused && m.fusedAsBatch {
		if _, err := m.s.SubmitBatch(m.fusedBatch); err != nil {
			return err
		}
	} else if m.useFused {
		if _, err := m.s.Submit(&m.fused); err != nil {
			return err
		}
	} else if _, err := m.s.SubmitBatch(m.batch); err != nil {
		return err
	}
	if syncFirst {
		if err := m.s.Sync(m.ctx); err != nil {
			return err
		}
	}
	c, err := m.s.Read(m.work, mlpScores, m.out)
	if err != nil {
		return err
	}
	if err := c.Wait(m.ctx); err != nil {
		return err
	}
	return m.s.Sync(m.ctx)
}

func (m *mlpCall) call(t testing.TB, x float32) []byte {
	t.Helper()
	if err := m.callShape(false, x); err != nil {
		t.Fatal(err)
	}
	if !m.s.Idle() {
		t.Fatal("stream not idle after the call")
	}
	return slices.Clone(m.out)
}

// BenchmarkMLPCall: the MLP stage's device work per call on cuda0,
// without Wasm or the host: sync-read is the old shape (Sync, then the
// download: two waits), read the new one (the download is the only wait);
// staging-off copies from and into pageable memory; eager-events records
// an event after every burst, as before flushDelay. before is the old
// shape on the old copy and event behaviour. fused is read with one
// mlp_forward launch instead of the six-kernel batch (fused/graph: as a
// one-command batch, replayed from the graph cache). p50/p99 per call.
func BenchmarkMLPCall(b *testing.B) {
	for _, c := range []struct {
		name      string
		syncFirst bool
		opts      []Config
		fused     bool
		asBatch   bool
	}{
		{"before", true, []Config{NewConfig().WithCopyStaging(0).withEagerEvents()}, false, false},
		{"sync-read", true, nil, false, false},
		{"read", false, nil, false, false},
		{"read/eager-events", false, []Config{NewConfig().withEagerEvents()}, false, false},
		{"read/staging-off", false, []Config{NewConfig().WithCopyStaging(0)}, false, false},
		{"fused", false, nil, true, false},
		{"fused/staging-off", false, []Config{NewConfig().WithCopyStaging(0)}, true, false},
		{"fused/graph", false, nil, true, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			p := requireGPU(b)
			if len(c.opts) > 0 {
				p.Close()
				var err error
				if p, err = Open(c.opts[0]); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { p.Close() })
			}
			m := newMLPCall(b, p)
			m.useFused, m.fusedAsBatch = c.fused, c.asBatch
			for i := range 100 {
				if err := m.callShape(c.syncFirst, float32(i)); err != nil {
					b.Fatal(err)
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				if err := m.callShape(c.syncFirst, float32(i%64)); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			reportPercentiles(b, lat)
		})
	}
}

// reportPercentiles reports p50 and p99 of per-call latencies.
func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds()), "p99-ns")
}
