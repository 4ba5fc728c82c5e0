package sessions_test

// Resident sessions on a real NVIDIA GPU: R1–R8 with the CUDA
// participants (NewCUDAExchange: the resident_gpu_exchange kernel on
// cuda0, the host program on host0), plus the start-up latency benchmark.
// Without a usable GPU every test here skips, unless
// STAGEHOST_REQUIRE_GPU=1, which turns the skip into a failure.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	. "github.com/stagehost/stagehost/sessions"
	. "github.com/stagehost/stagehost/sessions/exchange"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/internal/testutil"
)

var (
	cudaOnce sync.Once
	cudaP    *cuda.Platform
	cudaErr  error
)

// requireCUDA opens the CUDA platform once per process (opening JITs the
// module; the platform lives until the process exits).
func requireCUDA(t testing.TB) *cuda.Platform {
	t.Helper()
	cudaOnce.Do(func() { cudaP, cudaErr = cuda.Open(cuda.NewConfig()) })
	testutil.GPU(t, cudaErr)
	return cudaP
}

// cudaRig is a startup line on cuda0 and host0, a stream on each and the
// CUDA exchange, with or without an owner.
type cudaRig struct {
	t        testing.TB
	p        *cuda.Platform
	gpu      hw.Device
	host     *cuda.HostDevice
	budget   *hw.Budget
	owner    *host.Owner // nil: streams and payload are the rig's
	rt       *host.Runtime
	gs, hs   hw.Stream
	startup  *ResidentStartup
	payload  hw.Shared
	gp, np   Participant
	rounds   int
	gates    []func() // released at cleanup, so nothing stays parked
	sessions []*ResidentSession
}

func newCUDARig(t testing.TB, rounds int, withOwner bool) *cudaRig {
	t.Helper()
	p := requireCUDA(t)
	gpu, err := p.Device("cuda0")
	must(t, err)
	rt, err := host.NewRuntime(host.NewConfig())
	must(t, err)
	r := &cudaRig{t: t, p: p, gpu: gpu, host: p.Host(), budget: hw.NewBudget("cuda-test", 1<<20), rt: rt, rounds: rounds}
	if withOwner {
		r.owner = host.NewOwner("cuda-exchange", r.budget)
		r.gs, err = r.owner.NewStream(gpu)
		must(t, err)
		r.hs, err = r.owner.NewStream(r.host)
		must(t, err)
	} else {
		r.gs, err = gpu.NewStream()
		must(t, err)
		r.hs, err = r.host.NewStream()
		must(t, err)
	}
	r.startup, err = NewResidentStartup(p, gpu, r.host, r.budget)
	must(t, err)
	r.gp, r.np, r.payload, err = NewCUDAExchange(p, r.startup, r.gs, r.hs, rounds, r.owner)
	must(t, err)
	t.Cleanup(r.cleanup)
	return r
}

// cleanup releases every gate, closes what the test left open (Close
// publishes ABORT for an undecided session) and, without an owner, the
// rig's own streams and payload.
func (r *cudaRig) cleanup() {
	for _, g := range r.gates {
		g()
	}
	for _, s := range r.sessions {
		_ = s.Close() // a second Close returns the first one's result
	}
	if len(r.sessions) == 0 {
		_ = r.startup.Close()
	}
	if r.owner != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for _, s := range []hw.Stream{r.gs, r.hs} {
		if err := s.Close(ctx); err != nil && !errors.Is(err, errdefs.ErrClosed) {
			r.t.Errorf("stream close: %v", err)
		}
	}
	_ = r.payload.Free()
}

func (r *cudaRig) session(closeTimeout ...time.Duration) *ResidentSession {
	r.t.Helper()
	cfg := NewResidentConfig().WithRuntime(r.rt).WithName("cuda-sess")
	if r.owner != nil {
		cfg = cfg.WithOwner(r.owner)
	}
	for _, d := range closeTimeout {
		cfg = cfg.WithCloseTimeout(d)
	}
	s, err := NewResidentSession(r.startup, r.gp, r.np, cfg)
	must(r.t, err)
	r.sessions = append(r.sessions, s)
	return s
}

func (r *cudaRig) word() uint32               { return r.startup.Shared().Load32Acquire(0) }
func (r *cudaRig) payloadWord(off int) uint32 { return r.payload.Load32Acquire(off) }
func (r *cudaRig) snapshot() []byte           { return bytes.Clone(r.payload.Bytes()) }

func (r *cudaRig) waitOK(s *ResidentSession) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if done, err := s.Wait(ctx); err != nil || !done {
		r.t.Fatalf("Wait = %v, %v; want true, nil", done, err)
	}
}

func (r *cudaRig) checkExchanged() {
	r.t.Helper()
	got, err := ExchangeData(r.payload)
	must(r.t, err)
	if want := ExpectedPayload(r.rounds); !slices.Equal(got, want) {
		r.t.Fatalf("payload after %d rounds:\n got %v\nwant %v", r.rounds, got, want)
	}
	if g, n := r.payloadWord(GPUObservedOffset), r.payloadWord(NPUObservedOffset); g != 1 || n != 1 {
		r.t.Fatalf("observed words = %d, %d; want 1, 1", g, n)
	}
}

func (r *cudaRig) checkUntouched(before []byte) {
	r.t.Helper()
	if !bytes.Equal(r.payload.Bytes(), before) {
		r.t.Fatalf("payload was touched:\n got %v\nwant %v", r.payload.Bytes(), before)
	}
}

// gateHost submits, on the host stream, a spin on a host word ahead of
// whatever comes next there, and returns the release. It models an NPU
// that is slow to start its participant.
func (r *cudaRig) gateHost() func() {
	r.t.Helper()
	b, err := r.host.Alloc(64, 0, nil)
	must(r.t, err)
	spin, err := r.host.Prepare("spin")
	must(r.t, err)
	_, err = r.hs.Submit(&hw.Command{Program: spin, Args: []hw.Arg{hw.BufferArg(b, 0, -1), hw.Uint(0), hw.Uint(1)}})
	must(r.t, err)
	var once sync.Once
	release := func() {
		once.Do(func() {
			mem, _ := b.HostBytes()
			atomic.StoreUint32((*uint32)(unsafe.Pointer(&mem[0])), 1)
			_ = b.Free()
		})
	}
	r.gates = append(r.gates, release)
	return release
}

// gateGPU submits, on the GPU stream, the spin kernel on a word of mapped
// memory ahead of whatever comes next there, and returns the release.
func (r *cudaRig) gateGPU() func() {
	r.t.Helper()
	sh, err := r.p.AllocShared(64, []hw.Device{r.gpu}, nil)
	must(r.t, err)
	view, err := sh.View(r.gpu)
	must(r.t, err)
	spin, err := r.gpu.Prepare("spin")
	must(r.t, err)
	_, err = r.gs.Submit(&hw.Command{Program: spin, Args: []hw.Arg{hw.BufferArg(view, 0, 4), hw.Uint(0), hw.Uint(1)}})
	must(r.t, err)
	var once sync.Once
	release := func() {
		once.Do(func() {
			sh.Store32Release(0, 1)
			_ = sh.Free() // released once the spin retired
		})
	}
	r.gates = append(r.gates, release)
	return release
}

// parked gives submitted participants time to start polling on their
// devices, so that the checks below see parked participants, not ones
// still being launched.
func parked() { time.Sleep(2 * time.Millisecond) }

// ---- R1 ----

func TestCUDAR1StartupLineMappedForBothDevices(t *testing.T) {
	r := newCUDARig(t, 4, true)
	sh := r.startup.Shared()
	if sh.Size() != StartupSize || !aligned(sh.Bytes(), 64) {
		t.Fatalf("startup line: %d bytes, 64-byte aligned %v", sh.Size(), aligned(sh.Bytes(), 64))
	}
	if devs := sh.Devices(); len(devs) != 2 || devs[0] != r.gpu || devs[1] != hw.Device(r.host) {
		t.Fatalf("startup line devices %v; want [cuda0 host0]", devs)
	}
	for _, d := range []hw.Device{r.gpu, r.host} {
		v, err := sh.View(d)
		must(t, err)
		mem, err := v.HostBytes()
		must(t, err)
		if v.Device() != d || v.Size() != StartupSize || &mem[0] != &sh.Bytes()[0] {
			t.Fatalf("%s view: device %s, %d bytes, same mapping %v", d.Name(), v.Device().Name(), v.Size(), &mem[0] == &sh.Bytes()[0])
		}
	}
	if r.word() != Wait || slices.ContainsFunc(sh.Bytes(), func(b byte) bool { return b != 0 }) {
		t.Fatal("fresh startup line is not all WAIT (zero)")
	}
	// Publishing: the release store plus one prepared action per device.
	for i, a := range Publication(r.startup) {
		if a == nil {
			t.Fatalf("visibility action %d missing", i)
		}
	}
	if got := r.budget.Used(); got != StartupSize+PayloadSize {
		t.Fatalf("budget %d, want %d", got, StartupSize+PayloadSize)
	}
	s := r.session()
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	parked()
	must(t, s.Start())
	if r.word() != Run {
		t.Fatalf("startup word %d after Start", r.word())
	}
	r.waitOK(s)
	r.checkExchanged() // both devices saw the decision through the line
	must(t, s.Close())
}

// ---- R2 ----

func TestCUDAR2BothOrdersRunAndVerifyPayload(t *testing.T) {
	for _, gpuFirst := range []bool{true, false} {
		name := map[bool]string{true: "gpu-first", false: "npu-first"}[gpuFirst]
		t.Run(name, func(t *testing.T) {
			r := newCUDARig(t, 64, true)
			s := r.session()
			before := r.snapshot()
			first, second := s.SubmitGPU, s.SubmitNPU
			if !gpuFirst {
				first, second = second, first
			}
			must(t, first())
			parked()
			r.checkUntouched(before) // a parked participant touches nothing
			must(t, second())
			isClass(t, first(), errdefs.ErrBusy) // at most once
			parked()
			r.checkUntouched(before)
			must(t, s.Start())
			r.waitOK(s)
			r.checkExchanged()
			must(t, s.Close())
			spinUntil(t, "budget release", func() bool { return r.budget.Used() == 0 })
		})
	}
}

// ---- R3: what of it can be provoked on real hardware ----

// TestCUDAR3RefusedSubmissionAbortsPeer: CUDA refuses launches inside
// the driver thread (the completion fails with ErrRejected), never
// synchronously, so a device rejection at submission cannot be provoked;
// a refused submission can: the GPU stream is closed. ABORT is then
// published and the parked host participant retires without touching the
// payload.
func TestCUDAR3RefusedSubmissionAbortsPeer(t *testing.T) {
	r := newCUDARig(t, 8, false)
	s := r.session()
	before := r.snapshot()
	must(t, s.SubmitNPU())
	parked()
	must(t, r.gs.Close(context.Background()))
	err := s.SubmitGPU()
	isClass(t, err, errdefs.ErrClosed)
	if d, ok := s.Decision(); !ok || d != Abort || r.word() != Abort {
		t.Fatalf("decision %d (%v), word %d; want ABORT", d, ok, r.word())
	}
	r.waitOK(s)
	r.checkUntouched(before)
	must(t, s.Close())
}

// ---- R4 ----

func TestCUDAR4RunOnlyAfterBothAcceptedAndOnce(t *testing.T) {
	r := newCUDARig(t, 16, true)
	s := r.session()
	isClass(t, s.Start(), errdefs.ErrBusy)
	must(t, s.SubmitGPU())
	isClass(t, s.Start(), errdefs.ErrBusy)
	if r.word() != Wait {
		t.Fatal("a refused Start published")
	}
	must(t, s.SubmitNPU())
	parked()
	must(t, s.Start())
	isClass(t, s.Abort(), errdefs.ErrBusy)
	isClass(t, s.Start(), errdefs.ErrBusy)
	if r.word() != Run {
		t.Fatalf("word %d; a second decision was published", r.word())
	}
	r.waitOK(s)
	r.checkExchanged()
	must(t, s.Close())
}

// ---- R5 ----

func TestCUDAR5AbortBeforeStartRetiresWithoutTouchingPayload(t *testing.T) {
	r := newCUDARig(t, 16, true)
	s := r.session()
	before := r.snapshot()
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	parked()
	must(t, s.Abort())
	r.waitOK(s)
	r.checkUntouched(before)
	isClass(t, s.Start(), errdefs.ErrBusy)
	must(t, s.Close())
	if s.Quarantined() {
		t.Fatal("quarantined")
	}
}

// ---- R6 ----

func TestCUDAR6IsCompleteMakesNoProgress(t *testing.T) {
	r := newCUDARig(t, 8, true)
	s := r.session()
	before := r.snapshot()
	release := r.gateHost()
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	parked()
	for range 1000 {
		if done, err := s.IsComplete(); done || err != nil {
			t.Fatalf("undecided IsComplete = %v, %v", done, err)
		}
	}
	if r.word() != Wait {
		t.Fatal("IsComplete published")
	}
	r.checkUntouched(before)
	must(t, s.Start())
	// The GPU participant runs up to its first wait for the peer; the host
	// participant is stuck behind the gate. Asking changes nothing.
	spinUntil(t, "the GPU's first round", func() bool { return r.payloadWord(GPUCreditOffset) == 1 })
	for range 1000 {
		if done, err := s.IsComplete(); done || err != nil {
			t.Fatalf("gated IsComplete = %v, %v", done, err)
		}
	}
	if r.payloadWord(GPUObservedOffset) != 1 || r.payloadWord(NPUObservedOffset) != 0 || r.payloadWord(GPUCreditOffset) != 1 {
		t.Fatalf("IsComplete made progress: NPU observed %d, GPU credit %d", r.payloadWord(NPUObservedOffset), r.payloadWord(GPUCreditOffset))
	}
	release()
	spinUntil(t, "IsComplete", func() bool { done, _ := s.IsComplete(); return done })
	r.waitOK(s)
	r.checkExchanged()
	must(t, s.Close())
}

// ---- R7 ----

func TestCUDAR7OneDeadlineForBothJoins(t *testing.T) {
	r := newCUDARig(t, 32, true)
	s := r.session()
	release := r.gateHost()
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	parked()
	must(t, s.Start())
	// Both participants are waiting: the GPU for the host's credit, the
	// host participant behind its gate. One 50 ms deadline covers both
	// joins: the call returns after ~50 ms, not ~100.
	const d = 50 * time.Millisecond
	start := time.Now()
	done, err := s.WaitTimeout(d)
	took := time.Since(start)
	if done || err != nil {
		t.Fatalf("WaitTimeout = %v, %v; want false, nil", done, err)
	}
	if took < d || took > 2*d-10*time.Millisecond {
		t.Fatalf("WaitTimeout took %v; want one %v deadline for both joins", took, d)
	}
	t.Logf("WaitTimeout(%v) with both participants waiting returned (false, nil) after %v", d, took)
	if s.Poisoned() || s.Quarantined() {
		t.Fatal("a timeout poisoned the session")
	}
	release()
	r.waitOK(s)
	r.checkExchanged()
	must(t, s.Close())
}

// ---- R8 ----

func TestCUDAR8CloseUndecidedPublishesAbortAndBothRetire(t *testing.T) {
	r := newCUDARig(t, 16, false) // no owner: the payload outlives Close
	s := r.session()
	before := r.snapshot()
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	parked()
	must(t, s.Close())
	if d, ok := s.Decision(); !ok || d != Abort || s.Quarantined() {
		t.Fatalf("decision %d (%v), quarantined %v; want ABORT and healthy", d, ok, s.Quarantined())
	}
	r.checkUntouched(before)
	if !r.gs.Idle() || !r.hs.Idle() {
		t.Fatal("a participant did not retire")
	}
}

func TestCUDAR8CloseWithStuckParticipantQuarantines(t *testing.T) {
	r := newCUDARig(t, 16, true)
	s := r.session(100 * time.Millisecond)
	release := r.gateGPU() // the GPU participant cannot start
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	parked()
	used := r.budget.Used()
	err := s.Close()
	isClass(t, err, errdefs.ErrDeviceLost)
	if !s.Quarantined() || !r.owner.Quarantined() {
		t.Fatal("not quarantined")
	}
	if r.budget.Used() != used {
		t.Fatalf("quarantine released memory: %d → %d", used, r.budget.Used())
	}
	t.Logf("Close: %v", err)
	// Let the GPU go: the resident kernel then sees ABORT and retires.
	release()
	spinUntil(t, "the GPU stream going idle", r.gs.Idle)
}

// ---- start-up latency ----

// BenchmarkCUDAResidentStartup times, per iteration, publishing RUN
// (ResidentSession.Start: release store plus both visibility actions)
// until the host observes the GPU participant's "observed" word: the
// kernel is parked polling the startup word before the clock starts. The
// figure is a round trip (host store → GPU load over PCIe → GPU store →
// host load), so an upper bound on publish → observe. Metrics: medians
// and 90th percentiles over the iterations; npu-observe is the same for
// the host participant.
func BenchmarkCUDAResidentStartup(b *testing.B) {
	p := requireCUDA(b)
	gpu, _ := p.Device("cuda0")
	gs, err := gpu.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	hs, err := p.Host().NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer gs.Close(context.Background())
	defer hs.Close(context.Background())
	var gpuLat, npuLat []time.Duration
	for b.Loop() {
		startup, err := NewResidentStartup(p, gpu, p.Host(), nil)
		if err != nil {
			b.Fatal(err)
		}
		gp, np, payload, err := NewCUDAExchange(p, startup, gs, hs, 1, nil)
		if err != nil {
			b.Fatal(err)
		}
		s, err := NewResidentSession(startup, gp, np, NewResidentConfig())
		if err != nil {
			b.Fatal(err)
		}
		if err := s.SubmitGPU(); err != nil {
			b.Fatal(err)
		}
		if err := s.SubmitNPU(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(300 * time.Microsecond) // let the kernel park
		t0 := time.Now()
		if err := s.Start(); err != nil {
			b.Fatal(err)
		}
		var tg, tn time.Duration
		for tg == 0 || tn == 0 {
			if tg == 0 && payload.Load32Acquire(GPUObservedOffset) == 1 {
				tg = time.Since(t0)
			}
			if tn == 0 && payload.Load32Acquire(NPUObservedOffset) == 1 {
				tn = time.Since(t0)
			}
			if time.Since(t0) > patience {
				b.Fatal("RUN never observed")
			}
		}
		gpuLat, npuLat = append(gpuLat, tg), append(npuLat, tn)
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		done, err := s.Wait(ctx)
		cancel()
		if err != nil || !done {
			b.Fatal(done, err)
		}
		if got, _ := ExchangeData(payload); !slices.Equal(got, ExpectedPayload(1)) {
			b.Fatal("payload mismatch")
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		payload.Free()
	}
	q := func(xs []time.Duration, f float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return float64(s[int(f*float64(len(s)-1))].Nanoseconds())
	}
	b.ReportMetric(q(gpuLat, 0.5), "ns/gpu-observe-p50")
	b.ReportMetric(q(gpuLat, 0.9), "ns/gpu-observe-p90")
	b.ReportMetric(q(npuLat, 0.5), "ns/npu-observe-p50")
}

// A resident exchange on a real GPU: the resident_gpu_exchange kernel on
// cuda0 against a Go program on the CUDA platform's host device, host0.
func ExampleNewCUDAExchange() {
	p, err := cuda.Open(cuda.NewConfig())
	if err != nil {
		return // no CUDA GPU here
	}
	gpu, _ := p.Device("cuda0")
	owner := host.NewOwner("pingpong", hw.NewBudget("pingpong", 1<<20))
	gs, _ := owner.NewStream(gpu)
	hs, _ := owner.NewStream(p.Host())
	startup, err := NewResidentStartup(p, gpu, p.Host(), owner.Budget())
	if err != nil {
		panic(err)
	}
	gp, np, payload, err := NewCUDAExchange(p, startup, gs, hs, 64, owner)
	if err != nil {
		panic(err)
	}
	s, err := NewResidentSession(startup, gp, np, NewResidentConfig().WithOwner(owner))
	if err != nil {
		panic(err)
	}
	defer s.Close() // frees the line and closes the owner
	if err := s.SubmitGPU(); err != nil {
		panic(err)
	}
	if err := s.SubmitNPU(); err != nil {
		panic(err)
	}
	if err := s.Start(); err != nil {
		panic(err)
	}
	if done, err := s.WaitTimeout(5 * time.Second); !done || err != nil {
		panic(err)
	}
	got, _ := ExchangeData(payload)
	fmt.Println(slices.Equal(got, ExpectedPayload(64)))
}
