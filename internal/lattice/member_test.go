package lattice_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/manifest"
)

// TestMemberEmbeddedToken: a member that starts the embedded server with
// a token requires it of every client: a connection without it is
// refused, a second member with it joins and routes a call to the
// first's session.
func TestMemberEmbeddedToken(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte("a-lattice-token-of-some-length\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	lt := lattice.Config{Name: "tok", Embedded: true, Listen: "127.0.0.1:0", StoreDir: filepath.Join(dir, "js"),
		TokenFile: tokFile, HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3, QuarantineOnDeviceLost: true}
	ctx := context.Background()
	d1 := openDeployment(t, manifestOpts{instances: 1})
	m1, err := lattice.Join(ctx, d1.Deployment, lattice.MemberConfig{Lattice: lt, HostID: "one", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer m1.Close()
	if m1.Ready() != nil {
		t.Fatalf("ready: %v", m1.Ready())
	}
	if nc, err := nats.Connect(m1.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("the embedded server took a client without the token")
	}
	other := lattice.Config{Name: "tok", URL: m1.ClientURL(), TokenFile: tokFile, HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3}
	d2 := openDeployment(t, manifestOpts{instances: 1, extra: "[[session]]\nname = \"other\"\nstage = \"good\"\ndevice = \"gpu0\"\nprograms = [\"noop\"]\n"})
	if _, err := lattice.Join(ctx, d2.Deployment, lattice.MemberConfig{Lattice: lattice.Config{Name: "tok", URL: m1.ClientURL(), HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL}, HostID: "nocreds", Logger: quietLogger()}); err == nil {
		t.Fatal("a member without the token joined")
	}
	m2, err := lattice.Join(ctx, d2.Deployment, lattice.MemberConfig{Lattice: other, HostID: "two", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	// m1 learns of m2's session from m2's first heartbeat, after Join.
	testutil.Eventually(t, 5*time.Second, func() bool { return m1.Known("other") }, "m1 does not know m2's session \"other\"")
	if m2.Known("nope") {
		t.Error("m2 knows a session \"nope\" that no host has")
	}
	// m1 has no session "other": the call goes to m2.
	if err := m1.Front().WaitFor(ctx, func() bool { return len(m1.Front().Serving("other")) == 1 }); err != nil {
		t.Fatal(err)
	}
	out, tp, err := m1.Call(ctx, "other", nil)
	if err != nil || string(out) != "ok" {
		t.Fatalf("call through the lattice: %q, %v", out, err)
	}
	// None came in: the one the front made and sent, a valid one.
	if !trace.SpanContextFromContext(lattice.WithTraceparent(ctx, tp)).IsValid() {
		t.Errorf("traceparent sent: %q", tp)
	}
	if st := m1.Stats(); st["remote"] != 1 {
		t.Errorf("stats: %v", st)
	}
	// Leaving deletes m2's heartbeat at once: m1 refuses "other" with a
	// errdefs.RemoteError of class unavailable.
	if err := m2.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond) // half the TTL: the delete, not the expiry
	defer cancel()
	if err := m1.Front().WaitFor(wctx, func() bool { return len(m1.Front().Serving("other")) == 0 }); err != nil {
		t.Fatalf("m2's heartbeat still listed after Leave: %v", err)
	}
	_, _, err = m1.Call(ctx, "other", nil)
	var ce *errdefs.RemoteError
	if !errors.As(err, &ce) || ce.Class != errdefs.ClassUnavailable {
		t.Fatalf("after m2 left: %v", err)
	}
}

// TestHostCloseOrder: Close stops the host's endpoints and deletes its
// heartbeat first (a front forgets it at once, long before the TTL),
// then lets the call it took finish: the caller gets its answer.
func TestHostCloseOrder(t *testing.T) {
	url := startServer(t)
	const ttl = 10 * time.Second // far longer than the test: only the delete can drop the host
	m := join(t, url, "order", "slow", manifestOpts{instances: 1, latency: time.Second}, lattice.HostConfig{TTL: ttl})
	f := newFront(t, url, "order", lattice.FrontConfig{TTL: ttl})
	ctx := context.Background()
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := f.Call(ctx, "steady", nil)
		done <- result{out, err}
	}()
	// The call is in flight on the host once its in_flight shows.
	testutil.Eventually(t, 5*time.Second, func() bool { return m.h.Record().Sessions[0].InFlight != 0 }, "the call never reached the host")
	closed := make(chan error, 1)
	go func() { closed <- m.h.Close(ctx) }()
	// Well before the call's second on the device is over.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := f.WaitFor(wctx, func() bool { return !listed(f, "slow") }); err != nil {
		t.Fatalf("the host's heartbeat outlived Close's start by 300ms: %v", err)
	}
	select {
	case r := <-done:
		t.Fatalf("the call ended before the heartbeat went: %q %v", r.out, r.err)
	default:
	}
	r := <-done
	if r.err != nil || string(r.out) != "ok" {
		t.Fatalf("the call in flight: %q, %v", r.out, r.err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// TestMemberEmbeddedNkey: with nkey_seed_file the embedded server admits
// that key only.
func TestMemberEmbeddedNkey(t *testing.T) {
	dir := t.TempDir()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	seedFile := filepath.Join(dir, "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	lt := lattice.Config{Name: "nk", Embedded: true, Listen: "127.0.0.1:0", StoreDir: filepath.Join(dir, "js"),
		NkeySeedFile: seedFile, HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3}
	d := openDeployment(t, manifestOpts{instances: 1})
	m, err := lattice.Join(context.Background(), d.Deployment, lattice.MemberConfig{Lattice: lt, HostID: "one", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if nc, err := nats.Connect(m.ClientURL(), nats.Token("a-lattice-token-of-some-length")); err == nil {
		nc.Close()
		t.Fatal("the embedded server took a client without the nkey")
	}
	other, _ := nkeys.CreateUser()
	pub, _ := other.PublicKey()
	if nc, err := nats.Connect(m.ClientURL(), nats.Nkey(pub, other.Sign)); err == nil {
		nc.Close()
		t.Fatal("the embedded server took another nkey")
	}
	if out, _, err := m.Call(context.Background(), "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("call: %q, %v", out, err)
	}
}

// TestMemberFrontOnly: Join with no deployment (serve --supervise's
// supervisor) embeds the server, publishes no heartbeat and routes every
// call to the hosts that serve the session.
func TestMemberFrontOnly(t *testing.T) {
	dir := t.TempDir()
	lt := lattice.Config{Name: "fo", Embedded: true, Listen: "127.0.0.1:0", StoreDir: filepath.Join(dir, "js"),
		HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3}
	ctx := context.Background()
	front, err := lattice.Join(ctx, nil, lattice.MemberConfig{Lattice: lt, HostID: "front", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	if front.Host() != nil || front.Ready() != nil {
		t.Fatalf("front only: host %v, ready %v", front.Host(), front.Ready())
	}
	d := openDeployment(t, manifestOpts{instances: 1})
	w, err := lattice.Join(ctx, d.Deployment, lattice.MemberConfig{Lattice: lattice.Config{Name: "fo", URL: front.ClientURL(), HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3},
		HostID: "worker", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := front.Front().WaitFor(ctx, func() bool { return len(front.Front().Serving("steady")) == 1 }); err != nil {
		t.Fatal(err)
	}
	if hosts := front.Front().Hosts(); len(hosts) != 1 || hosts[0].ID != "worker" {
		t.Errorf("hosts %v; want the worker only (a front has no heartbeat)", hosts)
	}
	out, _, err := front.Call(ctx, "steady", nil)
	if err != nil || string(out) != "ok" {
		t.Fatalf("call through the front: %q, %v", out, err)
	}
	if st := front.Stats(); st["remote"] != 1 || st["local"] != 0 {
		t.Errorf("stats %v; want 1 remote", st)
	}
	if err := front.Leave(ctx); err != nil {
		t.Errorf("Leave of a front only: %v", err)
	}
}
