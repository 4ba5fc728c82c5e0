package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/localcall"
)

// tenantsManifest writes a manifest of one sim gpu with session a of
// tenant acme, b of tenant beta and shared of none; with hang, a's
// streams hang (a session-scoped fault: only acme's worker has it).
func tenantsManifest(t *testing.T, path string, hang bool) {
	t.Helper()
	good, goodSHA := hostileModule(t, "good_stage")
	fault := ""
	if hang {
		fault = "[[device.sim.fault]]\nkind = \"hang\"\nsession = \"a\"\n"
	}
	body := fmt.Sprintf(`version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
%s[[module]]
name = "good"
path = %q
sha256 = %q
[[tenant]]
name = "acme"
max_failures = 3
failure_window = "10m"
[[tenant]]
name = "beta"
[[session]]
name = "a"
stage = "good"
device = "gpu0"
programs = ["noop"]
tenant = "acme"
deadline = "300ms"
fence_timeout = "30s"
[[session]]
name = "b"
stage = "good"
device = "gpu0"
programs = ["noop"]
tenant = "beta"
[[session]]
name = "shared"
stage = "good"
device = "gpu0"
programs = ["noop"]
`, fault, good, goodSHA)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestServeSuperviseTenants runs `serve --supervise` over one sim gpu
// with two tenants: a worker per (device, tenant) beside the device's
// shared worker, each serving its sessions only. While tenant beta's b
// and the shared session are called all along:
//  1. a SIGKILL of acme's worker restarts that worker alone (a serves
//     again);
//  2. a hung call of acme's (a session-scoped hang) is answered
//     deadline_exceeded within its deadline plus 250 ms (and 250 ms of
//     slack); acme's worker, its call still running hang_grace (100 ms)
//     past its deadline, reports hung and is killed by the supervisor
//     at once (long before its fence_timeout, 30 s), and restarted;
//  3. at acme's third failure (max_failures) acme is quarantined
//     lattice-wide: a's calls are refused, unavailable;
//
// and b and shared answer every call, with no error, and their workers
// never restart.
func TestServeSuperviseTenants(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path := filepath.Join(t.TempDir(), "tenants.toml")
	tenantsManifest(t, path, false)
	sv := startSupervised(t, path, 10*time.Second)
	out, get, workers := sv.out, sv.get, sv.workers
	call := func(session string) (int, string) { return sv.run(session, nil) }
	const limit = 20 * time.Second

	// Placement: three workers, each with its tenant's sessions.
	var before map[string]workerJSON
	pollFor(t, limit, "the three workers ready", func() (bool, string) {
		var body string
		before, body = workers()
		return len(before) == 3 && before["gpu0"].State == "ready" && before["gpu0-acme"].State == "ready" && before["gpu0-beta"].State == "ready", body
	})
	for name, want := range map[string]struct {
		tenant   string
		sessions []string
	}{"gpu0": {"", []string{"shared"}}, "gpu0-acme": {"acme", []string{"a"}}, "gpu0-beta": {"beta", []string{"b"}}} {
		if w := before[name]; w.Tenant != want.tenant || !slices.Equal(w.Sessions, want.sessions) {
			t.Errorf("worker %s: tenant %q sessions %v, want %q %v", name, w.Tenant, w.Sessions, want.tenant, want.sessions)
		}
	}
	if code, body := get("/v1/status"); code != 200 || !strings.Contains(body, `"tenant": "acme"`) || !strings.Contains(body, `"tenant": "beta"`) {
		t.Errorf("/v1/status: %d %s", code, body)
	}
	for _, s := range []string{"a", "b", "shared"} {
		pollFor(t, limit, s+" served", func() (bool, string) {
			code, body := call(s)
			return code == 200 && body == "ok", body
		})
	}

	// Tenant beta's and the shared session's calls, all along.
	var mu sync.Mutex
	var lat []time.Duration
	var okN, failN atomic.Int64
	var lastErr atomic.Value
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range []string{"b", "shared"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				t0 := time.Now()
				code, body := call(s)
				d := time.Since(t0)
				if code == 200 {
					okN.Add(1)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				} else {
					failN.Add(1)
					lastErr.Store(fmt.Sprintf("%s: %d %s", s, code, body))
				}
			}
		}()
	}

	// 1. SIGKILL acme's worker: it alone restarts.
	if err := syscall.Kill(before["gpu0-acme"].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	pollFor(t, limit, "a served again after the SIGKILL", func() (bool, string) {
		code, body := call("a")
		return code == 200 && body == "ok", body
	})
	t.Logf("acme served again %v after its worker's SIGKILL", time.Since(killedAt).Round(time.Millisecond))

	// 2. acme's next worker hangs a's streams: SIGKILL it again (its
	// second failure), so that the next one reads the manifest with
	// the hang.
	tenantsManifest(t, path, true)
	ws, _ := workers()
	if err := syscall.Kill(ws["gpu0-acme"].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	pid := ws["gpu0-acme"].PID
	var hungPID int
	pollFor(t, limit, "acme's worker restarted", func() (bool, string) {
		ws, body := workers()
		hungPID = ws["gpu0-acme"].PID
		return ws != nil && ws["gpu0-acme"].State == "ready" && hungPID != pid, body
	})
	var code int
	var body string
	var took time.Duration
	var callAt time.Time
	pollFor(t, limit, "a's hung call answered by acme's worker", func() (bool, string) {
		callAt = time.Now()
		code, body = call("a")
		took = time.Since(callAt)
		return code != 503 || !strings.Contains(body, "no host"), body
	})
	// The worker is killed at the deadline + hang_grace (100ms); the
	// front answers by the deadline plus localcall.Grace (250ms).
	if code != 504 || !strings.Contains(body, `"class": "deadline_exceeded"`) || took > 300*time.Millisecond+localcall.Grace+250*time.Millisecond {
		t.Errorf("a's hung call: %d %s after %v; want deadline_exceeded within deadline + 250ms (+250ms of slack)", code, body, took)
	}
	t.Logf("a's hung call: %d %s after %v", code, strings.TrimSpace(body), took.Round(time.Millisecond))

	// 3. acme's worker reported hung and was killed: its third failure
	// quarantines acme.
	var hung workerJSON
	pollFor(t, limit, "acme's worker killed for its hang", func() (bool, string) {
		ws, body := workers()
		hung = ws["gpu0-acme"]
		return ws != nil && hung.Hangs == 1 && hung.LastExit != nil && hung.LastExit.PID == hungPID, body
	})
	if e := hung.LastExit; !e.Killed || e.Synthetic || !strings.Contains(e.Cause, "hung on device gpu0") || e.KilledAt.IsZero() {
		t.Errorf("acme's worker's exit %+v; want killed by the supervisor for its hang, reported", *e)
	} else {
		t.Logf("acme's hung worker: SIGKILL %v after the call began, reaped %v later", e.KilledAt.Sub(callAt).Round(time.Millisecond), e.Time.Sub(e.KilledAt).Round(time.Microsecond))
		if e.KilledAt.Sub(callAt) > 300*time.Millisecond+time.Second {
			t.Errorf("SIGKILL %v after the hung call began; want about its deadline (300ms) + hang_grace (100ms), far from fence_timeout (30s)", e.KilledAt.Sub(callAt))
		}
	}
	pollFor(t, limit, "acme quarantined lattice-wide", func() (bool, string) {
		code, body := call("a")
		return code == 503 && strings.Contains(body, `"class": "unavailable"`) && strings.Contains(body, "tenant acme is quarantined lattice-wide") &&
			strings.Contains(body, "failures of its workers within 10m0s (max_failures 3"), body
	})
	// acme's worker restarts again (with backoff), quarantined or not.
	pollFor(t, limit, "acme's worker restarted after it ended itself", func() (bool, string) {
		ws, body := workers()
		return ws != nil && ws["gpu0-acme"].Restarts >= 3 && ws["gpu0-acme"].State == "ready", body
	})
	close(done)
	wg.Wait()
	after, wbody := workers()
	if after["gpu0"].PID != before["gpu0"].PID || after["gpu0-beta"].PID != before["gpu0-beta"].PID || after["gpu0"].Restarts != 0 || after["gpu0-beta"].Restarts != 0 {
		t.Errorf("the shared or beta's worker restarted: %s", wbody)
	}
	if a := after["gpu0-acme"]; a.Hangs != 1 || a.Restarts < 3 {
		t.Errorf("acme's worker: %d hangs, %d restarts; want 1, ≥3: %s", a.Hangs, a.Restarts, wbody)
	}
	mu.Lock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	n := len(lat)
	mu.Unlock()
	if failN.Load() != 0 || n == 0 {
		t.Errorf("b and shared: %d calls failed (last %v), %d answered", failN.Load(), lastErr.Load(), n)
	} else {
		t.Logf("b and shared during acme's failures: %d calls, 0 errors, p50 %v, p99 %v", n, lat[n/2], lat[n*99/100])
	}
	if !strings.Contains(out.String(), "tenant acme quarantined lattice-wide") {
		t.Errorf("stdout:\n%s", out.String())
	}
	sv.stop(t)
}

// TestServeSuperviseTenantWorkerEnds: a tenant's worker that ends during
// a call (SIGKILL) has the call answered 503 unavailable with a message
// that names the worker and not its socket nor the connection's error
// (those are in the supervisor's log); the calls made after it are
// answered once the worker is back, never device_lost. Each worker's
// stdout lines name the worker, not its device.
func TestServeSuperviseTenantWorkerEnds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path := filepath.Join(t.TempDir(), "tenants.toml")
	// a's calls hang (until its deadline, 20s) in acme's first worker.
	write := func(hang bool) {
		tenantsManifest(t, path, hang)
		body, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(strings.Replace(string(body), `deadline = "300ms"`, `deadline = "20s"`, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(true)
	sv := startSupervised(t, path, 30*time.Second)
	const limit = 20 * time.Second
	var ws map[string]workerJSON
	pollFor(t, limit, "the three workers ready", func() (bool, string) {
		var body string
		ws, body = sv.workers()
		return len(ws) == 3 && ws["gpu0"].State == "ready" && ws["gpu0-acme"].State == "ready" && ws["gpu0-beta"].State == "ready", body
	})
	type answer struct {
		code int
		body string
	}
	inFlight := make(chan answer, 1)
	go func() {
		code, body := sv.run("a", nil)
		inFlight <- answer{code, body}
	}()
	pollFor(t, limit, "a's call in flight", func() (bool, string) {
		code, body := sv.get("/v1/sessions/a")
		return code == 200 && strings.Contains(body, `"in_flight": 1`), body
	})
	write(false) // the next worker of acme's serves a
	if err := syscall.Kill(ws["gpu0-acme"].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a := <-inFlight
	if a.code != 503 || !strings.Contains(a.body, `"class": "unavailable"`) ||
		!strings.Contains(a.body, `its worker gpu0-acme ended during the call; the call may have run`) ||
		strings.Contains(a.body, ".sock") || strings.Contains(a.body, "unix") {
		t.Errorf("the call in flight: %d %s", a.code, a.body)
	}
	// The calls after the kill: 200 once acme's worker is back; before
	// that unavailable, never device_lost.
	pollFor(t, limit, "a served again", func() (bool, string) {
		code, body := sv.run("a", nil)
		if code != 200 && !strings.Contains(body, `"class": "unavailable"`) {
			t.Errorf("a call after the kill: %d %s", code, body)
		}
		return code == 200 && body == "ok", body
	})
	if !strings.Contains(sv.stderr.String(), `msg="local call: the worker's connection failed" worker=gpu0-acme session=a`) {
		t.Errorf("no log line of the broken connection in the supervisor's stderr:\n%s", sv.stderr.String())
	}
	// stdout after the serving line: acme's second worker's joined line
	// (the first workers' may come before the serving line), and every
	// worker's stopped line.
	out := sv.stopAll(t)
	for _, want := range []string{
		"worker gpu0-acme joined lattice stagehost as host sv-gpu0-acme (1 session, 0 resident sessions)",
		"worker gpu0 stopped: SIGTERM",
		"worker gpu0-acme stopped: SIGTERM",
		"worker gpu0-beta stopped: SIGTERM",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout has no %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "worker gpu0 ") && l != "worker gpu0 stopped: SIGTERM" && !strings.HasPrefix(l, "worker gpu0 joined lattice stagehost as host sv-gpu0 (") {
			t.Errorf("a line of another worker's under gpu0's name: %q", l)
		}
	}
}
