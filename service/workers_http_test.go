package service_test

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/internal/supervise"
	"github.com/stagehost/stagehost/service"
)

type fakeWorkers struct {
	mu     sync.Mutex
	states []service.WorkerState
}

func (f *fakeWorkers) set(states ...service.WorkerState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states = states
}

func (f *fakeWorkers) WorkerStates() []service.WorkerState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]service.WorkerState(nil), f.states...)
}
func (f *fakeWorkers) WorkerStatus() []supervise.WorkerStatus {
	return []supervise.WorkerStatus{{Name: "gpu0", PID: 42}}
}
func (f *fakeWorkers) Sessions() []service.LatticeSessionStatus {
	return []service.LatticeSessionStatus{
		{Name: "a", State: "ready", Hosts: []string{"h-gpu0"}, Instances: 1, Free: 1},
		{Name: "b", State: "unavailable", Reason: "no live host serves it", Hosts: []string{}},
	}
}

// TestWorkersRoutes: on a supervisor /v1/workers lists the workers,
// /v1/sessions the lattice's sessions, a session is ready while a live
// host serves it, /readyz is not ready only when no worker is (the others
// in degraded), and /metrics has the stagehost_worker_* series.
func TestWorkersRoutes(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	if rec := s.do("GET", "/v1/workers", nil); rec.Code != 404 || errorBody(t, rec).Class != "not_found" {
		t.Fatalf("no supervisor: %d %s", rec.Code, rec.Body)
	}
	f := &fakeWorkers{}
	up := service.WorkerState{Name: "gpu1", Ready: true, State: "ready"}
	down := service.WorkerState{Name: "gpu0", State: "backing_off", Reason: "device gpu0 lost: injected\nmore", Restarts: 2, SyntheticExits: 1, DeviceLosses: 1, Hangs: 4}
	f.set(down, up)
	s.srv.SetWorkers(f)

	if rec := s.do("GET", "/v1/workers", nil); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"pid": 42`) {
		t.Errorf("/v1/workers: %d %s", rec.Code, rec.Body)
	}
	var rd deploy.Readiness
	rec := s.do("GET", "/readyz", nil)
	if err := json.Unmarshal(rec.Body.Bytes(), &rd); err != nil || rec.Code != 200 || !rd.Ready ||
		len(rd.Degraded) != 1 || rd.Degraded[0] != "worker gpu0 is backing_off: device gpu0 lost: injected" {
		t.Errorf("one worker ready: %d %s", rec.Code, rec.Body)
	}
	f.set(down, service.WorkerState{Name: "gpu1", State: "starting"})
	rec = s.do("GET", "/readyz", nil)
	if err := json.Unmarshal(rec.Body.Bytes(), &rd); err != nil || rec.Code != 503 || rd.Ready || len(rd.Degraded) != 2 ||
		len(rd.Reasons) != 1 || !strings.HasPrefix(rd.Reasons[0], "no worker is ready") {
		t.Errorf("no worker ready: %d %s", rec.Code, rec.Body)
	}
	f.set(down, up)

	var list struct {
		Sessions []service.LatticeSessionStatus
	}
	rec = s.do("GET", "/v1/sessions", nil)
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || len(list.Sessions) != 2 || list.Sessions[0].Hosts[0] != "h-gpu0" {
		t.Errorf("/v1/sessions: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/v1/sessions/a", nil); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"h-gpu0"`) {
		t.Errorf("/v1/sessions/a: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/v1/sessions/a/ready", nil); rec.Code != 200 {
		t.Errorf("a served: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/v1/sessions/b/ready", nil); rec.Code != 503 || !strings.Contains(rec.Body.String(), "no live host") {
		t.Errorf("b served by none: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/v1/sessions/zz/ready", nil); rec.Code != 404 {
		t.Errorf("unknown session: %d %s", rec.Code, rec.Body)
	}
	body := s.do("GET", "/metrics", nil).Body.String()
	for _, want := range []string{`stagehost_worker_up{worker="gpu0"} 0`, `stagehost_worker_up{worker="gpu1"} 1`,
		`stagehost_worker_restarts_total{worker="gpu0"} 2`, `stagehost_worker_synthetic_exits_total{worker="gpu0"} 1`,
		`stagehost_worker_device_losses_total{worker="gpu0"} 1`, `stagehost_worker_hangs_total{worker="gpu0"} 4`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(body, "stagehost_worker"))
		}
	}
}
