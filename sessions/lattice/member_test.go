package lattice_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stagehost/stagehost/sessions/deploy"
	"github.com/stagehost/stagehost/sessions/lattice"
	"github.com/stagehost/stagehost/sessions/manifest"
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
	lt := manifest.Lattice{Name: "tok", Embedded: true, Listen: "127.0.0.1:0", StoreDir: filepath.Join(dir, "js"),
		TokenFile: tokFile, HeartbeatTTL: time.Second, FenceFailures: 3, QuarantineOnDeviceLost: true}
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
	other := manifest.Lattice{Name: "tok", URL: m1.ClientURL(), TokenFile: tokFile, HeartbeatTTL: time.Second, FenceFailures: 3}
	d2 := openDeployment(t, manifestOpts{instances: 1, extra: "[[session]]\nname = \"other\"\nstage = \"good\"\ndevice = \"gpu0\"\nprograms = [\"noop\"]\n"})
	if _, err := lattice.Join(ctx, d2.Deployment, lattice.MemberConfig{Lattice: manifest.Lattice{Name: "tok", URL: m1.ClientURL(), HeartbeatTTL: time.Second}, HostID: "nocreds", Logger: quietLogger()}); err == nil {
		t.Fatal("a member without the token joined")
	}
	m2, err := lattice.Join(ctx, d2.Deployment, lattice.MemberConfig{Lattice: other, HostID: "two", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if !m1.Known("other") || m2.Known("nope") {
		t.Errorf("Known: other %v, nope %v", m1.Known("other"), m2.Known("nope"))
	}
	// m1 has no session "other": the call goes to m2.
	if err := m1.Front().WaitFor(ctx, func() bool { return len(m1.Front().Serving("other")) == 1 }); err != nil {
		t.Fatal(err)
	}
	out, err := m1.Call(ctx, "other", nil, "")
	if err != nil || string(out) != "ok" {
		t.Fatalf("call through the lattice: %q, %v", out, err)
	}
	if st := m1.Stats(); st["remote"] != 1 {
		t.Errorf("stats: %v", st)
	}
	// Leaving deletes m2's heartbeat at once: m1 refuses "other" with a
	// deploy.ClassError of class unavailable.
	if err := m2.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond) // half the TTL: the delete, not the expiry
	defer cancel()
	if err := m1.Front().WaitFor(wctx, func() bool { return len(m1.Front().Serving("other")) == 0 }); err != nil {
		t.Fatalf("m2's heartbeat still listed after Leave: %v", err)
	}
	_, err = m1.Call(ctx, "other", nil, "")
	var ce *deploy.ClassError
	if !errors.As(err, &ce) || ce.Class != deploy.ClassUnavailable {
		t.Fatalf("after m2 left: %v", err)
	}
}
