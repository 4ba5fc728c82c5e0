package lattice_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/manifest"
)

const ttl = time.Second

// load runs calls through the front from workers goroutines until stop
// is closed, counting every outcome.
type load struct {
	sent, ok, unavailable atomic.Int64
	mu                    sync.Mutex
	other                 []error // answers of any other class: lost
	unavailableMsgs       []string
	wg                    sync.WaitGroup
	stop                  chan struct{}
}

func startLoad(f *lattice.Front, workers int) *load {
	l := &load{stop: make(chan struct{})}
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				l.sent.Add(1)
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				out, err := f.Call(ctx, "steady", nil)
				cancel()
				switch {
				case err == nil && string(out) == "ok":
					l.ok.Add(1)
				case lattice.Class(err) == errdefs.ClassUnavailable:
					l.unavailable.Add(1)
					l.mu.Lock()
					l.unavailableMsgs = append(l.unavailableMsgs, err.Error())
					l.mu.Unlock()
					time.Sleep(time.Millisecond) // a client's pause before it tries again
				default:
					if err == nil {
						err = errors.New("answer " + string(out))
					}
					l.mu.Lock()
					l.other = append(l.other, err)
					l.mu.Unlock()
				}
			}
		}()
	}
	return l
}

func (l *load) finish() { close(l.stop); l.wg.Wait() }

// waitOK waits until the load has n more ok answers.
func (l *load) waitOK(t *testing.T, n int64, within time.Duration) {
	t.Helper()
	target := l.ok.Load() + n
	if !testutil.Poll(within, func() bool { return l.ok.Load() >= target }) {
		t.Fatalf("only %d of %d ok answers within %v", l.ok.Load(), target, within)
	}
}

func calls(m *member) uint64 { return m.d.Pool("steady").Status().Calls }

// TestLatticeSpreadKillRejoin is the "done means": three hosts and
// a front on one embedded nats-server; calls spread over the hosts; a host
// killed under load loses no call (every call is answered ok, or 503 if it
// was in flight on the killed host); the front stops listing the dead host
// within the heartbeat TTL; a restarted host rejoins and serves again.
func TestLatticeSpreadKillRejoin(t *testing.T) {
	url := startServer(t)
	const lat = "t1"
	// Each call takes 20ms on the device, so calls are in flight on every
	// host when one is killed.
	o := manifestOpts{instances: 2, latency: 20 * time.Millisecond}
	cfg := lattice.HostConfig{TTL: ttl}
	hosts := []*member{join(t, url, lat, "h1", o, cfg), join(t, url, lat, "h2", o, cfg), join(t, url, lat, "h3", o, cfg)}
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl})
	if got := f.Serving("steady"); len(got) != 3 {
		t.Fatalf("serving steady: %v, want h1 h2 h3", got)
	}

	// Spread: the queue group hands calls to every host.
	const workers = 6
	l := startLoad(f, workers)
	l.waitOK(t, 150, 10*time.Second)
	for _, m := range hosts {
		if c := calls(m); c == 0 {
			t.Errorf("host %s served no call", m.id)
		}
	}
	t.Logf("spread: h1 %d, h2 %d, h3 %d calls", calls(hosts[0]), calls(hosts[1]), calls(hosts[2]))

	// Kill h2 under load, with calls in flight on it.
	inFlight := func() int { return hosts[1].h.Record().Sessions[0].InFlight }
	for deadline := time.Now().Add(5 * time.Second); inFlight() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no call in flight on h2 within 5s")
		}
	}
	killed := time.Now()
	hosts[1].kill()
	ctx, cancel := context.WithTimeout(context.Background(), ttl+time.Second)
	defer cancel()
	if err := f.WaitFor(ctx, func() bool { return !listed(f, "h2") }); err != nil {
		t.Fatalf("the front still lists h2 %v after it was killed: %v", time.Since(killed), err)
	}
	gone := time.Since(killed)
	// Its last heartbeat was at most TTL/3 before the kill, so the front
	// forgets it at most TTL after the kill (plus its expiry tick).
	if gone > ttl+ttl/10 {
		t.Errorf("the front forgot h2 %v after the kill, want within the TTL %v", gone, ttl)
	}
	t.Logf("front forgot h2 %v after the kill", gone)
	if got := f.Serving("steady"); len(got) != 2 {
		t.Errorf("serving steady after the kill: %v", got)
	}
	l.waitOK(t, 100, 10*time.Second)

	// Restart h2: its heartbeat reappears and calls reach it again.
	h2 := join(t, url, lat, "h2", o, cfg)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := f.WaitFor(ctx2, func() bool { return listed(f, "h2") }); err != nil {
		t.Fatalf("restarted h2 not listed: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for calls(h2) < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("restarted h2 served %d calls in 10s", calls(h2))
		}
		l.waitOK(t, 10, 10*time.Second)
	}
	l.finish()

	sent, ok, un := l.sent.Load(), l.ok.Load(), l.unavailable.Load()
	t.Logf("sent %d, ok %d, 503 %d, other %d; front stats %+v; 503s: %q", sent, ok, un, len(l.other), f.Stats(), l.unavailableMsgs)
	if len(l.other) > 0 {
		t.Errorf("lost calls (answered neither ok nor 503): %d, first: %v", len(l.other), l.other[0])
	}
	if sent != ok+un {
		t.Errorf("sent %d != ok %d + 503 %d", sent, ok, un)
	}
	// Only the calls in flight on h2 when it died may fail: at most one
	// per worker, and each says which host went away.
	if un == 0 || un > workers {
		t.Errorf("%d calls answered 503: want the calls in flight on h2 when it died, at least 1 and at most the %d workers", un, workers)
	}
	for _, msg := range l.unavailableMsgs {
		if !strings.Contains(msg, "host h2 went away") {
			t.Errorf("503 without the host's name: %q", msg)
		}
	}
	if st := f.Stats(); st.HostGone != uint64(un) {
		t.Errorf("front counted %d calls lost with their host, the load saw %d 503s", st.HostGone, un)
	}
}

// TestNoLiveHostServes: a session that no live host serves is refused with
// 503 and the reason, before anything is sent.
func TestNoLiveHostServes(t *testing.T) {
	url := startServer(t)
	m := join(t, url, "t2", "h1", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	f := newFront(t, url, "t2", lattice.FrontConfig{TTL: ttl})
	_, err := f.Call(context.Background(), "absent", nil)
	var le *lattice.Error
	if !errors.As(err, &le) || le.Class != errdefs.ClassUnavailable || le.Status() != 503 ||
		!strings.Contains(le.Message, `session "absent" is served by no live host of lattice t2`) {
		t.Fatalf("call to an unserved session: %v", err)
	}
	if out, err := f.Call(context.Background(), "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("steady: %q %v", out, err)
	}
	m.kill()
	ctx, cancel := context.WithTimeout(context.Background(), 2*ttl)
	defer cancel()
	if err := f.WaitFor(ctx, func() bool { return len(f.Hosts()) == 0 }); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Call(context.Background(), "steady", nil); lattice.Class(err) != errdefs.ClassUnavailable ||
		!strings.Contains(err.Error(), "served by no live host") {
		t.Fatalf("call after the only host died: %v", err)
	}
	if st := f.Stats(); st.Refused != 2 {
		t.Errorf("refused %d, want 2", st.Refused)
	}
}

// TestDeadlineAndTraceparentCrossHosts: the caller's deadline reaches the
// host (its call ends with deadline_exceeded at the caller's deadline, not
// the device's latency), and the traceparent is logged by the host.
func TestDeadlineAndTraceparentCrossHosts(t *testing.T) {
	url := startServer(t)
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	join(t, url, "t3", "h1", manifestOpts{latency: 400 * time.Millisecond}, lattice.HostConfig{TTL: ttl, Logger: logger})
	// The sim device finishes its command (400ms) before the stage sees
	// the interruption: the front waits for the host's answer.
	f := newFront(t, url, "t3", lattice.FrontConfig{TTL: ttl, Grace: 2 * time.Second})

	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx, cancel := context.WithTimeout(lattice.WithTraceparent(context.Background(), tp), 60*time.Millisecond)
	defer cancel()
	_, err := f.Call(ctx, "steady", nil)
	var le *lattice.Error
	// The host's own answer: the call ended at the deadline the header
	// carried (without it, the call would have succeeded): the stage was
	// interrupted, or its stream_sync failed at the deadline and the guest
	// returned its code 103, which past the deadline is DeadlineExceeded
	// too (ABI.md §4.2).
	if !errors.As(err, &le) || le.Host != "h1" ||
		le.Class != errdefs.ClassDeadlineExceeded || !strings.Contains(le.Message, "interrupted") {
		t.Fatalf("call past its deadline: %#v (%v)", le, err)
	}
	if !strings.Contains(logs.String(), "traceparent="+tp) {
		t.Errorf("the host did not log the traceparent; log:\n%s", logs.String())
	}
	// Without one, the front makes one up.
	if _, err := f.Call(context.Background(), "steady", nil); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "traceparent=00-"); n != 2 {
		t.Errorf("%d calls logged with a traceparent, want 2; log:\n%s", n, logs.String())
	}
}

// TestFrontPrefersLocal: a front with a local host runs calls on a free
// local instance, sending nothing through NATS.
func TestFrontPrefersLocal(t *testing.T) {
	url := startServer(t)
	local := join(t, url, "t4", "h1", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	join(t, url, "t4", "h2", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	f := newFront(t, url, "t4", lattice.FrontConfig{TTL: ttl, Local: local.h})
	for range 20 {
		if out, err := f.Call(context.Background(), "steady", nil); err != nil || string(out) != "ok" {
			t.Fatalf("%q %v", out, err)
		}
	}
	if st := f.Stats(); st.Local != 20 || st.Remote != 0 {
		t.Errorf("stats %+v, want 20 local calls", st)
	}
	if st := local.d.Pool("steady").Status(); st.Outcomes[errdefs.ClassOK] != 20 || st.Calls != 20 {
		t.Errorf("local session outcomes %v", st.Outcomes)
	}
}

// TestSharedQuarantine: a module whose fence failed on one host is
// quarantined lattice-wide; the other hosts refuse it (503, the reason),
// it is listed, and once cleared they serve it again.
func TestSharedQuarantine(t *testing.T) {
	url := startServer(t)
	const lat = "t5"
	cfg := lattice.HostConfig{TTL: ttl, FenceFailures: 1}
	a := join(t, url, lat, "a", manifestOpts{fence: "spin"}, cfg)
	b := join(t, url, lat, "b", manifestOpts{}, cfg)
	c := join(t, url, lat, "c", manifestOpts{}, cfg)
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl})
	ctx := context.Background()
	if out, err := b.h.Call(ctx, "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("b before: %q %v", out, err)
	}
	// a's fence never returns: the instance is quarantined and, with
	// FenceFailures 1, the stage module lattice-wide.
	_, _ = a.h.Call(ctx, "steady", nil)
	sha := a.d.Manifest.Module("good").SHA256
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, m := range []*member{b, c} {
		q := m.h.Quarantine()
		if err := q.WaitFor(wctx, func() bool { _, ok := q.Lookup(sha); return ok }); err != nil {
			t.Fatalf("host %s never saw the quarantine: %v (a: %+v)", m.id, err, a.d.Pool("steady").Status())
		}
		_, err := m.h.Call(ctx, "steady", nil)
		var le *lattice.Error
		if !errors.As(err, &le) || le.Class != errdefs.ClassUnavailable || le.Status() != 503 ||
			!strings.HasPrefix(le.Message, "module "+sha+" is quarantined lattice-wide: ") || !strings.Contains(le.Message, "host a") {
			t.Fatalf("host %s call to a quarantined module: %v", m.id, err)
		}
	}
	// Through the front and NATS, once the heartbeats say so or not: the
	// answer is the refusal either way.
	if _, err := f.Call(ctx, "steady", nil); lattice.Class(err) != errdefs.ClassUnavailable || !strings.Contains(err.Error(), "quarantined lattice-wide") {
		t.Fatalf("front call to a quarantined module: %v", err)
	}
	list := b.h.Quarantine().List()
	if len(list) != 1 || list[0].SHA256 != sha || list[0].Host != "a" || list[0].Session != "steady" {
		t.Fatalf("quarantine list: %+v", list)
	}
	if err := f.Quarantine().Clear(ctx, sha); err != nil {
		t.Fatal(err)
	}
	q := c.h.Quarantine()
	if err := q.WaitFor(wctx, func() bool { return len(q.List()) == 0 }); err != nil {
		t.Fatal(err)
	}
	if out, err := c.h.Call(ctx, "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("c after clearing: %q %v", out, err)
	}
}

// TestPlacementCAS: hosts racing for a placement claim: exactly one wins
// each key; a stale revision can neither renew nor release it.
func TestPlacementCAS(t *testing.T) {
	url := startServer(t)
	const lat = "t6"
	a := join(t, url, lat, "a", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	b := join(t, url, lat, "b", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	ctx := context.Background()
	for i := range 25 {
		session := "s" + itoa(i)
		var wins [2]*lattice.Claim
		var errs [2]error
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j, m := range []*member{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				wins[j], errs[j] = m.h.ClaimPlacement(ctx, session)
			}()
		}
		close(start)
		wg.Wait()
		if (wins[0] == nil) == (wins[1] == nil) {
			t.Fatalf("%s: claims %v %v, errors %v %v: want exactly one winner", session, wins[0], wins[1], errs[0], errs[1])
		}
		w, loser := 0, 1
		if wins[1] != nil {
			w, loser = 1, 0
		}
		if !errors.Is(errs[loser], lattice.ErrClaimed) || !strings.Contains(errs[loser].Error(), "held by "+wins[w].Owner) {
			t.Fatalf("%s: loser's error %v", session, errs[loser])
		}
	}
	cl, err := a.h.ClaimPlacement(ctx, "solo")
	if err != nil {
		t.Fatal(err)
	}
	stale := *cl
	if err := a.h.Claims().Renew(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if err := b.h.Claims().Renew(ctx, &stale); !errors.Is(err, lattice.ErrClaimed) {
		t.Fatalf("renewing a stale revision: %v", err)
	}
	if err := b.h.Claims().Release(ctx, &stale); !errors.Is(err, lattice.ErrClaimed) {
		t.Fatalf("releasing a stale revision: %v", err)
	}
	if err := a.h.Claims().Release(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if _, err := b.h.ClaimPlacement(ctx, "solo"); err != nil {
		t.Fatalf("claiming a released key: %v", err)
	}
}

// TestUnacknowledgedCallsAreSentAgain: a call that reaches a member of
// the session's queue group that never acknowledges it (a host that died
// as it got the call) is sent again after AckTimeout and answered by a
// live host, instead of failing at its deadline.
func TestUnacknowledgedCallsAreSentAgain(t *testing.T) {
	url := startServer(t)
	const lat = "t9"
	join(t, url, lat, "h1", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	// A black hole in the session's queue group: it takes calls and never
	// acknowledges or answers them.
	swallowed := blackHole(t, url, lattice.SessionSubject(lat, "steady"), lattice.QueueGroup(lat, "steady"))
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl, AckTimeout: 20 * time.Millisecond})
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := f.Call(ctx, "steady", nil)
		cancel()
		if err != nil || string(out) != "ok" {
			t.Fatalf("call %d: %q, %v (stats %+v)", i, out, err, f.Stats())
		}
	}
	if swallowed.Load() == 0 || f.Stats().Resent != uint64(swallowed.Load()) {
		t.Fatalf("swallowed %d, resent %d: the queue group should have given the hole some calls, each sent again once", swallowed.Load(), f.Stats().Resent)
	}
}

// TestReplicasReachTheBuckets: HostConfig.Replicas is what the lattice's
// KV buckets are made with. A single embedded server cannot keep a
// bucket on two servers, so asking for 2 fails to make it, naming the
// bucket; 1 (the default) works.
func TestReplicasReachTheBuckets(t *testing.T) {
	url := startServer(t)
	d := openDeployment(t, manifestOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := lattice.NewHost(ctx, connect(t, url), d.Deployment, hostDefaults(lattice.HostConfig{Lattice: "r2", ID: "h", Replicas: 2, Logger: quietLogger()}))
	if err == nil || !strings.Contains(err.Error(), "bucket") {
		t.Fatalf("two replicas on one server: %v, want the bucket refused", err)
	}
	h, err := lattice.NewHost(ctx, connect(t, url), d.Deployment, hostDefaults(lattice.HostConfig{Lattice: "r1", ID: "h", Logger: quietLogger()}))
	if err != nil {
		t.Fatalf("the default, one replica: %v", err)
	}
	_ = h.Close(ctx)
	if _, err := lattice.NewFront(ctx, connect(t, url), lattice.FrontConfig{Lattice: "r3", TTL: manifest.DefaultHeartbeatTTL, Replicas: 2, Logger: quietLogger()}); err == nil {
		t.Fatal("a front asking for two replicas on one server made its buckets")
	}
}

// TestPoisonReadsItsOwnWrite: once Poison returns, the same view shows
// the module, so the host that quarantined it refuses its next call.
func TestPoisonReadsItsOwnWrite(t *testing.T) {
	url := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := join(t, url, "t10", "a", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	sha := a.d.Manifest.Module("good").SHA256
	for i := range 20 { // the watcher's lag is a race: try it often
		q := a.h.Quarantine()
		if err := q.Poison(ctx, lattice.Poison{SHA256: sha, Reason: "test", Host: "a", Session: "steady"}); err != nil {
			t.Fatal(err)
		}
		if _, ok := q.Lookup(sha); !ok {
			t.Fatalf("round %d: Poison returned before its own view showed the module", i)
		}
		if _, err := a.h.Call(ctx, "steady", nil); lattice.Class(err) != errdefs.ClassUnavailable {
			t.Fatalf("round %d: the call after Poison: %v, want unavailable", i, err)
		}
		if err := q.Clear(ctx, sha); err != nil {
			t.Fatal(err)
		}
		if err := q.WaitFor(ctx, func() bool { _, ok := q.Lookup(sha); return !ok }); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLeavingHostAnswers covers the moment between a host starting to
// leave and its endpoints stopping: a request that asked for an
// acknowledgement is neither acknowledged nor answered (its front sends
// it again, elsewhere), and one that did not is answered 503 unavailable
// naming the host, in the JSON error answer every other refusal uses.
// Nothing runs on the session either way.
func TestLeavingHostAnswers(t *testing.T) {
	url := startServer(t)
	const lat = "leaving"
	m := join(t, url, lat, "h1", manifestOpts{}, lattice.HostConfig{TTL: time.Second})
	client := connect(t, url)
	subj := lattice.SessionSubject(lat, "steady")
	runsBefore := m.d.Pool("steady").Status().Outcomes["ok"]

	lattice.SetLeaving(m.h, true)
	answer, err := client.Request(subj, []byte("x"), 5*time.Second)
	if err != nil {
		t.Fatalf("no answer without an acknowledgement asked for: %v", err)
	}
	if answer.Header.Get(micro.ErrorCodeHeader) != "503" {
		t.Fatalf("answer headers %v, body %s; want the 503 error answer", answer.Header, answer.Data)
	}
	var e lattice.Error
	if err := json.Unmarshal(answer.Data, &e); err != nil || e.Class != errdefs.ClassUnavailable || e.Host != "h1" || !strings.Contains(e.Message, "leaving") {
		t.Fatalf("error answer %s (%v)", answer.Data, err)
	}

	// With an acknowledgement asked for: silence (the front's ack timeout
	// then sends it to another host). 200 ms of silence is the check.
	inbox := nats.NewInbox()
	sub, err := client.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	req := nats.NewMsg(subj)
	req.Reply = inbox
	req.Data = []byte("x")
	req.Header.Set(lattice.AckHeader, "1")
	if err := client.PublishMsg(req); err != nil {
		t.Fatal(err)
	}
	if got, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("a leaving host answered a request that asked for an acknowledgement: %v %s", got.Header, got.Data)
	}

	lattice.SetLeaving(m.h, false)
	if n := m.d.Pool("steady").Status().Outcomes["ok"]; n != runsBefore {
		t.Fatalf("the session ran %d calls while its host was leaving", n-runsBefore)
	}
	// Not leaving: the same request is served (the check above can fail).
	if answer, err := client.Request(subj, []byte("x"), 5*time.Second); err != nil || answer.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Fatalf("a staying host's answer: %v %v", answer, err)
	}
}

// TestQuarantineChangeBeatsAtOnce: a host heartbeats as soon as the
// shared quarantine changes, not at its next tick, so a front routes to
// a session again right after its module was cleared (and refuses it
// right after it was poisoned). The heartbeat TTL is 30 s (a tick every
// 10 s); the test waits at most 5 s for each change.
func TestQuarantineChangeBeatsAtOnce(t *testing.T) {
	url := startServer(t)
	const lat = "qb"
	cfg := lattice.HostConfig{TTL: 30 * time.Second}
	m := join(t, url, lat, "h1", manifestOpts{}, cfg)
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: 30 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	state := func() string {
		for _, rec := range f.Hosts() {
			for _, sc := range rec.Sessions {
				if sc.Name == "steady" {
					return sc.State
				}
			}
		}
		return ""
	}
	waitState := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for state() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the front's heartbeat of h1 says steady is %q, not %q, 5 s after the change", state(), want)
			}
			// Polling the front's view of the heartbeats. Not
			// testutil.Poll: polling from 50µs on, the test sees the
			// heartbeat that says ready before the front's quarantine
			// watch has seen the clear, and its call is then refused (and
			// once the state stayed refused for 5 s); with 5 ms it passed
			// 200 runs of 200 under -race.
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitState("ready")
	sha := m.h.Record().Sessions[0].StageSHA256
	if err := m.h.Quarantine().Poison(ctx, lattice.Poison{SHA256: sha, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	waitState("refused")
	if _, err := f.Call(ctx, "steady", nil); lattice.Class(err) != errdefs.ClassUnavailable || !strings.Contains(err.Error(), "quarantined lattice-wide") {
		t.Fatalf("a call while poisoned: %v", err)
	}
	if err := m.h.Quarantine().Clear(ctx, sha); err != nil {
		t.Fatal(err)
	}
	waitState("ready")
	if out, err := f.Call(ctx, "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("a call after the clear: %q %v", out, err)
	}
}

// TestEndpointFollowsServing: a host whose instances of a session are
// all out of service leaves the session's queue group, so the lattice's
// calls go to the host that can run them instead of being answered 503
// there; once the session is reset it joins again (at its next
// heartbeat) and takes calls.
func TestEndpointFollowsServing(t *testing.T) {
	url := startServer(t)
	const lat = "ep"
	cfg := lattice.HostConfig{TTL: ttl, FenceFailures: -1} // no lattice-wide quarantine
	a := join(t, url, lat, "a", manifestOpts{fence: "spin"}, cfg)
	b := join(t, url, lat, "b", manifestOpts{}, cfg)
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// a's fence never returns: its one instance is quarantined.
	if _, err := a.h.Call(ctx, "steady", nil); lattice.Class(err) != errdefs.ClassDeviceLost {
		t.Fatalf("a's call: %v", err)
	}
	for i := range 20 {
		if out, err := f.Call(ctx, "steady", nil); err != nil || string(out) != "ok" {
			t.Fatalf("call %d through the lattice: %q %v", i, out, err)
		}
	}
	if n := b.d.Pool("steady").Status().Outcomes["ok"]; n != 20 {
		t.Fatalf("b ran %d of the 20 calls", n)
	}
	// a left the group as its call ended, before the 20 were sent: none
	// reached it to be answered not-run and sent again.
	if st := f.Stats(); st.Resent != 0 {
		t.Fatalf("%d calls went to a and were sent again: %+v", st.Resent, st)
	}
	// A reset puts a fresh instance in service: a takes calls again.
	if _, err := a.d.ResetSession(ctx, "steady"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.d.Pool("steady").Status().Calls == 1 {
		if time.Now().After(deadline) {
			t.Fatal("a took no call within 5 s of its reset")
		}
		if _, err := f.Call(ctx, "steady", nil); err != nil && lattice.Class(err) != errdefs.ClassDeviceLost {
			t.Fatalf("a call after the reset: %v", err)
		}
	}
}

// TestNotRunCallsGoElsewhere: a call that waited on a host for an
// instance of its session, until every instance there went out of
// service, ran nowhere: the host answers so (Stagehost-Not-Run) after it
// left the session's queue group, and the front sends the call again,
// to a host that runs it.
func TestNotRunCallsGoElsewhere(t *testing.T) {
	url := startServer(t)
	const lat = "nr"
	cfg := lattice.HostConfig{TTL: ttl, FenceFailures: -1}
	// a: one instance, a call holds it 1 s, then its fence never
	// returns and the instance is quarantined.
	a := join(t, url, lat, "a", manifestOpts{fence: "spin", latency: time.Second}, cfg)
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		out []byte
		err error
	}
	first, second := make(chan result, 1), make(chan result, 1)
	go func() { out, err := f.Call(ctx, "steady", nil); first <- result{out, err} }()
	waitFor := func(what string, cond func(deploy.SessionStatus) bool) {
		t.Helper()
		if !testutil.Poll(10*time.Second, func() bool { return cond(a.d.Pool("steady").Status()) }) {
			t.Fatalf("%s: %+v", what, a.d.Pool("steady").Status())
		}
	}
	waitFor("the first call running on a", func(deploy.SessionStatus) bool { return a.h.Record().Sessions[0].InFlight == 1 })
	go func() { out, err := f.Call(ctx, "steady", nil); second <- result{out, err} }()
	waitFor("the second call waiting on a", func(st deploy.SessionStatus) bool { return st.Waiting == 1 })
	b := join(t, url, lat, "b", manifestOpts{}, cfg) // within the first call's second (about 20 ms)

	if r := <-first; lattice.Class(r.err) != errdefs.ClassDeviceLost {
		t.Fatalf("the first call: %q %v", r.out, r.err)
	}
	if r := <-second; r.err != nil || string(r.out) != "ok" {
		t.Fatalf("the second call: %q %v", r.out, r.err)
	}
	if n := b.d.Pool("steady").Status().Outcomes["ok"]; n != 1 {
		t.Fatalf("b ran %d calls, want the second", n)
	}
}
