package deploy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/manifest"
)

// Session a's streams hang (a sim fault scoped to it): its call is
// interrupted at its deadline and its fence waits on the hung stream.
const overdueManifest = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device.sim.fault]]
kind = "hang"
session = "a"
[[module]]
name = "good"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[session]]
name = "a"
stage = "good"
device = "gpu0"
programs = ["noop"]
deadline = "200ms"
fence_timeout = "2s"
[[session]]
name = "b"
stage = "good"
device = "gpu0"
programs = ["noop"]
deadline = "50ms"
`

// TestOverdue: Config.WithOverdue reports a call still running its grace
// past its session's deadline (a hung stream holds its fence) once, long
// before its fence_timeout, never a call that ended in time, and never
// earlier for a caller's earlier deadline.
func TestOverdue(t *testing.T) {
	m, err := manifest.Load(writeManifest(t, overdueManifest))
	if err != nil {
		t.Fatal(err)
	}
	const grace = 30 * time.Millisecond
	got := make(chan deploy.Overdue, 16)
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig().WithOverdue(grace, func(o deploy.Overdue) { got <- o }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = d.Close(ctx)
	})
	ctx := context.Background()
	// b's calls end within their deadline: were their watches not
	// disarmed, each would report 80 ms after it began, before a's.
	for range 20 {
		if _, err := d.Pool("b").Run(ctx, []byte{0}); err != nil {
			t.Fatal(err)
		}
	}
	// a's caller gives a deadline of its own, far earlier than the
	// session's 200 ms (as a Stagehost-Deadline header does): it ends the
	// caller's wait, not the tenant's allowance, so the watch still
	// counts from the session's deadline.
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := d.Pool("a").Run(actx, []byte{0})
		done <- err
	}()
	var o deploy.Overdue
	select {
	case o = <-got:
	case err := <-done:
		t.Fatalf("a's call ended before it was overdue: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no overdue report within 20 s")
	}
	at := time.Since(start)
	if o.Session != "a" || o.Device != "gpu0" || o.Instance != 0 || o.Grace != grace {
		t.Fatalf("overdue %+v; want session a on gpu0, instance 0, grace %v", o, grace)
	}
	if late := time.Since(o.Deadline); late < grace || o.Deadline.Sub(start) > 250*time.Millisecond || o.Deadline.Sub(start) < 200*time.Millisecond {
		t.Fatalf("reported %v after its deadline %v (call started %v before it)", late, o.Deadline, o.Deadline.Sub(start))
	}
	if at < 200*time.Millisecond+grace {
		t.Fatalf("reported %v after the call began, before its deadline 200ms + grace %v", at, grace)
	}
	// The call goes on: its fence misses fence_timeout (2 s) and
	// quarantines the instance; the watch reported once.
	if err := <-done; !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("a's call: %v, want deadline_exceeded", err)
	}
	if at > 2*time.Second {
		t.Fatalf("reported %v after the call began: not before its fence_timeout", at)
	}
	select {
	case o := <-got:
		t.Fatalf("a second report: %+v", o)
	default:
	}
}
