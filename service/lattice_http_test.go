package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/requestid"
	"github.com/stagehost/stagehost/manifest"
)

// fakeLattice is a service.Lattice that knows the session "far" and
// answers it with a remote error or "far ok".
type fakeLattice struct {
	mu      sync.Mutex
	ready   error
	calls   []string // session|traceparent|request id
	cleared []string
	answer  error
	made    string // the traceparent it "sends" when ctx has none
	// resident requests: op|resident|request id; status is the status
	// answer of resident "far-pp".
	residents []string
	status    []byte
	// deadlines: each call's context deadline, as time left when it
	// was routed (-1: none).
	deadlines []time.Duration
	// quarantined is what Quarantined lists.
	quarantined []lattice.Poison
}

func (f *fakeLattice) Call(ctx context.Context, session string, input []byte) ([]byte, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	hdr := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, hdr)
	tp := hdr.Get("traceparent")
	f.calls = append(f.calls, session+"|"+tp+"|"+requestid.FromContext(ctx))
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	f.deadlines = append(f.deadlines, left)
	if tp == "" {
		tp = f.made // as a front makes one
	}
	if f.answer != nil {
		return nil, tp, f.answer
	}
	return []byte(session + " ok"), tp, nil
}
func (f *fakeLattice) Known(session string) bool { return session == "far" }

// StartResident starts run 7 of resident "far-pp" (or answers f.answer).
func (f *fakeLattice) StartResident(ctx context.Context, resident string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.residents = append(f.residents, "start|"+resident+"|"+requestid.FromContext(ctx))
	if f.answer != nil {
		return nil, f.answer
	}
	return []byte(`{"id":7,"resident":"` + resident + `","state":"running"}`), nil
}
func (f *fakeLattice) ResidentStatus(ctx context.Context, resident string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.residents = append(f.residents, "status|"+resident+"|"+requestid.FromContext(ctx))
	if f.answer != nil {
		return nil, f.answer
	}
	return f.status, nil
}
func (f *fakeLattice) KnownResident(resident string) bool { return resident == "far-pp" }
func (f *fakeLattice) Ready() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready
}
func (f *fakeLattice) Hosts() []lattice.HostRecord   { return []lattice.HostRecord{{ID: "h1"}} }
func (f *fakeLattice) Quarantined() []lattice.Poison { return f.quarantined }
func (f *fakeLattice) Clear(_ context.Context, sha string) (bool, error) {
	f.cleared = append(f.cleared, sha)
	return sha == strings.Repeat("a", 64), nil
}
func (f *fakeLattice) Stats() map[string]uint64 { return map[string]uint64{"remote": 7} }

func TestLatticeRoutes(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	// Outside a lattice the lattice routes are 404.
	if rec := s.do("GET", "/v1/lattice/hosts", nil); rec.Code != 404 || errorBody(t, rec).Class != "not_found" {
		t.Fatalf("no lattice: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("POST", "/v1/sessions/far/run", strings.NewReader("x")); rec.Code != 404 {
		t.Fatalf("no lattice, remote session: %d %s", rec.Code, rec.Body)
	}
	f := &fakeLattice{}
	s.srv.SetLattice(f)
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	rec := s.do("POST", "/v1/sessions/far/run", strings.NewReader("x"), "traceparent", tp, "X-Request-Id", "rid-1")
	if rec.Code != 200 || rec.Body.String() != "far ok" || f.calls[0] != "far|"+tp+"|rid-1" {
		t.Fatalf("routed: %d %s %v", rec.Code, rec.Body, f.calls)
	}
	if rec := s.do("POST", "/v1/sessions/nowhere/run", strings.NewReader("x")); rec.Code != 404 || errorBody(t, rec).Class != "not_found" {
		t.Fatalf("unknown: %d %s", rec.Code, rec.Body)
	}
	code := int32(3)
	f.answer = &errdefs.RemoteError{Class: errdefs.ClassClientError, Message: "stage failed with code 3", Host: "h1", Code: &code}
	rec = s.do("POST", "/v1/sessions/far/run", strings.NewReader("x"))
	if e := errorBody(t, rec); rec.Code != 422 || e.Class != "client_error" || e.Code == nil || *e.Code != 3 {
		t.Fatalf("remote client error: %d %s", rec.Code, rec.Body)
	}
	f.answer = &errdefs.RemoteError{Class: errdefs.ClassUnavailable, Message: "session \"far\" is served by no live host"}
	rec = s.do("POST", "/v1/sessions/far/run", strings.NewReader("x"))
	if e := errorBody(t, rec); rec.Code != 503 || e.Class != "unavailable" || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("unavailable: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/v1/lattice/hosts", nil); rec.Code != 200 || !strings.Contains(rec.Body.String(), "h1") {
		t.Fatalf("hosts: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("DELETE", "/v1/lattice/quarantine/xyz", nil); rec.Code != 400 {
		t.Fatalf("bad sha: %d %s", rec.Code, rec.Body)
	}
	for _, key := range []string{"tenant.", "tenant.a.b", "tenantacme"} {
		if rec := s.do("DELETE", "/v1/lattice/quarantine/"+key, nil); rec.Code != 400 {
			t.Fatalf("bad tenant entry %q: %d %s", key, rec.Code, rec.Body)
		}
	}
	if rec := s.do("DELETE", "/v1/lattice/quarantine/tenant.acme", nil); rec.Code != 404 || errorBody(t, rec).Error != "tenant acme is not in the lattice's quarantine" {
		t.Fatalf("a tenant not quarantined: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("DELETE", "/v1/lattice/quarantine/"+strings.Repeat("b", 64), nil); rec.Code != 404 || errorBody(t, rec).Error != "module "+strings.Repeat("b", 64)+" is not in the lattice's quarantine" {
		t.Fatalf("not quarantined: %d %s", rec.Code, rec.Body)
	}
	// The list: each entry's key in sha256, and its kind.
	if rec := s.do("GET", "/v1/lattice/quarantine", nil); rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{
  "quarantine": []
}` {
		t.Fatalf("an empty quarantine: %d %s", rec.Code, rec.Body)
	}
	at := time.Date(2026, 12, 3, 18, 0, 0, 0, time.UTC)
	f.quarantined = []lattice.Poison{
		{SHA256: strings.Repeat("c", 64), Reason: "a trap", Host: "h1", Session: "s", At: at},
		{SHA256: "tenant.acme", Reason: "3 failures", Host: "sv", At: at},
	}
	rec = s.do("GET", "/v1/lattice/quarantine", nil)
	var list struct {
		Quarantine []map[string]any
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || rec.Code != 200 || len(list.Quarantine) != 2 {
		t.Fatalf("quarantine: %d %s", rec.Code, rec.Body)
	}
	if m, tn := list.Quarantine[0], list.Quarantine[1]; m["sha256"] != strings.Repeat("c", 64) || m["kind"] != "module" || m["tenant"] != nil || m["session"] != "s" ||
		tn["sha256"] != "tenant.acme" || tn["kind"] != "tenant" || tn["tenant"] != "acme" || tn["reason"] != "3 failures" {
		t.Fatalf("quarantine entries: %s", rec.Body)
	}
	if rec := s.do("DELETE", "/v1/lattice/quarantine/"+strings.Repeat("a", 64), nil); rec.Code != 200 {
		t.Fatalf("clear: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/metrics", nil); !strings.Contains(rec.Body.String(), `stagehost_lattice_calls_total{route="remote"} 7`) {
		t.Fatalf("metrics lack the lattice counts")
	}
	if rec := s.do("GET", "/readyz", nil); rec.Code != 200 {
		t.Fatalf("ready: %d %s", rec.Code, rec.Body)
	}
	f.mu.Lock()
	f.ready = errors.New("disconnected from the NATS server of lattice l")
	f.mu.Unlock()
	if rec := s.do("GET", "/readyz", nil); rec.Code != 503 || !strings.Contains(rec.Body.String(), "lattice: disconnected") {
		t.Fatalf("not ready: %d %s", rec.Code, rec.Body)
	}
}

// specLattice is a supervisor's lattice: it routes session "far", which
// this process does not have, and knows its manifest spec.
type specLattice struct {
	*fakeLattice
	spec *manifest.Session
}

func (l specLattice) SessionSpec(session string) *manifest.Session {
	if session == "far" {
		return l.spec
	}
	return nil
}

// TestSupervisorAppliesTheSessionsMaxInput: a process that routes a
// session it does not have, but whose spec it knows (a supervisor's,
// deploy.sessionSpecs), refuses a body over the session's max_input with
// 413 out_of_budget naming that limit, before the call is routed, whether
// the body's length is declared or not; a body at the limit is routed.
func TestSupervisorAppliesTheSessionsMaxInput(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	f := &fakeLattice{}
	s.srv.SetLattice(specLattice{f, &manifest.Session{Name: "far", MaxInput: 8}})
	const want = `the request body of 9 bytes is larger than session "far"'s max_input of 8 bytes`
	rec := s.do("POST", "/v1/sessions/far/run", strings.NewReader("123456789"))
	if rec.Code != 413 {
		t.Fatalf("9 bytes with Content-Length: %d %s, want 413 with %q", rec.Code, rec.Body, want)
	}
	if e := errorBody(t, rec); e.Class != "out_of_budget" || !strings.Contains(e.Error, want) {
		t.Fatalf("9 bytes with Content-Length: %d %s, want 413 with %q", rec.Code, rec.Body, want)
	}
	// Without a Content-Length, the limit applies as the body is read.
	rec = s.do("POST", "/v1/sessions/far/run", io.MultiReader(strings.NewReader("123456789")))
	if rec.Code != 413 {
		t.Fatalf("9 bytes, chunked: %d %s, want 413", rec.Code, rec.Body)
	}
	if e := errorBody(t, rec); e.Class != "out_of_budget" || !strings.Contains(e.Error, `session "far"'s max_input`) {
		t.Fatalf("9 bytes, chunked: %d %s", rec.Code, rec.Body)
	}
	f.mu.Lock()
	routed := len(f.calls)
	f.mu.Unlock()
	if routed != 0 {
		t.Fatalf("a body over max_input was routed: %v", f.calls)
	}
	if rec := s.do("POST", "/v1/sessions/far/run", strings.NewReader("12345678")); rec.Code != 200 || rec.Body.String() != "far ok" {
		t.Fatalf("8 bytes: %d %s", rec.Code, rec.Body)
	}
	// Without the spec only the default max_input applies here.
	s = serveHostile(t, "", "", nil)
	s.srv.SetLattice(specLattice{f, nil})
	if rec := s.do("POST", "/v1/sessions/far/run", strings.NewReader("123456789")); rec.Code != 200 {
		t.Fatalf("9 bytes without a spec: %d %s", rec.Code, rec.Body)
	}
}

// TestLatticeCallCarriesTheSessionsDeadline: a call routed through the
// lattice has one deadline over its wait, trip and run: the
// Stagehost-Deadline header's where it is shorter, else the session's
// manifest deadline where this process knows the session, else none
// here (the front's default applies).
func TestLatticeCallCarriesTheSessionsDeadline(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	f := &fakeLattice{}
	s.srv.SetLattice(specLattice{fakeLattice: f, spec: &manifest.Session{Name: "far", MaxInput: 1 << 20, Deadline: 2 * time.Second}})
	for _, c := range []struct {
		hdr      []string
		min, max time.Duration
	}{
		{nil, time.Second, 2 * time.Second},
		{[]string{"Stagehost-Deadline", "500ms"}, 0, 500 * time.Millisecond},
		{[]string{"Stagehost-Deadline", "9s"}, time.Second, 2 * time.Second},
	} {
		if rec := s.do("POST", "/v1/sessions/far/run", strings.NewReader("x"), c.hdr...); rec.Code != 200 {
			t.Fatalf("%v: %d %s", c.hdr, rec.Code, rec.Body)
		}
		f.mu.Lock()
		left := f.deadlines[len(f.deadlines)-1]
		f.mu.Unlock()
		if left <= c.min || left > c.max {
			t.Errorf("%v: the call had %v left, want in (%v, %v]", c.hdr, left, c.min, c.max)
		}
	}
	// A session whose spec this process does not know: no deadline here.
	s2 := serveHostile(t, "", "", nil)
	f2 := &fakeLattice{}
	s2.srv.SetLattice(f2)
	if rec := s2.do("POST", "/v1/sessions/far/run", strings.NewReader("x")); rec.Code != 200 || f2.deadlines[0] != -1 {
		t.Fatalf("unknown spec: %d %s, deadline %v", rec.Code, rec.Body, f2.deadlines)
	}
}
