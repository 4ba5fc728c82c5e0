package main

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/internal/supervise"
	"github.com/stagehost/stagehost/manifest"
)

// tenantGuard counts the failures of each tenant's workers under `serve
// --supervise` and quarantines a tenant lattice-wide once it failed
// max_failures times within failure_window ([[tenant]]). A failure is a
// device_lost report of one of its workers (a fault, or a hung call the
// worker ended itself for: quarantinedInstance) or a synthetic exit
// (the worker died without a word). It is safe for concurrent use.
type tenantGuard struct {
	m      *manifest.Manifest
	now    func() time.Time
	poison func(tenant, reason string) // called once per tenant, outside the lock

	mu       sync.Mutex
	seen     map[string]int         // worker → failures counted so far
	fails    map[string][]time.Time // tenant → its failures within the window
	poisoned map[string]bool
}

func newTenantGuard(m *manifest.Manifest, now func() time.Time, poison func(tenant, reason string)) *tenantGuard {
	return &tenantGuard{m: m, now: now, poison: poison, seen: map[string]int{}, fails: map[string][]time.Time{}, poisoned: map[string]bool{}}
}

// changed is the supervisor's OnChange hook.
func (g *tenantGuard) changed(st supervise.WorkerStatus) {
	if st.Tenant == "" {
		return
	}
	total := st.DeviceLosses + st.SyntheticExits
	g.mu.Lock()
	n := total - g.seen[st.Name]
	if n <= 0 || g.poisoned[st.Tenant] {
		g.seen[st.Name] = max(total, g.seen[st.Name])
		g.mu.Unlock()
		return
	}
	g.seen[st.Name] = total
	pol := g.m.TenantPolicy(st.Tenant)
	now := g.now()
	list := g.fails[st.Tenant]
	for range n {
		list = append(list, now)
	}
	list = slices.DeleteFunc(list, func(t time.Time) bool { return now.Sub(t) > pol.FailureWindow })
	g.fails[st.Tenant] = list
	hit := len(list) >= pol.MaxFailures
	if hit {
		g.poisoned[st.Tenant] = true
	}
	g.mu.Unlock()
	if hit {
		g.poison(st.Tenant, fmt.Sprintf("tenant %s: %d failures of its workers within %s (max_failures %d; last on worker %s)",
			st.Tenant, len(list), pol.FailureWindow, pol.MaxFailures, st.Name))
	}
}

// quarantinedInstance names an instance of d's sessions that is
// quarantined (its fence missed fence_timeout: device work that cannot
// be proven finished, such as a hung kernel), and why; "" when none is.
// A tenant's worker ends itself then: a hung kernel cannot be stopped
// from inside its process, only by the process's end.
func quarantinedInstance(d *deploy.Deployment) string {
	for _, st := range d.Statuses() {
		for _, in := range st.Instances {
			if in.State == "quarantined" {
				return fmt.Sprintf("session %s instance %d quarantined: %s", st.Name, in.Index, in.Reason)
			}
		}
	}
	return ""
}

// needsWorker lists the sessions that plain `serve` (one process, no
// --supervise) refuses to run, each with why: a cuda session that runs
// vendor PTX kernels ([[kernel]] with ptx), whose faults and hangs only
// a process boundary contains (docs/security.md). A session's tenant
// alone is no reason: a tenant without vendor device code runs
// in-process (its sessions share the process's failure domain), and Wasm
// vendor kernels on sim are contained by wazero. Until [[kernel]]
// exists the list is empty: vendorPTXOn is the hook.
func needsWorker(m *manifest.Manifest) []string {
	var out []string
	for i := range m.Sessions {
		s := &m.Sessions[i]
		for _, dev := range s.Devices {
			if md := m.Device(dev); md != nil && md.Backend == manifest.BackendCUDA {
				if k := vendorPTXOn(m, s); k != "" {
					out = append(out, fmt.Sprintf("session %q runs vendor PTX kernel %q on cuda device %q", s.Name, k, dev))
					break
				}
			}
		}
	}
	return out
}

// vendorPTXOn names a vendor PTX kernel session s lists, "" for none.
var vendorPTXOn = func(m *manifest.Manifest, s *manifest.Session) string { return "" }
