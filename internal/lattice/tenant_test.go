package lattice_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
)

// TestTenantQuarantine: a tenant in the shared quarantine (TenantKey)
// has its sessions' calls refused, unavailable, on every host, and
// served again once cleared; a session without that tenant is not
// touched.
func TestTenantQuarantine(t *testing.T) {
	url := startServer(t)
	const lat = "tq"
	cfg := lattice.HostConfig{TTL: 30 * time.Second}
	a := join(t, url, lat, "h1", manifestOpts{extra: "tenant = \"acme\"\n[[tenant]]\nname = \"acme\"\n"}, cfg)
	other := join(t, url, lat, "h2", manifestOpts{}, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if out, err := a.h.Call(ctx, "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("before: %q %v", out, err)
	}
	if err := other.h.Quarantine().Poison(ctx, lattice.Poison{SHA256: lattice.TenantKey("acme"), Reason: "tenant acme: 3 failures in 10m0s"}); err != nil {
		t.Fatal(err)
	}
	if err := a.h.Quarantine().WaitFor(ctx, func() bool { _, ok := a.h.Quarantine().Lookup(lattice.TenantKey("acme")); return ok }); err != nil {
		t.Fatal(err)
	}
	if _, err := a.h.Call(ctx, "steady", nil); lattice.Class(err) != errdefs.ClassUnavailable || !strings.Contains(err.Error(), "tenant acme is quarantined lattice-wide: tenant acme: 3 failures") {
		t.Fatalf("a call of the quarantined tenant: %v", err)
	}
	// Over the local transport the refusal keeps its class.
	var re *errdefs.RemoteError
	if _, err := a.h.CallLocal(ctx, "steady", "", "", "", nil); !errors.As(err, &re) || re.Class != errdefs.ClassUnavailable {
		t.Fatalf("a local call of the quarantined tenant: %#v", err)
	}
	if out, err := other.h.Call(ctx, "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("a session without the tenant: %q %v", out, err)
	}
	if err := a.h.Quarantine().Clear(ctx, lattice.TenantKey("acme")); err != nil {
		t.Fatal(err)
	}
	if err := a.h.Quarantine().WaitFor(ctx, func() bool { _, ok := a.h.Quarantine().Lookup(lattice.TenantKey("acme")); return !ok }); err != nil {
		t.Fatal(err)
	}
	if out, err := a.h.Call(ctx, "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("after the clear: %q %v", out, err)
	}
}
