package service

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/internal/supervise"
)

// workerRow is one worker of a supervisor on the status page and in
// GET /v1/status.
type workerRow struct {
	Name     string   `json:"name"`
	Tenant   string   `json:"tenant,omitempty"` // "" for a device's shared worker
	PID      int      `json:"pid,omitempty"`
	State    string   `json:"state"`
	Reason   string   `json:"reason,omitempty"` // why it is not ready, when it is not
	Restarts int      `json:"restarts"`
	Uptime   string   `json:"uptime,omitempty"`
	Devices  []string `json:"devices"`
	Sessions []string `json:"sessions"`
	// LastExit is how its last process ended ("exit status 65",
	// "SIGKILL"), LastExitReason why (the worker's reason, or the last
	// line it wrote to stderr), LastExitStderr the end of its stderr.
	LastExit       string   `json:"last_exit,omitempty"`
	LastExitReason string   `json:"last_exit_reason,omitempty"`
	LastExitStderr []string `json:"last_exit_stderr,omitempty"`
	// Notes are the worker's own, from its ready report (a persisted
	// module or swap it could not restore).
	Notes []string `json:"notes,omitempty"`
}

func workerRows(sts []supervise.WorkerStatus) []workerRow {
	rows := make([]workerRow, 0, len(sts))
	for _, st := range sts {
		r := workerRow{Name: st.Name, Tenant: st.Tenant, PID: st.PID, State: string(st.State), Restarts: st.Restarts,
			Devices: st.Devices, Sessions: st.Sessions, Notes: st.Notes}
		if !st.Reported {
			// A worker per device, named after it; a tenant's worker
			// is named DEVICE-TENANT.
			r.Devices = []string{st.Name}
			if st.Tenant != "" {
				r.Devices = []string{strings.TrimSuffix(st.Name, "-"+st.Tenant)}
			}
		}
		if r.Sessions == nil {
			r.Sessions = []string{}
		}
		if st.State != supervise.StateReady {
			r.Reason = st.Reason
		}
		if st.PID != 0 {
			r.Uptime = roundDuration(st.Uptime)
		}
		if e := st.LastExit; e != nil {
			switch {
			case e.StartFailed:
				r.LastExit = "could not start"
			case e.SignalName != "":
				r.LastExit = e.SignalName
			default:
				r.LastExit = fmt.Sprintf("exit status %d", e.Code)
			}
			r.LastExit += " at " + e.Time.Format(time.TimeOnly)
			r.LastExitReason, r.LastExitStderr = e.Reason, e.Stderr
		}
		rows = append(rows, r)
	}
	return rows
}

// statusDevices is the optional part of Workers that gives the status
// page the devices (the supervisor's workerView).
type statusDevices interface {
	deviceViews() []deviceView
}

// deviceViews lists the manifest's devices with their health from the
// live workers' heartbeats; a device no live worker reports is
// "unknown", with its worker's state.
func (v *workerView) deviceViews() []deviceView {
	health := map[string]deviceView{}
	for _, rec := range v.front.Hosts() {
		for _, dh := range rec.Devices {
			dv := deviceView{Health: "ok"}
			if !dh.Healthy {
				dv.Health, dv.Error = "lost", dh.Error
			}
			health[dh.Name] = dv
		}
	}
	states := map[string]supervise.WorkerStatus{}
	for _, st := range v.sup.Status() {
		states[st.Name] = st
	}
	var out []deviceView
	for i := range v.m.Devices {
		md := &v.m.Devices[i]
		dv, ok := health[md.Name]
		if !ok {
			dv = deviceView{Health: "unknown", Error: "no live worker reports it"}
			if st, ok := states[md.Name]; ok {
				dv.Error = fmt.Sprintf("worker %s is %s", st.Name, st.State)
				if st.Reason != "" {
					dv.Error += ": " + st.Reason
				}
			}
		}
		dv.Name, dv.Backend, dv.Engine = md.Name, string(md.Backend), md.Engine.String()
		out = append(out, dv)
	}
	return out
}

// StatusBody is GET /v1/status: what the status page shows, as JSON.
type StatusBody struct {
	Readiness deploy.Readiness `json:"readiness"`
	Devices   []StatusDevice   `json:"devices"`
	// Sessions: a single process's /v1/sessions rows; a supervisor's
	// (its workers' sessions, by their heartbeats).
	Sessions any `json:"sessions"`
	// Workers lists a supervisor's workers; absent elsewhere.
	Workers []workerRow `json:"workers,omitempty"`
}

// StatusDevice is one device of GET /v1/status.
type StatusDevice struct {
	Name    string `json:"name"`
	Backend string `json:"backend"`
	Engine  string `json:"engine"`
	Health  string `json:"health"` // ok, lost, or (a supervisor's, no live worker reports it) unknown
	Error   string `json:"error,omitempty"`
}

func (s *Server) statusDevices() []deviceView {
	if wk := s.workersOf(); wk != nil {
		if sd, ok := wk.(statusDevices); ok {
			return sd.deviceViews()
		}
		return nil
	}
	var out []deviceView
	for i := range s.d.Manifest.Devices {
		md := &s.d.Manifest.Devices[i]
		dv := deviceView{Name: md.Name, Backend: string(md.Backend), Engine: md.Engine.String(), Health: "ok"}
		if err := s.d.DeviceErr(md.Name); err != nil {
			dv.Health, dv.Error = "lost", err.Error()
		}
		out = append(out, dv)
	}
	return out
}

// getStatus answers GET /v1/status.
func (s *Server) getStatus(w http.ResponseWriter, r *http.Request) {
	body := StatusBody{Readiness: s.Readiness(), Devices: []StatusDevice{}}
	for _, dv := range s.statusDevices() {
		body.Devices = append(body.Devices, StatusDevice(dv))
	}
	if wk := s.workersOf(); wk != nil {
		body.Sessions = wk.Sessions()
		body.Workers = workerRows(wk.WorkerStatus())
	} else {
		body.Sessions = s.d.Statuses()
	}
	writeJSON(w, http.StatusOK, body)
}

// supervisorSessionViews are a supervisor's sessions for the page.
func supervisorSessionViews(wk Workers) []sessionView {
	var out []sessionView
	for _, ls := range wk.Sessions() {
		b, _ := json.Marshal(ls)
		sv := sessionFromJSON(b)
		sv.Device = strings.Join(ls.Hosts, ", ")
		out = append(out, sv)
	}
	return out
}
