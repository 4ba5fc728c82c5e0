package deploy_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/manifest"
)

// deviceSplit has a session per device, a session pooled over gpu0 and
// gpu1 (five instances: gpu0 gets slots 0, 2, 4 and gpu1 slots 1, 3), a
// resident on gpu0 with npu0, and a module only gpu1's session uses.
const deviceSplit = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device]]
name = "gpu1"
backend = "sim"
engine = "gpu"
[[device.sim.fault]]
kind = "fail_completion"
count = 1
session = "b"
[[device]]
name = "npu0"
backend = "sim"
engine = "npu"
[[module]]
name = "good"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[module]]
name = "cstage"
path = "@REPO@/examples/wasm/cstage/cstage.wasm"
sha256 = "@SHA:examples/wasm/cstage/cstage.wasm@"
[[session]]
name = "a"
stage = "good"
device = "gpu0"
programs = ["noop"]
[[session]]
name = "b"
stage = "cstage"
device = "gpu1"
programs = ["noop"]
[[session]]
name = "pooled"
stage = "good"
devices = ["gpu0", "gpu1"]
instances = 5
programs = ["noop"]
[[resident]]
name = "pp"
gpu = "gpu0"
npu = "npu0"
rounds = 4
`

// openDevice opens m's work on device; loaded gets the modules it loads.
func openDevice(t *testing.T, m *manifest.Manifest, device string, loaded *[]string) *deploy.Deployment {
	t.Helper()
	progress := func(msg string) {
		if name, ok := strings.CutPrefix(msg, "loading module "); ok && loaded != nil {
			*loaded = append(*loaded, strings.Fields(name)[0])
		}
	}
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig().WithDevice(device).WithProgress(progress))
	if err != nil {
		t.Fatalf("Open(Device %q): %v", device, err)
	}
	t.Cleanup(func() { d.Close(context.Background()) })
	return d
}

func instanceDevices(st deploy.SessionStatus) []string {
	var devs []string
	for _, in := range st.Instances {
		devs = append(devs, in.Device)
	}
	return devs
}

// TestOpenDeviceOpensOnlyThatDevicesWork: Options.Device opens the
// device (and its residents' npu), the sessions with a slot on it with
// only those slots' instances, its residents, and only the modules its
// sessions need; the others are absent, and faults of other devices or
// sessions are skipped.
func TestOpenDeviceOpensOnlyThatDevicesWork(t *testing.T) {
	m, err := manifest.Load(writeManifest(t, deviceSplit))
	if err != nil {
		t.Fatal(err)
	}
	var loaded []string
	d0 := openDevice(t, m, "gpu0", &loaded)
	if got, want := d0.DeviceNames(), []string{"gpu0", "npu0"}; !slices.Equal(got, want) {
		t.Errorf("gpu0's devices: %v, want %v", got, want)
	}
	if got, want := d0.SessionNames(), []string{"a", "pooled"}; !slices.Equal(got, want) {
		t.Errorf("gpu0's sessions: %v, want %v", got, want)
	}
	if got, want := instanceDevices(d0.Pool("pooled").Status()), []string{"gpu0", "gpu0", "gpu0"}; !slices.Equal(got, want) {
		t.Errorf("gpu0's pooled instances on %v, want %v", got, want)
	}
	if got := d0.ResidentNames(); !slices.Equal(got, []string{"pp"}) {
		t.Errorf("gpu0's residents: %v, want [pp]", got)
	}
	if err := d0.DeviceErr("gpu1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("gpu0's deployment has gpu1: %v", err)
	}
	if !slices.Equal(loaded, []string{"good"}) {
		t.Errorf("gpu0's deployment loaded modules %v, want [good] (cstage is only gpu1's session's)", loaded)
	}
	run, err := d0.Resident("pp").Run(context.Background())
	if err != nil || run.Rounds != 4 {
		t.Errorf("gpu0's resident: %+v, %v", run, err)
	}
	if _, err := d0.Pool("a").Run(context.Background(), nil); err != nil {
		t.Errorf("gpu0's session a: %v", err)
	}

	loaded = nil
	d1 := openDevice(t, m, "gpu1", &loaded)
	if got, want := d1.DeviceNames(), []string{"gpu1"}; !slices.Equal(got, want) {
		t.Errorf("gpu1's devices: %v, want %v", got, want)
	}
	if got, want := d1.SessionNames(), []string{"b", "pooled"}; !slices.Equal(got, want) {
		t.Errorf("gpu1's sessions: %v, want %v", got, want)
	}
	if got, want := instanceDevices(d1.Pool("pooled").Status()), []string{"gpu1", "gpu1"}; !slices.Equal(got, want) {
		t.Errorf("gpu1's pooled instances on %v, want %v", got, want)
	}
	if !slices.Equal(loaded, []string{"good", "cstage"}) {
		t.Errorf("gpu1's deployment loaded modules %v, want [good cstage]", loaded)
	}
	if got := d1.ResidentNames(); len(got) != 0 {
		t.Errorf("gpu1's residents: %v, want none", got)
	}
	// gpu1's fault for b applies in gpu1's worker.
	if _, err := d1.Pool("b").Run(context.Background(), nil); err == nil {
		t.Error("session b's injected fail_completion did not apply on gpu1")
	}

	// A device with no session and no resident of its own: nothing but it.
	loaded = nil
	dn := openDevice(t, m, "npu0", &loaded)
	if got := dn.DeviceNames(); !slices.Equal(got, []string{"npu0"}) {
		t.Errorf("npu0's devices: %v", got)
	}
	if n := len(dn.SessionNames()) + len(dn.ResidentNames()); n != 0 {
		t.Errorf("npu0's deployment has %d sessions and residents, want none", n)
	}
	if len(loaded) != 0 {
		t.Errorf("npu0's deployment loaded modules %v, want none", loaded)
	}

	if _, err := deploy.Open(context.Background(), m, deploy.NewConfig().WithDevice("gpu9")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open(Device gpu9): %v, want not found", err)
	}
}

// tenantSplit has a session of tenant acme, one of tenant beta and one
// without a tenant on gpu0, and a resident on gpu0.
const tenantSplit = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device]]
name = "npu0"
backend = "sim"
engine = "npu"
[[module]]
name = "good"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[module]]
name = "cstage"
path = "@REPO@/examples/wasm/cstage/cstage.wasm"
sha256 = "@SHA:examples/wasm/cstage/cstage.wasm@"
[[tenant]]
name = "acme"
[[tenant]]
name = "beta"
[[session]]
name = "a"
stage = "good"
device = "gpu0"
tenant = "acme"
programs = ["noop"]
[[session]]
name = "b"
stage = "cstage"
device = "gpu0"
tenant = "beta"
programs = ["fill"]
[[session]]
name = "shared"
stage = "good"
device = "gpu0"
programs = ["noop"]
[[resident]]
name = "pp"
gpu = "gpu0"
npu = "npu0"
rounds = 4
`

// TestOpenTenantOpensOnlyThatTenantsSessions: WithTenant("acme") opens
// acme's sessions only (no resident, only their modules); WithTenant("")
// the sessions without a tenant and the residents.
func TestOpenTenantOpensOnlyThatTenantsSessions(t *testing.T) {
	m, err := manifest.Load(writeManifest(t, tenantSplit))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tenant              string
		sessions, residents []string
		loaded              []string
	}{
		{"acme", []string{"a"}, []string{}, []string{"good"}},
		{"beta", []string{"b"}, []string{}, []string{"cstage"}},
		{"", []string{"shared"}, []string{"pp"}, []string{"good"}},
	} {
		var loaded []string
		progress := func(msg string) {
			if name, ok := strings.CutPrefix(msg, "loading module "); ok {
				loaded = append(loaded, strings.Fields(name)[0])
			}
		}
		d, err := deploy.Open(context.Background(), m, deploy.NewConfig().WithDevice("gpu0").WithTenant(tc.tenant).WithProgress(progress))
		if err != nil {
			t.Fatalf("Open(tenant %q): %v", tc.tenant, err)
		}
		if got := d.SessionNames(); !slices.Equal(got, tc.sessions) {
			t.Errorf("tenant %q's sessions: %v, want %v", tc.tenant, got, tc.sessions)
		}
		if got := d.ResidentNames(); !slices.Equal(got, tc.residents) && len(got)+len(tc.residents) > 0 {
			t.Errorf("tenant %q's residents: %v, want %v", tc.tenant, got, tc.residents)
		}
		if !slices.Equal(loaded, tc.loaded) {
			t.Errorf("tenant %q's modules: %v, want %v", tc.tenant, loaded, tc.loaded)
		}
		for _, name := range tc.sessions {
			if _, err := d.Pool(name).Run(context.Background(), nil); err != nil {
				t.Errorf("tenant %q's session %s: %v", tc.tenant, name, err)
			}
		}
		d.Close(context.Background())
	}
}
