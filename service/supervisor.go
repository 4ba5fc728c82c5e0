package service

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/supervise"
	"github.com/stagehost/stagehost/manifest"
)

// SupervisedNameErrors names the sessions and residents of m whose names
// cannot be NATS subject tokens, which a supervisor's workers need.
func SupervisedNameErrors(m *manifest.Manifest) []string {
	var bad []string
	for _, s := range m.Sessions {
		if !lattice.ValidName(s.Name) {
			bad = append(bad, fmt.Sprintf("session %q", s.Name))
		}
	}
	for _, r := range m.Residents {
		if !lattice.ValidName(r.Name) {
			bad = append(bad, fmt.Sprintf("resident %q", r.Name))
		}
	}
	return bad
}

// SupervisedWorkerName is the name of the worker of `serve --supervise`
// that runs device's sessions of tenant: the device's name for the
// shared worker (tenant ""), DEVICE-TENANT for a tenant's.
func SupervisedWorkerName(device, tenant string) string {
	if tenant == "" {
		return device
	}
	return device + "-" + tenant
}

// SupervisedWorkerNameErrors says, one string each, which workers of
// `serve --supervise` on m would have the name of another: a tenant
// worker DEVICE-TENANT named like a device (device "a-b", and tenant "b"
// with a session on device "a"), or like another tenant worker (tenant
// "b-c" on device "a", tenant "c" on device "a-b"). A worker's name is its
// socket, its host id and its entry in /v1/workers, so it must be unique.
func SupervisedWorkerNameErrors(m *manifest.Manifest) []string {
	type owner struct{ device, tenant string }
	seen := map[string]owner{}
	for _, d := range m.Devices {
		seen[d.Name] = owner{device: d.Name}
	}
	var bad []string
	for _, d := range m.Devices {
		for _, t := range m.SessionTenants(d.Name) {
			name := SupervisedWorkerName(d.Name, t)
			if o, ok := seen[name]; ok {
				if o.tenant == "" {
					bad = append(bad, fmt.Sprintf("the worker of device %q and tenant %q would be named %q, a device's name", d.Name, t, name))
				} else {
					bad = append(bad, fmt.Sprintf("the worker of device %q and tenant %q would be named %q, as the worker of device %q and tenant %q", d.Name, t, name, o.device, o.tenant))
				}
				continue
			}
			seen[name] = owner{d.Name, t}
		}
	}
	return bad
}

// SupervisedLattice is the lattice, named name, of `serve --supervise` on
// a manifest without [lattice]: the manifest's defaults
// (manifest.DefaultHeartbeatTTL, DefaultClaimTTL, DefaultFenceFailures,
// DefaultPayloadStoreMax), except that a lost device does not put the module in the shared
// quarantine (a worker whose device was lost is restarted, and serves
// its sessions again).
func SupervisedLattice(name string) manifest.Lattice {
	return manifest.Lattice{Name: name, HeartbeatTTL: manifest.DefaultHeartbeatTTL, ClaimTTL: manifest.DefaultClaimTTL,
		FenceFailures: manifest.DefaultFenceFailures, QuarantineOnDeviceLost: false, PayloadStoreMax: manifest.DefaultPayloadStoreMax}
}

// supervisedFront is the supervisor's Lattice: the member (a
// front only), for which the manifest's sessions and residents are known
// from the start (a call to one that no worker serves yet is 503, not
// 404).
type supervisedFront struct {
	*lattice.Member
	m *manifest.Manifest
	// view is the supervisor's view of its workers, once SetWorkers gave
	// it: the sessions known follow the workers' reports.
	view *atomic.Pointer[workerView]
	// local is the local transport's route, nil for none.
	local LocalRoute
}

// LocalRoute runs a call over the local transport to a worker on this
// machine (internal/localcall), when one serves the session: handled
// false means it did not send the call (no such worker is ready, or its
// socket refused the connection), so the call goes through the lattice.
type LocalRoute func(ctx context.Context, session string, input []byte) (out []byte, handled bool, err error)

// SupervisorFrontLocal is [SupervisorFront] with calls sent over route
// first (the local transport), and through the lattice when route did
// not send them.
func SupervisorFrontLocal(member *lattice.Member, m *manifest.Manifest, route LocalRoute) Lattice {
	return supervisedFront{member, m, new(atomic.Pointer[workerView]), route}
}

// Call is the member's, after the local route's.
func (f supervisedFront) Call(ctx context.Context, session string, input []byte) ([]byte, string, error) {
	if f.local != nil {
		if out, handled, err := f.local(ctx, session, input); handled {
			return out, "", err
		}
	}
	return f.Member.Call(ctx, session, input)
}

// SupervisorFront is the Lattice of `serve --supervise`: member (a front
// only, joined with no deployment), for which m's sessions and residents
// are known from the start (a call to one that no worker serves yet is
// 503 unavailable, not 404), and which offers m's session specs
// (sessionSpecs).
func SupervisorFront(member *lattice.Member, m *manifest.Manifest) Lattice {
	return supervisedFront{member, m, new(atomic.Pointer[workerView]), nil}
}

func (f supervisedFront) Known(session string) bool {
	if v := f.view.Load(); v != nil {
		return v.listed(session) || v.heartbeatNames(session)
	}
	return f.m.Session(session) != nil || f.Member.Known(session)
}

// heartbeatNames says whether a live host's heartbeat names session now.
func (v *workerView) heartbeatNames(session string) bool {
	for _, rec := range v.front.Hosts() {
		for _, sc := range rec.Sessions {
			if sc.Name == session {
				return true
			}
		}
	}
	return false
}

// listed says whether the supervisor lists session (see Sessions): a
// session of the workers' latest reports, or of the manifest while a
// worker has not reported.
func (v *workerView) listed(session string) bool {
	for _, st := range v.sup.Status() {
		if st.Reported && slices.Contains(st.Sessions, session) || !st.Reported && v.m.Session(session) != nil {
			return true
		}
	}
	return false
}

// Hosts is the front's view of the live hosts' heartbeats (the workers'),
// for the status page's devices.
func (v *workerView) Hosts() []lattice.HostRecord { return v.front.Hosts() }

var _ sessionSpecs = supervisedFront{}

// SessionSpec is the manifest's session: its max_input and deadline
// apply at the supervisor, before a call is routed to a worker.
func (f supervisedFront) SessionSpec(session string) *manifest.Session { return f.m.Session(session) }

func (f supervisedFront) KnownResident(resident string) bool {
	return f.m.Resident(resident) != nil || f.Member.KnownResident(resident)
}

// workerView is the supervisor's Workers: the supervisor's status
// of each worker, and the sessions as the front sees the workers'
// heartbeats.
type workerView struct {
	sup   *supervise.Supervisor
	front *lattice.Front
	m     *manifest.Manifest
}

// SupervisorWorkers is the Workers of `serve --supervise`: sup's status
// of each worker, and m's sessions as front sees the workers'
// heartbeats.
func SupervisorWorkers(sup *supervise.Supervisor, front *lattice.Front, m *manifest.Manifest) Workers {
	return &workerView{sup: sup, front: front, m: m}
}

func (v *workerView) WorkerStatus() []supervise.WorkerStatus { return v.sup.Status() }

func (v *workerView) WorkerStates() []WorkerState {
	sts := v.sup.Status()
	out := make([]WorkerState, len(sts))
	for i, st := range sts {
		ws := WorkerState{Name: st.Name, Tenant: st.Tenant, State: string(st.State), Ready: st.State == supervise.StateReady,
			Restarts: st.Restarts, SyntheticExits: st.SyntheticExits, DeviceLosses: st.DeviceLosses, Hangs: st.Hangs}
		if !ws.Ready {
			ws.Reason = st.Reason
			if ws.Reason == "" && st.LastExit != nil {
				ws.Reason = "last exit: " + st.LastExit.Reason
			}
		}
		out[i] = ws
	}
	return out
}

func (v *workerView) Sessions() []LatticeSessionStatus {
	byName := map[string]*LatticeSessionStatus{}
	var order []string
	add := func(name string) *LatticeSessionStatus {
		ls := byName[name]
		if ls == nil {
			ls = &LatticeSessionStatus{Name: name, State: "unavailable", Hosts: []string{}, HostOutcomes: map[string]map[string]uint64{}}
			byName[name] = ls
			order = append(order, name)
		}
		return ls
	}
	// The manifest's sessions while a worker has not reported what it
	// serves; then the sessions the workers' latest ready reports list
	// (a worker that re-read a changed manifest drops a session from
	// the list): the supervisor's view follows its workers'.
	workers := v.sup.Status()
	listed := map[string]bool{}
	unreported := false
	for _, st := range workers {
		if !st.Reported {
			unreported = true
		}
		for _, name := range st.Sessions {
			listed[name] = true
		}
	}
	for _, ms := range v.m.Sessions {
		if unreported || listed[ms.Name] {
			add(ms.Name)
		}
	}
	for _, st := range workers {
		for _, name := range st.Sessions {
			add(name)
		}
	}
	notServing := map[string][]string{}
	for _, rec := range v.front.Hosts() {
		for _, sc := range rec.Sessions {
			ls := add(sc.Name)
			if len(sc.Outcomes) > 0 {
				ls.HostOutcomes[rec.ID] = sc.Outcomes
			}
			if !sc.Serving {
				notServing[sc.Name] = append(notServing[sc.Name], fmt.Sprintf("host %s has it %s: %s", rec.ID, sc.State, sc.Reason))
				continue
			}
			ls.Hosts = append(ls.Hosts, rec.ID)
			ls.Instances += sc.Instances
			ls.Free += sc.Free
			ls.InFlight += sc.InFlight
			ls.Waiting += sc.Waiting
		}
	}
	out := make([]LatticeSessionStatus, 0, len(order))
	for _, name := range order {
		ls := byName[name]
		switch {
		case len(ls.Hosts) > 0:
			ls.State = "ready"
		case len(notServing[name]) > 0:
			ls.Reason = "no live host serves it (" + strings.Join(notServing[name], "; ") + ")"
		default:
			ls.Reason = "no live host serves it"
		}
		out = append(out, *ls)
	}
	return out
}
