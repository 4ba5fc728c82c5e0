package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/service"
)

// brokenSessions has a good session between two that cannot be created:
// one whose stagehost_init traps, one whose stagehost_init never returns.
const brokenSessions = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device.sim.fault]]
kind = "reject"
session = "boot_trap"
[[module]]
name = "good"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[module]]
name = "init_trap"
path = "@REPO@/deploy/testdata/init_trap.wasm"
sha256 = "@SHA:deploy/testdata/init_trap.wasm@"
[[module]]
name = "init_loop"
path = "@REPO@/deploy/testdata/init_loop.wasm"
sha256 = "@SHA:deploy/testdata/init_loop.wasm@"
[[session]]
name = "boot_trap"
stage = "init_trap"
device = "gpu0"
[[session]]
name = "steady"
stage = "good"
device = "gpu0"
programs = ["noop"]
@LOOP@
`

const loopSession = `[[session]]
name = "boot_loop"
stage = "init_loop"
device = "gpu0"
init_timeout = "200ms"
`

// TestSessionThatCannotBeCreatedFailsAlone: a session whose stagehost_init
// traps is recorded as failed, with the trap as its reason; the others
// run, and calls to it fail with ErrUnavailable.
func TestSessionThatCannotBeCreatedFailsAlone(t *testing.T) {
	d := open(t, strings.Replace(brokenSessions, "@LOOP@", "", 1))
	if out, err := d.Pool("steady").Run(context.Background(), nil); err != nil || string(out) != "ok" {
		t.Fatalf("steady: %q %v", out, err)
	}
	bad := d.Pool("boot_trap")
	if err := bad.Failed(); err == nil || !strings.Contains(err.Error(), "stagehost_init") || !errors.Is(err, errdefs.ErrFault) {
		t.Fatalf("Failed: %v", err)
	}
	if d.Pool("steady").Failed() != nil {
		t.Fatal("steady failed")
	}
	if got := d.FailedSessions(); len(got) != 1 || got[0] != "boot_trap" {
		t.Fatalf("FailedSessions %v", got)
	}
	_, err := bad.Run(context.Background(), nil)
	if !errors.Is(err, deploy.ErrUnavailable) || !strings.Contains(err.Error(), "trapped") || service.HTTPStatus(err) != http.StatusServiceUnavailable {
		t.Fatalf("run on the failed session: %v", err)
	}
	st := d.Statuses()
	if len(st) != 2 || st[0].Name != "boot_trap" || st[0].State != "failed" || !strings.Contains(st[0].Reason, "stagehost_init") || st[1].State != "ready" {
		t.Fatalf("statuses %+v", st)
	}
}

// TestSessionWhoseInitLoopsFails: stagehost_init that never returns is
// interrupted at the session's init_timeout, and only that session fails.
func TestSessionWhoseInitLoopsFails(t *testing.T) {
	d := open(t, strings.Replace(brokenSessions, "@LOOP@", loopSession, 1))
	err := d.Pool("boot_loop").Failed()
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("boot_loop: %v", err)
	}
	if out, err := d.Pool("steady").Run(context.Background(), nil); err != nil || string(out) != "ok" {
		t.Fatalf("steady: %q %v", out, err)
	}
}

func TestServerShowsFailedSessions(t *testing.T) {
	d := open(t, strings.Replace(brokenSessions, "@LOOP@", "", 1))
	srv := httptest.NewServer(service.NewServer(d, nil).Handler())
	defer srv.Close()
	get := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := get("POST", "/v1/sessions/boot_trap/run")
	var e struct{ Error, Class string }
	if err := json.Unmarshal([]byte(body), &e); err != nil || code != http.StatusServiceUnavailable ||
		e.Class != "unavailable" || !strings.Contains(e.Error, "could not be created") || !strings.Contains(e.Error, "stagehost_init") {
		t.Fatalf("run: %d %s", code, body)
	}
	code, body = get("GET", "/v1/sessions/boot_trap")
	var st deploy.SessionStatus
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != http.StatusOK || st.State != "failed" || !strings.Contains(st.Reason, "trapped") {
		t.Fatalf("get: %d %s", code, body)
	}
	code, body = get("GET", "/v1/sessions")
	if code != http.StatusOK || !strings.Contains(body, `"state": "failed"`) || !strings.Contains(body, `"state": "ready"`) {
		t.Fatalf("list: %d %s", code, body)
	}
	if code, body := get("POST", "/v1/sessions/steady/run"); code != http.StatusOK || body != "ok" {
		t.Fatalf("steady: %d %s", code, body)
	}
	code, body = get("GET", "/metrics")
	for _, want := range []string{
		`stagehost_session_up{session="boot_trap"} 0`,
		`stagehost_session_up{session="steady"} 1`,
		`stagehost_session_runs_total{outcome="unavailable",session="boot_trap"} 1`,
	} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
