package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/stages"
)

// The end-to-end tests of serve as an operator runs it: limits, errors,
// health, tokens and TLS, with the real binary (docs/service.md).

// prodManifest writes a manifest with the given [service] table (or
// none) and four sessions: steady (the good stage, max_input 1KiB), trap
// (its stage traps), liar (its fence lies, so its first call quarantines
// it) and stuck (its device hangs: a call waits for its 3s deadline).
// hostileModule is the absolute path and sha256 of the test module
// stages/testdata/hostile/<name>.wasm, for a manifest's [[module]].
func hostileModule(t *testing.T, name string) (path, sha256 string) {
	t.Helper()
	return repoFile(t, "stages/testdata/hostile/"+name+".wasm")
}

// repoFile is the absolute path and sha256 of the repository's file rel
// (slash-separated, from the repository's root), for a manifest.
func repoFile(t *testing.T, rel string) (path, sha256 string) {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("..", "..", filepath.FromSlash(rel))) // a test runs in its package's directory
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, stages.SHA256(b)
}

func prodManifest(t *testing.T, service string) string {
	t.Helper()
	good, goodSHA := hostileModule(t, "good_stage")
	trap, trapSHA := hostileModule(t, "trap_stage")
	liar, liarSHA := hostileModule(t, "lying_fence")
	src := fmt.Sprintf(`version = 1
%s
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
[[device.sim.fault]]
kind = "hang"
session = "stuck"
[[module]]
name = "good"
path = %q
sha256 = %q
[[module]]
name = "trap"
path = %q
sha256 = %q
[[module]]
name = "lying_fence"
path = %q
sha256 = %q
[[session]]
name = "steady"
stage = "good"
device = "gpu0"
programs = ["noop"]
max_input = "1KiB"
[[session]]
name = "trap"
stage = "trap"
device = "gpu0"
[[session]]
name = "liar"
stage = "lying_fence"
device = "gpu1"
programs = ["noop"]
[[session]]
name = "stuck"
stage = "good"
device = "gpu1"
programs = ["noop"]
deadline = "3s"
fence_timeout = "1s"
`, service, good, goodSHA, trap, trapSHA, liar, liarSHA)
	path := filepath.Join(t.TempDir(), "prod.toml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// server is a running `stagehost serve`.
type server struct {
	t      *testing.T
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT or https://…
	addr   string // 127.0.0.1:PORT
	lines  *bufio.Scanner
	stderr *bytes.Buffer
}

func startServe(t *testing.T, args ...string) *server {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	cmd, stdout, stderr := startBinary(t, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	base, lines := testutil.Serving(t, stdout, serveStartTimeout, func() string { _ = cmd.Process.Kill(); _ = cmd.Wait(); return stderr.String() })
	return &server{t: t, cmd: cmd, base: base, addr: base[strings.Index(base, "://")+3:], lines: lines, stderr: stderr}
}

// stop sends SIGTERM, waits for the exit and returns stdout's rest and
// stderr (which may only be read after the process has exited).
func (s *server) stop() (string, string) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatal(err)
	}
	var rest strings.Builder
	for s.lines.Scan() {
		rest.WriteString(s.lines.Text() + "\n")
	}
	if err := s.cmd.Wait(); err != nil {
		s.t.Fatalf("serve exited with %v\n%s%s", err, rest.String(), s.stderr.String())
	}
	return rest.String(), s.stderr.String()
}

type answer struct {
	code   int
	header http.Header
	body   []byte
}

type errorJSON struct {
	Error, Class string
	RequestID    string `json:"request_id"`
}

func (a answer) errBody(t *testing.T) errorJSON {
	t.Helper()
	var e errorJSON
	if err := json.Unmarshal(a.body, &e); err != nil || e.Class == "" || e.RequestID == "" || a.header.Get("X-Request-Id") != e.RequestID {
		t.Fatalf("not a JSON error (%v): %d %v %s", err, a.code, a.header, a.body)
	}
	return e
}

func (s *server) request(c *http.Client, method, path string, body io.Reader, header ...string) answer {
	s.t.Helper()
	req, err := http.NewRequest(method, s.base+path, body)
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if c == nil {
		c = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

// closedWithin reads c until the server closes it, and fails unless that
// happens within limit. It returns what was read.
func closedWithin(t *testing.T, c net.Conn, limit time.Duration) string {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(limit)); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open past %v (read %q)", limit, b)
	}
	return string(b)
}

// TestServeTimeouts: a client that sends part of a body and then stops is
// cut off by read_timeout; an idle keep-alive connection is closed by
// idle_timeout (with no read_timeout, which it would otherwise default to).
func TestServeTimeouts(t *testing.T) {
	t.Parallel() // a server process of its own; most of the test waits out its timeouts
	s := startServe(t, prodManifest(t, "[service]\nread_timeout = \"1s\""))
	slow, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	start := time.Now()
	if _, err := io.WriteString(slow, "POST /v1/sessions/steady/run HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"); err != nil {
		t.Fatal(err)
	}
	closedWithin(t, slow, 10*time.Second)
	t.Logf("slow body cut off after %v", time.Since(start).Round(time.Millisecond))
	s.stop()

	s = startServe(t, prodManifest(t, "[service]\nread_timeout = \"0s\"\nidle_timeout = \"1s\""))
	idle, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if got := closedWithin(t, idle, 10*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("idle connection's answer: %q", got)
	}
	s.stop()
}

// TestServeConnectionLimit: with max_connections = 2 and two connections
// open, a third is not served until one of them closes.
func TestServeConnectionLimit(t *testing.T) {
	t.Parallel() // a server process of its own; most of the test waits out its timeouts
	s := startServe(t, prodManifest(t, "[service]\nmax_connections = 2\nread_header_timeout = \"60s\""))
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	third, err := net.Dial("tcp", s.addr) // the kernel's backlog takes it
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if _, err := io.WriteString(third, "GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = third.SetReadDeadline(time.Now().Add(300 * time.Millisecond)) // a bounded wait for what must not happen
	if n, err := third.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("the third connection was served while two are open (%d bytes, %v)", n, err)
	}
	held[0].Close()
	if got := closedWithin(t, third, 10*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("third connection after one closed: %q", got)
	}
	s.stop()
}

// TestServeOversizeBody: a body declared larger than the session's
// max_input is refused 413 before the client sends any of it.
func TestServeOversizeBody(t *testing.T) {
	s := startServe(t, prodManifest(t, ""))
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /v1/sessions/steady/run HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // the answer comes at once, with no byte of the body sent
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	a := answer{resp.StatusCode, resp.Header, body}
	if e := a.errBody(t); a.code != 413 || e.Class != "out_of_budget" || !strings.Contains(e.Error, "max_input of 1024 bytes") {
		t.Fatalf("oversize: %d %s", a.code, body)
	}
	// A streamed (chunked) body over the limit too.
	a = s.request(nil, "POST", "/v1/sessions/steady/run", io.MultiReader(strings.NewReader(strings.Repeat("x", 4096))))
	if e := a.errBody(t); a.code != 413 || e.Class != "out_of_budget" {
		t.Fatalf("chunked oversize: %d %s", a.code, a.body)
	}
	if a := s.request(nil, "POST", "/v1/sessions/steady/run", strings.NewReader(strings.Repeat("x", 1024))); a.code != 200 {
		t.Fatalf("a body of max_input: %d %s", a.code, a.body)
	}
	s.stop()
}

// TestServeErrorsAreJSON: unknown routes, wrong methods and a trapping
// guest answer JSON with a request id; the trap's Wasm stack trace is in
// the log with that id, not in the body; --log-level info shows the
// access log.
func TestServeErrorsAreJSON(t *testing.T) {
	s := startServe(t, prodManifest(t, ""), "--log-level", "info")
	a := s.request(nil, "GET", "/nowhere", nil)
	if e := a.errBody(t); a.code != 404 || e.Class != "not_found" {
		t.Errorf("404: %d %s", a.code, a.body)
	}
	a = s.request(nil, "DELETE", "/v1/sessions/steady", nil)
	if e := a.errBody(t); a.code != 405 || e.Class != "method_not_allowed" || a.header.Get("Allow") == "" {
		t.Errorf("405: %d %v %s", a.code, a.header, a.body)
	}
	a = s.request(nil, "POST", "/v1/sessions/trap/run", nil, "X-Request-Id", "e2e-trap-1")
	if e := a.errBody(t); a.code != 500 || e.Class != "fault" || e.RequestID != "e2e-trap-1" || strings.Contains(string(a.body), "stack") {
		t.Errorf("trap: %d %s", a.code, a.body)
	}
	_, stderr := s.stop()
	var traced, accessed bool
	for _, line := range strings.Split(stderr, "\n") {
		traced = traced || strings.Contains(line, "request_id=e2e-trap-1") && strings.Contains(line, "wasm stack trace")
		accessed = accessed || strings.Contains(line, `msg="http request" method=POST path=/v1/sessions/trap/run status=500`) && strings.Contains(line, "request_id=e2e-trap-1")
	}
	if !traced || !accessed {
		t.Errorf("stderr lacks the trace (%v) or the access log (%v) with the request id:\n%s", traced, accessed, stderr)
	}
	if code, _, errs := runBinary(t, "serve", prodManifest(t, ""), "--log-level", "loud"); code != exitUsage || !strings.Contains(errs, "want debug, info, warn or error") {
		t.Errorf("--log-level loud: %d %s", code, errs)
	}
}

type readyBody struct {
	Ready   bool
	Status  string
	Reasons []string
}

func (s *server) ready(path string) (int, readyBody) {
	s.t.Helper()
	a := s.request(nil, "GET", path, nil)
	var r readyBody
	if err := json.Unmarshal(a.body, &r); err != nil {
		s.t.Fatalf("%s: %v %s", path, err, a.body)
	}
	return a.code, r
}

// TestServeReadiness: ready until the liar is quarantined, then 503 with
// why; a disconnected client is client_closed in /metrics and
// /v1/sessions alike; after SIGTERM /readyz says draining for
// drain_delay while requests are still answered.
func TestServeReadiness(t *testing.T) {
	s := startServe(t, prodManifest(t, "[service]\ndrain_delay = \"30s\""), "--grace", "5s")
	for _, p := range []string{"/readyz", "/v2/health/ready"} {
		if code, r := s.ready(p); code != 200 || !r.Ready {
			t.Fatalf("%s: %d %+v", p, code, r)
		}
	}
	if a := s.request(nil, "POST", "/v1/sessions/liar/run", nil); a.code != 503 || a.errBody(t).Class != "device_lost" {
		t.Fatalf("liar: %d %s", a.code, a.body)
	}
	code, r := s.ready("/readyz")
	if code != 503 || r.Ready || len(r.Reasons) != 1 || !strings.Contains(r.Reasons[0], "session liar is quarantined") {
		t.Fatalf("readyz after the quarantine: %d %+v", code, r)
	}
	if a := s.request(nil, "GET", "/v1/sessions/liar/ready", nil); a.code != 503 || !strings.Contains(string(a.body), "quarantined") {
		t.Errorf("liar ready: %d %s", a.code, a.body)
	}
	for _, p := range []string{"/livez", "/healthz", "/v2/health/live"} {
		if a := s.request(nil, "GET", p, nil); a.code != 200 {
			t.Errorf("%s: %d", p, a.code)
		}
	}

	// A client that gives up on the stuck session's call.
	quick := &http.Client{Timeout: 300 * time.Millisecond}
	if _, err := quick.Post(s.base+"/v1/sessions/stuck/run", "application/octet-stream", nil); err == nil {
		t.Fatal("the stuck session answered")
	}
	var st struct {
		Calls    int
		Outcomes map[string]int
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		if err := json.Unmarshal(s.request(nil, "GET", "/v1/sessions/stuck", nil).body, &st); err != nil {
			t.Fatal(err)
		}
		return st.Calls != 0
	}, "the stuck call never ended")
	if st.Outcomes["client_closed"] != 1 || len(st.Outcomes) != 1 {
		t.Errorf("/v1/sessions/stuck outcomes: %v", st.Outcomes)
	}
	metrics := string(s.request(nil, "GET", "/metrics", nil).body)
	if !strings.Contains(metrics, `stagehost_session_runs_total{outcome="client_closed",session="stuck"} 1`) || strings.Contains(metrics, `outcome="deadline_exceeded",session="stuck"`) {
		t.Errorf("metrics disagree:\n%s", grepLines(metrics, "stagehost_session_runs_total"))
	}

	// Draining: SIGTERM flips /readyz while the service still answers.
	keep := &http.Client{Timeout: 30 * time.Second} // its keep-alive connection outlives the listener
	if a := s.request(keep, "GET", "/v1/sessions", nil); a.code != 200 {
		t.Fatal(a.code)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var ready answer
	if !testutil.Poll(20*time.Second, func() bool {
		ready = s.request(keep, "GET", "/readyz", nil)
		return ready.code == 503 && strings.Contains(string(ready.body), `"status": "draining"`)
	}) {
		t.Fatalf("readyz never said draining: %d %s", ready.code, ready.body)
	}
	if a := s.request(keep, "POST", "/v1/sessions/steady/run", nil); a.code != 200 {
		t.Errorf("a run while draining: %d %s", a.code, a.body)
	}
	_ = s.cmd.Process.Kill() // not waiting out the 30s drain delay
	_ = s.cmd.Wait()
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestServeAuth: with tokens (from files and an environment variable),
// routes need a bearer token of their scope; health does not.
func TestServeAuth(t *testing.T) {
	dir := t.TempDir()
	const admin, invoke, fromEnv = "admin-e2e-0123456789abcdef", "invoke-e2e-0123456789abcdef", "env-e2e-0123456789abcdef"
	for name, tok := range map[string]string{"admin": admin, "invoke": invoke} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("STAGEHOST_E2E_INVOKE", fromEnv)
	m := prodManifest(t, "[service]\ninvoke_token_env = \"STAGEHOST_E2E_INVOKE\"")
	s := startServe(t, m, "--admin-token-file", filepath.Join(dir, "admin"), "--invoke-token-file", filepath.Join(dir, "invoke"))
	for _, tc := range []struct {
		method, path, token string
		code                int
	}{
		{"POST", "/v1/sessions/steady/run", "", 401},
		{"POST", "/v1/sessions/steady/run", "not-a-token-0123456789", 401},
		{"POST", "/v1/sessions/steady/run", invoke, 200},
		{"POST", "/v1/sessions/steady/run", fromEnv, 200},
		{"GET", "/v1/sessions", admin, 200},
		{"GET", "/metrics", invoke, 403},
		{"GET", "/metrics", admin, 200},
		{"GET", "/debug/trace", "", 401},
		{"GET", "/livez", "", 200},
		{"GET", "/readyz", "", 200},
	} {
		var hdr []string
		if tc.token != "" {
			hdr = []string{"Authorization", "Bearer " + tc.token}
		}
		a := s.request(nil, tc.method, tc.path, nil, hdr...)
		if a.code != tc.code {
			t.Errorf("%s %s with %q: %d %s", tc.method, tc.path, tc.token, a.code, a.body)
		}
		if tc.code == 401 && (a.errBody(t).Class != "unauthenticated" || !strings.HasPrefix(a.header.Get("WWW-Authenticate"), "Bearer")) {
			t.Errorf("%s %s: %v %s", tc.method, tc.path, a.header, a.body)
		}
		if tc.code == 403 && a.errBody(t).Class != "permission_denied" {
			t.Errorf("%s %s: %s", tc.method, tc.path, a.body)
		}
	}
	s.stop()
}

// TestServeRefusesOpenNonLoopback: a non-loopback --addr needs tokens or
// --insecure-no-auth, which warns.
func TestServeRefusesOpenNonLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	m := prodManifest(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	refused := exec.CommandContext(ctx, stagehostBinary(t), "serve", m, "--addr", "0.0.0.0:0")
	var outb, errb bytes.Buffer
	refused.Stdout, refused.Stderr = &outb, &errb
	_ = refused.Run()
	code, out, errs := refused.ProcessState.ExitCode(), outb.String(), errb.String()
	if code != exitUsage || !strings.Contains(errs, "refusing to serve 0.0.0.0:0 without authentication") || strings.Contains(out, "serving") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	cmd, stdout, stderr := startBinary(t, "serve", m, "--addr", "0.0.0.0:0", "--insecure-no-auth")
	if base, lines := serving(cmd, stdout); base == "" {
		_ = cmd.Wait()
		t.Fatalf("--insecure-no-auth did not serve:\n%s", stderr.String())
	} else {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		for lines.Scan() {
		}
	}
	if err := cmd.Wait(); err != nil || !strings.Contains(stderr.String(), "WARNING: --insecure-no-auth") {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	tok := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tok, []byte("admin-e2e-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, stdout, stderr = startBinary(t, "serve", m, "--addr", "0.0.0.0:0", "--admin-token-file", tok)
	base, lines := serving(cmd, stdout)
	if base == "" {
		_ = cmd.Wait()
		t.Fatalf("with a token it did not serve:\n%s", stderr.String())
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	for lines.Scan() {
	}
	if err := cmd.Wait(); err != nil || strings.Contains(stderr.String(), "WARNING") {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
}

// TestServeTLS: with --tls-cert and --tls-key the service speaks HTTPS.
func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	s := startServe(t, prodManifest(t, ""), "--tls-cert", certFile, "--tls-key", keyFile)
	if !strings.HasPrefix(s.base, "https://") {
		t.Fatalf("serving %s", s.base)
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if a := s.request(c, "POST", "/v1/sessions/steady/run", nil); a.code != 200 || string(a.body) != "ok" {
		t.Errorf("https run: %d %s", a.code, a.body)
	}
	plain := &http.Client{Timeout: 30 * time.Second}
	if resp, err := plain.Get("http://" + s.addr + "/livez"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain HTTP was served")
		}
	}
	s.stop()
	if code, _, errs := runBinary(t, "serve", prodManifest(t, ""), "--tls-cert", certFile); code != exitUsage || !strings.Contains(errs, "go together") {
		t.Errorf("--tls-cert alone: %d %s", code, errs)
	}
	if code, _, errs := runBinary(t, "serve", prodManifest(t, ""), "--tls-cert", keyFile, "--tls-key", certFile); code != exitInvalid {
		t.Errorf("swapped pair: %d %s", code, errs)
	}
}

func selfSigned(t *testing.T, dir string) (string, string, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "stagehost test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestLogLevel: --log-level info shows guest logs (run and serve), and
// under serve they carry the request id; the default (warn) hides them.
func TestLogLevel(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const guest = `msg="cstage: filled and summed 16 floats" session=fill`
	if code, out, errs := runBinary(t, "run", "../../host.toml", "--session", "fill", "--quiet", "--log-level", "info"); code != exitOK || !strings.Contains(errs, guest) {
		t.Errorf("run --log-level info: %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runBinary(t, "run", "../../host.toml", "--session", "fill", "--quiet"); code != exitOK || strings.Contains(errs, "cstage: filled") {
		t.Errorf("run: %d\n%s%s", code, out, errs)
	}
	s := startServe(t, cstageManifest(t, ""), "--quiet", "--log-level", "info")
	if a := s.request(nil, "POST", "/v1/sessions/fill/run", nil, "X-Request-Id", "guest-log-1"); a.code != 200 {
		t.Fatalf("fill: %d %s", a.code, a.body)
	}
	_, stderr := s.stop()
	if !strings.Contains(stderr, guest+" request_id=guest-log-1") {
		t.Errorf("serve's stderr lacks the guest log with its request id:\n%s", stderr)
	}
}

// TestServeWriteTimeout: an answer not written within write_timeout is
// cut off (the stuck session's call takes its 3s deadline).
func TestServeWriteTimeout(t *testing.T) {
	t.Parallel() // a server process of its own; most of the test waits out its timeouts
	s := startServe(t, prodManifest(t, "[service]\nwrite_timeout = \"1s\""))
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Post(s.base+"/v1/sessions/stuck/run", "application/octet-stream", nil)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("an answer after the write timeout: %d", resp.StatusCode)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the client's own timeout, not the server's: %v", err)
	}
	if a := s.request(nil, "POST", "/v1/sessions/steady/run", nil); a.code != 200 {
		t.Fatalf("steady: %d %s", a.code, a.body)
	}
	s.stop()
}

// TestServeMaxInFlight: with max_in_flight = 1 and one request holding
// its slot (its body half sent), /v1/ requests are answered 429 busy with
// Retry-After; health still answers; closing the first frees the slot.
func TestServeMaxInFlight(t *testing.T) {
	s := startServe(t, prodManifest(t, "[service]\nmax_in_flight = 1"))
	// The holder sends a run whose body never ends, so it holds the one
	// slot. A poll that the server happens to take first makes the
	// holder's request the one refused: then it is sent again.
	var holder net.Conn
	hold := func() {
		if holder != nil {
			holder.Close()
		}
		var err error
		if holder, err = net.Dial("tcp", s.addr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(holder, "POST /v1/sessions/steady/run HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab"); err != nil {
			t.Fatal(err)
		}
	}
	hold()
	defer func() { holder.Close() }()
	refused := func() bool { // the holder's request was answered (429)
		_ = holder.SetReadDeadline(time.Now().Add(time.Millisecond))
		n, _ := holder.Read(make([]byte, 1))
		return n > 0
	}
	var a answer
	if !testutil.Poll(20*time.Second, func() bool { // until the holder's request is in flight
		if a = s.request(nil, "GET", "/v1/sessions", nil); a.code == 429 {
			return true
		}
		if refused() {
			hold()
		}
		return false
	}) {
		t.Fatalf("never 429: %d %s", a.code, a.body)
	}
	if e := a.errBody(t); e.Class != "busy" || a.header.Get("Retry-After") != "1" || !strings.Contains(e.Error, "max_in_flight of 1") {
		t.Errorf("429: %v %s", a.header, a.body)
	}
	if a := s.request(nil, "GET", "/readyz", nil); a.code != 200 {
		t.Errorf("readyz: %d", a.code)
	}
	// A second run whose body has not come yet is refused at once (the
	// connection closes), not when the server's read timeout (30s) gives
	// up on the rest of its body.
	second, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if _, err := io.WriteString(second, "POST /v1/sessions/steady/run HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab"); err != nil {
		t.Fatal(err)
	}
	_ = second.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(second), nil)
	if err != nil {
		t.Fatalf("a run refused before its body came got no answer within 10s: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || !resp.Close {
		t.Errorf("a run refused before its body came: %d, close %v", resp.StatusCode, resp.Close)
	}
	// And the server closes the connection: it waits for no more of the
	// body (a graceful stop would wait for it).
	if n, err := second.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("after the refusal the connection stays open: read %d, %v", n, err)
	}
	holder.Close()
	if !testutil.Poll(20*time.Second, func() bool { // until the server notices the closed connection
		a = s.request(nil, "GET", "/v1/sessions", nil)
		return a.code == 200
	}) {
		t.Fatalf("the slot was never freed: %d %s", a.code, a.body)
	}
	s.stop()
}

// TestServeResidentLimits: a resident whose run cannot finish holds its
// one max_runs slot, so a second start is 429; another keeps only its
// last history runs.
func TestServeResidentLimits(t *testing.T) {
	t.Parallel() // a server process of its own; most of the test waits out its timeouts
	m := prodManifest(t, "")
	b, err := os.ReadFile(m)
	if err != nil {
		t.Fatal(err)
	}
	extra := `
[[device]]
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
name = "stalled"
gpu = "gpu0"
npu = "npu1"
max_runs = 1
join_deadline = "2s"
[[resident]]
name = "brief"
gpu = "gpu0"
npu = "npu0"
history = 2
`
	if err := os.WriteFile(m, append(b, extra...), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, m)
	if a := s.request(nil, "POST", "/v1/residents/stalled/start", nil); a.code != 202 {
		t.Fatalf("first start: %d %s", a.code, a.body)
	}
	a := s.request(nil, "POST", "/v1/residents/stalled/start", nil)
	if e := a.errBody(t); a.code != 429 || e.Class != "busy" || !strings.Contains(e.Error, "max_runs of 1") {
		t.Errorf("second start: %d %s", a.code, a.body)
	}
	for range 3 {
		if a := s.request(nil, "POST", "/v1/residents/brief/start", nil); a.code != 202 {
			t.Fatalf("brief start: %d %s", a.code, a.body)
		}
	}
	var list struct {
		Running int
		Runs    []struct {
			ID    int
			State string
		}
	}
	if !testutil.Poll(20*time.Second, func() bool {
		if err := json.Unmarshal(s.request(nil, "GET", "/v1/residents/brief", nil).body, &list); err != nil {
			t.Fatal(err)
		}
		return list.Running == 0
	}) {
		t.Fatalf("brief runs never finished: %+v", list)
	}
	if len(list.Runs) != 2 || list.Runs[0].ID != 2 || list.Runs[1].ID != 3 || list.Runs[1].State != "verified" {
		t.Errorf("history: %+v", list)
	}
	s.stop()
}

// TestServeStarting: serve listens before it makes its sessions; while a
// session's stagehost_init runs (here until its 3s init_timeout) /livez
// is 200 and /readyz 503 starting.
func TestServeStarting(t *testing.T) {
	t.Parallel() // a server process of its own; most of the test waits out its timeouts
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	loop, err := filepath.Abs("../../deploy/testdata/init_loop.wasm")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(loop)
	if err != nil {
		t.Fatal(err)
	}
	m := prodManifest(t, "")
	src, err := os.ReadFile(m)
	if err != nil {
		t.Fatal(err)
	}
	src = append(src, fmt.Sprintf("[[module]]\nname = \"init_loop\"\npath = %q\nsha256 = %q\n[[session]]\nname = \"boot_loop\"\nstage = \"init_loop\"\ndevice = \"gpu0\"\ninit_timeout = \"3s\"\n", loop, stages.SHA256(b))...)
	if err := os.WriteFile(m, src, 0o644); err != nil {
		t.Fatal(err)
	}
	// A free port, taken again by serve at once.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	cmd, stdout, stderr := startBinary(t, "serve", m, "--addr", addr)
	c := &http.Client{Timeout: 5 * time.Second}
	var resp *http.Response
	if !testutil.Poll(30*time.Second, func() bool { // until the port opens
		resp, err = c.Get("http://" + addr + "/readyz")
		return err == nil
	}) {
		t.Fatalf("never listened: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), `"status": "starting"`) {
		t.Fatalf("readyz while starting: %d %s", resp.StatusCode, body)
	}
	if resp, err := c.Get("http://" + addr + "/livez"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("livez while starting: %v", err)
	} else {
		resp.Body.Close()
	}
	base, lines := serving(cmd, stdout)
	if base == "" {
		_ = cmd.Wait()
		t.Fatalf("no serving line:\n%s", stderr.String())
	}
	s := &server{t: t, cmd: cmd, base: base, addr: addr, lines: lines, stderr: stderr}
	code, r := s.ready("/readyz")
	if code != 503 || r.Status != "not_ready" || len(r.Reasons) != 1 || !strings.Contains(r.Reasons[0], "session boot_loop is failed") {
		t.Errorf("readyz after start-up: %d %+v", code, r)
	}
	if a := s.request(nil, "POST", "/v1/sessions/steady/run", nil); a.code != 200 {
		t.Errorf("steady: %d %s", a.code, a.body)
	}
	s.stop()
}
