package lattice_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/testutil"
)

// exclusive is the test manifest's session with placement "exclusive".
var exclusive = manifestOpts{instances: 2, latency: 2 * time.Millisecond, extra: "placement = \"exclusive\"\n"}

// holders watches which of a set of hosts serve "steady", from a
// goroutine that samples them until stop, and counts the samples in
// which more than one did.
type holders struct {
	mu      sync.Mutex
	hosts   map[string]*member
	both    atomic.Int64
	samples atomic.Int64
	stop    chan struct{}
	done    chan struct{}
}

func watchHolders(ms ...*member) *holders {
	w := &holders{hosts: map[string]*member{}, stop: make(chan struct{}), done: make(chan struct{})}
	for _, m := range ms {
		w.hosts[m.id] = m
	}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			default:
			}
			w.mu.Lock()
			n := 0
			for _, m := range w.hosts {
				if m.h.Serves("steady") {
					n++
				}
			}
			w.mu.Unlock()
			w.samples.Add(1)
			if n > 1 {
				w.both.Add(1)
			}
			time.Sleep(200 * time.Microsecond) // sampling, not synchronising
		}
	}()
	return w
}

// forget stops watching a host (before it is killed: a killed host's
// Host still says what it last knew).
func (w *holders) forget(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.hosts, id)
}

func (w *holders) finish() { close(w.stop); <-w.done }

// servedBy waits until the front sees exactly one host serving "steady"
// and returns it.
func servedBy(t *testing.T, f *lattice.Front, within time.Duration, not ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var got []string
	err := f.WaitFor(ctx, func() bool {
		got = f.Serving("steady")
		return len(got) == 1 && !slices.Contains(not, got[0])
	})
	if err != nil {
		t.Fatalf("serving steady: %v after %v, want one host other than %v", got, within, not)
	}
	return got[0]
}

// standbyReason returns a host's heartbeat state and reason for "steady".
func standbyReason(m *member) (string, string, string) {
	for _, sc := range m.h.Record().Sessions {
		if sc.Name == "steady" {
			return sc.State, sc.Reason, sc.Placement
		}
	}
	return "", "", ""
}

// TestExclusivePlacement: three hosts have a session with placement
// "exclusive"; the first to join claims it and serves every call, the
// others stand by (their heartbeats say who holds it). The holder leaves
// (Close): it releases its claim and a standby takes over within a
// heartbeat. That holder is killed: its claim expires and the last host
// takes over within the claim's TTL. Sampled all along, no two hosts
// ever serve at once; every call is answered ok or 503.
func TestExclusivePlacement(t *testing.T) {
	url := startServer(t)
	const lat = "x1"
	cfg := lattice.HostConfig{TTL: ttl, ClaimTTL: 2 * ttl}
	h1 := join(t, url, lat, "h1", exclusive, cfg)
	h2 := join(t, url, lat, "h2", exclusive, cfg)
	h3 := join(t, url, lat, "h3", exclusive, cfg)
	byID := map[string]*member{"h1": h1, "h2": h2, "h3": h3}
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl})
	w := watchHolders(h1, h2, h3)
	defer w.finish()

	// h1 joined first and holds it; h2 and h3 stand by, naming h1.
	if got := servedBy(t, f, 5*time.Second); got != "h1" {
		t.Fatalf("steady served by %s, want h1 (the first to join)", got)
	}
	for _, m := range []*member{h2, h3} {
		state, reason, placement := standbyReason(m)
		if state != "standby" || !strings.Contains(reason, "held by host h1") || placement != "exclusive" {
			t.Errorf("%s's heartbeat: %s %q placement %q, want standby, held by host h1, exclusive", m.id, state, reason, placement)
		}
	}
	if _, reason, placement := standbyReason(h1); placement != "exclusive" || reason != "" {
		t.Errorf("h1's heartbeat: %q placement %q", reason, placement)
	}
	// A standby host refuses a call it is handed directly.
	if _, err := h2.h.Call(context.Background(), "steady", nil); lattice.Class(err) != "unavailable" || !strings.Contains(err.Error(), "held by host h1") {
		t.Errorf("a call on standby h2: %v", err)
	}

	l := startLoad(f, 4)
	l.waitOK(t, 100, 10*time.Second)
	if c2, c3 := calls(h2), calls(h3); c2 != 0 || c3 != 0 || calls(h1) < 100 {
		t.Errorf("calls: h1 %d, h2 %d, h3 %d: want all on h1", calls(h1), c2, c3)
	}

	// 1. h1 leaves: it releases its claim; a standby claims it at its next
	// heartbeat (TTL/3), and the front sees it a moment later.
	w.forget("h1")
	left := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h1.h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	second := servedBy(t, f, 5*time.Second, "h1")
	took := time.Since(left)
	t.Logf("h1 left; %s serves %v later", second, took)
	if took > ttl {
		t.Errorf("%s took over %v after h1 left, want within a heartbeat TTL (%v)", second, took, ttl)
	}
	before := calls(byID[second])
	l.waitOK(t, 50, 10*time.Second)
	if calls(byID[second]) == before {
		t.Errorf("the new holder %s served no call", second)
	}

	// 2. The second holder is killed: nobody serves until its claim
	// expires (ClaimTTL after its last renewal), then the last host does.
	third := "h2"
	if second == "h2" {
		third = "h3"
	}
	w.forget(second)
	killed := time.Now()
	byID[second].kill()
	if got := servedBy(t, f, 3*cfg.ClaimTTL, "h1", second); got != third {
		t.Fatalf("after %s was killed, %s serves, want %s", second, got, third)
	}
	took = time.Since(killed)
	t.Logf("%s killed; %s serves %v later", second, third, took)
	// Its last renewal was at most TTL/3 before the kill; the claim lasts
	// ClaimTTL from then; the last host claims it at its next heartbeat.
	if took > cfg.ClaimTTL+ttl {
		t.Errorf("%s took over %v after %s was killed, want within ClaimTTL + TTL (%v)", third, took, second, cfg.ClaimTTL+ttl)
	}
	l.waitOK(t, 50, 10*time.Second)
	l.finish()

	sent, ok, un := l.sent.Load(), l.ok.Load(), l.unavailable.Load()
	t.Logf("sent %d, ok %d, 503 %d; samples %d; front %+v", sent, ok, un, w.samples.Load(), f.Stats())
	if len(l.other) > 0 {
		t.Errorf("calls answered neither ok nor 503: %d, first: %v", len(l.other), l.other[0])
	}
	if sent != ok+un {
		t.Errorf("sent %d != ok %d + 503 %d", sent, ok, un)
	}
	for _, msg := range l.unavailableMsgs {
		// In the gap: no heartbeat says the session is served, or one
		// still does but nobody subscribes (the killed holder's, until it
		// expires), or a call was in flight on the killed holder.
		if !strings.Contains(msg, "served by no live host") && !strings.Contains(msg, "no responders") && !strings.Contains(msg, "went away") {
			t.Errorf("a 503 that names neither the gap nor a host gone: %q", msg)
			break
		}
	}
	if n := w.both.Load(); n != 0 {
		t.Errorf("in %d of %d samples two hosts served the exclusive session at once", n, w.samples.Load())
	}
}

// TestExclusiveHolderCutOff: the holder loses its NATS connection but
// lives on. It cannot renew its claim, so it stops serving once half the
// claim's TTL has passed since its last renewal; the other host can only
// claim it once the claim expired, a whole TTL after that renewal: the
// first stops before the second starts.
func TestExclusiveHolderCutOff(t *testing.T) {
	url := startServer(t)
	const lat = "x2"
	cfg := lattice.HostConfig{TTL: ttl, ClaimTTL: 2 * ttl}
	h1 := join(t, url, lat, "h1", exclusive, cfg)
	h2 := join(t, url, lat, "h2", exclusive, cfg)
	if !h1.h.Serves("steady") || h2.h.Serves("steady") {
		t.Fatalf("serves: h1 %v, h2 %v; want h1 only", h1.h.Serves("steady"), h2.h.Serves("steady"))
	}
	cut := time.Now()
	h1.nc.Close()
	deadline := cut.Add(3 * cfg.ClaimTTL)
	var stopped time.Time
	for !h2.h.Serves("steady") {
		if stopped.IsZero() && !h1.h.Serves("steady") {
			stopped = time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("h2 does not serve %v after h1 was cut off (h1 serves: %v)", 3*cfg.ClaimTTL, h1.h.Serves("steady"))
		}
		time.Sleep(time.Millisecond) // polling, not synchronising
	}
	started := time.Now()
	if stopped.IsZero() {
		if h1.h.Serves("steady") {
			t.Fatal("h2 serves while cut-off h1 still does")
		}
		t.Fatal("h1 stopped serving in the same poll in which h2 started: the order was not observed")
	}
	t.Logf("h1 cut off; it stopped serving after %v, h2 started after %v", stopped.Sub(cut), started.Sub(cut))
	if stopped.Sub(cut) > cfg.ClaimTTL/2+ttl/3+ttl/10 {
		t.Errorf("h1 stopped %v after the cut, want within ClaimTTL/2 + a heartbeat (%v)", stopped.Sub(cut), cfg.ClaimTTL/2+ttl/3)
	}
	if started.Sub(stopped) < cfg.ClaimTTL/3 {
		t.Errorf("h2 started %v after h1 stopped; the claim's lease keeps at least ClaimTTL/2 - TTL/3 = %v between them", started.Sub(stopped), cfg.ClaimTTL/2-ttl/3)
	}
}

// TestExclusiveLetsGo: the holder's session cannot serve (its one
// instance was quarantined: its fence never returns), so it lets its
// claim go at its next heartbeat and the other host takes over; the
// first does not claim it back while it cannot serve, and its heartbeat
// says why.
func TestExclusiveLetsGo(t *testing.T) {
	url := startServer(t)
	const lat = "x3"
	cfg := lattice.HostConfig{TTL: ttl, ClaimTTL: 2 * ttl, FenceFailures: -1}
	bad := exclusive
	bad.instances, bad.fence = 1, "spin"
	h1 := join(t, url, lat, "h1", bad, cfg)
	h2 := join(t, url, lat, "h2", exclusive, cfg)
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl})
	if got := servedBy(t, f, 5*time.Second); got != "h1" {
		t.Fatalf("steady served by %s, want h1", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.Call(ctx, "steady", nil); err == nil {
		t.Fatal("a call to h1, whose fence never returns, succeeded")
	}
	if got := servedBy(t, f, 5*time.Second, "h1"); got != "h2" {
		t.Fatalf("steady served by %s after h1's instance was quarantined, want h2", got)
	}
	for range 20 {
		if out, err := f.Call(ctx, "steady", nil); err != nil || string(out) != "ok" {
			t.Fatalf("a call after the takeover: %q %v", out, err)
		}
	}
	if c := calls(h2); c != 20 {
		t.Errorf("h2 served %d calls, want 20", c)
	}
	state, reason, _ := standbyReason(h1)
	if state != "quarantined" || h1.h.Serves("steady") {
		t.Errorf("h1's heartbeat: %s %q (serves %v), want quarantined and not serving", state, reason, h1.h.Serves("steady"))
	}
}

// TestExclusiveHandoverWatch: a standby claims a released claim as soon
// as its watch of the placement bucket sees the release, not at its next
// heartbeat: with a 3s TTL (a heartbeat every second) the holder leaves
// right after the standby joined, and the standby serves within 500ms,
// well before its first heartbeat.
func TestExclusiveHandoverWatch(t *testing.T) {
	url := startServer(t)
	const lat = "x4"
	cfg := lattice.HostConfig{TTL: 3 * time.Second, ClaimTTL: 6 * time.Second}
	h1 := join(t, url, lat, "h1", exclusive, cfg)
	h2 := join(t, url, lat, "h2", exclusive, cfg)
	joined := time.Now()
	if !h1.h.Serves("steady") || h2.h.Serves("steady") {
		t.Fatalf("serves: h1 %v, h2 %v; want h1 only", h1.h.Serves("steady"), h2.h.Serves("steady"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	left := time.Now()
	if err := h1.h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return h2.h.Serves("steady") }, "h2 does not serve after h1 left")
	took := time.Since(left)
	t.Logf("h1 left %v after h2 joined; h2 serves %v later", left.Sub(joined), took)
	if took > 500*time.Millisecond {
		t.Errorf("h2 served %v after h1 left: it waited for its heartbeat (every %v) instead of seeing the release", took, cfg.TTL/3)
	}
}

// TestExclusiveAdoptsOwnClaim: a renewal whose answer the holder lost
// (here the test renews the holder's claim behind its back, so the
// holder's revision is stale) makes the holder's renewals fail; it stops
// serving once its lease ends, then finds the claim still its own and
// adopts it, serving again, while the host standing by never serves.
func TestExclusiveAdoptsOwnClaim(t *testing.T) {
	url := startServer(t)
	const lat = "x5"
	cfg := lattice.HostConfig{TTL: ttl, ClaimTTL: 2 * ttl}
	h1 := join(t, url, lat, "h1", exclusive, cfg)
	h2 := join(t, url, lat, "h2", exclusive, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := h1.h.Claims().Get(ctx, lattice.PlacementKey("steady"))
	if err != nil || cl.Owner != "h1" {
		t.Fatalf("the claim: %+v %v", cl, err)
	}
	if err := h1.h.Claims().Renew(ctx, cl); err != nil { // h1's revision is stale now
		t.Fatal(err)
	}
	renewed := time.Now()
	stopped, adopted := false, false
	for deadline := time.Now().Add(10 * time.Second); !adopted; {
		if time.Now().After(deadline) {
			t.Fatalf("h1 did not adopt its claim within 10s (stopped %v)", stopped)
		}
		serves := h1.h.Serves("steady")
		stopped = stopped || !serves
		adopted = stopped && serves
		if h2.h.Serves("steady") {
			t.Fatal("h2 serves: the claim was h1's all along")
		}
		time.Sleep(time.Millisecond) // polling, not synchronising
	}
	// Before the claim could expire (claim_ttl after that renewal), so it
	// was adopted, not claimed anew.
	if took := time.Since(renewed); took >= cfg.ClaimTTL {
		t.Errorf("h1 served again %v after the renewal behind its back: not before the claim expired (%v)", took, cfg.ClaimTTL)
	}
	if cur, err := h1.h.Claims().Get(ctx, lattice.PlacementKey("steady")); err != nil || cur.Owner != "h1" {
		t.Errorf("the claim after the adoption: %+v %v", cur, err)
	}
}
