package service_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/service"
)

// listen serves s on a loopback port until ctx ends; it returns the
// address and the channel Serve's error comes on.
func listen(t *testing.T, s *served, ctx context.Context, grace time.Duration) (string, net.Listener, chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(ctx, ln, grace) }()
	return "http://" + ln.Addr().String(), ln, served
}

// TestGraceCutOffAnswers503: a call still in flight when the grace
// period runs out (here: waiting for the session's one instance, which
// the test holds) is answered 503 class unavailable with Connection:
// close, once; Serve returns nil and counts it cut off and answered.
func TestGraceCutOffAnswers503(t *testing.T) {
	s := serveHostile(t, "", "queue_limit = 4\nqueue_timeout = \"10m\"", nil)
	sess := s.d.Pool("steady")
	held, err := sess.Acquire(testutil.Context(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	base, _, served := listen(t, s, ctx, 50*time.Millisecond)

	type answer struct {
		resp *http.Response
		body []byte
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("POST", base+"/v1/sessions/steady/run", strings.NewReader("x"))
		req.Header.Set("X-Request-Id", "cut-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- answer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- answer{resp, b, err}
	}()
	testutil.Eventually(t, 30*time.Second, func() bool { return sess.Status().Waiting == 1 }, "the call never waited for the held instance")
	stop() // SIGTERM: no drain delay; the grace of 50ms runs out with the call still waiting
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v, want nil after the cut-off", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return after its grace period")
	}
	var a answer
	select {
	case a = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the call in flight got no answer")
	}
	if a.err != nil {
		t.Fatalf("the call in flight: %v, want a 503", a.err)
	}
	var e service.ErrorBody
	if err := json.Unmarshal(a.body, &e); err != nil || a.resp.StatusCode != 503 || e.Class != "unavailable" ||
		e.RequestID != "cut-1" || !a.resp.Close || a.resp.Header.Get("Retry-After") == "" || !strings.Contains(e.Error, "grace period ran out") {
		t.Fatalf("the call in flight: %d %v %s (%v)", a.resp.StatusCode, a.resp.Header, a.body, err)
	}
	held.Release()
	// The handler returns (its context ended with the connection) and
	// is not counted a second time.
	testutil.Eventually(t, 30*time.Second, func() bool { return sess.Status().Waiting == 0 }, "the cut-off call still waits")
	if acc, ans := s.srv.Counts(); acc != 1 || ans != 1 || s.srv.CutOff() != 1 {
		t.Fatalf("counts: %d accepted, %d answered, %d cut off; want 1, 1, 1", acc, ans, s.srv.CutOff())
	}
}

// TestDrainAnswersCloseTheirConnections: from the start of the drain
// delay, every answer carries Connection: close, so a keep-alive client
// does not send its next request on a connection the shutdown closes.
func TestDrainAnswersCloseTheirConnections(t *testing.T) {
	s := serveHostile(t, "[service]\ndrain_delay = \"10m\"", "", nil)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	base, ln, served := listen(t, s, ctx, time.Second)
	defer func() {
		ln.Close() // ends the drain delay: Serve returns
		<-served
	}()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	post := func() *http.Response {
		t.Helper()
		if _, err := io.WriteString(conn, "POST /v1/sessions/steady/run HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := post(); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("before the drain: %d, Connection: close %v", resp.StatusCode, resp.Close)
	}
	stop()
	testutil.Eventually(t, 30*time.Second, func() bool {
		rec := s.do("GET", "/readyz", nil)
		return rec.Code == 503 && strings.Contains(rec.Body.String(), "draining")
	}, "never draining")
	// The same keep-alive connection: answered, and told to close.
	resp := post()
	if resp.StatusCode != 200 || !resp.Close { // Close: the answer said Connection: close
		t.Fatalf("while draining: %d %v, want 200 with Connection: close", resp.StatusCode, resp.Header)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("the connection stays open after Connection: close (%v)", err)
	}
}

// TestGraceCutOffAnswersASlowUpload: a request whose body is still
// arriving when the grace period runs out is answered 503 too.
func TestGraceCutOffAnswersASlowUpload(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	base, _, served := listen(t, s, ctx, 50*time.Millisecond)
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	// One byte of ten: the handler waits for the rest.
	if _, err := io.WriteString(conn, "POST /v1/sessions/steady/run HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nx"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { acc, _ := s.srv.Counts(); return acc == 1 }, "the request was never accepted")
	stop()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return after its grace period")
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the slow upload got no answer: %v", err)
	}
	var e service.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != 503 || e.Class != "unavailable" {
		t.Fatalf("the slow upload: %d %+v %v", resp.StatusCode, e, err)
	}
	if acc, ans := s.srv.Counts(); acc != 1 || ans != 1 || s.srv.CutOff() != 1 {
		t.Fatalf("counts: %d accepted, %d answered, %d cut off", acc, ans, s.srv.CutOff())
	}
}
