package sessions_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	. "github.com/stagehost/stagehost/sessions"
	. "github.com/stagehost/stagehost/sessions/exchange"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// patience bounds every wait in these tests: a test that would otherwise
// hang fails after it instead. Nothing is synchronised by sleeping.
const patience = 20 * time.Second

// TestMain fails the run if a resident kernel or a stream worker outlives
// the tests: every rig loses its devices at cleanup, which stops both.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if stacks := leaked(); stacks != "" {
			fmt.Fprintf(os.Stderr, "leaked resident kernels or stream workers:\n%s\n", stacks)
			code = 1
		}
	}
	os.Exit(code)
}

func leaked() string {
	deadline := time.Now().Add(patience)
	for {
		buf := make([]byte, 1<<20)
		all := string(buf[:runtime.Stack(buf, true)])
		var out []string
		for g := range strings.SplitSeq(all, "\n\n") {
			if strings.Contains(g, "sim.(*Stream).run") || strings.Contains(g, "sessions.runExchange") {
				out = append(out, g)
			}
		}
		if len(out) == 0 || time.Now().After(deadline) {
			return strings.Join(out, "\n\n")
		}
		runtime.Gosched()
	}
}

// rig is a platform with a GPU and an NPU (or CPU) device, an owner with
// one stream on each, a runtime, a startup line and a simulated exchange.
// At cleanup both devices are lost, which stops every resident kernel and
// releases every hang, so no test leaves a spinning participant behind.
type rig struct {
	t        testing.TB
	p        *sim.Platform
	gpu, npu *sim.Device
	budget   *hw.Budget
	owner    *host.Owner // nil for a rig made with noOwner
	rt       *host.Runtime
	gs, ns   hw.Stream
	startup  *ResidentStartup
	payload  hw.Shared
	gp, np   Participant
	rounds   int
}

type rigOpt func(*rigConfig)

type rigConfig struct {
	peer    hw.Engine
	noOwner bool
	wrap    bool // wrap both streams in recording streams
}

func cpuPeer(c *rigConfig)   { c.peer = hw.EngineCPU }
func noOwner(c *rigConfig)   { c.noOwner = true }
func recording(c *rigConfig) { c.wrap = true }

func newRig(t testing.TB, rounds int, opts ...rigOpt) *rig {
	t.Helper()
	cfg := rigConfig{peer: hw.EngineNPU}
	for _, o := range opts {
		o(&cfg)
	}
	p := sim.New()
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	must(t, err)
	npu, err := p.AddDevice("npu0", cfg.peer, sim.NewDeviceConfig())
	must(t, err)
	t.Cleanup(func() {
		gpu.Lose("test cleanup")
		npu.Lose("test cleanup")
	})
	rt, err := host.NewRuntime(host.NewConfig())
	must(t, err)
	r := &rig{t: t, p: p, gpu: gpu, npu: npu, budget: hw.NewBudget("test", 1<<20), rt: rt, rounds: rounds}
	if !cfg.noOwner {
		r.owner = host.NewOwner("exchange", r.budget)
		r.gs, err = r.owner.NewStream(gpu)
		must(t, err)
		r.ns, err = r.owner.NewStream(npu)
		must(t, err)
	} else {
		r.gs, err = gpu.NewStream()
		must(t, err)
		r.ns, err = npu.NewStream()
		must(t, err)
	}
	if cfg.wrap {
		r.gs, r.ns = &recStream{Stream: r.gs}, &recStream{Stream: r.ns}
	}
	r.startup, err = NewResidentStartup(p, gpu, npu, r.budget)
	must(t, err)
	r.gp, r.np, r.payload, err = NewSimExchange(p, r.startup, r.gs, r.ns, rounds, r.owner)
	must(t, err)
	return r
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// session makes the rig's session with the rig's runtime and owner.
func (r *rig) session(closeTimeout ...time.Duration) *ResidentSession {
	r.t.Helper()
	cfg := NewResidentConfig().WithRuntime(r.rt).WithName("sess")
	if r.owner != nil {
		cfg = cfg.WithOwner(r.owner)
	}
	for _, d := range closeTimeout {
		cfg = cfg.WithCloseTimeout(d)
	}
	s, err := NewResidentSession(r.startup, r.gp, r.np, cfg)
	must(r.t, err)
	return s
}

func (r *rig) word() uint32 { return r.startup.Shared().Load32Acquire(0) }

func (r *rig) releases() (gpu, npu uint64) {
	return r.gpu.VisibilityReleases(), r.npu.VisibilityReleases()
}

func (r *rig) snapshot() []byte { return bytes.Clone(r.payload.Bytes()) }

// payloadWord loads a payload control word with an acquire load.
func (r *rig) payloadWord(off int) uint32 { return r.payload.Load32Acquire(off) }

// waitOK joins the session under the test's patience and requires both
// participants to have retired successfully.
func (r *rig) waitOK(s *ResidentSession) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	done, err := s.Wait(ctx)
	if err != nil || !done {
		r.t.Fatalf("Wait = %v, %v; want true, nil", done, err)
	}
}

// checkExchanged requires the payload to hold the result of r.rounds
// rounds.
func (r *rig) checkExchanged() {
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

// checkUntouched requires the payload to equal before byte for byte.
func (r *rig) checkUntouched(before []byte) {
	r.t.Helper()
	if !bytes.Equal(r.payload.Bytes(), before) {
		r.t.Fatalf("payload was touched:\n got %v\nwant %v", r.payload.Bytes(), before)
	}
}

// spinUntil polls cond, yielding, until it holds; it fails the test after
// patience.
func spinUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		runtime.Gosched()
	}
}

func isClass(t testing.TB, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("error %v; want class %v", err, class)
	}
}

// recStream wraps a stream and hands out completions that record every
// blocking join (WaitRetired) with its context's deadline. Non-blocking
// Retired queries are counted separately.
type recStream struct {
	hw.Stream
	mu        sync.Mutex
	waits     int
	deadlines []time.Time
	queries   atomic.Int64
}

func (s *recStream) Submit(cmd *hw.Command) (hw.Completion, error) {
	if _, err := s.Stream.Submit(cmd); err != nil {
		return hw.Completion{}, err
	}
	return hw.NewCompletion(s, s.Stream.(*sim.Stream).Submitted()), nil
}

func (s *recStream) Retired(seq uint64) (bool, error) {
	s.queries.Add(1)
	return s.Stream.(hw.Retirer).Retired(seq)
}

func (s *recStream) WaitRetired(ctx context.Context, seq uint64) error {
	d, _ := ctx.Deadline()
	s.mu.Lock()
	s.waits++
	s.deadlines = append(s.deadlines, d)
	s.mu.Unlock()
	return s.Stream.(hw.Retirer).WaitRetired(ctx, seq)
}

func (s *recStream) joins() (int, []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waits, slices.Clone(s.deadlines)
}

func simStream(s hw.Stream) *sim.Stream {
	if r, ok := s.(*recStream); ok {
		return r.Stream.(*sim.Stream)
	}
	return s.(*sim.Stream)
}

// records returns the tracer's records for the session "sess".
func (r *rig) records() []host.Record {
	var out []host.Record
	for _, rec := range r.rt.Tracer().Records() {
		if rec.Owner == "sess" {
			out = append(out, rec)
		}
	}
	return out
}

func aligned(b []byte, n uintptr) bool { return uintptr(unsafe.Pointer(&b[0]))%n == 0 }
