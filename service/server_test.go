package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/service"
	"github.com/stagehost/stagehost/stages"
)

// hostile is a manifest of the steady good stage, a trapping stage and a
// session whose own fence lies (so its first call quarantines it), with
// @SERVICE@ and @SESSION@ to fill in.
const hostile = `
version = 1
@SERVICE@
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device]]
name = "gpu1"
backend = "sim"
engine = "gpu"
[[device.sim.fault]]
kind = "hang"
session = "liar"
[[device]]
name = "npu0"
backend = "sim"
engine = "npu"
[[module]]
name = "good"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[module]]
name = "trap"
path = "@REPO@/stages/testdata/hostile/trap_stage.wasm"
sha256 = "@TRAPSHA@"
[[module]]
name = "lying_fence"
path = "@REPO@/stages/testdata/hostile/lying_fence.wasm"
sha256 = "@LIARSHA@"
[[session]]
name = "steady"
stage = "good"
device = "gpu0"
programs = ["noop"]
@SESSION@
[[session]]
name = "trap"
stage = "trap"
device = "gpu0"
[[session]]
name = "liar"
stage = "lying_fence"
device = "gpu1"
programs = ["noop"]
[[resident]]
name = "pp"
gpu = "gpu0"
npu = "npu0"
`

func hostileManifest(t *testing.T, svc, session string) string {
	t.Helper()
	r := strings.NewReplacer("@SERVICE@", svc, "@SESSION@", session,
		"@TRAPSHA@", sha(t, "stages/testdata/hostile/trap_stage.wasm"),
		"@LIARSHA@", sha(t, "stages/testdata/hostile/lying_fence.wasm"))
	return r.Replace(hostile)
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

type served struct {
	t      *testing.T
	srv    *service.Server
	d      *deploy.Deployment
	log    *syncBuffer
	header http.Header // sent with every request
}

func serveHostile(t *testing.T, svc, session string, cfg func(*service.Config)) *served {
	t.Helper()
	d := open(t, hostileManifest(t, svc, session))
	c := service.ConfigFromManifest(d.Manifest)
	if cfg != nil {
		cfg(&c)
	}
	log := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return &served{t: t, srv: service.NewServerConfig(d, logger, c), d: d, log: log, header: http.Header{}}
}

// do serves one request in process and returns the recorded response.
func (s *served) do(method, path string, body io.Reader, header ...string) *httptest.ResponseRecorder {
	s.t.Helper()
	req := httptest.NewRequest(method, path, body)
	for k, v := range s.header {
		req.Header[k] = v
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	s.srv.Handler().ServeHTTP(rec, req)
	return rec
}

func errorBody(t *testing.T, rec *httptest.ResponseRecorder) service.ErrorBody {
	t.Helper()
	var e service.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Class == "" || e.RequestID == "" {
		t.Fatalf("not a JSON error body (%v): %d %s", err, rec.Code, rec.Body)
	}
	if rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("X-Request-Id") != e.RequestID {
		t.Fatalf("headers %v, body's request id %q", rec.Header(), e.RequestID)
	}
	return e
}

func TestErrorClasses(t *testing.T) {
	for _, tc := range []struct {
		err    error
		class  string
		status int
	}{
		{nil, "ok", 500},
		{&stages.ClientError{Code: 3}, "client_error", 422},
		{errdefs.Errorf(errdefs.ErrBusy, "x"), "busy", 429},
		{errdefs.Errorf(errdefs.ErrDeviceLost, "x"), "device_lost", 503},
		{errdefs.Errorf(errdefs.ErrUnsupported, "x"), "unsupported", 501},
		{errdefs.Errorf(errdefs.ErrInvalidArgument, "x"), "invalid_argument", 400},
		{errdefs.Errorf(errdefs.ErrNotFound, "x"), "not_found", 404},
		{errdefs.Errorf(errdefs.ErrOutOfBudget, "x"), "out_of_budget", 413},
		{errdefs.Errorf(errdefs.ErrDeadlineExceeded, "x"), "deadline_exceeded", 504},
		{errdefs.Errorf(errdefs.ErrRejected, "x"), "rejected", 503},
		{errdefs.Errorf(errdefs.ErrFault, "x"), "fault", 500},
		{errdefs.Errorf(errdefs.ErrClosed, "x"), "closed", 503},
		{deploy.ErrUnavailable, "unavailable", 503},
		{errdefs.Errorf(errdefs.ErrFailedPrecondition, "x"), "failed_precondition", 409},
		{&errdefs.RemoteError{Class: "failed_precondition", Message: "x"}, "failed_precondition", 409},
		{errors.New("no class"), "internal", 500},
	} {
		if got := service.Class(tc.err); got != tc.class {
			t.Errorf("%v: class %q, want %q", tc.err, got, tc.class)
		}
		if tc.err != nil {
			if got := service.HTTPStatus(tc.err); got != tc.status {
				t.Errorf("%v: status %d, want %d", tc.err, got, tc.status)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := service.Outcome(ctx, errdefs.ContextError(ctx, "waiting")); got != "client_closed" {
		t.Errorf("a cancelled caller's outcome is %q", got)
	}
	if got := service.Outcome(ctx, nil); got != "ok" {
		t.Errorf("a cancelled caller's success is %q", got)
	}
}

func TestPublicMessageDropsTraces(t *testing.T) {
	err := errors.New("stage \"trap\" trapped: wasm error: unreachable\nwasm stack trace:\n\t.stagehost_run()")
	if got := deploy.PublicMessage(err); got != `stage "trap" trapped: wasm error: unreachable` {
		t.Errorf("%q", got)
	}
}

// TestEveryErrorIsJSON: unknown routes and wrong methods are JSON errors
// with a request id, like every other error.
func TestEveryErrorIsJSON(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	rec := s.do("GET", "/nowhere", nil)
	if e := errorBody(t, rec); rec.Code != 404 || e.Class != "not_found" || !strings.Contains(e.Error, "/nowhere") {
		t.Errorf("unknown route: %d %+v", rec.Code, e)
	}
	rec = s.do("DELETE", "/v1/sessions/steady/run", nil)
	if e := errorBody(t, rec); rec.Code != 405 || e.Class != "method_not_allowed" || rec.Header().Get("Allow") != "POST" {
		t.Errorf("wrong method: %d %+v %v", rec.Code, e, rec.Header())
	}
	rec = s.do("POST", "/v1/sessions/nope/run", nil)
	if e := errorBody(t, rec); rec.Code != 404 || e.Class != "not_found" {
		t.Errorf("unknown session: %d %+v", rec.Code, e)
	}
}

func TestRequestIDs(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	if rec := s.do("GET", "/livez", nil, "X-Request-Id", "caller-42.a:b_c"); rec.Header().Get("X-Request-Id") != "caller-42.a:b_c" {
		t.Errorf("a sane incoming id is not kept: %v", rec.Header())
	}
	for _, bad := range []string{"", "has space", strings.Repeat("x", 129), "quote\"d"} {
		rec := s.do("GET", "/livez", nil, "X-Request-Id", bad)
		got := rec.Header().Get("X-Request-Id")
		if got == "" || got == bad || len(got) != 24 {
			t.Errorf("incoming %q: id %q", bad, got)
		}
	}
	a, b := s.do("GET", "/livez", nil).Header().Get("X-Request-Id"), s.do("GET", "/livez", nil).Header().Get("X-Request-Id")
	if a == b {
		t.Errorf("two requests share id %q", a)
	}
	// The access log names every request; a successful probe at debug
	// only.
	s.do("GET", "/v1/sessions", nil, "X-Request-Id", "caller-43")
	s.do("GET", "/readyz", nil, "X-Request-Id", "probe-1")
	if strings.Contains(s.log.String(), "request_id=caller-42.a:b_c") || strings.Contains(s.log.String(), "probe-1") {
		t.Errorf("a successful probe is logged at info:\n%s", s.log)
	}
	for _, want := range []string{`msg="http request" method=GET path=/v1/sessions status=200`, "request_id=caller-43", "bytes="} {
		if !strings.Contains(s.log.String(), want) {
			t.Errorf("access log lacks %q:\n%s", want, s.log)
		}
	}
}

// TestTrapGivesNoStackTrace: a trapping guest is answered 500 fault with
// a short message; the Wasm stack trace is in the log, with the request id.
func TestTrapGivesNoStackTrace(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	rec := s.do("POST", "/v1/sessions/trap/run", nil, "X-Request-Id", "trap-req-1")
	e := errorBody(t, rec)
	if rec.Code != 500 || e.Class != "fault" || !strings.Contains(e.Error, "unreachable") {
		t.Fatalf("trap: %d %+v", rec.Code, e)
	}
	if strings.Contains(rec.Body.String(), "stack") || strings.Contains(rec.Body.String(), `\n`) || strings.Contains(rec.Body.String(), "stagehost_run(") {
		t.Errorf("the body holds a trace: %s", rec.Body)
	}
	var logged string
	for _, line := range strings.Split(s.log.String(), "\n") {
		if strings.Contains(line, "request failed") && strings.Contains(line, "request_id=trap-req-1") {
			logged = line
		}
	}
	if !strings.Contains(logged, "wasm stack trace") {
		t.Errorf("the log lacks the trace with the request id:\n%s", s.log)
	}
}

// blockingBody is a request body that says when it is first read, then
// waits for release.
type blockingBody struct {
	reading chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockingBody) Read(p []byte) (int, error) {
	b.once.Do(func() { close(b.reading) })
	<-b.release
	return 0, io.EOF
}

// countingBody counts the bytes read from it.
type countingBody struct {
	n, size int
}

func (c *countingBody) Read(p []byte) (int, error) {
	if c.n >= c.size {
		return 0, io.EOF
	}
	k := min(len(p), c.size-c.n)
	c.n += k
	return k, nil
}

// TestBodyLimit: a body over the session's max_input is 413
// out_of_budget; with a Content-Length it is refused unread, and without
// one (chunked) no more than max_input+1 bytes are read.
func TestBodyLimit(t *testing.T) {
	s := serveHostile(t, "", `max_input = "16B"`, nil)
	body := &countingBody{size: 1 << 20}
	req := httptest.NewRequest("POST", "/v1/sessions/steady/run", body)
	req.ContentLength = 1 << 20
	rec := httptest.NewRecorder()
	s.srv.Handler().ServeHTTP(rec, req)
	if e := errorBody(t, rec); rec.Code != 413 || e.Class != "out_of_budget" || body.n != 0 {
		t.Errorf("declared oversize body: %d %+v, %d bytes read", rec.Code, e, body.n)
	}
	body = &countingBody{size: 1 << 20}
	req = httptest.NewRequest("POST", "/v1/sessions/steady/run", body)
	req.ContentLength = -1
	rec = httptest.NewRecorder()
	s.srv.Handler().ServeHTTP(rec, req)
	if e := errorBody(t, rec); rec.Code != 413 || e.Class != "out_of_budget" || body.n > 17 {
		t.Errorf("streamed oversize body: %d %+v, %d bytes read", rec.Code, e, body.n)
	}
	if rec := s.do("POST", "/v1/sessions/steady/run", strings.NewReader(strings.Repeat("x", 16))); rec.Code != 200 {
		t.Errorf("a body of max_input: %d %s", rec.Code, rec.Body)
	}
}

// TestMaxInFlight: past max_in_flight, /v1/ requests are answered 429
// busy with Retry-After; health is not limited.
func TestMaxInFlight(t *testing.T) {
	s := serveHostile(t, "[service]\nmax_in_flight = 1", "", nil)
	body := &blockingBody{reading: make(chan struct{}), release: make(chan struct{})}
	done := make(chan int)
	go func() {
		req := httptest.NewRequest("POST", "/v1/sessions/steady/run", body)
		rec := httptest.NewRecorder()
		s.srv.Handler().ServeHTTP(rec, req)
		done <- rec.Code
	}()
	<-body.reading // the first request holds the one slot
	rec := s.do("GET", "/v1/sessions", nil)
	if e := errorBody(t, rec); rec.Code != 429 || e.Class != "busy" || rec.Header().Get("Retry-After") == "" {
		t.Errorf("second request: %d %+v %v", rec.Code, e, rec.Header())
	}
	// An infer of the Open Inference Protocol is a run: limited too,
	// with the protocol's error body.
	rec = s.do("POST", "/v2/models/steady/infer", strings.NewReader(`{"inputs":[]}`))
	if rec.Code != 429 || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), `"error": "the service is handling its max_in_flight of 1 requests`) {
		t.Errorf("an infer past max_in_flight: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	if rec := s.do("GET", "/readyz", nil); rec.Code != 200 {
		t.Errorf("readyz under load: %d", rec.Code)
	}
	close(body.release)
	if code := <-done; code != 200 {
		t.Errorf("first request: %d", code)
	}
	if rec := s.do("GET", "/v1/sessions", nil); rec.Code != 200 {
		t.Errorf("after the first: %d", rec.Code)
	}
}

func TestAuthScopes(t *testing.T) {
	const admin, invoke = "admin-token-0123456789", "invoke-token-0123456789"
	s := serveHostile(t, "", "", func(c *service.Config) {
		c.AdminTokens, c.InvokeTokens = []string{admin}, []string{invoke}
	})
	for _, tc := range []struct {
		method, path, token string
		code                int
		class               string
	}{
		{"POST", "/v1/sessions/steady/run", "", 401, "unauthenticated"},
		{"POST", "/v1/sessions/steady/run", "wrong-token-0123456789", 401, "unauthenticated"},
		{"POST", "/v1/sessions/steady/run", invoke, 200, ""},
		{"POST", "/v1/sessions/steady/run", admin, 200, ""},
		{"GET", "/v1/sessions", invoke, 200, ""},
		{"GET", "/metrics", "", 401, "unauthenticated"},
		{"GET", "/metrics", invoke, 403, "permission_denied"},
		{"GET", "/metrics", admin, 200, ""},
		{"GET", "/debug/trace", invoke, 403, "permission_denied"},
		{"POST", "/v1/residents/pp/start", invoke, 403, "permission_denied"},
		{"GET", "/livez", "", 200, ""},
		{"GET", "/readyz", "", 200, ""},
		{"GET", "/healthz", "", 200, ""},
		{"GET", "/v2/health/ready", "", 200, ""},
	} {
		var rec *httptest.ResponseRecorder
		if tc.token == "" {
			rec = s.do(tc.method, tc.path, nil)
		} else {
			rec = s.do(tc.method, tc.path, nil, "Authorization", "Bearer "+tc.token)
		}
		if rec.Code != tc.code {
			t.Errorf("%s %s with %q: %d %s", tc.method, tc.path, tc.token, rec.Code, rec.Body)
			continue
		}
		if tc.class != "" {
			if e := errorBody(t, rec); e.Class != tc.class {
				t.Errorf("%s %s with %q: class %q", tc.method, tc.path, tc.token, e.Class)
			}
			if (tc.code == 401) != strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s with %q: WWW-Authenticate %q", tc.method, tc.path, tc.token, rec.Header().Get("WWW-Authenticate"))
			}
		}
	}
	if rec := s.do("GET", "/metrics", nil, "Authorization", "Basic "+admin); rec.Code != 401 {
		t.Errorf("a Basic credential: %d", rec.Code)
	}
}

func TestReadTokens(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	if err := os.WriteFile(file, []byte("# comment\n\ntoken-one-0123456789\n  token-two-0123456789  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("STAGEHOST_TEST_TOKENS", "token-three-0123456789,token-four-0123456789")
	got, err := deploy.ReadTokens(file, "STAGEHOST_TEST_TOKENS")
	if err != nil || strings.Join(got, " ") != "token-one-0123456789 token-two-0123456789 token-three-0123456789 token-four-0123456789" {
		t.Fatalf("%q %v", got, err)
	}
	if _, err := deploy.ReadTokens("", "STAGEHOST_TEST_UNSET_VARIABLE"); err == nil {
		t.Error("an unset variable gives no error")
	}
	t.Setenv("STAGEHOST_TEST_TOKENS", "short")
	if _, err := deploy.ReadTokens("", "STAGEHOST_TEST_TOKENS"); err == nil {
		t.Error("a short token gives no error")
	}
}

type readiness struct {
	Ready   bool
	Status  string
	Reasons []string
}

func readyz(t *testing.T, s *served, path string) (int, readiness) {
	t.Helper()
	rec := s.do("GET", path, nil)
	var r readiness
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatalf("%s: %v %s", path, err, rec.Body)
	}
	return rec.Code, r
}

// TestReadinessFlipsOnQuarantine: /readyz is 200 until the liar's call
// quarantines it, then 503 naming it; the liar's own readiness too. With
// ready_quarantined_share = 1 the service stays ready.
func TestReadinessFlipsOnQuarantine(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	for _, p := range []string{"/readyz", "/v2/health/ready"} {
		if code, r := readyz(t, s, p); code != 200 || !r.Ready || r.Status != "ready" {
			t.Fatalf("%s before: %d %+v", p, code, r)
		}
	}
	if rec := s.do("GET", "/v1/sessions/liar/ready", nil); rec.Code != 200 {
		t.Fatalf("liar ready before: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("POST", "/v1/sessions/liar/run", nil); rec.Code != 503 || errorBody(t, rec).Class != "device_lost" {
		t.Fatalf("liar: %d %s", rec.Code, rec.Body)
	}
	code, r := readyz(t, s, "/readyz")
	if code != 503 || r.Ready || r.Status != "not_ready" || len(r.Reasons) != 1 || !strings.Contains(r.Reasons[0], "session liar is quarantined") {
		t.Fatalf("readyz after: %d %+v", code, r)
	}
	rec := s.do("GET", "/v1/sessions/liar/ready", nil)
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), `"state": "quarantined"`) {
		t.Errorf("liar ready after: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/v1/sessions/steady/ready", nil); rec.Code != 200 {
		t.Errorf("steady ready after: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/livez", nil); rec.Code != 200 {
		t.Errorf("livez: %d", rec.Code)
	}

	tolerant := serveHostile(t, "[service]\nready_quarantined_share = 1.0", "", nil)
	tolerant.do("POST", "/v1/sessions/liar/run", nil)
	if code, r := readyz(t, tolerant, "/readyz"); code != 200 {
		t.Errorf("share 1: %d %+v", code, r)
	}
}

func TestReadinessOnDeviceLoss(t *testing.T) {
	body := strings.Replace(hostileManifest(t, "", ""), "kind = \"hang\"\nsession = \"liar\"", "kind = \"lose\"", 1)
	d := open(t, body)
	s := &served{t: t, srv: service.NewServer(d, slog.New(slog.DiscardHandler)), d: d}
	code, r := readyz(t, s, "/readyz")
	if code != 503 || len(r.Reasons) != 1 || !strings.Contains(r.Reasons[0], "device gpu1 is lost") {
		t.Errorf("readyz: %d %+v", code, r)
	}
	if rec := s.do("GET", "/v1/sessions/liar/ready", nil); rec.Code != 503 || !strings.Contains(rec.Body.String(), "device gpu1 is lost") {
		t.Errorf("liar ready: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/v1/sessions/steady/ready", nil); rec.Code != 200 {
		t.Errorf("steady ready: %d %s", rec.Code, rec.Body)
	}
}

// TestClientClosedAgrees: a call whose caller went away is client_closed
// in /v1/sessions and in /metrics alike.
func TestClientClosedAgrees(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.d.Pool("steady").Run(ctx, nil); err == nil {
		t.Fatal("a cancelled call succeeded")
	}
	if _, err := s.d.Pool("steady").Run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	rec := s.do("GET", "/v1/sessions/steady", nil)
	var st deploy.SessionStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || st.Outcomes["client_closed"] != 1 || st.Outcomes["ok"] != 1 || st.Calls != 2 || st.Failures != 1 {
		t.Fatalf("status: %v %s", err, rec.Body)
	}
	metrics := s.do("GET", "/metrics", nil).Body.String()
	for _, want := range []string{
		`stagehost_session_runs_total{outcome="client_closed",session="steady"} 1`,
		`stagehost_session_runs_total{outcome="ok",session="steady"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(metrics, `outcome="deadline_exceeded"`) {
		t.Errorf("a disconnect counted as a deadline")
	}
}

// TestResidentLimits: past max_runs a start is refused busy (429) while
// the run holds its slot; the history keeps the last runs only.
func TestResidentLimits(t *testing.T) {
	body := hostileManifest(t, "", "") + "max_runs = 1\nhistory = 2\njoin_deadline = \"1s\"\n"
	d := open(t, body)
	for i := 1; i <= 3; i++ {
		if _, err := d.Resident("pp").Run(context.Background()); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	runs := d.Resident("pp").Runs()
	if len(runs) != 2 || runs[0].ID != 2 || runs[1].ID != 3 {
		t.Errorf("history: %+v", runs)
	}
	// A run that cannot finish (its npu hangs) holds the one slot until
	// its join deadline.
	body = strings.Replace(body, "engine = \"npu\"\n", "engine = \"npu\"\n[[device.sim.fault]]\nkind = \"hang\"\n", 1)
	d = open(t, body)
	s := &served{t: t, srv: service.NewServer(d, slog.New(slog.DiscardHandler)), d: d}
	rec := s.do("POST", "/v1/residents/pp/start", nil)
	if rec.Code != 202 {
		t.Fatalf("start: %d %s", rec.Code, rec.Body)
	}
	rec = s.do("POST", "/v1/residents/pp/start", nil)
	if e := errorBody(t, rec); rec.Code != 429 || e.Class != "busy" || !strings.Contains(e.Error, "max_runs of 1") {
		t.Errorf("second start: %d %+v", rec.Code, e)
	}
}

// TestLimitListener: past n open connections Accept waits until one is
// closed.
func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := service.LimitListener(inner, 1)
	defer ln.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	for range 2 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first := <-accepted
	select {
	case <-accepted:
		t.Fatal("a second connection was accepted while the first is open")
	case <-time.After(100 * time.Millisecond): // a bounded wait for something that must not happen
	}
	first.Close()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("closing the first connection did not let the second in")
	}
	ln.Close()
	for range accepted {
	}
}

// TestStartingServer: before Attach, liveness is 200, readiness 503
// starting, and other routes 503 unavailable; after it, all serve.
func TestStartingServer(t *testing.T) {
	srv := service.NewStartingServer(slog.New(slog.DiscardHandler), service.DefaultConfig())
	s := &served{t: t, srv: srv}
	if rec := s.do("GET", "/livez", nil); rec.Code != 200 {
		t.Errorf("livez: %d", rec.Code)
	}
	code, r := readyz(t, s, "/readyz")
	if code != 503 || r.Status != "starting" || len(r.Reasons) != 1 {
		t.Errorf("readyz: %d %+v", code, r)
	}
	rec := s.do("POST", "/v1/sessions/steady/run", nil)
	if e := errorBody(t, rec); rec.Code != 503 || e.Class != "unavailable" || rec.Header().Get("Retry-After") == "" {
		t.Errorf("run while starting: %d %+v", rec.Code, e)
	}
	srv.Attach(open(t, hostileManifest(t, "", "")))
	if code, r := readyz(t, s, "/readyz"); code != 200 || !r.Ready {
		t.Errorf("readyz after Attach: %d %+v", code, r)
	}
	if rec := s.do("POST", "/v1/sessions/steady/run", nil); rec.Code != 200 {
		t.Errorf("run after Attach: %d %s", rec.Code, rec.Body)
	}
}
