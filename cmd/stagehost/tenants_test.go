package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/supervise"
	"github.com/stagehost/stagehost/manifest"
)

// TestTenantGuard: a tenant is poisoned once, when its workers' failures
// (device losses, hangs and synthetic exits) reach max_failures within
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
	st.Hangs = 1
	g.changed(st) // 2
	if len(poisoned) != 0 {
		t.Fatalf("poisoned early: %v", poisoned)
	}
	st.DeviceLosses = 2
	g.changed(st) // 3 within the minute
	if len(poisoned) != 1 || !strings.HasPrefix(poisoned[0], "acme: tenant acme: 3 failures of its workers within 1m0s") {
		t.Fatalf("poisoned = %v", poisoned)
	}
	st.DeviceLosses = 9
	g.changed(st)
	if len(poisoned) != 1 {
		t.Fatalf("poisoned twice: %v", poisoned)
	}
	// Cleared by an operator: the next failures count from zero, and the
	// third quarantines the tenant again.
	inQuarantine := true
	g.quarantined = func(string) bool { return inQuarantine }
	st.DeviceLosses = 10
	g.changed(st)
	if len(poisoned) != 1 {
		t.Fatalf("poisoned again while still quarantined: %v", poisoned)
	}
	inQuarantine = false
	for i := range 2 {
		st.DeviceLosses = 11 + i
		g.changed(st)
	}
	if len(poisoned) != 1 {
		t.Fatalf("poisoned after 2 failures since the clear: %v", poisoned)
	}
	st.DeviceLosses = 13
	g.changed(st)
	if len(poisoned) != 2 || !strings.HasPrefix(poisoned[1], "acme: tenant acme: 3 failures of its workers within 1m0s") {
		t.Fatalf("after 3 failures since the clear: poisoned = %v", poisoned)
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

// TestSupervisedWorkers: a shared worker per device and a worker per
// tenant with sessions there, started with --tenant; a tenant worker's
// name that is a device's is refused.
func TestSupervisedWorkers(t *testing.T) {
	m := &manifest.Manifest{
		Devices: []manifest.Device{{Name: "gpu0"}, {Name: "gpu1"}},
		Sessions: []manifest.Session{
			{Name: "a", Devices: []string{"gpu0", "gpu1"}, Tenant: "acme"},
			{Name: "b", Devices: []string{"gpu1"}, Tenant: "beta"},
			{Name: "s", Devices: []string{"gpu0"}},
		},
	}
	ws, err := supervisedWorkers(m, "/bin/stagehost", "/m.toml", "sv", "/state", supervisorFlags{level: "info", grace: time.Second}, []string{"X=1"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range ws {
		got = append(got, w.Name+"/"+w.Tenant+"/"+strings.Join(w.Args, " "))
	}
	want := []string{
		"gpu0//serve /m.toml --worker gpu0 --host-id sv-gpu0 --log-level info --grace 1s --state-dir /state",
		"gpu0-acme/acme/serve /m.toml --worker gpu0 --host-id sv-gpu0-acme --log-level info --grace 1s --state-dir /state --tenant acme",
		"gpu1//serve /m.toml --worker gpu1 --host-id sv-gpu1 --log-level info --grace 1s --state-dir /state",
		"gpu1-acme/acme/serve /m.toml --worker gpu1 --host-id sv-gpu1-acme --log-level info --grace 1s --state-dir /state --tenant acme",
		"gpu1-beta/beta/serve /m.toml --worker gpu1 --host-id sv-gpu1-beta --log-level info --grace 1s --state-dir /state --tenant beta",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("workers:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	m.Devices = append(m.Devices, manifest.Device{Name: "gpu0-acme"})
	if _, err := supervisedWorkers(m, "/bin/stagehost", "/m.toml", "sv", "/state", supervisorFlags{}, nil); err == nil || !strings.Contains(err.Error(), `would be named "gpu0-acme", a device's name`) {
		t.Fatalf("a colliding name: %v", err)
	}
}

// TestWorkerNameCollision: a tenant worker named like a device is a note
// of check's (exit 0: plain serve runs it) and refused by serve
// --supervise before it starts anything, exit 64 as for the name rule.
func TestWorkerNameCollision(t *testing.T) {
	t.Setenv(envLatticeURL, "")
	dir := t.TempDir()
	path := filepath.Join(dir, "tenants.toml")
	tenantsManifest(t, path, false)
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A second device named like gpu0's worker of tenant acme.
	collide := filepath.Join(dir, "collide.toml")
	dev := "[[device]]\nname = \"gpu0-acme\"\nbackend = \"sim\"\nengine = \"gpu\"\n[[module]]"
	if err := os.WriteFile(collide, []byte(strings.Replace(string(body), "[[module]]", dev, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	const why = `the worker of device "gpu0" and tenant "acme" would be named "gpu0-acme", a device's name`
	if code, out, _ := runCLI(t, "check", collide); code != exitOK || !strings.Contains(out, "note: "+why+": serve --supervise refuses it") {
		t.Errorf("check: exit %d\n%s", code, out)
	}
	if code, out, _ := runCLI(t, "check", path); code != exitOK || strings.Contains(out, "note:") {
		t.Errorf("check without a collision: exit %d\n%s", code, out)
	}
	code, _, stderr := runCLI(t, "serve", collide, "--supervise", "--addr", "127.0.0.1:0")
	if code != exitUsage || !strings.Contains(stderr, why+": rename the device or the tenant") {
		t.Errorf("serve --supervise: exit %d, stderr %q; want %d", code, stderr, exitUsage)
	}
}

// TestServeTenantFlag: --tenant needs --worker, and a tenant with a
// session on the worker's device.
func TestServeTenantFlag(t *testing.T) {
	t.Setenv(envLatticeURL, "")
	path := filepath.Join(t.TempDir(), "tenants.toml")
	tenantsManifest(t, path, false)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", path, "--tenant", "acme"}, "--tenant needs --worker"},
		{[]string{"serve", path, "--worker", "gpu0", "--tenant", "nobody"}, `no session of tenant "nobody" is on device "gpu0"`},
	} {
		code, _, stderr := runCLI(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, code, stderr, exitUsage, c.want)
		}
	}
}

// TestNeedsWorkerFindsVendorPTX: the vkernel example's session, whose
// [[kernel]] has ptx, is refused by plain serve once its device is a cuda
// one, and not on sim.
func TestNeedsWorkerFindsVendorPTX(t *testing.T) {
	m, err := manifest.Load(filepath.Join("testdata", "vkernel", "host.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if bad := needsWorker(m); len(bad) != 0 {
		t.Fatalf("on sim: %v", bad)
	}
	for i := range m.Devices {
		m.Devices[i].Backend = manifest.BackendCUDA
	}
	if bad := needsWorker(m); len(bad) != 1 || !strings.Contains(bad[0], `vendor PTX kernel "double"`) {
		t.Fatalf("on cuda: %v", bad)
	}
}

// TestMaxLocalAnswer: the supervisor takes answers up to its sessions'
// largest output_limit and 64 KiB for a message, without overflowing.
func TestMaxLocalAnswer(t *testing.T) {
	m := &manifest.Manifest{Sessions: []manifest.Session{{Name: "a", OutputLimit: 1 << 20}, {Name: "b", OutputLimit: 16 << 20}}}
	if got := maxLocalAnswer(m); got != 16<<20+64<<10 {
		t.Fatalf("maxLocalAnswer = %d", got)
	}
	m.Sessions[0].OutputLimit = math.MaxInt64 - 1
	if got := maxLocalAnswer(m); got != math.MaxInt64 {
		t.Fatalf("maxLocalAnswer with a huge output_limit = %d", got)
	}
}
