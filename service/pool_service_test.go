package service_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/service"
)

// pooled is a manifest with a session of three instances over two sim
// devices, a session of two instances whose fence lies (each call
// quarantines the instance it ran on), and a session that spins until
// its deadline; @QUEUE@ sets the pooled session's queue keys.
const pooled = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device.sim.fault]]
kind = "hang"
session = "liars"
[[device]]
name = "gpu1"
backend = "sim"
engine = "gpu"
[[device.sim.fault]]
kind = "hang"
session = "liars"
[[module]]
name = "good"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[module]]
name = "lying_fence"
path = "@REPO@/stages/testdata/hostile/lying_fence.wasm"
sha256 = "@LIARSHA@"
[[module]]
name = "loop"
path = "@REPO@/stages/testdata/hostile/loop_stage.wasm"
sha256 = "@LOOPSHA@"
[[session]]
name = "pooled"
stage = "good"
devices = ["gpu0", "gpu1"]
instances = 3
programs = ["noop"]
@QUEUE@
[[session]]
name = "liars"
stage = "lying_fence"
devices = ["gpu0", "gpu1"]
programs = ["noop"]
[[session]]
name = "spin"
stage = "loop"
device = "gpu0"
deadline = "30s"
`

func openPooled(t *testing.T, queue string) *deploy.Deployment {
	t.Helper()
	r := strings.NewReplacer("@QUEUE@", queue,
		"@LIARSHA@", sha(t, "stages/testdata/hostile/lying_fence.wasm"),
		"@LOOPSHA@", sha(t, "stages/testdata/hostile/loop_stage.wasm"))
	return open(t, r.Replace(pooled))
}

func TestPooledSessionSpreadsItsInstancesOverItsDevices(t *testing.T) {
	d := openPooled(t, "queue_limit = 0")
	s := d.Pool("pooled")
	ctx := context.Background()
	var turns []*deploy.Turn
	seen := map[int]string{}
	for range 3 {
		turn, err := s.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		i, dev := turn.Instance()
		seen[i] = dev
		turns = append(turns, turn)
	}
	want := map[int]string{0: "gpu0", 1: "gpu1", 2: "gpu0"}
	for i, dev := range want {
		if seen[i] != dev {
			t.Fatalf("instances %v, want %v (instance i on devices[i mod 2])", seen, want)
		}
	}
	// All three are held and no caller may wait (queue_limit 0): refused
	// at once. (Waiting in order is pool_test.go's.)
	if _, err := s.Acquire(ctx); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("past queue_limit: %v, want ErrBusy", err)
	}
	turns[0].Release()
	for _, turn := range turns[1:] {
		out, err := turn.Run(ctx, nil)
		if err != nil || string(out) != "ok" {
			t.Fatalf("Run = %q, %v", out, err)
		}
		turn.Release()
	}
	st := s.Status()
	if len(st.Instances) != 3 || st.InstancesOut != 0 || st.State != "ready" || st.Outcomes["busy"] != 1 || st.Outcomes["ok"] != 2 {
		t.Fatalf("status %+v", st)
	}
}

// watchedBody records whether the service read the request body.
type watchedBody struct{ reads atomic.Int32 }

func (b *watchedBody) Read(p []byte) (int, error) {
	b.reads.Add(1)
	return 0, io.EOF
}

func TestAFullQueueIsRefusedBeforeTheBodyIsRead(t *testing.T) {
	d := openPooled(t, "queue_limit = 0")
	srv := service.NewServerConfig(d, nil, service.ConfigFromManifest(d.Manifest))
	s := &served{t: t, srv: srv, d: d, log: &syncBuffer{}, header: http.Header{}}
	var turns []*deploy.Turn
	for range 3 {
		turn, err := d.Pool("pooled").Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		turns = append(turns, turn)
	}
	body := &watchedBody{}
	rec := s.do("POST", "/v1/sessions/pooled/run", body)
	if e := errorBody(t, rec); rec.Code != http.StatusTooManyRequests || e.Class != "busy" || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("%d %s %v", rec.Code, rec.Body, rec.Header())
	}
	if n := body.reads.Load(); n != 0 {
		t.Fatalf("the refused request's body was read %d times", n)
	}
	for _, turn := range turns {
		turn.Release()
	}
	if rec := s.do("POST", "/v1/sessions/pooled/run", strings.NewReader("x")); rec.Code != 200 || rec.Body.String() != "ok" {
		t.Fatalf("once an instance is free: %d %s", rec.Code, rec.Body)
	}
}

func TestAQuarantinedInstanceLeavesTheRotation(t *testing.T) {
	d := openPooled(t, "")
	srv := service.NewServerConfig(d, nil, service.ConfigFromManifest(d.Manifest))
	s := &served{t: t, srv: srv, d: d, log: &syncBuffer{}, header: http.Header{}}
	// Each call's fence lies about its hung work: the instance it ran on
	// is quarantined, and the other serves the next call.
	for i := range 2 {
		rec := s.do("POST", "/v1/sessions/liars/run", nil)
		if e := errorBody(t, rec); rec.Code != 503 || e.Class != "device_lost" {
			t.Fatalf("call %d: %d %s", i, rec.Code, rec.Body)
		}
		st := d.Pool("liars").Status()
		if st.InstancesOut != i+1 {
			t.Fatalf("after call %d: %d instances out, want %d: %+v", i, st.InstancesOut, i+1, st)
		}
		want := "ready"
		if i == 1 {
			want = "quarantined"
		}
		if st.State != want || st.Instances[st.InstancesOut-1].State != "quarantined" {
			t.Fatalf("after call %d: state %q, want %q: %+v", i, st.State, want, st)
		}
		if i == 0 {
			// One of two out: not ready by default (share 0), ready when
			// half may be out; the session itself still serves.
			if rec := s.do("GET", "/readyz", nil); rec.Code != 503 || !strings.Contains(rec.Body.String(), "session liars has 1 of 2 instances out of service: instance 0: ") {
				t.Fatalf("readyz, share 0: %d %s", rec.Code, rec.Body)
			}
			c := service.ConfigFromManifest(d.Manifest)
			c.ReadyQuarantinedShare = 0.5
			half := &served{t: t, srv: service.NewServerConfig(d, nil, c), d: d, log: &syncBuffer{}, header: http.Header{}}
			if rec := half.do("GET", "/readyz", nil); rec.Code != 200 {
				t.Fatalf("readyz, share 0.5: %d %s", rec.Code, rec.Body)
			}
			if rec := s.do("GET", "/v1/sessions/liars/ready", nil); rec.Code != 200 {
				t.Fatalf("the session with one instance serving: %d %s", rec.Code, rec.Body)
			}
		}
	}
	// Every instance is out of service: the reason, at once.
	rec := s.do("POST", "/v1/sessions/liars/run", nil)
	if e := errorBody(t, rec); rec.Code != 503 || e.Class != "device_lost" || !strings.Contains(e.Error, "all 2 instances are out of service") {
		t.Fatalf("with every instance quarantined: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/readyz", nil); rec.Code != 503 || !strings.Contains(rec.Body.String(), "session liars has 2 of 2 instances out of service") {
		t.Fatalf("readyz: %d %s", rec.Code, rec.Body)
	}
}

func TestTheDeadlineHeaderShortensNeverLengthens(t *testing.T) {
	d := openPooled(t, "")
	srv := service.NewServerConfig(d, nil, service.ConfigFromManifest(d.Manifest))
	s := &served{t: t, srv: srv, d: d, log: &syncBuffer{}, header: http.Header{}}
	start := time.Now()
	rec := s.do("POST", "/v1/sessions/spin/run", nil, service.DeadlineHeader, "50ms")
	if e := errorBody(t, rec); rec.Code != http.StatusGatewayTimeout || e.Class != "deadline_exceeded" {
		t.Fatalf("a spinning stage under a 50ms header: %d %s", rec.Code, rec.Body)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("took %v: the header did not shorten the 30s deadline", took)
	}
	if got := d.Pool("spin").Status().Outcomes["deadline_exceeded"]; got != 1 {
		t.Fatalf("outcome counted as %v, want deadline_exceeded", d.Pool("spin").Status().Outcomes)
	}
	for _, bad := range []string{"soon", "0s", "-1s"} {
		rec := s.do("POST", "/v1/sessions/pooled/run", nil, service.DeadlineHeader, bad)
		if e := errorBody(t, rec); rec.Code != 400 || e.Class != "invalid_argument" || !strings.Contains(e.Error, service.DeadlineHeader) {
			t.Fatalf("header %q: %d %s", bad, rec.Code, rec.Body)
		}
	}
	if rec := s.do("POST", "/v1/sessions/pooled/run", nil, service.DeadlineHeader, "1h"); rec.Code != 200 {
		t.Fatalf("a header above the manifest's deadline: %d %s", rec.Code, rec.Body)
	}
}

func TestTryAcquireNeverWaitsAndCountsNothing(t *testing.T) {
	d := openPooled(t, "queue_limit = 4")
	s := d.Pool("pooled")
	var turns []*deploy.Turn
	for range 3 {
		turn := s.TryAcquire()
		if turn == nil {
			t.Fatal("TryAcquire found no free instance of three")
		}
		turns = append(turns, turn)
	}
	if turn := s.TryAcquire(); turn != nil {
		t.Fatal("TryAcquire returned a fourth instance of three")
	}
	for _, turn := range turns {
		turn.Release()
	}
	st := s.Status()
	if st.Calls != 0 || len(st.Outcomes) != 0 {
		t.Fatalf("TryAcquire counted calls: %+v", st)
	}
	turn := s.TryAcquire()
	if turn == nil {
		t.Fatal("no instance after every turn was released")
	}
	if out, err := turn.Run(context.Background(), nil); err != nil || string(out) != "ok" {
		t.Fatal(out, err)
	}
	turn.Release()
	if d.Pool("spin").TryAcquire() == nil {
		t.Fatal("a single-instance session's free instance")
	}
}

// TestAPoolIsReadyWhileOneOfItsDevicesServes: a pooled session's
// readiness is 200 while an instance of it on a healthy device serves,
// even when the first of its devices is lost; a session only on that
// device is 503.
func TestAPoolIsReadyWhileOneOfItsDevicesServes(t *testing.T) {
	r := strings.NewReplacer("@QUEUE@", "",
		"@LIARSHA@", sha(t, "stages/testdata/hostile/lying_fence.wasm"),
		"@LOOPSHA@", sha(t, "stages/testdata/hostile/loop_stage.wasm"))
	body := strings.Replace(r.Replace(pooled), "kind = \"hang\"\nsession = \"liars\"", "kind = \"lose\"", 1) // gpu0 is lost
	d := open(t, body)
	s := &served{t: t, srv: service.NewServerConfig(d, nil, service.ConfigFromManifest(d.Manifest)), d: d, log: &syncBuffer{}, header: http.Header{}}
	if rec := s.do("GET", "/v1/sessions/pooled/ready", nil); rec.Code != 200 {
		t.Errorf("pooled over gpu0 (lost) and gpu1: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/v1/sessions/spin/ready", nil); rec.Code != 503 || !strings.Contains(rec.Body.String(), "device gpu0 is lost") {
		t.Errorf("spin, on gpu0 only: %d %s", rec.Code, rec.Body)
	}
}
