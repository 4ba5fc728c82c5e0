package service

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/supervise"
)

// Workers is what the HTTP service of a supervisor (`stagehost serve
// --supervise`, docs/lattice.md) needs of its workers and of the
// sessions they serve through the lattice: `serve` sets it with
// [Server.SetWorkers], over package supervise and the lattice's front,
// so that this package imports neither.
type Workers interface {
	// WorkerStates lists each worker's state, for /readyz and /metrics.
	WorkerStates() []WorkerState
	// WorkerStatus is the body's "workers" of GET /v1/workers: the
	// supervisor's full status of each worker.
	WorkerStatus() []supervise.WorkerStatus
	// Sessions lists the sessions the lattice serves, by the front's view
	// of the live hosts' heartbeats (and the manifest's sessions none
	// serves now).
	Sessions() []LatticeSessionStatus
}

// WorkerState is one worker of a supervisor, as readiness and metrics
// see it.
type WorkerState struct {
	Name   string
	Tenant string // the tenant whose sessions it serves; "" for a device's shared worker
	Ready  bool   // its process reported ready and runs
	State  string // supervise's state: starting, ready, restarting, backing_off, stopping, stopped
	// Reason is why it is not ready, when it is not.
	Reason         string
	Restarts       int
	SyntheticExits int
	DeviceLosses   int
	Hangs          int // hung reports: processes killed for device work past a call's deadline
}

// LatticeSessionStatus is the status of one manifest session as a
// supervisor's workers serve it: one row of its /v1/sessions, summed over
// the live hosts' heartbeats (a single host lists [deploy.SessionStatus]
// rows instead).
type LatticeSessionStatus struct {
	Name string `json:"name"`
	// State is "ready" while a live host (a worker) serves the session,
	// else "unavailable", with Reason.
	State  string   `json:"state"`
	Reason string   `json:"reason,omitempty"`
	Hosts  []string `json:"hosts"` // the live hosts that serve it
	// Sums over those hosts' heartbeats.
	Instances int `json:"instances"`
	Free      int `json:"free"`
	InFlight  int `json:"in_flight"`
	Waiting   int `json:"waiting"`
	// HostOutcomes counts each live host's calls of the session since
	// that host started, by outcome ("ok" or an error class), from its
	// heartbeat: a worker that restarts counts from 0 again.
	HostOutcomes map[string]map[string]uint64 `json:"host_outcomes"`
}

type workersBox struct{ w Workers }

// SetWorkers makes the service a supervisor's: GET /v1/workers lists w's
// workers, /v1/sessions the sessions the lattice serves, /readyz is not
// ready only while no worker is ready (the others are listed in
// "degraded"), and /metrics adds the workers' stagehost_worker_* series.
// Call it once, after [Server.Attach] and with [Server.SetLattice].
func (s *Server) SetWorkers(w Workers) {
	s.registry.MustRegister(workersCollector{w})
	s.workers.Store(&workersBox{w})
	// A supervisor's front knows the sessions its workers report.
	if f, ok := s.latticeOf().(supervisedFront); ok {
		if v, ok := w.(*workerView); ok {
			f.view.Store(v)
		}
	}
}

func (s *Server) workersOf() Workers {
	if b := s.workers.Load(); b != nil {
		return b.w
	}
	return nil
}

var errNoWorkers = &serviceError{errdefs.ClassNotFound, "this process supervises no workers (serve --supervise)"}

func (s *Server) listWorkers(w http.ResponseWriter, r *http.Request) {
	wk := s.workersOf()
	if wk == nil {
		s.writeError(w, r, errNoWorkers)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"workers": wk.WorkerStatus()})
}

// latticeSession finds a session of the supervisor's view, or nil.
func latticeSession(wk Workers, name string) *LatticeSessionStatus {
	for _, ls := range wk.Sessions() {
		if ls.Name == name {
			return &ls
		}
	}
	return nil
}

// supervisorSession answers GET /v1/sessions/{name} and its /ready on a
// supervisor.
func (s *Server) supervisorSession(w http.ResponseWriter, r *http.Request, wk Workers, ready bool) {
	name := r.PathValue("name")
	ls := latticeSession(wk, name)
	if ls == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no session %q on any live host of the lattice", name))
		return
	}
	if !ready {
		writeJSON(w, http.StatusOK, ls)
		return
	}
	rd := sessionReadiness{Name: ls.Name, State: ls.State, Ready: ls.State == "ready", Reason: ls.Reason}
	if rd.Ready && s.state.Load() == stateDraining {
		rd.Ready, rd.Reason = false, "the service is shutting down (SIGTERM)"
	}
	status := http.StatusOK
	if !rd.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, rd)
}

// workersReadiness is the supervisor's rule: not ready only while no
// worker is ready; each worker that is not is listed in degraded.
func workersReadiness(wk Workers) (reasons, degraded []string) {
	states := wk.WorkerStates()
	ready := 0
	for _, st := range states {
		if st.Ready {
			ready++
			continue
		}
		line := fmt.Sprintf("worker %s is %s", st.Name, st.State)
		if st.Reason != "" {
			line += ": " + firstLine(st.Reason)
		}
		degraded = append(degraded, line)
	}
	if ready == 0 {
		reasons = append(reasons, "no worker is ready ("+strings.Join(degraded, "; ")+")")
	}
	return reasons, degraded
}

var (
	workerUp = prometheus.NewDesc("stagehost_worker_up",
		"1 while the supervisor's worker is ready; 0 while it starts, restarts or backs off.", []string{"worker"}, nil)
	workerRestarts = prometheus.NewDesc("stagehost_worker_restarts_total",
		"Restarts of the supervisor's worker.", []string{"worker"}, nil)
	workerSynthetic = prometheus.NewDesc("stagehost_worker_synthetic_exits_total",
		"Exits of the worker it did not report (a crash, a kill): synthetic exits.", []string{"worker"}, nil)
	workerLosses = prometheus.NewDesc("stagehost_worker_device_losses_total",
		"Device losses the worker reported.", []string{"worker"}, nil)
	workerHangs = prometheus.NewDesc("stagehost_worker_hangs_total",
		"Hangs the worker reported (a call's device work past its deadline and the tenant's hang_grace), each ending its process with SIGKILL.", []string{"worker"}, nil)
)

// The sessions' series of a supervisor, from the workers' heartbeats.
var (
	latticeSessionUp = prometheus.NewDesc("stagehost_lattice_session_up",
		"1 while a live worker (host) serves the session, else 0.", []string{"session"}, nil)
	latticeSessionRuns = prometheus.NewDesc("stagehost_lattice_session_runs_total",
		"Session runs on each live host since that host started, by outcome (ok, or an error class), from its heartbeat.", []string{"session", "host", "outcome"}, nil)
	latticeSessionInFlight = prometheus.NewDesc("stagehost_lattice_session_in_flight",
		"Calls of the session on the live hosts that serve it, waiting for an instance or running.", []string{"session"}, nil)
	latticeSessionWaiting = prometheus.NewDesc("stagehost_lattice_session_waiting",
		"Calls of the session waiting for an instance on the live hosts that serve it.", []string{"session"}, nil)
)

type workersCollector struct{ w Workers }

func (c workersCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- workerUp
	ch <- workerRestarts
	ch <- workerSynthetic
	ch <- workerLosses
	ch <- workerHangs
	ch <- latticeSessionUp
	ch <- latticeSessionRuns
	ch <- latticeSessionInFlight
	ch <- latticeSessionWaiting
}

func (c workersCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.w.WorkerStates() {
		up := 0.0
		if st.Ready {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(workerUp, prometheus.GaugeValue, up, st.Name)
		ch <- prometheus.MustNewConstMetric(workerRestarts, prometheus.CounterValue, float64(st.Restarts), st.Name)
		ch <- prometheus.MustNewConstMetric(workerSynthetic, prometheus.CounterValue, float64(st.SyntheticExits), st.Name)
		ch <- prometheus.MustNewConstMetric(workerLosses, prometheus.CounterValue, float64(st.DeviceLosses), st.Name)
		ch <- prometheus.MustNewConstMetric(workerHangs, prometheus.CounterValue, float64(st.Hangs), st.Name)
	}
	for _, ls := range c.w.Sessions() {
		up := 0.0
		if ls.State == "ready" {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(latticeSessionUp, prometheus.GaugeValue, up, ls.Name)
		ch <- prometheus.MustNewConstMetric(latticeSessionInFlight, prometheus.GaugeValue, float64(ls.InFlight), ls.Name)
		ch <- prometheus.MustNewConstMetric(latticeSessionWaiting, prometheus.GaugeValue, float64(ls.Waiting), ls.Name)
		for host, outcomes := range ls.HostOutcomes {
			for outcome, n := range outcomes {
				ch <- prometheus.MustNewConstMetric(latticeSessionRuns, prometheus.CounterValue, float64(n), ls.Name, host, outcome)
			}
		}
	}
}
