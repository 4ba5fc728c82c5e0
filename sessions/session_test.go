package sessions_test

import (
	"context"
	"errors"
	"fmt"
	. "github.com/stagehost/stagehost/sessions"
	. "github.com/stagehost/stagehost/sessions/exchange"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

// ---- R1: the startup line ----

func TestR1StartupLineIsDedicated64BytesVisibleToBoth(t *testing.T) {
	for _, peer := range []hw.Engine{hw.EngineNPU, hw.EngineCPU} {
		t.Run(peer.String(), func(t *testing.T) {
			var opts []rigOpt
			if peer == hw.EngineCPU {
				opts = append(opts, cpuPeer)
			}
			r := newRig(t, 1, opts...)
			sh := r.startup.Shared()
			if sh.Size() != StartupSize || StartupSize != 64 {
				t.Fatalf("startup line is %d bytes; want 64", sh.Size())
			}
			if !aligned(sh.Bytes(), 64) {
				t.Fatal("startup line is not 64-byte aligned")
			}
			if devs := sh.Devices(); len(devs) != 2 || devs[0] != r.gpu || devs[1] != r.npu {
				t.Fatalf("startup line devices = %v; want [gpu0 npu0]", devs)
			}
			for _, d := range []hw.Device{r.gpu, r.npu} {
				if _, err := sh.View(d); err != nil {
					t.Fatalf("view for %s: %v", d.Name(), err)
				}
			}
			if r.word() != Wait || slices.ContainsFunc(sh.Bytes(), func(b byte) bool { return b != 0 }) {
				t.Fatalf("fresh startup line %v; want all zero (WAIT)", sh.Bytes())
			}
			// The line is the startup's own allocation, not the payload's.
			if &sh.Bytes()[0] == &r.payload.Bytes()[0] {
				t.Fatal("startup line shares memory with the payload")
			}
			if got := r.budget.Used(); got != StartupSize+PayloadSize {
				t.Fatalf("budget used %d; want %d", got, StartupSize+PayloadSize)
			}
		})
	}
}

func TestR1StartupEngines(t *testing.T) {
	p := sim.New()
	gpu, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	gpu2, _ := p.AddDevice("gpu1", hw.EngineGPU, sim.NewDeviceConfig())
	npu, _ := p.AddDevice("npu0", hw.EngineNPU, sim.NewDeviceConfig())
	cpu, _ := p.AddDevice("cpu0", hw.EngineCPU, sim.NewDeviceConfig())
	budget := hw.NewBudget("b", 0)
	for _, c := range []struct {
		name     string
		gpu, npu hw.Device
		class    error
	}{
		{"gpu+npu", gpu, npu, nil},
		{"gpu+cpu", gpu, cpu, nil},
		{"gpu+gpu", gpu, gpu2, errdefs.ErrUnsupported},
		{"npu+npu", npu, npu, errdefs.ErrUnsupported},
		{"cpu+npu", cpu, npu, errdefs.ErrUnsupported},
		{"npu+gpu", npu, gpu, errdefs.ErrUnsupported},
		{"nil", gpu, nil, errdefs.ErrInvalidArgument},
	} {
		st, err := NewResidentStartup(p, c.gpu, c.npu, budget)
		if c.class == nil {
			must(t, err)
			must(t, st.Close())
			isClass(t, st.Close(), errdefs.ErrClosed)
			continue
		}
		isClass(t, err, c.class)
	}
	if budget.Used() != 0 {
		t.Fatalf("budget used %d after every startup was closed or refused", budget.Used())
	}
	isClass(t, func() error { _, err := NewResidentStartup(p, gpu, npu, hw.NewBudget("tiny", 63)); return err }(), errdefs.ErrOutOfBudget)
	must(t, p.Close())
}

func TestR1PublishIsReleaseStorePlusEachDeviceVisibility(t *testing.T) {
	r := newRig(t, 4)
	s := r.session()
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	g0, n0 := r.releases()
	must(t, s.Start())
	g1, n1 := r.releases()
	if g1 != g0+1 || n1 != n0+1 {
		t.Fatalf("visibility releases gpu %d→%d, npu %d→%d; want one more on each", g0, g1, n0, n1)
	}
	if r.word() != Run {
		t.Fatalf("startup word %d after Start; want RUN", r.word())
	}
	r.waitOK(s)
	r.checkExchanged()
	must(t, s.Close())
}

func TestR1PublishAllocatesNothing(t *testing.T) {
	r := newRig(t, 1)
	g0, n0 := r.releases()
	allocs := testing.AllocsPerRun(100, func() {
		if err := Publish(r.startup, Wait); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("publish allocates %v times; want 0", allocs)
	}
	if g, n := r.releases(); g-g0 < 100 || n-n0 < 100 {
		t.Fatalf("visibility releases grew by %d and %d over ≥100 publications", g-g0, n-n0)
	}
}

// ---- R2: each participant once, either order, only a GPU engine ----

func TestR2BothOrdersRunAndVerifyPayload(t *testing.T) {
	for _, gpuFirst := range []bool{true, false} {
		name := map[bool]string{true: "gpu-first", false: "npu-first"}[gpuFirst]
		t.Run(name, func(t *testing.T) {
			r := newRig(t, 16)
			s := r.session()
			first, second := s.SubmitGPU, s.SubmitNPU
			if !gpuFirst {
				first, second = second, first
			}
			must(t, first())
			if r.word() != Wait {
				t.Fatal("a submission published a decision")
			}
			must(t, second())
			must(t, s.Start())
			r.waitOK(s)
			r.checkExchanged()
			if d, ok := s.Decision(); !ok || d != Run {
				t.Fatalf("Decision = %d, %v; want RUN", d, ok)
			}
			must(t, s.Close())
			if r.budget.Used() != 0 {
				t.Fatalf("budget used %d after a healthy close; want 0", r.budget.Used())
			}
			if s.Quarantined() || s.Poisoned() {
				t.Fatal("healthy session quarantined or poisoned")
			}
		})
	}
}

func TestR2EachParticipantSubmittedAtMostOnce(t *testing.T) {
	r := newRig(t, 2)
	s := r.session()
	must(t, s.SubmitGPU())
	isClass(t, s.SubmitGPU(), errdefs.ErrBusy)
	must(t, s.SubmitNPU())
	isClass(t, s.SubmitNPU(), errdefs.ErrBusy)
	if g, n := simStream(r.gs).Submitted(), simStream(r.ns).Submitted(); g != 1 || n != 1 {
		t.Fatalf("streams accepted %d and %d commands; want 1 each", g, n)
	}
	must(t, s.Start())
	isClass(t, s.SubmitGPU(), errdefs.ErrBusy)
	r.waitOK(s)
	r.checkExchanged()
	must(t, s.Close())
	isClass(t, s.SubmitNPU(), errdefs.ErrClosed)
}

func TestR2OnlyAGPUEngineIsTheGPUParticipant(t *testing.T) {
	r := newRig(t, 1)
	other, err := r.p.AddDevice("gpu1", hw.EngineGPU, sim.NewDeviceConfig())
	must(t, err)
	t.Cleanup(func() { other.Lose("test cleanup") })
	os, err := other.NewStream()
	must(t, err)
	noop, err := other.Prepare("noop")
	must(t, err)
	noStartup := r.gp
	noStartup.Command.Args = noStartup.Command.Args[1:]

	for _, c := range []struct {
		name     string
		gpu, npu Participant
	}{
		{"swapped", r.np, r.gp},
		{"npu-as-gpu", r.np, r.np},
		{"gpu-as-npu", r.gp, r.gp},
		{"gpu-not-the-startups", Participant{Stream: os, Command: hw.Command{Program: noop}}, r.np},
		{"program-of-another-device", Participant{Stream: r.gs, Command: r.np.Command}, r.np},
		{"does-not-poll-startup", noStartup, r.np},
		{"nil-stream", Participant{}, r.np},
	} {
		_, err := NewResidentSession(r.startup, c.gpu, c.npu, NewResidentConfig())
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: err %v; want invalid argument", c.name, err)
		}
		if c.name == "npu-as-gpu" && !strings.Contains(fmt.Sprint(err), "only a GPU engine") {
			t.Errorf("npu-as-gpu: err %v; want it refused as not a GPU engine", err)
		}
	}
	_, err = NewResidentSession(r.startup, r.gp, r.np, NewResidentConfig().WithCloseTimeout(-1))
	isClass(t, err, errdefs.ErrInvalidArgument)
	// Refused sessions took nothing: the startup still binds once.
	s := r.session()
	_, err = NewResidentSession(r.startup, r.gp, r.np, NewResidentConfig())
	isClass(t, err, errdefs.ErrBusy)
	isClass(t, r.startup.Close(), errdefs.ErrBusy)
	must(t, s.Close())
}

func TestR2CommandsAreCopied(t *testing.T) {
	r := newRig(t, 8)
	s := r.session()
	// Scribble over the caller's commands after the session took them.
	r.gp.Command.Args[2] = hw.Uint(1)
	r.np.Command.Args[2] = hw.Uint(1)
	r.gp.Command.Args[1] = hw.Arg{}
	must(t, s.SubmitNPU())
	must(t, s.SubmitGPU())
	must(t, s.Start())
	r.waitOK(s)
	r.checkExchanged() // 8 rounds, not 1
	must(t, s.Close())
}

// ---- R3: a rejected participant aborts its peer ----

func TestR3RejectionPublishesAbortForPeer(t *testing.T) {
	for _, rejectGPU := range []bool{true, false} {
		name := map[bool]string{true: "gpu-rejected", false: "npu-rejected"}[rejectGPU]
		t.Run(name, func(t *testing.T) {
			r := newRig(t, 16)
			s := r.session()
			before := r.snapshot()
			peerSubmit, rejectedSubmit := s.SubmitNPU, s.SubmitGPU
			rejected, peer := r.gs, r.ns
			if !rejectGPU {
				peerSubmit, rejectedSubmit = s.SubmitGPU, s.SubmitNPU
				rejected, peer = r.ns, r.gs
			}
			must(t, peerSubmit()) // the peer is now polling WAIT
			simStream(rejected).Inject(sim.Fault{Kind: sim.RejectSubmit})
			g0, n0 := r.releases()
			err := rejectedSubmit()
			isClass(t, err, errdefs.ErrRejected)
			if d, ok := s.Decision(); !ok || d != Abort || r.word() != Abort {
				t.Fatalf("after a rejection: decision %d, %v, word %d; want ABORT published", d, ok, r.word())
			}
			if g, n := r.releases(); g != g0+1 || n != n0+1 {
				t.Fatal("ABORT was not made visible to both devices")
			}
			if simStream(rejected).Submitted() != 0 {
				t.Fatal("the rejected stream queued something")
			}
			isClass(t, rejectedSubmit(), errdefs.ErrBusy) // decided: no retry
			isClass(t, s.Start(), errdefs.ErrBusy)
			r.waitOK(s) // the peer retired
			if !simStream(peer).Idle() {
				t.Fatal("peer stream still busy after Wait")
			}
			r.checkUntouched(before)
			if s.Poisoned() {
				t.Fatal("a rejection poisoned the session")
			}
			must(t, s.Close())
		})
	}
}

// ---- R4: RUN only after both; one decision; failed publication poisons ----

func TestR4RunOnlyAfterBothAccepted(t *testing.T) {
	r := newRig(t, 4)
	s := r.session()
	g0, n0 := r.releases()
	isClass(t, s.Start(), errdefs.ErrBusy)
	must(t, s.SubmitGPU())
	isClass(t, s.Start(), errdefs.ErrBusy)
	if _, ok := s.Decision(); ok || r.word() != Wait {
		t.Fatal("a refused Start decided or published")
	}
	if g, n := r.releases(); g != g0 || n != n0 {
		t.Fatal("a refused Start executed visibility actions")
	}
	must(t, s.SubmitNPU())
	must(t, s.Start())
	r.waitOK(s)
	r.checkExchanged()
	must(t, s.Close())
}

func TestR4SecondDecisionRefused(t *testing.T) {
	for _, first := range []uint32{Run, Abort} {
		t.Run(DecisionName(first), func(t *testing.T) {
			r := newRig(t, 4)
			s := r.session()
			must(t, s.SubmitGPU())
			must(t, s.SubmitNPU())
			if first == Run {
				must(t, s.Start())
			} else {
				must(t, s.Abort())
			}
			g0, n0 := r.releases()
			isClass(t, s.Start(), errdefs.ErrBusy)
			isClass(t, s.Abort(), errdefs.ErrBusy)
			if g, n := r.releases(); g != g0 || n != n0 || r.word() != first {
				t.Fatalf("a refused decision published: word %d, releases %d→%d, %d→%d", r.word(), g0, g, n0, n)
			}
			if d, _ := s.Decision(); d != first {
				t.Fatalf("decision %d; want %d", d, first)
			}
			r.waitOK(s)
			must(t, s.Close())
			if g, n := r.releases(); g != g0 || n != n0 {
				t.Fatal("Close published a second decision")
			}
		})
	}
}

func TestR4FailedPublicationPoisonsAndNothingMoreIsPublished(t *testing.T) {
	for _, onGPU := range []bool{true, false} {
		name := map[bool]string{true: "gpu-visibility", false: "npu-visibility"}[onGPU]
		t.Run(name, func(t *testing.T) {
			r := newRig(t, 4)
			s := r.session(patience)
			must(t, s.SubmitGPU())
			must(t, s.SubmitNPU())
			failing, healthy := r.gpu, r.npu
			if !onGPU {
				failing, healthy = r.npu, r.gpu
			}
			failing.Inject(sim.Fault{Kind: sim.FailVisibility})
			f0, h0 := failing.VisibilityReleases(), healthy.VisibilityReleases()
			err := s.Start()
			isClass(t, err, errdefs.ErrFault)
			if !s.Poisoned() {
				t.Fatal("a failed publication did not poison the session")
			}
			if d, ok := s.Decision(); !ok || d != Run {
				t.Fatalf("decision %d, %v; want RUN kept as the decision", d, ok)
			}
			// The other device's action still ran (publish executes every action).
			if failing.VisibilityReleases() != f0 || healthy.VisibilityReleases() != h0+1 {
				t.Fatal("publish did not execute the healthy device's action exactly once")
			}
			isClass(t, s.Abort(), errdefs.ErrBusy)
			isClass(t, s.Start(), errdefs.ErrBusy)
			isClass(t, s.SubmitGPU(), errdefs.ErrBusy)
			// The sim is fully coherent, so both participants saw RUN.
			r.waitOK(s)
			err = s.Close()
			isClass(t, err, errdefs.ErrDeviceLost)
			if !s.Quarantined() {
				t.Fatal("a poisoned session was not quarantined")
			}
			if r.word() != Run || failing.VisibilityReleases() != f0 || healthy.VisibilityReleases() != h0+1 {
				t.Fatal("a second decision was published after the failed one")
			}
			if r.budget.Used() != StartupSize+PayloadSize {
				t.Fatalf("budget used %d; a poisoned session keeps %d", r.budget.Used(), StartupSize+PayloadSize)
			}
		})
	}
}

func TestR4FailedAbortOnCloseIsNotRepublished(t *testing.T) {
	r := newRig(t, 4)
	s := r.session(patience)
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	r.npu.Inject(sim.Fault{Kind: sim.FailVisibility})
	isClass(t, s.Close(), errdefs.ErrDeviceLost) // ABORT's publication failed: poisoned
	if d, ok := s.Decision(); !ok || d != Abort || !s.Poisoned() || !s.Quarantined() {
		t.Fatalf("decision %d %v, poisoned %v, quarantined %v", d, ok, s.Poisoned(), s.Quarantined())
	}
	g, n := r.releases()
	isClass(t, s.Close(), errdefs.ErrDeviceLost)
	if g2, n2 := r.releases(); g2 != g || n2 != n {
		t.Fatal("a second Close published again")
	}
}

// ---- R5: ABORT before start is not cancellation ----

func TestR5AbortBeforeStartRetiresWithoutTouchingPayload(t *testing.T) {
	r := newRig(t, 16)
	s := r.session()
	before := r.snapshot()
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	must(t, s.Abort())
	r.waitOK(s)
	r.checkUntouched(before)
	must(t, s.Close())
}

func TestR5AbortDoesNotCancelARunningExchange(t *testing.T) {
	r := newRig(t, 256)
	s := r.session()
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	must(t, s.Start())
	// Both participants are inside the exchange now.
	spinUntil(t, "both participants to observe RUN", func() bool {
		return r.payloadWord(GPUObservedOffset) == 1 && r.payloadWord(NPUObservedOffset) == 1
	})
	isClass(t, s.Abort(), errdefs.ErrBusy)
	if r.word() != Run {
		t.Fatal("Abort after RUN changed the startup word")
	}
	r.waitOK(s)
	r.checkExchanged() // every one of the 256 rounds ran
	must(t, s.Close())
}

// ---- R6: IsComplete reads cached retirement, makes no progress ----

func TestR6IsCompleteMakesNoProgress(t *testing.T) {
	r := newRig(t, 4, recording)
	s := r.session()
	if done, err := s.IsComplete(); done || err != nil {
		t.Fatalf("IsComplete before a decision = %v, %v", done, err)
	}
	release := simStream(r.gs).Inject(sim.Fault{Kind: sim.Hang})
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	must(t, s.Start())
	spinUntil(t, "the NPU participant to observe RUN", func() bool { return r.payloadWord(NPUObservedOffset) == 1 })
	for range 1000 {
		if done, err := s.IsComplete(); done || err != nil {
			t.Fatalf("IsComplete with a hung GPU = %v, %v", done, err)
		}
	}
	gs, ns := r.gs.(*recStream), r.ns.(*recStream)
	if w, _ := gs.joins(); w != 0 {
		t.Fatal("IsComplete blocked on a completion")
	}
	if w, _ := ns.joins(); w != 0 {
		t.Fatal("IsComplete blocked on a completion")
	}
	if gs.queries.Load() == 0 {
		t.Fatal("IsComplete did not read the cached retirement")
	}
	if simStream(r.gs).RetiredCount() != 0 || simStream(r.ns).RetiredCount() != 0 ||
		r.payloadWord(GPUObservedOffset) != 0 || r.payloadWord(NPUCreditOffset) != 0 {
		t.Fatal("something advanced while only IsComplete was called")
	}
	if len(r.records()) != 0 || s.Poisoned() {
		t.Fatal("IsComplete changed session state")
	}
	release()
	r.waitOK(s)
	r.checkExchanged()
	if done, err := s.IsComplete(); !done || err != nil {
		t.Fatalf("IsComplete after Wait = %v, %v", done, err)
	}
	must(t, s.Close())
}

func TestR6IsCompleteObservesWithoutRecordingOrPoisoning(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	r := newRig(t, 4)
	s := r.session(patience)
	simStream(r.gs).Inject(sim.Fault{Kind: sim.FailCompletion})
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	must(t, s.Abort())
	var err error
	spinUntil(t, "both participants to retire", func() bool {
		_, err = s.IsComplete()
		return err != nil && simStream(r.ns).Idle()
	})
	isClass(t, err, errdefs.ErrFault)
	if s.Poisoned() || len(r.records()) != 0 {
		t.Fatal("IsComplete poisoned the session or traced an occupancy")
	}
	_, err = s.Wait(callCtx)
	isClass(t, err, errdefs.ErrFault)
	if !s.Poisoned() || len(r.records()) != 2 {
		t.Fatalf("Wait: poisoned %v, %d records; want poisoned and 2 records", s.Poisoned(), len(r.records()))
	}
	isClass(t, s.Close(), errdefs.ErrDeviceLost)
}

// ---- R7: one deadline, both joins attempted ----

func TestR7TimeoutReturnsFalseAndKeepsOwnership(t *testing.T) {
	for _, hangGPU := range []bool{true, false} {
		name := map[bool]string{true: "gpu-hung", false: "npu-hung"}[hangGPU]
		t.Run(name, func(t *testing.T) {
			r := newRig(t, 16)
			s := r.session()
			hung := r.gs
			if !hangGPU {
				hung = r.ns
			}
			release := simStream(hung).Inject(sim.Fault{Kind: sim.Hang})
			must(t, s.SubmitGPU())
			must(t, s.SubmitNPU())
			must(t, s.Start())
			done, err := s.WaitTimeout(20 * time.Millisecond)
			if done || err != nil {
				t.Fatalf("WaitTimeout with a hung participant = %v, %v; want false, nil", done, err)
			}
			if s.Poisoned() || s.Quarantined() || len(r.records()) != 0 {
				t.Fatal("a timeout poisoned, quarantined or traced the session")
			}
			if _, err := r.payload.View(r.gpu); err != nil {
				t.Fatal("payload released after a timeout")
			}
			release()
			r.waitOK(s)
			r.checkExchanged()
			must(t, s.Close())
		})
	}
}

func TestR7BothJoinsShareOneDeadline(t *testing.T) {
	r := newRig(t, 4, recording)
	s := r.session()
	release := simStream(r.gs).Inject(sim.Fault{Kind: sim.Hang})
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	must(t, s.Start())
	start := time.Now()
	done, err := s.WaitTimeout(30 * time.Millisecond)
	elapsed := time.Since(start)
	if done || err != nil {
		t.Fatalf("WaitTimeout = %v, %v; want false, nil", done, err)
	}
	gw, gd := r.gs.(*recStream).joins()
	nw, nd := r.ns.(*recStream).joins()
	if gw != 1 || nw != 1 {
		t.Fatalf("joins attempted: GPU %d, NPU %d; want 1 each", gw, nw)
	}
	if gd[0].IsZero() || !gd[0].Equal(nd[0]) {
		t.Fatalf("join deadlines GPU %v, NPU %v; want one shared deadline", gd[0], nd[0])
	}
	if elapsed > patience {
		t.Fatalf("WaitTimeout(30ms) took %v", elapsed)
	}
	release()
	r.waitOK(s)
	must(t, s.Close())
}

func TestR7FailingGPUJoinDoesNotSkipNPUJoin(t *testing.T) {
	r := newRig(t, 4, recording)
	s := r.session(patience)
	simStream(r.gs).Inject(sim.Fault{Kind: sim.FailCompletion})
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	must(t, s.Abort())
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	done, err := s.Wait(ctx)
	if done {
		t.Fatal("Wait reported success with a failed GPU participant")
	}
	isClass(t, err, errdefs.ErrFault)
	if nw, _ := r.ns.(*recStream).joins(); nw != 1 {
		t.Fatalf("NPU join attempted %d times after the GPU join failed; want 1", nw)
	}
	recs := r.records()
	if len(recs) != 2 {
		t.Fatalf("%d occupancies traced; want GPU and NPU", len(recs))
	}
	for _, rec := range recs {
		wantFailed := rec.Lane == host.LaneCompute
		if rec.Failed != wantFailed {
			t.Fatalf("record %+v: failed %v; want %v", rec, rec.Failed, wantFailed)
		}
	}
	if !s.Poisoned() {
		t.Fatal("a failed join did not poison the session")
	}
	isClass(t, s.Close(), errdefs.ErrDeviceLost)
}

func TestR7WaitBeforeDecisionIsBusy(t *testing.T) {
	r := newRig(t, 1)
	s := r.session()
	must(t, s.SubmitGPU())
	_, err := s.WaitTimeout(time.Millisecond)
	isClass(t, err, errdefs.ErrBusy)
	must(t, s.Close())
}

// ---- R8: close ----

func TestR8CloseUndecidedPublishesAbortAndBothRetire(t *testing.T) {
	for _, c := range []struct {
		name     string
		gpu, npu bool
	}{{"both-submitted", true, true}, {"gpu-only", true, false}, {"npu-only", false, true}, {"none", false, false}} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, 16, noOwner)
			s := r.session()
			before := r.snapshot()
			if c.gpu {
				must(t, s.SubmitGPU())
			}
			if c.npu {
				must(t, s.SubmitNPU())
			}
			g0, n0 := r.releases()
			must(t, s.Close())
			if d, ok := s.Decision(); !ok || d != Abort {
				t.Fatal("Close did not decide ABORT")
			}
			if g, n := r.releases(); g != g0+1 || n != n0+1 {
				t.Fatal("Close's ABORT was not made visible to both devices")
			}
			if !r.gs.Idle() || !r.ns.Idle() {
				t.Fatal("a participant has not retired after Close")
			}
			r.checkUntouched(before)
			want := 0
			if c.gpu {
				want++
			}
			if c.npu {
				want++
			}
			if recs := r.records(); len(recs) != want || slices.ContainsFunc(recs, func(h host.Record) bool { return h.Failed }) {
				t.Fatalf("records %+v; want %d successful occupancies", recs, want)
			}
			if r.budget.Used() != 0 { // the startup line was freed; the payload is not on the budget
				t.Fatalf("budget used %d after a healthy close", r.budget.Used())
			}
			isClass(t, s.Close(), errdefs.ErrClosed)
			must(t, r.payload.Free())
		})
	}
}

func TestR8CloseWithHungParticipantQuarantines(t *testing.T) {
	for _, c := range []struct {
		name    string
		hangGPU bool
		start   bool
	}{{"gpu-hung-undecided", true, false}, {"gpu-hung-running", true, true}, {"npu-hung-running", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, 16)
			s := r.session(20 * time.Millisecond)
			hung := r.gs
			if !c.hangGPU {
				hung = r.ns
			}
			simStream(hung).Inject(sim.Fault{Kind: sim.Hang}) // released by the rig's cleanup (device loss)
			must(t, s.SubmitGPU())
			must(t, s.SubmitNPU())
			if c.start {
				must(t, s.Start())
			}
			used := r.budget.Used()
			err := s.Close()
			isClass(t, err, errdefs.ErrDeviceLost)
			if !s.Quarantined() {
				t.Fatal("not quarantined")
			}
			// Every owner is kept: startup line, payload, streams, budget charges.
			if r.budget.Used() != used || used != StartupSize+PayloadSize {
				t.Fatalf("budget used %d → %d; quarantine must keep %d", used, r.budget.Used(), StartupSize+PayloadSize)
			}
			if _, err := r.startup.Shared().View(r.gpu); err != nil {
				t.Fatalf("startup line freed: %v", err)
			}
			if _, err := r.payload.View(r.npu); err != nil {
				t.Fatalf("payload freed: %v", err)
			}
			if !r.owner.Quarantined() {
				t.Fatal("the owner was not marked quarantined: Go code could still free it")
			}
			if len(r.owner.Streams()) != 2 {
				t.Fatal("the owner was closed")
			}
			st := r.rt.Stats()
			if !slices.Equal(st.Quarantined, []string{"sess"}) || st.QuarantinedBytes != StartupSize+PayloadSize {
				t.Fatalf("runtime stats %+v; want sess quarantined with %d bytes", st, StartupSize+PayloadSize)
			}
			if !slices.ContainsFunc(r.records(), func(h host.Record) bool {
				return h.Failed && h.Device == hung.Device().Name()
			}) {
				t.Fatalf("records %+v; want the hung participant traced as failed", r.records())
			}
			isClass(t, s.Close(), errdefs.ErrDeviceLost) // and stays so
			isClass(t, s.Start(), errdefs.ErrClosed)
		})
	}
}

func TestR8OwnerThatCannotDrainKeepsStartupLine(t *testing.T) {
	r := newRig(t, 2)
	s := r.session(10 * time.Millisecond)
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	must(t, s.Start())
	r.waitOK(s)
	// Other work on an owned stream that will not drain.
	simStream(r.gs).Inject(sim.Fault{Kind: sim.Hang})
	noop, err := r.gpu.Prepare("noop")
	must(t, err)
	_, err = r.gs.Submit(&hw.Command{Program: noop})
	must(t, err)
	isClass(t, s.Close(), errdefs.ErrDeviceLost)
	if !s.Quarantined() || !r.owner.Quarantined() {
		t.Fatal("an owner that could not drain did not quarantine the session")
	}
	if _, err := r.startup.Shared().View(r.gpu); err != nil || r.budget.Used() != StartupSize+PayloadSize {
		t.Fatalf("startup line or payload released (budget used %d): %v", r.budget.Used(), err)
	}
}

func TestR8DroppedUndecidedSessionPublishesAbort(t *testing.T) {
	r := newRig(t, 4, noOwner)
	func() {
		s := r.session()
		must(t, s.SubmitGPU())
		must(t, s.SubmitNPU())
	}() // the session is now unreachable, never closed
	spinUntil(t, "the dropped session to publish ABORT", func() bool {
		runtime.GC()
		return r.word() == Abort
	})
	spinUntil(t, "both participants to retire", func() bool { return r.gs.Idle() && r.ns.Idle() })
	// An unreachable session frees nothing.
	if r.budget.Used() != StartupSize {
		t.Fatalf("budget used %d; the startup line must stay allocated", r.budget.Used())
	}
}

// ---- tracing ----

func TestTracedOccupanciesUseTheirLanes(t *testing.T) {
	r := newRig(t, 4)
	s := r.session()
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	must(t, s.Start())
	r.waitOK(s)
	r.waitOK(s) // a second Wait records nothing more
	must(t, s.Close())
	recs := r.records()
	if len(recs) != 2 {
		t.Fatalf("records %+v; want 2", recs)
	}
	for _, rec := range recs {
		switch rec.Lane {
		case host.LaneCompute:
			if rec.Device != "gpu0" {
				t.Fatalf("compute record on %q", rec.Device)
			}
		case host.LaneNPU:
			if rec.Device != "npu0" {
				t.Fatalf("npu record on %q", rec.Device)
			}
		default:
			t.Fatalf("record on lane %v", rec.Lane)
		}
		if rec.Failed || rec.Dur < 0 || rec.Start.IsZero() {
			t.Fatalf("bad record %+v", rec)
		}
	}
}

func TestSessionWithoutOwnerOrRuntime(t *testing.T) {
	r := newRig(t, 3, noOwner, cpuPeer)
	s, err := NewResidentSession(r.startup, r.gp, r.np, NewResidentConfig())
	must(t, err)
	if s.Name() != "resident" {
		t.Fatalf("default name %q", s.Name())
	}
	must(t, s.SubmitNPU())
	must(t, s.SubmitGPU())
	must(t, s.Start())
	r.waitOK(s)
	r.checkExchanged()
	must(t, s.Close())
	must(t, r.payload.Free())
	if r.budget.Used() != 0 {
		t.Fatalf("budget used %d", r.budget.Used())
	}
}

func TestSimExchangeArguments(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	r := newRig(t, 1)
	_, _, _, err := NewSimExchange(r.p, r.startup, r.ns, r.gs, 1, nil)
	isClass(t, err, errdefs.ErrInvalidArgument)
	_, _, _, err = NewSimExchange(r.p, r.startup, r.gs, r.ns, -1, nil)
	isClass(t, err, errdefs.ErrInvalidArgument)
	_, _, _, err = NewSimExchange(nil, r.startup, r.gs, r.ns, 1, nil)
	isClass(t, err, errdefs.ErrInvalidArgument)
	q := host.NewOwner("closed", nil)
	must(t, q.Close(callCtx))
	_, _, _, err = NewSimExchange(r.p, r.startup, r.gs, r.ns, 1, q)
	isClass(t, err, errdefs.ErrClosed)
	if _, err := ExchangeData(nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatal(err)
	}
	if got := ExpectedPayload(0); got[3] != 3 {
		t.Fatalf("ExpectedPayload(0) = %v", got)
	}
}

func TestR8CloseWaitsUnderTheTenSecondDefault(t *testing.T) {
	if DefaultCloseTimeout != 10*time.Second {
		t.Fatalf("DefaultCloseTimeout = %v; the seed waits up to 10 s", DefaultCloseTimeout)
	}
	r := newRig(t, 4, recording)
	s := r.session() // no WithCloseTimeout: the default applies
	release := simStream(r.gs).Inject(sim.Fault{Kind: sim.Hang})
	must(t, s.SubmitGPU())
	must(t, s.SubmitNPU())
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	// The GPU participant retires only once Close is already waiting for
	// it: Close must wait for it, not give up and quarantine.
	spinUntil(t, "Close to join the GPU participant", func() bool {
		n, _ := r.gs.(*recStream).joins()
		return n > 0
	})
	_, deadlines := r.gs.(*recStream).joins()
	release()
	if err := <-closed; err != nil {
		t.Fatalf("Close with a participant that retires while Close waits = %v; want nil", err)
	}
	if s.Quarantined() {
		t.Fatal("Close quarantined a session whose participants retired")
	}
	// The join's deadline is the close timeout from Close's start: at
	// least 10 s after start, whatever the scheduling.
	if d := deadlines[0]; d.Sub(start) < 10*time.Second {
		t.Fatalf("Close joined with a deadline %v after its start; want at least 10s", d.Sub(start))
	}
	if d, ok := s.Decision(); !ok || d != Abort {
		t.Fatal("Close did not decide ABORT")
	}
	if !r.gs.Idle() || !r.ns.Idle() {
		t.Fatal("a participant has not retired after Close")
	}
}
