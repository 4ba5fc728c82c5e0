package service_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
)

// swapLattice is a fakeLattice with model control: it records each swap
// and answers it, or with err.
type swapLattice struct {
	*fakeLattice
	swaps []string // session|ref|host_only|deadline set
	err   error
}

func (l *swapLattice) SwapSession(ctx context.Context, session, ref string, hostOnly bool) (lattice.SwapAnswer, error) {
	_, dl := ctx.Deadline()
	l.swaps = append(l.swaps, strings.Join([]string{session, ref, boolString(hostOnly), boolString(dl)}, "|"))
	if l.err != nil {
		return lattice.SwapAnswer{}, l.err
	}
	return lattice.SwapAnswer{Session: session, To: ref, HostOnly: hostOnly, Revision: 3,
		Hosts: []lattice.SwapHost{{ID: "h1", Acknowledged: true}}}, nil
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// TestSwapRouteInALattice: in a lattice, POST /v1/sessions/{name}/swap
// goes to the lattice's model control, lattice-wide unless host_only,
// for a session another host serves too; its errors keep their class.
func TestSwapRouteInALattice(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	l := &swapLattice{fakeLattice: &fakeLattice{}}
	s.srv.SetLattice(l)
	rec := s.do("POST", "/v1/sessions/far/swap", strings.NewReader(`{"stage": "good"}`))
	var ans lattice.SwapAnswer
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &ans) != nil || ans.Revision != 3 || ans.HostOnly || l.swaps[0] != "far|good|false|false" {
		t.Fatalf("lattice-wide: %d %s %v", rec.Code, rec.Body, l.swaps)
	}
	rec = s.do("POST", "/v1/sessions/pooled/swap", strings.NewReader(`{"stage": "good", "host_only": true, "timeout": "5s"}`))
	if rec.Code != 200 || l.swaps[1] != "pooled|good|true|true" {
		t.Fatalf("host only: %d %s %v", rec.Code, rec.Body, l.swaps)
	}
	if rec := s.do("POST", "/v1/sessions/pooled/swap", strings.NewReader(`{"stage": "good", "timeout": "soon"}`)); rec.Code != 400 || len(l.swaps) != 2 {
		t.Fatalf("bad timeout: %d %s", rec.Code, rec.Body)
	}
	l.err = &errdefs.RemoteError{Class: errdefs.ClassDeadlineExceeded, Message: "not acknowledged within the deadline by host h2"}
	if rec := s.do("POST", "/v1/sessions/far/swap", strings.NewReader(`{"stage": "good"}`)); rec.Code != 504 || !strings.Contains(rec.Body.String(), "host h2") {
		t.Fatalf("timed out: %d %s", rec.Code, rec.Body)
	}
}
