package manifest

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const tenantManifest = `version = 1

[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"

[[module]]
name = "good"
path = "modules/good_stage.wasm"
sha256 = "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b"
%TENANTS%
[[session]]
name = "a"
stage = "good"
device = "gpu0"
%TENANT_A%

[[session]]
name = "shared"
stage = "good"
device = "gpu0"
`

func tenantToml(tenants, tenantA string) []byte {
	s := strings.ReplaceAll(tenantManifest, "%TENANTS%", tenants)
	return []byte(strings.ReplaceAll(s, "%TENANT_A%", tenantA))
}

func TestTenants(t *testing.T) {
	m, err := Decode(filepath.Join("testdata", "host.toml"), tenantToml(`
[[tenant]]
name = "acme"
max_failures = 2
failure_window = "1m"
hang_grace = "250ms"

[[tenant]]
name = "beta"
`, `tenant = "acme"`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Session("a").TenantName(); got != "acme" {
		t.Fatalf("session a's tenant = %q", got)
	}
	if got := m.Session("shared").TenantName(); got != "" {
		t.Fatalf("session shared's tenant = %q", got)
	}
	if p := m.TenantPolicy("acme"); p.MaxFailures != 2 || p.FailureWindow != time.Minute || p.HangGrace != 250*time.Millisecond {
		t.Fatalf("acme = %+v", p)
	}
	if p := m.TenantPolicy("beta"); p.MaxFailures != DefaultTenantMaxFailures || p.FailureWindow != DefaultTenantFailureWindow || p.HangGrace != DefaultTenantHangGrace {
		t.Fatalf("beta = %+v", p)
	}
	if got := m.SessionTenants("gpu0"); len(got) != 1 || got[0] != "acme" {
		t.Fatalf("tenants on gpu0 = %v (beta has no session)", got)
	}
}

func TestTenantErrors(t *testing.T) {
	for _, tc := range []struct{ tenants, a, want string }{
		{"", `tenant = "acme"`, `testdata/host.toml:17: session[0].tenant: no tenant is named "acme" (there is no [[tenant]])`},
		{"[[tenant]]\nname = \"acme\"\n", `tenant = "acm"`, `testdata/host.toml:19: session[0].tenant: no tenant is named "acm" (did you mean "acme"?)`},
		{"", `tenant = ""`, `testdata/host.toml:17: session[0].tenant: "" is not a tenant name: 1 to 64 of letters, digits, '-' and '_'`},
		{"[[tenant]]\nname = \"a.b\"\n", ``, `testdata/host.toml:13: tenant[0].name: "a.b" is not a tenant name: 1 to 64 of letters, digits, '-' and '_'`},
		{"[[tenant]]\nname = \"x\"\n[[tenant]]\nname = \"x\"\n", ``, `testdata/host.toml:15: tenant[1].name: duplicate tenant name "x" (also at tenant[0].name, line 13)`},
		{"[[tenant]]\nname = \"x\"\nmax_failures = 0\n", ``, `testdata/host.toml:14: tenant[0].max_failures: must be between 1 and 65536, not 0`},
		{"[[tenant]]\nname = \"x\"\nfailure_window = \"0s\"\n", ``, `testdata/host.toml:14: tenant[0].failure_window: must be positive`},
		{"[[tenant]]\nname = \"x\"\nhang_grace = \"0s\"\n", ``, `testdata/host.toml:14: tenant[0].hang_grace: must be positive`},
		{"[[tenant]]\nname = \"x\"\nhang_grace = \"61s\"\n", ``, `testdata/host.toml:14: tenant[0].hang_grace: at most 1m0s, got 1m1s`},
		{"[[tenant]]\nname = \"x\"\nkill_grace = 1\n", ``, `testdata/host.toml:14: tenant[0].kill_grace: unknown key`},
	} {
		_, err := Decode(filepath.Join("testdata", "host.toml"), tenantToml(tc.tenants, tc.a), nil)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("tenants %q, %q: err = %v, want %s…", tc.tenants, tc.a, err, tc.want)
		}
	}
}
