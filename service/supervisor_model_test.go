package service_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/modelctl"
	"github.com/stagehost/stagehost/internal/supervise"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/service"
	"github.com/stagehost/stagehost/stages"
)

type fakeStatuses []supervise.WorkerStatus

func (f fakeStatuses) Status() []supervise.WorkerStatus { return f }

// A supervisor's model control over one worker's endpoint (a deployment
// served with modelctl.Serve on an embedded NATS server): refusals keep
// their class, and a worker that reports ready with an older revision
// of the model state than the store's is made to restore it.
func TestSupervisorModelControl(t *testing.T) {
	nc := testutil.NATS(t)
	d := open(t, `version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "good"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[session]]
name = "b"
stage = "good"
device = "gpu0"
programs = ["noop"]
`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := modelctl.OpenDir(t.TempDir())
	echo, err := os.ReadFile(filepath.Join(repo, "stages/testdata/hostile/echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	echoSHA := stages.SHA256(echo)
	sub, err := modelctl.Serve(nc, "l", "sv-w1", d, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	// The worker reported ready having restored revision 0; then the
	// store got v2 and b's swap to it (revision 2), which it missed.
	w1 := supervise.WorkerStatus{Name: "w1", PID: 42, State: supervise.StateReady, Reported: true, Sessions: []string{"b"}}
	mc, changed := service.SupervisorModelControl(service.SupervisorModel{Conn: nc, Lattice: "l", Supervisor: fakeStatuses{w1},
		HostOf: func(w string) string { return "sv-" + w }, Store: store, Manifest: d.Manifest})

	for _, c := range []struct {
		err   error
		class string
		msg   string
	}{
		{swapErr(mc.SwapSession(ctx, "nope", "good")), errdefs.ClassNotFound, `no session "nope"`},
		{swapErr(mc.SwapSession(ctx, "b", "nope")), errdefs.ClassNotFound, `worker w1: `},
		{resetErr(mc.ResetSession(ctx, "nope")), errdefs.ClassNotFound, `no session "nope"`},
	} {
		if deploy.Class(c.err) != c.class || !strings.Contains(c.err.Error(), c.msg) || errors.Is(c.err, errdefs.ErrNotFound) != (c.class == errdefs.ClassNotFound) {
			t.Errorf("%v (%s); want class %s with %q", c.err, deploy.Class(c.err), c.class, c.msg)
		}
	}

	if err := store.PutBlob(ctx, echoSHA, echo); err != nil {
		t.Fatal(err)
	}
	goodSHA := sha(t, "stages/testdata/hostile/good_stage.wasm")
	for _, fn := range []func(*modelctl.State) error{
		func(s *modelctl.State) error {
			s.AddModule(modelctl.ModuleRecord{Name: "v2", SHA256: echoSHA, Source: "upload"})
			return nil
		},
		func(s *modelctl.State) error {
			s.SetSwap(modelctl.SwapRecord{Session: "b", Stage: "v2@" + echoSHA, ManifestStage: "good@" + goodSHA})
			return nil
		},
	} {
		if err := store.Update(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}
	changed(w1)
	run := func() string {
		out, err := d.Pool("b").Run(ctx, []byte("hi"))
		if err != nil {
			return err.Error()
		}
		return string(out)
	}
	if !testutil.Poll(10*time.Second, func() bool { return run() == "hi" }) {
		t.Fatalf("the worker did not restore the state it missed: b answers %q", run())
	}
	body, err := mc.Modules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if mb := body.(service.ModulesBody); len(mb.Modules) != 2 || len(mb.Workers["w1"]) != 2 {
		t.Errorf("modules: %+v", mb)
	}
}

// A swap of a session two workers serve goes to both; one that refuses
// is the answer, named, and nothing is recorded.
func TestSupervisorModelControlTwoWorkers(t *testing.T) {
	nc := testutil.NATS(t)
	const body = `version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "good"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[session]]
name = "b"
stage = "good"
device = "gpu0"
programs = ["noop"]
`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := modelctl.OpenDir(t.TempDir())
	var ds []*deploy.Deployment
	var sts fakeStatuses
	for i, name := range []string{"w1", "w2"} {
		d := open(t, body)
		sub, err := modelctl.Serve(nc, "l", "sv-"+name, d, store, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		ds = append(ds, d)
		sts = append(sts, supervise.WorkerStatus{Name: name, PID: 10 + i, State: supervise.StateReady, Reported: true, Sessions: []string{"b"}})
	}
	mc, _ := service.SupervisorModelControl(service.SupervisorModel{Conn: nc, Lattice: "l", Supervisor: sts,
		HostOf: func(w string) string { return "sv-" + w }, Store: store, Manifest: ds[0].Manifest})
	echo, err := os.ReadFile(filepath.Join(repo, "stages/testdata/hostile/echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	echoSHA := stages.SHA256(echo)
	info, created, err := mc.LoadModule(ctx, deploy.ModuleRequest{Name: "v2", SHA256: echoSHA}, echo, "upload")
	if err != nil || !created || info.Ref != "v2@"+echoSHA {
		t.Fatalf("load: %+v %v %v", info, created, err)
	}
	if _, err := mc.SwapSession(ctx, "b", "v2"); err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		if out, err := d.Pool("b").Run(ctx, []byte("hi")); err != nil || string(out) != "hi" {
			t.Errorf("worker %d after the swap: %q %v", i+1, out, err)
		}
	}
	// v3 only on w1 (loaded there directly): w2 refuses the swap.
	if _, _, err := ds[0].LoadModule(ctx, deploy.ModuleRequest{Name: "v3", SHA256: echoSHA}, echo, "upload"); err != nil {
		t.Fatal(err)
	}
	before, _ := store.Load(ctx)
	_, err = mc.SwapSession(ctx, "b", "v3")
	if deploy.Class(err) != errdefs.ClassNotFound || !strings.HasPrefix(err.Error(), "worker w2: ") {
		t.Errorf("a swap w2 refuses: %v", err)
	}
	if after, _ := store.Load(ctx); after.Revision != before.Revision || len(after.Swaps) != 1 || after.Swaps[0].Stage != "v2@"+echoSHA {
		t.Errorf("the state after a refused swap: %+v (before %+v)", after, before)
	}
}

func swapErr(_ deploy.SwapResult, err error) error   { return err }
func resetErr(_ deploy.ResetResult, err error) error { return err }
