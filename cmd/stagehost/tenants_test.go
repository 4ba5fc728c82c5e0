package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/supervise"
	"github.com/stagehost/stagehost/manifest"
)

// TestTenantGuard: a tenant is poisoned once, when its workers' failures
// (device losses and synthetic exits) reach max_failures within
// failure_window; failures that left the window do not count; the shared
// workers never count.
func TestTenantGuard(t *testing.T) {
	m := &manifest.Manifest{Tenants: []manifest.Tenant{{Name: "acme", MaxFailures: 3, FailureWindow: time.Minute}}}
	now := time.Unix(1000, 0)
	var poisoned []string
	g := newTenantGuard(m, func() time.Time { return now }, func(tenant, reason string) { poisoned = append(poisoned, tenant+": "+reason) })
	st := supervise.WorkerStatus{Name: "gpu0-acme", Tenant: "acme"}
	g.changed(supervise.WorkerStatus{Name: "gpu0", DeviceLosses: 9})
	st.DeviceLosses = 1
	g.changed(st)
	g.changed(st) // the same count again: no new failure
	now = now.Add(2 * time.Minute)
	st.SyntheticExits = 1
	g.changed(st) // the first left the window: 1 within it
	now = now.Add(time.Second)
	st.DeviceLosses = 2
	g.changed(st) // 2
	if len(poisoned) != 0 {
		t.Fatalf("poisoned early: %v", poisoned)
	}
	st.DeviceLosses = 3
	g.changed(st) // 3 within the minute
	if len(poisoned) != 1 || !strings.HasPrefix(poisoned[0], "acme: tenant acme: 3 failures of its workers within 1m0s") {
		t.Fatalf("poisoned = %v", poisoned)
	}
	st.DeviceLosses = 9
	g.changed(st)
	if len(poisoned) != 1 {
		t.Fatalf("poisoned twice: %v", poisoned)
	}
}

// TestNeedsWorker: plain serve refuses a cuda session that runs vendor
// PTX kernels (vendorPTXOn names one), and nothing else: a session of a
// tenant, or a sim session, runs in-process.
func TestNeedsWorker(t *testing.T) {
	m := &manifest.Manifest{
		Devices:  []manifest.Device{{Name: "cuda0", Backend: manifest.BackendCUDA}, {Name: "gpu0", Backend: manifest.BackendSim}},
		Sessions: []manifest.Session{{Name: "v", Devices: []string{"cuda0"}, Tenant: "acme"}, {Name: "w", Devices: []string{"gpu0"}, Programs: []string{"k"}}},
	}
	if got := needsWorker(m); len(got) != 0 {
		t.Fatalf("without vendor kernels: %v", got)
	}
	old := vendorPTXOn
	t.Cleanup(func() { vendorPTXOn = old })
	vendorPTXOn = func(_ *manifest.Manifest, s *manifest.Session) string { return "k" }
	if got := needsWorker(m); len(got) != 1 || got[0] != `session "v" runs vendor PTX kernel "k" on cuda device "cuda0"` {
		t.Fatalf("with a vendor kernel: %v", got)
	}
}
