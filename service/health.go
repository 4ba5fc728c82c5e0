package service

import (
	"fmt"
	"net/http"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
)

// Readiness reports whether the service should be sent traffic: not while
// it starts (before [Server.Attach]) or drains after SIGTERM, nor while a device is lost, nor while
// a session's quarantined or failed share of instances is above
// Config.ReadyQuarantinedShare; on a supervisor ([Server.SetWorkers]),
// not while no worker is ready (those that are not are listed in
// Degraded).
func (s *Server) Readiness() deploy.Readiness {
	if s.state.Load() == stateDraining {
		return deploy.Readiness{Status: "draining", Reasons: []string{"the service is shutting down (SIGTERM)"}}
	}
	if !s.attached.Load() {
		return deploy.Readiness{Status: "starting", Reasons: []string{"the service is starting: loading modules and creating sessions"}}
	}
	var reasons, degraded []string
	if wk := s.workersOf(); wk != nil {
		reasons, degraded = workersReadiness(wk) // workers_http.go
	}
	for _, name := range s.d.DeviceNames() {
		if err := s.d.DeviceErr(name); err != nil {
			reasons = append(reasons, fmt.Sprintf("device %s is lost: %s", name, deploy.PublicMessage(err)))
		}
	}
	if l := s.latticeOf(); l != nil {
		if err := l.Ready(); err != nil {
			reasons = append(reasons, "lattice: "+err.Error())
		}
	}
	for _, st := range s.d.Statuses() {
		instances, bad := max(len(st.Instances), 1), st.InstancesOut
		if st.State == "failed" {
			bad = instances // could not be created: no instance serves
		}
		if bad == 0 {
			continue
		}
		if share := float64(bad) / float64(instances); share > s.cfg.ReadyQuarantinedShare {
			if instances == 1 {
				reasons = append(reasons, fmt.Sprintf("session %s is %s: %s", st.Name, st.State, firstLine(st.Reason)))
			} else {
				reasons = append(reasons, fmt.Sprintf("session %s has %d of %d instances out of service: %s", st.Name, bad, instances, firstLine(st.Reason)))
			}
		}
	}
	if len(reasons) > 0 {
		return deploy.Readiness{Status: "not_ready", Reasons: reasons, Degraded: degraded}
	}
	return deploy.Readiness{Ready: true, Status: "ready", Degraded: degraded}
}

func firstLine(s string) string {
	return deploy.PublicMessage(&serviceError{msg: s})
}

func (s *Server) ready(w http.ResponseWriter, _ *http.Request) {
	rd := s.Readiness()
	status := http.StatusOK
	if !rd.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, rd)
}

// sessionReadiness is the body of /v1/sessions/{name}/ready.
type sessionReadiness struct {
	Name   string `json:"name"`
	Ready  bool   `json:"ready"`
	State  string `json:"state"` // the session's state, as in /v1/sessions
	Reason string `json:"reason,omitempty"`
}

func (s *Server) sessionReady(w http.ResponseWriter, r *http.Request) {
	if wk := s.workersOf(); wk != nil {
		s.supervisorSession(w, r, wk, true)
		return
	}
	sess := s.d.Pool(r.PathValue("name"))
	if sess == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no session %q", r.PathValue("name")))
		return
	}
	st := sess.Status()
	rd := sessionReadiness{Name: st.Name, State: st.State, Ready: st.State == "ready"}
	if !rd.Ready {
		rd.Reason = firstLine(st.Reason)
	} else if dev, err := s.lostDevices(st); err != nil {
		rd.Ready, rd.Reason = false, fmt.Sprintf("device %s is lost: %s", dev, deploy.PublicMessage(err))
	} else if s.state.Load() == stateDraining {
		rd.Ready, rd.Reason = false, "the service is shutting down (SIGTERM)"
	}
	status := http.StatusOK
	if !rd.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, rd)
}

// lostDevices returns nil when at least one of a session's instances in
// service runs on a healthy device; else a lost device of the session
// and its error.
func (s *Server) lostDevices(st deploy.SessionStatus) (string, error) {
	var dev string
	var lost error
	for _, in := range st.Instances {
		if in.State != "ready" {
			continue
		}
		err := s.d.DeviceErr(in.Device)
		if err == nil {
			return "", nil
		}
		if lost == nil {
			dev, lost = in.Device, err
		}
	}
	return dev, lost
}
