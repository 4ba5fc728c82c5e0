package manifest

import (
	"slices"
	"time"
)

// MaxTenantName is the longest tenant name.
const MaxTenantName = 64

// The defaults of a tenant's failure policy (docs/manifest.md, [[tenant]]).
const (
	// DefaultTenantMaxFailures is max_failures: how many faults or hangs
	// of a tenant's worker within failure_window quarantine the tenant.
	DefaultTenantMaxFailures = 3
	// DefaultTenantFailureWindow is failure_window.
	DefaultTenantFailureWindow = 10 * time.Minute
	// DefaultTenantHangGrace is hang_grace: how long a call's device work
	// may outlive the call's deadline in the tenant's worker before the
	// worker is ended.
	DefaultTenantHangGrace = 100 * time.Millisecond
	// MaxTenantHangGrace is the longest hang_grace.
	MaxTenantHangGrace = time.Minute
	maxTenantFailures  = 1 << 16
)

// Tenant is one [[tenant]]: a failure domain. Under `serve --supervise`
// the sessions of a tenant run in worker processes of their own, one per
// device (docs/security.md): a fault or a hang of the tenant's device
// code ends only those processes.
type Tenant struct {
	Name string
	// MaxFailures is how many failures (a device lost, a call stopped by
	// ending the worker) of the tenant's workers within FailureWindow
	// quarantine the tenant lattice-wide; default
	// [DefaultTenantMaxFailures].
	MaxFailures int
	// FailureWindow is the window MaxFailures counts in; default
	// [DefaultTenantFailureWindow].
	FailureWindow time.Duration
	// HangGrace is how long past a call's deadline the tenant's worker
	// waits for the call (its fence included) to end before it ends
	// itself and the supervisor sends SIGKILL: device work still running
	// then cannot be stopped otherwise (docs/security.md). Default
	// [DefaultTenantHangGrace].
	HangGrace time.Duration
}

// Tenant returns the [[tenant]] named name, or nil.
func (m *Manifest) Tenant(name string) *Tenant {
	for i := range m.Tenants {
		if m.Tenants[i].Name == name {
			return &m.Tenants[i]
		}
	}
	return nil
}

// TenantPolicy returns the failure policy of the tenant named name: its
// [[tenant]] table, or the defaults for a tenant without one.
func (m *Manifest) TenantPolicy(name string) Tenant {
	if t := m.Tenant(name); t != nil {
		return *t
	}
	return Tenant{Name: name, MaxFailures: DefaultTenantMaxFailures, FailureWindow: DefaultTenantFailureWindow, HangGrace: DefaultTenantHangGrace}
}

// TenantName returns the tenant the session belongs to: its tenant key;
// without one, the tenant of the vendor kernels it lists (a [[kernel]]'s
// tenant key, else the kernel's name, set when the manifest is read); ""
// for none (the shared worker of each of its devices serves it).
func (s *Session) TenantName() string {
	return s.Tenant
}

// SessionTenants returns the tenants that have sessions on device dev,
// sorted, without "".
func (m *Manifest) SessionTenants(dev string) []string {
	var out []string
	for i := range m.Sessions {
		s := &m.Sessions[i]
		if t := s.TenantName(); t != "" && slices.Contains(s.Devices, dev) && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// ValidTenantName reports whether s is a tenant name: 1 to
// [MaxTenantName] of letters, digits, '-' and '_' (it becomes part of a
// worker's host id and of NATS subjects).
func ValidTenantName(s string) bool {
	if len(s) == 0 || len(s) > MaxTenantName {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

type tenantMeta struct {
	p    keyPath
	name bool
}

// tenants decodes the [[tenant]] tables.
func (d *decoder) tenants(root *table, m *Manifest) []tenantMeta {
	list, _ := root.tables("tenant")
	metas := make([]tenantMeta, len(list))
	if len(list) > 0 {
		m.Tenants = make([]Tenant, len(list))
	}
	first := map[string]keyPath{}
	for i, t := range list {
		if t == nil {
			continue
		}
		tn, meta := &m.Tenants[i], &metas[i]
		meta.p = t.path
		tn.Name, meta.name = t.name("name")
		if meta.name && !ValidTenantName(tn.Name) {
			d.errorf(t.path.key("name"), "%q is not a tenant name: 1 to %d of letters, digits, '-' and '_'", tn.Name, MaxTenantName)
			meta.name = false
		}
		if meta.name {
			d.unique(t.path.key("name"), tn.Name, "tenant", first)
		}
		n, _ := t.integer("max_failures", DefaultTenantMaxFailures, 1, maxTenantFailures)
		tn.MaxFailures = int(n)
		tn.FailureWindow, _ = t.duration("failure_window", DefaultTenantFailureWindow, true)
		tn.HangGrace, _ = t.duration("hang_grace", DefaultTenantHangGrace, true)
		if tn.HangGrace > MaxTenantHangGrace {
			d.errorf(t.path.key("hang_grace"), "at most %s, got %s", MaxTenantHangGrace, tn.HangGrace)
			tn.HangGrace = DefaultTenantHangGrace
		}
		t.finish()
	}
	return metas
}

// sessionTenant decodes session.tenant.
func (d *decoder) sessionTenant(t *table, s *Session) {
	name, ok := t.str("tenant", "", false)
	if !ok || !t.has("tenant") {
		return
	}
	if !ValidTenantName(name) {
		d.errorf(t.path.key("tenant"), "%q is not a tenant name: 1 to %d of letters, digits, '-' and '_'", name, MaxTenantName)
		return
	}
	s.Tenant = name
}

// checkTenants: a session's tenant is a declared [[tenant]].
func (d *decoder) checkTenants(m *Manifest, tens []tenantMeta, sess []sessMeta) {
	for _, x := range tens {
		d.badNames["tenant"] = d.badNames["tenant"] || !x.name
	}
	names := namesOf(m.Tenants, func(t *Tenant) string { return t.Name })
	for i, s := range m.Sessions {
		if sess[i].p == nil || s.Tenant == "" {
			continue
		}
		if m.Tenant(s.Tenant) == nil {
			d.notFound(sess[i].p.key("tenant"), "tenant", s.Tenant, names)
		}
	}
	d.deriveTenants(m, sess)
}

// deriveTenants gives a session without a tenant key the tenant of the
// vendor kernels it lists (a [[kernel]]'s tenant key, else the kernel's
// name), so that vendor device code runs in a failure domain of its own
// by default, and checks that a session runs no kernel another tenant
// owns: a kernel with a tenant key runs only in that tenant's workers,
// whatever the session's key says. Kernels of two tenants in one session
// are an error at its programs key.
func (d *decoder) deriveTenants(m *Manifest, sess []sessMeta) {
	for i := range m.Sessions {
		s := &m.Sessions[i]
		if sess[i].p == nil {
			continue
		}
		if s.Tenant != "" {
			d.ownKernels(m, s, sess[i].p)
			continue
		}
		var from, tenant string
		for _, name := range s.Programs {
			k := m.KernelNamed(name)
			if k == nil {
				continue
			}
			t := k.Tenant
			if t == "" {
				t = k.Name
			}
			switch {
			case tenant == "":
				from, tenant = name, t
			case t != tenant:
				d.errorf(sess[i].p.key("programs"), "vendor kernels %q and %q belong to tenants %q and %q: a session runs in one tenant's worker (give both kernels one tenant key, or list kernels of one tenant)", from, name, tenant, t)
				tenant = ""
			}
			if tenant == "" {
				break
			}
		}
		if tenant == "" {
			continue
		}
		if !ValidTenantName(tenant) {
			d.errorf(sess[i].p.key("programs"), "vendor kernel %q has no tenant key and its name is not a tenant name (1 to %d of letters, digits, '-' and '_'), so it cannot be a tenant of its own: give the kernel a tenant key, or the session one", from, MaxTenantName)
			continue
		}
		s.Tenant = tenant
	}
}

// ownKernels: a session with a tenant key lists no vendor kernel whose
// tenant key names another tenant (a kernel without one runs in the
// session's tenant's worker).
func (d *decoder) ownKernels(m *Manifest, s *Session, p keyPath) {
	for _, name := range s.Programs {
		if k := m.KernelNamed(name); k != nil && k.Tenant != "" && k.Tenant != s.Tenant {
			d.errorf(p.key("tenant"), "the session is tenant %q's, and vendor kernel %q is tenant %q's: a kernel with a tenant key runs only in its own tenant's workers (list kernels of tenant %q, or change one of the tenant keys)", s.Tenant, name, k.Tenant, s.Tenant)
		}
	}
}
