package lattice_test

import (
	"context"
	"sync"
	"testing"
	"time"

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
