package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
)

// latticeManifest writes a manifest with a [lattice] table and sessions
// of the good stage (one per name in good, on gpu0) and "liar" (its
// fence lies: a call quarantines its instance; gpu1 hangs under it).
func latticeManifest(t *testing.T, lattice string, good ...string) string {
	t.Helper()
	goodPath, goodSHA := hostileModule(t, "good_stage")
	liarPath, liarSHA := hostileModule(t, "lying_fence")
	var sb strings.Builder
	fmt.Fprintf(&sb, `version = 1
[runtime]
cache_dir = "off"
%s
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device]]
name = "gpu1"
backend = "sim"
engine = "gpu"
[[device.sim.fault]]
kind = "hang"
session = "liar"
[[module]]
name = "good"
path = %q
sha256 = %q
[[module]]
name = "lying_fence"
path = %q
sha256 = %q
[[session]]
name = "liar"
stage = "lying_fence"
device = "gpu1"
programs = ["noop"]
`, lattice, goodPath, goodSHA, liarPath, liarSHA)
	for _, name := range good {
		fmt.Fprintf(&sb, "[[session]]\nname = %q\nstage = \"good\"\ndevice = \"gpu0\"\nprograms = [\"noop\"]\n", name)
	}
	path := filepath.Join(t.TempDir(), "lattice.toml")
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// freePort returns a loopback TCP port free at the time of the call.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// pollFor polls f (an HTTP request's observable answer) until it holds,
// or fails the test at the deadline with the last answer.
func pollFor(t *testing.T, limit time.Duration, what string, f func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	last := ""
	if testutil.Poll(limit, func() bool {
		ok, got := f()
		last = got
		return ok
	}) {
		return time.Since(start)
	}
	t.Fatalf("%s: not within %v; last answer: %s", what, limit, last)
	return 0
}

// TestServeLattice runs two `stagehost serve` on loopback in one
// lattice: the first starts the embedded NATS server, the second
// connects to it. A call to the second for a session only the first has
// is answered by the first through the lattice; a module quarantined on
// one host is refused on the other until an admin clears it; when the
// first is killed, the second answers 503 unavailable for its session
// within the heartbeat TTL.
func TestServeLattice(t *testing.T) {
	port := freePort(t)
	const ttl = time.Second
	first := startServe(t, latticeManifest(t, fmt.Sprintf(`[lattice]
name = "e2e"
host_id = "first"
embedded = true
listen = "127.0.0.1:%d"
store_dir = %q
heartbeat_ttl = "1s"
fence_failures = 1
`, port, t.TempDir()), "only_first"), "--log-level", "debug")
	second := startServe(t, latticeManifest(t, fmt.Sprintf(`[lattice]
name = "e2e"
url = "nats://127.0.0.1:%d"
heartbeat_ttl = "1s"
fence_failures = 1
`, port), "own"), "--host-id", "second")

	// Through the lattice: the second has no session only_first.
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	a := second.request(nil, "POST", "/v1/sessions/only_first/run", strings.NewReader("x"),
		"traceparent", tp, "X-Request-Id", "lattice-e2e-1", "Stagehost-Deadline", "5s")
	if a.code != 200 || string(a.body) != "ok" {
		t.Fatalf("only_first through the second: %d %s", a.code, a.body)
	}
	var sessions struct {
		Sessions []struct {
			Name     string
			Outcomes map[string]uint64
		}
	}
	if err := json.Unmarshal(first.request(nil, "GET", "/v1/sessions", nil).body, &sessions); err != nil {
		t.Fatal(err)
	}
	okCount := uint64(0)
	for _, s := range sessions.Sessions {
		if s.Name == "only_first" {
			okCount = s.Outcomes["ok"]
		}
	}
	if okCount != 1 {
		t.Fatalf("the first's only_first outcomes: %+v, want ok 1", sessions)
	}
	// /v1/sessions stays local; an unknown session is 404; the lattice
	// routes and metrics.
	if b := string(second.request(nil, "GET", "/v1/sessions", nil).body); strings.Contains(b, "only_first") || !strings.Contains(b, `"own"`) {
		t.Errorf("the second's /v1/sessions is not local: %s", b)
	}
	if a := second.request(nil, "POST", "/v1/sessions/nope/run", strings.NewReader("x")); a.code != 404 || a.errBody(t).Class != "not_found" {
		t.Errorf("unknown session: %d %s", a.code, a.body)
	}
	if b := string(second.request(nil, "GET", "/v1/lattice/hosts", nil).body); !strings.Contains(b, `"id": "first"`) || !strings.Contains(b, `"id": "second"`) {
		t.Errorf("/v1/lattice/hosts: %s", b)
	}
	if b := string(second.request(nil, "GET", "/metrics", nil).body); !strings.Contains(b, `stagehost_lattice_calls_total{route="remote"} 1`) ||
		!strings.Contains(b, "stagehost_lattice_connected 1") {
		t.Errorf("metrics: %s", grepLines(b, "stagehost_lattice"))
	}

	// Shared quarantine: the liar's call on the second quarantines its
	// instance, and with fence_failures = 1 its module lattice-wide.
	if a := second.request(nil, "POST", "/v1/sessions/liar/run", strings.NewReader("x")); a.code != 503 || a.errBody(t).Class != "device_lost" {
		t.Fatalf("liar on the second: %d %s", a.code, a.body)
	}
	// Wait for the first's view through its admin route, not by calling
	// the liar: a call that came before the poison would run (and
	// quarantine) the first's own liar instance.
	var q struct {
		Quarantine []struct{ SHA256, Reason, Host, Session string }
	}
	pollFor(t, 5*time.Second, "the first lists the quarantined module", func() (bool, string) {
		b := first.request(nil, "GET", "/v1/lattice/quarantine", nil).body
		q.Quarantine = nil
		return json.Unmarshal(b, &q) == nil && len(q.Quarantine) > 0, string(b)
	})
	if len(q.Quarantine) != 1 || q.Quarantine[0].Host != "second" || q.Quarantine[0].Session != "liar" || q.Quarantine[0].Reason == "" {
		t.Fatalf("quarantine: %+v", q)
	}
	if a := first.request(nil, "POST", "/v1/sessions/liar/run", strings.NewReader("x")); a.code != 503 || !strings.Contains(string(a.body), "quarantined lattice-wide") {
		t.Fatalf("the first does not refuse the quarantined module: %d %s", a.code, a.body)
	}
	sha := q.Quarantine[0].SHA256
	if a := first.request(nil, "DELETE", "/v1/lattice/quarantine/"+sha, nil); a.code != 200 {
		t.Fatalf("clearing: %d %s", a.code, a.body)
	}
	if a := first.request(nil, "DELETE", "/v1/lattice/quarantine/"+strings.Repeat("0", 64), nil); a.code != 404 {
		t.Errorf("clearing a module not in it: %d %s", a.code, a.body)
	}
	// Cleared: the first runs its own liar instance again (its fence
	// lies, so the call fails device_lost: it ran).
	if a := first.request(nil, "POST", "/v1/sessions/liar/run", strings.NewReader("x")); a.code != 503 || a.errBody(t).Class != "device_lost" {
		t.Fatalf("liar on the first after clearing: %d %s", a.code, a.body)
	}

	// Kill the first (and its NATS server): within the TTL the second
	// answers 503 unavailable for only_first, and is not ready.
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()
	took := pollFor(t, 3*ttl, "only_first refused after the first died", func() (bool, string) {
		a := second.request(nil, "POST", "/v1/sessions/only_first/run", strings.NewReader("x"), "Stagehost-Deadline", "500ms")
		return a.code == 503 && a.errBody(t).Class == "unavailable", fmt.Sprintf("%d %s", a.code, a.body)
	})
	if took > ttl+500*time.Millisecond {
		t.Errorf("refused %v after the kill, want within the TTL %v", took, ttl)
	}
	if a := second.request(nil, "GET", "/readyz", nil); a.code != 503 || !strings.Contains(string(a.body), "lattice:") {
		t.Errorf("/readyz of the disconnected second: %d %s", a.code, a.body)
	}
	if a := second.request(nil, "POST", "/v1/sessions/own/run", strings.NewReader("x")); a.code != 200 {
		t.Errorf("a local session without the lattice: %d %s", a.code, a.body)
	}
	// The request id and traceparent reached the first's log.
	logs := first.stderr.String()
	if !regexp.MustCompile(`lattice call.*traceparent=` + tp + `.*request_id=lattice-e2e-1`).MatchString(logs) {
		t.Errorf("the first's log has no lattice call with the traceparent and request id:\n%s", grepLines(logs, "lattice"))
	}
	// SIGTERM with the lattice's server gone: leaving waits on nothing
	// that cannot be sent.
	t0 := time.Now()
	second.stop()
	if took := time.Since(t0); took > 3*time.Second {
		t.Errorf("the disconnected second took %v to stop", took)
	}
}

// TestServeLatticeExclusive runs three `stagehost serve` in one lattice:
// the first starts the embedded NATS server; the second and the third
// both have session solo with placement = "exclusive". The second joins
// first and holds it; the third stands by (its heartbeat says so in
// /v1/lattice/hosts) and sends calls to solo through the lattice to the
// second. On SIGTERM the second lets solo go, and the third serves it
// within a heartbeat TTL.
func TestServeLatticeExclusive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three serve processes")
	}
	port := freePort(t)
	const ttl = time.Second
	table := func(id, how string) string {
		return fmt.Sprintf("[lattice]\nname = \"ex\"\nhost_id = %q\n%s\nheartbeat_ttl = \"1s\"\nclaim_ttl = \"2s\"\n", id, how)
	}
	const solo = "[[session]]\nname = \"solo\"\nstage = \"good\"\ndevice = \"gpu0\"\nprograms = [\"noop\"]\nplacement = \"exclusive\"\n"
	startServe(t, latticeManifest(t, table("first", fmt.Sprintf("embedded = true\nlisten = \"127.0.0.1:%d\"\nstore_dir = %q", port, t.TempDir())), "own"))
	url := fmt.Sprintf("url = \"nats://127.0.0.1:%d\"", port)
	second := startServe(t, latticeManifest(t, table("second", url)+solo))
	third := startServe(t, latticeManifest(t, table("third", url)+solo))

	type hosts struct {
		Hosts []struct {
			ID       string
			Sessions []struct {
				Name, State, Reason, Placement string
				Serving                        bool
			}
		}
	}
	soloOf := func(s *server) map[string]string {
		var h hosts
		out := map[string]string{}
		if err := json.Unmarshal(s.request(nil, "GET", "/v1/lattice/hosts", nil).body, &h); err != nil {
			return out
		}
		for _, rec := range h.Hosts {
			for _, sc := range rec.Sessions {
				if sc.Name == "solo" && sc.Placement == "exclusive" {
					out[rec.ID] = fmt.Sprintf("%s serving=%v %s", sc.State, sc.Serving, sc.Reason)
				}
			}
		}
		return out
	}
	pollFor(t, 5*time.Second, "second holds solo, third stands by", func() (bool, string) {
		m := soloOf(third)
		return strings.HasPrefix(m["second"], "ready serving=true") &&
			strings.HasPrefix(m["third"], "standby serving=false placement is exclusive and held by host second"), fmt.Sprint(m)
	})
	for _, s := range []*server{second, third} {
		if a := s.request(nil, "POST", "/v1/sessions/solo/run", strings.NewReader("x")); a.code != 200 || string(a.body) != "ok" {
			t.Fatalf("solo: %d %s", a.code, a.body)
		}
	}
	if b := string(third.request(nil, "GET", "/metrics", nil).body); !strings.Contains(b, `stagehost_lattice_calls_total{route="remote"} 1`) {
		t.Errorf("the third's call to solo did not go through the lattice: %s", grepLines(b, "stagehost_lattice_calls"))
	}

	// SIGTERM the holder: the third takes solo over within a heartbeat.
	t0 := time.Now()
	second.stop()
	took := pollFor(t, 5*ttl, "the third serves solo", func() (bool, string) {
		a := third.request(nil, "POST", "/v1/sessions/solo/run", strings.NewReader("x"), "Stagehost-Deadline", "500ms")
		return a.code == 200, fmt.Sprintf("%d %s", a.code, a.body)
	})
	t.Logf("the third served solo %v after the second's SIGTERM", time.Since(t0))
	if took > ttl {
		t.Errorf("the third served solo %v after the holder's SIGTERM, want within the heartbeat TTL %v", took, ttl)
	}
	// Its heartbeat says so once the front's view has it (a moment after
	// the call could run).
	pollFor(t, 5*time.Second, "the third's heartbeat shows solo served", func() (bool, string) {
		m := soloOf(third)
		return strings.HasPrefix(m["third"], "ready serving=true"), fmt.Sprint(m)
	})
}
