package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
)

// oldJSON encodes v as the service did before the resident answers had
// types: a map, indented, with a final newline.
func oldJSON(t *testing.T, v map[string]any) string {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestResidentLattice: the resident routes answer a local resident as
// before, byte for byte; a resident this host lacks is forwarded to the
// lattice when it knows it (202 / 200 with the host's JSON, indented as
// the service's own), with the host's error class otherwise; 404 for a
// resident neither has.
func TestResidentLattice(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	res := s.d.Resident("pp")
	if _, err := res.Run(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Outside a lattice another host's resident is 404.
	for _, req := range [][2]string{{"GET", "/v1/residents/far-pp"}, {"POST", "/v1/residents/far-pp/start"}} {
		if rec := s.do(req[0], req[1], nil); rec.Code != 404 || errorBody(t, rec).Class != "not_found" {
			t.Fatalf("%s %s outside a lattice: %d %s", req[0], req[1], rec.Code, rec.Body)
		}
	}

	// The local resident's status, as the map of old encoded it, with
	// the runs' epoch.
	local := s.do("GET", "/v1/residents/pp", nil)
	epoch := res.Status().Epoch
	if epoch == "" {
		t.Fatal("a resident with no epoch")
	}
	want := oldJSON(t, map[string]any{"epoch": epoch, "resident": res.Spec.Name, "rounds": res.Spec.Rounds,
		"max_runs": res.Spec.MaxRuns, "history": res.Spec.History, "running": res.Running(), "runs": res.Runs(),
		"quarantined": res.Quarantined(), "max_quarantined": res.Spec.MaxQuarantined})
	if local.Code != 200 || local.Body.String() != want {
		t.Fatalf("local status: %d\n%s\nwant\n%s", local.Code, local.Body, want)
	}

	f := &fakeLattice{}
	s.srv.SetLattice(f)
	// Another host's status: its compact JSON, written as the service's
	// own (the same bytes as the local resident's).
	var err error
	if f.status, err = json.Marshal(res.Status()); err != nil {
		t.Fatal(err)
	}
	rec := s.do("GET", "/v1/residents/far-pp", nil, "X-Request-Id", "rid-status")
	if rec.Code != 200 || rec.Body.String() != want || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("forwarded status: %d %v\n%s\nwant\n%s", rec.Code, rec.Header(), rec.Body, want)
	}
	rec = s.do("POST", "/v1/residents/far-pp/start", nil, "X-Request-Id", "rid-start")
	if rec.Code != 202 || rec.Body.String() != oldJSON(t, map[string]any{"resident": "far-pp", "id": 7, "state": "running"}) {
		t.Fatalf("forwarded start: %d %s", rec.Code, rec.Body)
	}
	if got := strings.Join(f.residents, " "); got != "status|far-pp|rid-status start|far-pp|rid-start" {
		t.Fatalf("lattice requests: %s", got)
	}

	// The local resident stays local, its start answer as before.
	rec = s.do("POST", "/v1/residents/pp/start", nil)
	if rec.Code != 202 || rec.Body.String() != oldJSON(t, map[string]any{"epoch": epoch, "resident": "pp", "id": 2, "state": "running"}) {
		t.Fatalf("local start: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/v1/residents/pp", nil); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"id": 2`) {
		t.Fatalf("local status after a start: %d %s", rec.Code, rec.Body)
	}
	if len(f.residents) != 2 {
		t.Fatalf("a local resident went to the lattice: %v", f.residents)
	}

	// A resident no host has is 404.
	for _, req := range [][2]string{{"GET", "/v1/residents/nowhere"}, {"POST", "/v1/residents/nowhere/start"}} {
		rec := s.do(req[0], req[1], nil)
		if e := errorBody(t, rec); rec.Code != 404 || e.Class != "not_found" || !strings.Contains(e.Error, "any live host of its lattice") {
			t.Fatalf("%s %s: %d %s", req[0], req[1], rec.Code, rec.Body)
		}
	}

	// The host's errors keep their class.
	f.answer = &errdefs.RemoteError{Class: errdefs.ClassBusy, Message: `resident "far-pp" already has its max_runs of 4 runs running`, Host: "h1"}
	rec = s.do("POST", "/v1/residents/far-pp/start", nil)
	if e := errorBody(t, rec); rec.Code != 429 || e.Class != "busy" || !strings.Contains(e.Error, "max_runs") || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("busy: %d %s", rec.Code, rec.Body)
	}
	f.answer = &errdefs.RemoteError{Class: errdefs.ClassUnavailable, Message: `resident "far-pp" is on no live host of lattice l`}
	rec = s.do("GET", "/v1/residents/far-pp", nil)
	if e := errorBody(t, rec); rec.Code != 503 || e.Class != "unavailable" || !strings.Contains(e.Error, "no live host") {
		t.Fatalf("unavailable: %d %s", rec.Code, rec.Body)
	}
	f.answer = nil
	f.status = []byte("not json")
	rec = s.do("GET", "/v1/residents/far-pp", nil)
	if e := errorBody(t, rec); rec.Code != 500 || e.Class != "internal" {
		t.Fatalf("an answer that is not JSON: %d %s", rec.Code, rec.Body)
	}
}
