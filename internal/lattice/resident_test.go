package lattice_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/requestid"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/manifest"
)

// residentsTOML adds to the test manifest a sim npu and resident "pp"
// (gpu0, npu0), and a hanging sim npu with resident "stuck" (gpu0,
// npu1), whose every run is quarantined (its NPU participant never
// runs), with max_quarantined = 1.
const residentsTOML = `[[device]]
name = "npu0"
backend = "sim"
engine = "npu"
[[device]]
name = "npu1"
backend = "sim"
engine = "npu"
[[device.sim.fault]]
kind = "hang"
[[resident]]
name = "pp"
gpu = "gpu0"
npu = "npu0"
rounds = 4
join_deadline = "10s"
[[resident]]
name = "stuck"
gpu = "gpu0"
npu = "npu1"
join_deadline = "20ms"
max_quarantined = 1
`

// residentStatus asks the front for a resident's status and decodes it.
func residentStatus(t *testing.T, f *lattice.Front, name string) deploy.ResidentStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := f.ResidentStatus(ctx, name)
	if err != nil {
		t.Fatalf("status of %s: %v", name, err)
	}
	var st deploy.ResidentStatus
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status of %s: %v: %s", name, err, out)
	}
	return st
}

// waitRun polls a resident's status through the front until run id has
// finished (any state but starting and running), and returns it.
func waitRun(t *testing.T, f *lattice.Front, name string, id int) deploy.ResidentRun {
	t.Helper()
	var st deploy.ResidentStatus
	var found deploy.ResidentRun
	if !testutil.Poll(15*time.Second, func() bool {
		st = residentStatus(t, f, name)
		for _, run := range st.Runs {
			if run.ID == id && run.State != "starting" && run.State != "running" {
				found = run
				return true
			}
		}
		return false
	}) {
		t.Fatalf("run %d of %s not finished within 15s: %+v", id, name, st)
	}
	return found
}

// TestResidentThroughLattice: a host's residents are in its heartbeat
// and reachable from a front that has none: a start (sent once) answers
// the run's id, the status shows it verified, the host's refusal keeps
// its class; a resident no live host has, or whose host left, is
// refused unavailable. A front whose local host has the resident starts
// it there.
func TestResidentThroughLattice(t *testing.T) {
	url := startServer(t)
	const lat = "res"
	h1 := join(t, url, lat, "h1", manifestOpts{extra: residentsTOML}, lattice.HostConfig{TTL: ttl})
	nc := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := lattice.NewFront(ctx, nc, lattice.FrontConfig{Lattice: lat, TTL: ttl, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)

	// The heartbeat lists the residents.
	recs := f.Hosts()
	if len(recs) != 1 || fmt.Sprintf("%+v", recs[0].Residents) !=
		"[{Name:pp GPU:gpu0 NPU:npu0 Running:0 MaxRuns:4 Quarantined:0 MaxQuarantined:4} {Name:stuck GPU:gpu0 NPU:npu1 Running:0 MaxRuns:4 Quarantined:0 MaxQuarantined:1}]" {
		t.Fatalf("heartbeats: %+v", recs)
	}
	if !f.KnownResident("pp") || f.KnownResident("steady") || f.KnownResident("nope") ||
		fmt.Sprint(f.ResidentHosts("pp")) != "[h1]" {
		t.Fatalf("known: pp %v, steady %v, nope %v; hosts of pp %v", f.KnownResident("pp"), f.KnownResident("steady"), f.KnownResident("nope"), f.ResidentHosts("pp"))
	}

	// A spy sees every request to pp's endpoints, in the order the front
	// sent them, then a marker the front's connection sends after.
	var mu sync.Mutex
	var seen []string
	spy := connect(t, url)
	if _, err := spy.Subscribe("stagehost."+lat+".resident.pp.*", func(m *nats.Msg) {
		mu.Lock()
		seen = append(seen, m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}

	// Start through the front: the run's id, then verified.
	sctx := requestid.With(ctx, "rid-1")
	out, err := f.StartResident(sctx, "pp")
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	var started deploy.ResidentStart
	if err := json.Unmarshal(out, &started); err != nil || started.Epoch == "" || started != (deploy.ResidentStart{Epoch: started.Epoch, ID: 1, Resident: "pp", State: "running"}) {
		t.Fatalf("start answer %s (%v)", out, err)
	}
	if epoch := h1.d.Resident("pp").Status().Epoch; started.Epoch != epoch {
		t.Fatalf("the start's epoch %q, the host's resident's %q", started.Epoch, epoch)
	}
	if err := nc.Publish("stagehost."+lat+".resident.pp.marker", nil); err != nil {
		t.Fatal(err)
	}
	var got string
	if !testutil.Poll(5*time.Second, func() bool { // the spy's log, up to the marker
		mu.Lock()
		got = strings.Join(seen, " ")
		mu.Unlock()
		return strings.HasSuffix(got, "marker")
	}) {
		t.Fatalf("the spy saw %q", got)
	}
	if got != "start marker" {
		t.Fatalf("requests sent to pp: %s; want the start once", got)
	}
	if run := waitRun(t, f, "pp", 1); run.State != "verified" || !run.Verified || run.Rounds != 4 {
		t.Fatalf("run 1: %+v", run)
	}
	if st := residentStatus(t, f, "pp"); st.Epoch != started.Epoch || st.Resident != "pp" || st.Rounds != 4 || st.MaxRuns != 4 || st.Running != 0 || len(st.Runs) != 1 {
		t.Fatalf("status: %+v", st)
	}

	// The host's refusal keeps its class: stuck's first run is
	// quarantined, and at its max_quarantined of 1 the next start is
	// refused device_lost.
	out, err = f.StartResident(ctx, "stuck")
	if err != nil {
		t.Fatalf("start of stuck: %v", err)
	}
	if run := waitRun(t, f, "stuck", 1); run.State != "quarantined" {
		t.Fatalf("stuck's run: %+v (start answer %s)", run, out)
	}
	_, err = f.StartResident(ctx, "stuck")
	var le *lattice.Error
	if !errors.As(err, &le) || le.Class != errdefs.ClassDeviceLost || le.Host != "h1" || !strings.Contains(le.Message, "the cap is 1") || le.Status() != 503 {
		t.Fatalf("start past max_quarantined: %#v", err)
	}
	if rc := h1.h.Record().Residents; len(rc) != 2 || rc[1].Quarantined != 1 {
		t.Fatalf("heartbeat after a quarantined run: %+v", rc)
	}

	// A front whose local host has the resident starts it there: the
	// resident's own error, not the lattice's.
	local, err := lattice.NewFront(ctx, connect(t, url), lattice.FrontConfig{Lattice: lat, TTL: ttl, Local: h1.h, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(local.Close)
	_, err = local.StartResident(ctx, "stuck")
	if errors.As(err, &le) || lattice.Class(err) != errdefs.ClassDeviceLost {
		t.Fatalf("local start past max_quarantined: %#v", err)
	}

	// No live host has it: unavailable, sent nowhere.
	for _, name := range []string{"nope", "steady"} {
		_, err = f.StartResident(ctx, name)
		if !errors.As(err, &le) || le.Class != errdefs.ClassUnavailable || !strings.Contains(le.Message, "on no live host of lattice res") {
			t.Fatalf("start of %s: %v", name, err)
		}
	}

	// A heartbeat names a resident that no host subscribes to: no
	// responders, unavailable.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, lattice.HostsBucket(lat))
	if err != nil {
		t.Fatal(err)
	}
	ghost, _ := json.Marshal(lattice.HostRecord{Lattice: lat, ID: "ghost", TTL: ttl, Residents: []lattice.ResidentCapacity{{Name: "gone", GPU: "gpu0", NPU: "npu0"}}})
	if _, err := kv.Put(ctx, "ghost", ghost); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitFor(ctx, func() bool { return listed(f, "ghost") }); err != nil {
		t.Fatal(err)
	}
	_, err = f.StartResident(ctx, "gone")
	if !errors.As(err, &le) || le.Class != errdefs.ClassUnavailable || !strings.Contains(le.Message, "(no responders)") {
		t.Fatalf("start of a resident no host subscribes to: %v", err)
	}

	// The host leaves: its residents are on no live host.
	if err := h1.h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitFor(ctx, func() bool { return !listed(f, "h1") }); err != nil {
		t.Fatal(err)
	}
	_, err = f.StartResident(ctx, "pp")
	if !errors.As(err, &le) || le.Class != errdefs.ClassUnavailable || !strings.Contains(le.Message, `resident "pp" is on no live host`) {
		t.Fatalf("start after the host left: %v", err)
	}
	if _, err = f.ResidentStatus(ctx, "pp"); lattice.Class(err) != errdefs.ClassUnavailable {
		t.Fatalf("status after the host left: %v", err)
	}
	if !f.KnownResident("pp") {
		t.Fatal("pp forgotten: a resident a heartbeat named stays known")
	}
}

// TestMemberResident: a front-only member (serve --supervise's) starts a
// resident of a member that has it and reads its status; the lattice's
// errors are errdefs.RemoteErrors, and KnownResident follows the
// heartbeats.
func TestMemberResident(t *testing.T) {
	dir := t.TempDir()
	lt := lattice.Config{Name: "mr", Embedded: true, Listen: "127.0.0.1:0", StoreDir: filepath.Join(dir, "js"),
		HeartbeatTTL: ttl, ClaimTTL: max(manifest.DefaultClaimTTL, 2*ttl), FenceFailures: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	front, err := lattice.Join(ctx, nil, lattice.MemberConfig{Lattice: lt, HostID: "front", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	if front.KnownResident("pp") {
		t.Fatal("pp known before any heartbeat named it")
	}
	d := openDeployment(t, manifestOpts{extra: residentsTOML})
	w, err := lattice.Join(ctx, d.Deployment, lattice.MemberConfig{Lattice: lattice.Config{Name: "mr", URL: front.ClientURL(), HeartbeatTTL: ttl, ClaimTTL: max(manifest.DefaultClaimTTL, 2*ttl), FenceFailures: 3},
		HostID: "worker", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := front.Front().WaitFor(ctx, func() bool { return front.KnownResident("pp") }); err != nil {
		t.Fatal(err)
	}
	out, err := front.StartResident(ctx, "pp")
	var started deploy.ResidentStart
	if err != nil || json.Unmarshal(out, &started) != nil || started.ID != 1 || started.State != "running" {
		t.Fatalf("start through the front: %s, %v", out, err)
	}
	if run := waitRun(t, front.Front(), "pp", 1); run.State != "verified" || !run.Verified {
		t.Fatalf("run: %+v", run)
	}
	out, err = front.ResidentStatus(ctx, "pp")
	if err != nil || !strings.Contains(string(out), `"state":"verified"`) {
		t.Fatalf("status through the member: %s, %v", out, err)
	}
	_, err = front.StartResident(ctx, "nope")
	var ce *errdefs.RemoteError
	if !errors.As(err, &ce) || ce.Class != errdefs.ClassUnavailable {
		t.Fatalf("start of a resident no host has: %#v", err)
	}
	if err := w.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := front.Front().WaitFor(ctx, func() bool { return len(front.Front().Hosts()) == 0 }); err != nil {
		t.Fatal(err)
	}
	if _, err := front.ResidentStatus(ctx, "pp"); !errors.As(err, &ce) || ce.Class != errdefs.ClassUnavailable || !front.KnownResident("pp") {
		t.Fatalf("status after the worker left: %#v (known %v)", err, front.KnownResident("pp"))
	}
}

// TestResidentRequestsSentAgain: a resident's status request that
// reaches a member of its queue group that never acknowledges it (a
// host that died as it got the request) is sent again after AckTimeout
// and answered by the live host, instead of waiting for its deadline; a
// start that no host acknowledged is never sent again, and is answered
// unavailable at its deadline, naming that no host took it.
func TestResidentRequestsSentAgain(t *testing.T) {
	url := startServer(t)
	const lat = "resa"
	join(t, url, lat, "h1", manifestOpts{extra: residentsTOML}, lattice.HostConfig{TTL: ttl})
	swallowed := blackHole(t, url, lattice.ResidentStatusSubject(lat, "pp"), lattice.ResidentQueueGroup(lat, "pp"))
	swallowedStarts := blackHole(t, url, lattice.ResidentStartSubject(lat, "pp"), lattice.ResidentQueueGroup(lat, "pp"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := lattice.NewFront(ctx, connect(t, url), lattice.FrontConfig{Lattice: lat, TTL: ttl, AckTimeout: 20 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	for i := range 20 {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := f.ResidentStatus(cctx, "pp")
		cancel()
		if err != nil {
			t.Fatalf("status %d: %v (stats %+v)", i, err, f.Stats())
		}
	}
	if swallowed.Load() == 0 {
		t.Fatal("the hole took no status request: nothing was sent again")
	}
	if st := f.Stats(); st != (lattice.FrontStats{}) {
		t.Fatalf("resident requests counted in the front's stats: %+v", st)
	}
	// Starts: those the hole takes are not sent again.
	holeStarts := 0
	for range 20 {
		cctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := f.StartResident(cctx, "pp")
		cancel()
		if err == nil {
			continue
		}
		var le *lattice.Error
		if !errors.As(err, &le) || le.Class != errdefs.ClassUnavailable || !strings.Contains(le.Message, "no host took the start") {
			t.Fatalf("a start the hole took: %#v", err)
		}
		holeStarts++
	}
	if holeStarts == 0 || int64(holeStarts) != swallowedStarts.Load() {
		t.Fatalf("%d starts failed, the hole took %d: each start is sent once", holeStarts, swallowedStarts.Load())
	}
}
