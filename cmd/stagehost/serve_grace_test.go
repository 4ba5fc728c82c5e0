package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
)

// TestServeGraceRunsOut: SIGTERM while two calls are in flight (one runs
// a stage that does not return within --grace, the other waits for the
// session's one instance): each is answered 503 unavailable when --grace
// runs out, serve exits 0, and its stopped line counts them cut off and
// answered.
func TestServeGraceRunsOut(t *testing.T) {
	cmd, stdout, stderr := startBinary(t, "serve", "testdata/grace.toml", "--addr", "127.0.0.1:0", "--grace", "100ms", "--quiet")
	base, lines := testutil.Serving(t, stdout, serveStartTimeout, func() string { _ = cmd.Process.Kill(); _ = cmd.Wait(); return stderr.String() })
	client := &counted{c: &http.Client{Timeout: 2 * time.Minute}}
	type answer struct {
		code int
		body []byte
		err  error
	}
	answers := make(chan answer, 2)
	call := func() {
		code, body, err := client.post(base, "/v1/sessions/spin/run", nil)
		answers <- answer{code, body, err}
	}
	// One call holds the session's one instance (its stage spins), the
	// other waits for it.
	go call()
	go call()
	testutil.Eventually(t, time.Minute, func() bool {
		_, body, _ := client.get(base, "/v1/sessions/spin")
		return bytes.Contains(body, []byte(`"waiting": 1`))
	}, "no call waits: the other does not hold the instance")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case a := <-answers:
			var e struct{ Class, Error string }
			if a.err != nil || a.code != 503 || json.Unmarshal(a.body, &e) != nil || e.Class != "unavailable" {
				t.Errorf("a call in flight at the end of --grace: %d %s %v", a.code, a.body, a.err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a call in flight got no answer")
		}
	}
	var rest bytes.Buffer
	for lines.Scan() {
		rest.WriteString(lines.Text() + "\n")
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v\nstdout: %s\nstderr: %s", err, rest.String(), stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("serve did not exit after its grace period")
	}
	m := regexp.MustCompile(`stopped: (\d+) requests? accepted, (\d+) answered, (\d+) of them cut off when --grace ran out \(answered 503 unavailable\)`).FindStringSubmatch(rest.String())
	if m == nil {
		t.Fatalf("no shutdown report with the calls cut off: %s", rest.String())
	}
	if m[1] != m[2] || m[3] != "2" {
		t.Fatalf("stopped line %q: want as many answered as accepted, 2 cut off", m[0])
	}
	if got := strconv.FormatUint(client.responses.Load(), 10); got != m[2] {
		t.Fatalf("the server answered %s requests, the client received %s responses", m[2], got)
	}
}
