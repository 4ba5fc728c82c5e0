package lattice_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/manifest"
)

// TestLocalCallsWithoutNATS: a member's own sessions keep serving the
// calls that reach it (Member.Call: the HTTP run route's path) while its
// NATS server is away: with the server shut down, 60 calls from 6
// callers on 2 instances (so most wait for an instance) all answer "ok",
// each within its deadline, and none is refused.
func TestLocalCallsWithoutNATS(t *testing.T) {
	srv, err := lattice.EmbeddedServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	down := false
	t.Cleanup(func() {
		if !down {
			srv.Shutdown()
		}
		srv.WaitForShutdown()
	})
	d := openDeployment(t, manifestOpts{instances: 2, latency: 2 * time.Millisecond})
	lt := lattice.Config{Name: "alone", URL: srv.ClientURL(), HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3}
	ctx := testutil.Context(t, 10*time.Second)
	m, err := lattice.Join(ctx, d.Deployment, lattice.MemberConfig{Lattice: lt, HostID: "alone", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	srv.Shutdown()
	down = true
	testutil.Eventually(t, 5*time.Second, func() bool { return m.Ready() != nil }, "the member still says it is connected")

	const deadline = time.Second
	var wg sync.WaitGroup
	errs := make(chan string, 60)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				cctx, cancel := context.WithTimeout(context.Background(), deadline)
				start := time.Now()
				out, _, err := m.Call(cctx, "steady", nil)
				took := time.Since(start)
				cancel()
				if err != nil || string(out) != "ok" || took > deadline {
					errs <- time.Now().Format(time.StampMilli) + " " + string(out) + " " + took.String() + " " + errString(err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error("a local call without NATS:", e)
	}
	if st := m.Stats(); st["local"] != 60 || st["remote"] != 0 {
		t.Errorf("routes: %v, want 60 local", st)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestFrontRefusesWhileDisconnected: a front whose NATS server has been
// gone for longer than the TTL answers a call to another host's session
// 503 at once ("disconnected"), not at the call's deadline, and still
// lists the host it last heard (it cannot know it is gone).
func TestFrontRefusesWhileDisconnected(t *testing.T) {
	srv, err := lattice.EmbeddedServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	down := false
	t.Cleanup(func() {
		if !down {
			srv.Shutdown()
		}
		srv.WaitForShutdown()
	})
	url := srv.ClientURL()
	h := join(t, url, "gone", "h", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	ctx := testutil.Context(t, 10*time.Second)
	nc := connect(t, url)
	f, err := lattice.NewFront(ctx, nc, lattice.FrontConfig{Lattice: "gone", TTL: ttl, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close(); f.Close() }) // as Member.Close does, disconnected
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("steady")) == 1 }); err != nil {
		t.Fatal(err)
	}
	h.nc.Close()
	srv.Shutdown()
	down = true
	// Within the TTL of the disconnection a call is sent (and waits for
	// the connection, within its deadline); past it, it is refused.
	var last error
	testutil.Eventually(t, 5*time.Second, func() bool {
		cctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, last = f.Call(cctx, "steady", nil)
		return strings.Contains(errString(last), "disconnected")
	}, "no refusal while disconnected: %v", last)
	cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err = f.Call(cctx, "steady", nil)
	if took := time.Since(start); lattice.Class(err) != errdefs.ClassUnavailable || !strings.Contains(errString(err), "disconnected from the NATS servers") || took > 500*time.Millisecond {
		t.Errorf("a call while disconnected: %v after %v, want 503 at once", err, took)
	}
	if len(f.Serving("steady")) != 1 {
		t.Errorf("the disconnected front forgot the host: %v", f.Hosts())
	}
}

// TestServerRestartMidCall: the lattice's only NATS server goes away
// while a host runs a call, and comes back (same port, same store) 1 s
// later: the call is answered "ok" once both are reconnected, well
// within its deadline (10 s), not 503 ("went away") nor at the deadline.
func TestServerRestartMidCall(t *testing.T) {
	dir := t.TempDir()
	listen := "127.0.0.1:" + itoa(freeTCPPort(t))
	start := func() *server.Server {
		srv, err := lattice.StartEmbedded(lattice.EmbeddedConfig{Listen: listen, StoreDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	var mu sync.Mutex
	srv := start()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	url := srv.ClientURL()
	h := join(t, url, "restart", "h", manifestOpts{latency: 500 * time.Millisecond}, lattice.HostConfig{TTL: ttl})
	ctx := testutil.Context(t, 20*time.Second)
	nc := connect(t, url)
	f, err := lattice.NewFront(ctx, nc, lattice.FrontConfig{Lattice: "restart", TTL: ttl, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("steady")) == 1 }); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	lattice.SetOnRun(h.h, func(string) {
		once.Do(func() {
			mu.Lock()
			srv.Shutdown()
			srv.WaitForShutdown()
			mu.Unlock()
			time.AfterFunc(time.Second, func() { // the outage's length
				mu.Lock()
				srv = start()
				mu.Unlock()
			})
		})
	})
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t0 := time.Now()
	out, err := f.Call(cctx, "steady", nil)
	if took := time.Since(t0); err != nil || string(out) != "ok" || took > 5*time.Second {
		t.Fatalf("a call across a restart of the server: %q, %v after %v", out, err, took)
	}
}
