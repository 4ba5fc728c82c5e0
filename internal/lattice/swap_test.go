package lattice_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/stages"
)

// version is one of the test stages that answer their version ("v1",
// "v2"): its bytes and sha256.
type version struct {
	bin []byte
	sha string
}

func readVersion(t testing.TB, n string) version {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "version"+n+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return version{bin: b, sha: stages.SHA256(b)}
}

// versionSession is manifest TOML for module "ver" (version 1) and
// session "ver" on gpu0.
func versionSession(t testing.TB) string {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join("testdata", "version1.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return "[[module]]\nname = \"ver\"\npath = \"" + abs + "\"\nsha256 = \"" + readVersion(t, "1").sha + "\"\n" +
		"[[session]]\nname = \"ver\"\nstage = \"ver\"\ndevice = \"gpu0\"\n"
}

// swapConfig is a host config whose heartbeat ticks every 10 s: a
// heartbeat that shows a swap within the tests' bounds was written for
// the swap, not by the tick.
func swapConfig() lattice.HostConfig {
	return lattice.HostConfig{TTL: 30 * time.Second}
}

func joinVersion(t *testing.T, url, lat, id string) *member {
	t.Helper()
	return join(t, url, lat, id, manifestOpts{extra: versionSession(t)}, swapConfig())
}

// running is what the front's view says host id runs for session "ver":
// its stage sha256, model revision and host_only, ok false when the
// front does not list it.
func running(f *lattice.Front, id string) (lattice.SessionCapacity, bool) {
	for _, r := range f.Hosts() {
		if r.ID != id {
			continue
		}
		for _, sc := range r.Sessions {
			if sc.Name == "ver" {
				return sc, true
			}
		}
	}
	return lattice.SessionCapacity{}, false
}

func recordOf(h *lattice.Host) lattice.SessionCapacity {
	for _, sc := range h.Record().Sessions {
		if sc.Name == "ver" {
			return sc
		}
	}
	return lattice.SessionCapacity{}
}

func waitCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestLatticeSwapReachesEveryHost swaps a session served by three hosts
// through a front: once the swap has answered, every call from the
// front gets the new version, whichever host runs it, and every host's
// heartbeat shows the new module at the swap's revision (written for the
// swap: the heartbeats tick every 10 s). Calls run throughout: none that
// started after the answer got the old version.
func TestLatticeSwapReachesEveryHost(t *testing.T) {
	url := startServer(t)
	const lat = "swapall"
	v1, v2 := readVersion(t, "1"), readVersion(t, "2")
	hosts := []*member{joinVersion(t, url, lat, "h1"), joinVersion(t, url, lat, "h2"), joinVersion(t, url, lat, "h3")}
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: 30 * time.Second})
	ctx := waitCtx(t, 30*time.Second)
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("ver")) == 3 }); err != nil {
		t.Fatalf("three hosts serving: %v (%v)", err, f.Serving("ver"))
	}
	for range 6 {
		if out, err := f.Call(ctx, "ver", nil); err != nil || string(out) != "v1" {
			t.Fatalf("before the swap: %q, %v", out, err)
		}
	}

	// Callers run through the swap; each call records when it started.
	type result struct {
		started time.Time
		out     string
	}
	var (
		mu      sync.Mutex
		results []result
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	t.Cleanup(func() { stop.Store(true); wg.Wait() }) // before ctx is cancelled
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				started := time.Now()
				out, err := f.Call(ctx, "ver", nil)
				if err != nil {
					if !stop.Load() {
						t.Errorf("a call during the swap: %v", err)
					}
					return
				}
				mu.Lock()
				results = append(results, result{started, string(out)})
				mu.Unlock()
			}
		}()
	}
	ans, err := f.SwapSession(ctx, lattice.DesiredModule{Session: "ver", Module: "ver", SHA256: v2.sha}, v2.bin)
	answered := time.Now()
	if err != nil {
		t.Fatalf("swap: %v (%+v)", err, ans)
	}
	if len(ans.Hosts) != 3 || ans.Revision == 0 {
		t.Fatalf("swap answer: %+v", ans)
	}
	for _, h := range ans.Hosts {
		if !h.Acknowledged || h.StageSHA256 != v2.sha {
			t.Fatalf("swap answer: host %+v", h)
		}
	}
	// Heartbeats show the new module at once: in the front's view as
	// the swap answers, and in each host's record.
	for _, m := range hosts {
		sc, ok := running(f, m.id)
		if !ok || sc.StageSHA256 != v2.sha || sc.ModelRevision != ans.Revision || sc.HostOnly {
			t.Fatalf("host %s's heartbeat after the swap: %+v (want stage %s, revision %d)", m.id, sc, v2.sha, ans.Revision)
		}
		if sc := recordOf(m.h); sc.StageSHA256 != v2.sha {
			t.Fatalf("host %s's record after the swap: %+v", m.id, sc)
		}
	}
	for i := range 60 {
		out, err := f.Call(ctx, "ver", nil)
		if err != nil || string(out) != "v2" {
			t.Fatalf("call %d after the swap's answer: %q, %v", i, out, err)
		}
	}
	stop.Store(true)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	late := 0
	for _, r := range results {
		if r.started.After(answered) {
			late++
			if r.out != "v2" {
				t.Fatalf("a call started %v after the swap's answer got %q", r.started.Sub(answered), r.out)
			}
		}
	}
	t.Logf("swap took %.1f ms over 3 hosts; %d calls during and after it, %d started after the answer", ans.TookMS, len(results), late)
	_ = v1
}

// TestHostOnlySwapHeartbeatsAtOnce swaps one host's session only: its
// heartbeat shows the new module and host_only within the test's bound
// (the heartbeats tick every 10 s), the other host's stays; the
// lattice's next swap of the session reaches the host-only one too.
func TestHostOnlySwapHeartbeatsAtOnce(t *testing.T) {
	url := startServer(t)
	const lat = "swaphost"
	v1, v2 := readVersion(t, "1"), readVersion(t, "2")
	a, _ := joinVersion(t, url, lat, "a"), joinVersion(t, url, lat, "b")
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: 30 * time.Second})
	ctx := waitCtx(t, 20*time.Second)
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("ver")) == 2 }); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.d.LoadModule(ctx, deploy.ModuleRequest{Name: "ver", SHA256: v2.sha}, v2.bin, "upload"); err != nil {
		t.Fatal(err)
	}
	swapped := time.Now()
	res, err := a.h.Swap(ctx, "ver", "ver@"+v2.sha)
	if err != nil || !res.Swapped {
		t.Fatalf("host-only swap: %+v, %v", res, err)
	}
	seen := waitCtx(t, 2*time.Second)
	if err := f.WaitFor(seen, func() bool {
		sc, _ := running(f, "a")
		return sc.StageSHA256 == v2.sha && sc.HostOnly
	}); err != nil {
		sc, _ := running(f, "a")
		t.Fatalf("host a's heartbeat 2 s after its swap: %+v (want stage %s, host_only)", sc, v2.sha)
	}
	t.Logf("the front's view showed the swap %v after it started", time.Since(swapped))
	if sc, _ := running(f, "b"); sc.StageSHA256 != v1.sha || sc.HostOnly {
		t.Fatalf("host b's heartbeat: %+v", sc)
	}
	if out, err := a.h.Call(ctx, "ver", nil); err != nil || string(out) != "v2" {
		t.Fatalf("host a: %q, %v", out, err)
	}
	// The lattice's swap back to version 1 reaches host a too.
	ans, err := f.SwapSession(ctx, lattice.DesiredModule{Session: "ver", Module: "ver", SHA256: v1.sha}, v1.bin)
	if err != nil {
		t.Fatalf("lattice-wide swap: %v (%+v)", err, ans)
	}
	if sc, _ := running(f, "a"); sc.StageSHA256 != v1.sha || sc.HostOnly || sc.ModelRevision != ans.Revision {
		t.Fatalf("host a after the lattice-wide swap: %+v", sc)
	}
	if out, err := a.h.Call(ctx, "ver", nil); err != nil || string(out) != "v1" {
		t.Fatalf("host a after the lattice-wide swap: %q, %v", out, err)
	}
}

// TestQuarantineFollowsTheRunningModule swaps host a's session to
// version 2 behind the lattice's back (the deployment's own swap), then
// quarantines version 2 lattice-wide from host b: host a's next call is
// refused before it runs (its session counts no call), the front sends
// the calls to b, and a swap to the quarantined module is refused.
func TestQuarantineFollowsTheRunningModule(t *testing.T) {
	url := startServer(t)
	const lat = "swapq"
	v2 := readVersion(t, "2")
	a, b := joinVersion(t, url, lat, "a"), joinVersion(t, url, lat, "b")
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: 30 * time.Second})
	ctx := waitCtx(t, 20*time.Second)
	if _, _, err := a.d.LoadModule(ctx, deploy.ModuleRequest{Name: "ver", SHA256: v2.sha}, v2.bin, "upload"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.d.SwapSession(ctx, "ver", "ver@"+v2.sha); err != nil {
		t.Fatal(err)
	}
	if out, err := a.h.Call(ctx, "ver", nil); err != nil || string(out) != "v2" {
		t.Fatalf("host a after its swap: %q, %v", out, err)
	}
	if err := b.h.Quarantine().Poison(ctx, lattice.Poison{SHA256: v2.sha, Reason: "test: version 2 is bad", Host: "b", Session: "ver"}); err != nil {
		t.Fatal(err)
	}
	if err := a.h.Quarantine().WaitFor(ctx, func() bool { _, ok := a.h.Quarantine().Lookup(v2.sha); return ok }); err != nil {
		t.Fatal(err)
	}
	ran := a.d.Pool("ver").Status().Calls
	_, err := a.h.Call(ctx, "ver", nil)
	if lattice.Class(err) != errdefs.ClassUnavailable {
		t.Fatalf("host a's call to a quarantined module: %v, want unavailable", err)
	}
	if got := a.d.Pool("ver").Status().Calls; got != ran {
		t.Fatalf("host a's session counted %d calls after the quarantine, want 0: the call ran", got-ran)
	}
	if sc := recordOf(a.h); sc.State != "refused" || sc.StageSHA256 != v2.sha {
		t.Fatalf("host a's heartbeat: %+v, want refused with stage %s", sc, v2.sha)
	}
	// The front routes by the heartbeats: a's says refused at once.
	if err := f.WaitFor(ctx, func() bool { sc, _ := running(f, "a"); return sc.State == "refused" }); err != nil {
		sc, _ := running(f, "a")
		t.Fatalf("host a's heartbeat in the front's view: %+v", sc)
	}
	for i := range 10 {
		out, err := f.Call(ctx, "ver", nil)
		if err != nil || string(out) != "v1" {
			t.Fatalf("call %d through the front: %q, %v", i, out, err)
		}
	}
	if got := a.d.Pool("ver").Status().Calls; got != ran {
		t.Fatalf("host a ran %d of the front's calls with a quarantined module", got-ran)
	}
	// Swapping to the quarantined module is refused, per host and
	// lattice-wide, before anything changes.
	if _, _, err := b.d.LoadModule(ctx, deploy.ModuleRequest{Name: "ver", SHA256: v2.sha}, v2.bin, "upload"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.h.Swap(ctx, "ver", "ver@"+v2.sha); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("host-only swap to a quarantined module: %v, want invalid_argument", err)
	}
	_, err = f.SwapSession(ctx, lattice.DesiredModule{Session: "ver", Module: "ver", SHA256: v2.sha}, v2.bin)
	if lattice.Class(err) != errdefs.ClassInvalidArgument {
		t.Fatalf("lattice-wide swap to a quarantined module: %v, want invalid_argument", err)
	}
	if out, err := b.h.Call(ctx, "ver", nil); err != nil || string(out) != "v1" {
		t.Fatalf("host b after the refused swaps: %q, %v", out, err)
	}
}

// TestLateHostRunsTheLatticeModule swaps the lattice's session, then
// joins a host whose manifest has only version 1, and restarts one
// (a new process with the same id): each runs version 2 from its first
// heartbeat, the module's bytes read from the lattice's modules store.
func TestLateHostRunsTheLatticeModule(t *testing.T) {
	url := startServer(t)
	const lat = "swaplate"
	v2 := readVersion(t, "2")
	a, b := joinVersion(t, url, lat, "a"), joinVersion(t, url, lat, "b")
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: 30 * time.Second})
	ctx := waitCtx(t, 30*time.Second)
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("ver")) == 2 }); err != nil {
		t.Fatal(err)
	}
	ans, err := f.SwapSession(ctx, lattice.DesiredModule{Session: "ver", Module: "ver", SHA256: v2.sha}, v2.bin)
	if err != nil {
		t.Fatalf("swap: %v", err)
	}
	_ = a
	check := func(m *member) {
		t.Helper()
		if sc := recordOf(m.h); sc.StageSHA256 != v2.sha || sc.ModelRevision != ans.Revision || !sc.Serving {
			t.Fatalf("host %s as it joined: %+v, want stage %s at revision %d, serving", m.id, sc, v2.sha, ans.Revision)
		}
		if out, err := m.h.Call(ctx, "ver", nil); err != nil || string(out) != "v2" {
			t.Fatalf("host %s: %q, %v", m.id, out, err)
		}
	}
	c := joinVersion(t, url, lat, "c")
	check(c)
	b.kill()
	b2 := joinVersion(t, url, lat, "b")
	check(b2)
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("ver")) == 3 }); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		if out, err := f.Call(ctx, "ver", nil); err != nil || string(out) != "v2" {
			t.Fatalf("call %d through the front: %q, %v", i, out, err)
		}
	}
}

// TestMemberSwapSession swaps through a Member, as serve's swap route
// does: lattice-wide with the module's bytes from the member's own
// deployment (the other host has never loaded it), then on the member's
// host only; a fence module and a member without a deployment are
// refused.
func TestMemberSwapSession(t *testing.T) {
	dir := t.TempDir()
	lt := lattice.Config{Name: "mswap", Embedded: true, Listen: "127.0.0.1:0", StoreDir: filepath.Join(dir, "js"),
		HeartbeatTTL: 30 * time.Second, ClaimTTL: time.Minute, FenceFailures: 3}
	ctx := waitCtx(t, 30*time.Second)
	v1, v2 := readVersion(t, "1"), readVersion(t, "2")
	d := openDeployment(t, manifestOpts{extra: versionSession(t), fence: "spin"})
	m, err := lattice.Join(ctx, d.Deployment, lattice.MemberConfig{Lattice: lt, HostID: "one", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close) // after the other host's cleanup: it closes the server
	other := join(t, m.ClientURL(), "mswap", "two", manifestOpts{extra: versionSession(t)}, swapConfig())
	f := m.Front()
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("ver")) == 2 }); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.LoadModule(ctx, deploy.ModuleRequest{Name: "ver", SHA256: v2.sha}, v2.bin, "upload"); err != nil {
		t.Fatal(err)
	}
	ans, err := m.SwapSession(ctx, "ver", "ver", false)
	if err != nil || ans.HostOnly || ans.SHA256 != v2.sha || len(ans.Hosts) != 2 {
		t.Fatalf("lattice-wide swap: %+v, %v", ans, err)
	}
	if out, err := other.h.Call(ctx, "ver", nil); err != nil || string(out) != "v2" {
		t.Fatalf("the other host after the swap: %q, %v", out, err)
	}
	ans, err = m.SwapSession(ctx, "ver", "ver@"+v1.sha, true)
	if err != nil || !ans.HostOnly || ans.Local == nil || !ans.Local.Swapped {
		t.Fatalf("host-only swap: %+v, %v", ans, err)
	}
	if sc, _ := running(f, "two"); sc.StageSHA256 != v2.sha {
		t.Fatalf("the other host after a host-only swap: %+v", sc)
	}
	if sc := recordOf(m.Host()); sc.StageSHA256 != v1.sha || !sc.HostOnly {
		t.Fatalf("this host after its host-only swap: %+v", sc)
	}
	if _, err := m.SwapSession(ctx, "ver", "spin", false); !errors.Is(err, errdefs.ErrInvalidArgument) && lattice.Class(err) != errdefs.ClassInvalidArgument {
		t.Fatalf("a fence module: %v, want invalid_argument", err)
	}
	fo, err := lattice.Join(ctx, nil, lattice.MemberConfig{Lattice: lattice.Config{Name: "mswap", URL: m.ClientURL(), HeartbeatTTL: 30 * time.Second, ClaimTTL: time.Minute},
		HostID: "front", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer fo.Close()
	if _, err := fo.SwapSession(ctx, "ver", "ver", false); !errors.Is(err, errdefs.ErrUnsupported) {
		t.Fatalf("a member without a deployment: %v, want unsupported", err)
	}
}

// TestHostThatMissedASwapRunsNone: host c is away during a swap (its
// heartbeat gone from the lattice's view, and its apply held), so the
// swap answers without it and commits; c still takes the session's calls
// from the queue group, but runs none of them with the old module: the
// front's calls carry the committed revision, c answers them not run,
// and the front sends them to a or b. Once c applies the swap it serves
// the new version.
func TestHostThatMissedASwapRunsNone(t *testing.T) {
	url := startServer(t)
	const lat = "swapmiss"
	v2 := readVersion(t, "2")
	joinVersion(t, url, lat, "a")
	joinVersion(t, url, lat, "b")
	c := joinVersion(t, url, lat, "c")
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: 30 * time.Second})
	ctx := waitCtx(t, 30*time.Second)
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("ver")) == 3 }); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	lattice.SetApplyHold(c.h, func() { <-release })
	// c is away: its heartbeat is gone from the lattice.
	js, err := jetstream.New(c.nc)
	if err != nil {
		t.Fatal(err)
	}
	hostsKV, err := js.KeyValue(ctx, lattice.HostsBucket(lat))
	if err != nil {
		t.Fatal(err)
	}
	if err := hostsKV.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitFor(ctx, func() bool { return !listed(f, "c") }); err != nil {
		t.Fatal(err)
	}
	ans, err := f.SwapSession(ctx, lattice.DesiredModule{Session: "ver", Module: "ver", SHA256: v2.sha}, v2.bin)
	if err != nil || len(ans.Hosts) != 2 {
		t.Fatalf("swap without c: %+v, %v", ans, err)
	}
	ran := c.d.Pool("ver").Status().Calls
	for i := range 30 {
		if out, err := f.Call(ctx, "ver", nil); err != nil || string(out) != "v2" {
			t.Fatalf("call %d after the swap: %q, %v", i, out, err)
		}
	}
	if got := c.d.Pool("ver").Status().Calls; got != ran {
		t.Fatalf("host c ran %d calls with the old module after the swap was committed", got-ran)
	}
	if _, err := c.h.Call(ctx, "ver", nil); lattice.Class(err) != errdefs.ClassUnavailable {
		t.Fatalf("host c's own call before it applied the swap: %v, want unavailable", err)
	}
	// c's own front (serve's: Local is c) runs nothing on c either, once
	// c's view has the commit: its calls go through the lattice.
	if err := lattice.WaitCommitted(ctx, c.h, "ver", ans.Revision); err != nil {
		t.Fatal(err)
	}
	fc := newFront(t, url, lat, lattice.FrontConfig{TTL: 30 * time.Second, Local: c.h})
	for i := range 10 {
		if out, err := fc.Call(ctx, "ver", nil); err != nil || string(out) != "v2" {
			t.Fatalf("call %d through c's own front: %q, %v", i, out, err)
		}
	}
	if got := c.d.Pool("ver").Status().Calls; got != ran {
		t.Fatalf("host c ran %d calls of its own front with the old module", got-ran)
	}
	releaseOnce.Do(func() { close(release) })
	if err := f.WaitFor(ctx, func() bool { sc, _ := running(f, "c"); return sc.StageSHA256 == v2.sha && sc.Serving }); err != nil {
		sc, _ := running(f, "c")
		t.Fatalf("host c after its apply: %+v", sc)
	}
	if out, err := c.h.Call(ctx, "ver", nil); err != nil || string(out) != "v2" {
		t.Fatalf("host c after its apply: %q, %v", out, err)
	}
}

// TestLatticeSwapWaitsForCallsInFlight: a call runs on the old module
// (300 ms of sim device latency) as the swap starts; the swap answers
// only after that call has ended on its host, so no call runs the old
// module once it has answered.
func TestLatticeSwapWaitsForCallsInFlight(t *testing.T) {
	url := startServer(t)
	const lat = "swapdrain"
	v2 := readVersion(t, "2")
	a := join(t, url, lat, "a", manifestOpts{latency: 300 * time.Millisecond}, swapConfig())
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: 30 * time.Second})
	ctx := waitCtx(t, 30*time.Second)
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("steady")) == 1 }); err != nil {
		t.Fatal(err)
	}
	pool := a.d.Pool("steady")
	before := pool.Status().Calls
	done := make(chan error, 1)
	go func() {
		out, err := f.Call(ctx, "steady", nil)
		if err == nil && string(out) != "ok" {
			err = errors.New("got " + string(out))
		}
		done <- err
	}()
	// The call holds the one instance: TryAcquire finds none free.
	for {
		turn := pool.TryAcquire()
		if turn == nil {
			break
		}
		turn.Release()
		if ctx.Err() != nil {
			t.Fatal("the call never took the instance")
		}
		runtime.Gosched()
	}
	ans, err := f.SwapSession(ctx, lattice.DesiredModule{Session: "steady", Module: "ver2", SHA256: v2.sha}, v2.bin)
	if err != nil {
		t.Fatalf("swap: %v", err)
	}
	if got := pool.Status().Calls; got != before+1 {
		t.Fatalf("the swap answered (%.1f ms) while the call on the old module still ran: %d calls ended, want %d", ans.TookMS, got-before, 1)
	}
	if err := <-done; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	if out, err := f.Call(ctx, "steady", nil); err != nil || string(out) != "v2" {
		t.Fatalf("after the swap: %q, %v", out, err)
	}
	t.Logf("the swap answered after %.1f ms, once the call in flight had ended", ans.TookMS)
}

// TestFailedApplyIsTriedAgain: a host joins while the swapped module's
// bytes are missing from the modules store: it joins with the session
// refused (model_failed, model_error, not serving) and runs nothing;
// once the bytes are back it applies the swap at its next try and
// serves the new version.
func TestFailedApplyIsTriedAgain(t *testing.T) {
	old := lattice.SetModelRetry(100 * time.Millisecond)
	t.Cleanup(func() { lattice.SetModelRetry(old) }) // after the hosts' cleanups
	url := startServer(t)
	const lat = "swapretry"
	v2 := readVersion(t, "2")
	a := joinVersion(t, url, lat, "a")
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: 30 * time.Second})
	ctx := waitCtx(t, 30*time.Second)
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("ver")) == 1 }); err != nil {
		t.Fatal(err)
	}
	ans, err := f.SwapSession(ctx, lattice.DesiredModule{Session: "ver", Module: "ver", SHA256: v2.sha}, v2.bin)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(a.nc)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(ctx, lattice.ModulesStore(lat))
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Delete(ctx, v2.sha); err != nil {
		t.Fatal(err)
	}
	c := joinVersion(t, url, lat, "c")
	if sc := recordOf(c.h); sc.ModelFailed != ans.Revision || sc.ModelError == "" || sc.State != "refused" || sc.Serving || sc.StageSHA256 == v2.sha {
		t.Fatalf("host c joined without the module's bytes: %+v", sc)
	}
	if _, err := c.h.Call(ctx, "ver", nil); lattice.Class(err) != errdefs.ClassUnavailable {
		t.Fatalf("host c's call before it applied the swap: %v, want unavailable", err)
	}
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: v2.sha}, bytes.NewReader(v2.bin)); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitFor(ctx, func() bool {
		sc, _ := running(f, "c")
		return sc.StageSHA256 == v2.sha && sc.ModelRevision == ans.Revision && sc.Serving && sc.ModelFailed == 0
	}); err != nil {
		sc, _ := running(f, "c")
		t.Fatalf("host c after the bytes came back: %+v", sc)
	}
	if out, err := c.h.Call(ctx, "ver", nil); err != nil || string(out) != "v2" {
		t.Fatalf("host c: %q, %v", out, err)
	}
}

// TestFailedSwapIsReported: a swap to a module whose instances cannot be
// made (its stagehost_init traps) fails on both hosts: the answer names
// each with its error, and both keep serving version 1. A swap that one
// host does not acknowledge within the deadline names that host only;
// the other already runs version 2.
func TestFailedSwapIsReported(t *testing.T) {
	url := startServer(t)
	const lat = "swapfail"
	v2 := readVersion(t, "2")
	a, b := joinVersion(t, url, lat, "a"), joinVersion(t, url, lat, "b")
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: 30 * time.Second})
	ctx := waitCtx(t, 30*time.Second)
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("ver")) == 2 }); err != nil {
		t.Fatal(err)
	}
	trap, err := os.ReadFile(filepath.Join(repo, "stages/testdata/hostile/trap_init.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	ans, err := f.SwapSession(ctx, lattice.DesiredModule{Session: "ver", Module: "trap", SHA256: stages.SHA256(trap)}, trap)
	var le *lattice.Error
	if !errors.As(err, &le) || le.Class != errdefs.ClassUnavailable || !strings.Contains(le.Message, "host a:") || !strings.Contains(le.Message, "host b:") {
		t.Fatalf("a swap whose instances cannot be made: %v, want unavailable naming hosts a and b", err)
	}
	for _, h := range ans.Hosts {
		if h.Acknowledged || h.Error == "" {
			t.Fatalf("host %+v: want its error", h)
		}
	}
	for _, m := range []*member{a, b} {
		if out, err := m.h.Call(ctx, "ver", nil); err != nil || string(out) != "v1" {
			t.Fatalf("host %s after the failed swap: %q, %v", m.id, out, err)
		}
	}
	t.Logf("failed swap: %v", err)

	// b does not apply within the deadline.
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	lattice.SetApplyHold(b.h, func() { <-release })
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = f.SwapSession(short, lattice.DesiredModule{Session: "ver", Module: "ver", SHA256: v2.sha}, v2.bin)
	if !errors.As(err, &le) || le.Class != errdefs.ClassDeadlineExceeded || !strings.Contains(le.Message, "host b") || strings.Contains(le.Message, "host a") {
		t.Fatalf("a swap host b did not acknowledge: %v, want deadline_exceeded naming host b only", err)
	}
	t.Logf("timed out: %v", err)
	if out, err := a.h.Call(ctx, "ver", nil); err != nil || string(out) != "v2" {
		t.Fatalf("host a after the swap timed out: %q, %v", out, err)
	}
	if out, err := b.h.Call(ctx, "ver", nil); err != nil || string(out) != "v1" {
		t.Fatalf("host b, still applying: %q, %v", out, err)
	}
	releaseOnce.Do(func() { close(release) })
	if err := f.WaitFor(ctx, func() bool { sc, _ := running(f, "b"); return sc.StageSHA256 == v2.sha }); err != nil {
		t.Fatal(err)
	}
}
