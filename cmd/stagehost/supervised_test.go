package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
)

// supervised is a `stagehost serve MANIFEST --supervise` process of a
// test, listening on a port of its own, with an HTTP client to it.
type supervised struct {
	cmd    *exec.Cmd
	base   string   // http://127.0.0.1:PORT
	stderr *syncBuf // the process's stderr
	out    *syncBuf // its stdout after the serving line
	// outDone is closed once its stdout ended (every process writing
	// it, the workers included, exited).
	outDone chan struct{}
	client  *http.Client
}

// startSupervised starts `serve path --supervise` with the test flags
// (any port, host id sv, --quiet, no state kept) and waits for its
// serving line; it is killed at the test's end. timeout bounds each
// HTTP request of the client.
func startSupervised(t *testing.T, path string, timeout time.Duration) *supervised {
	t.Helper()
	cmd := exec.Command(stagehostBinary(t), "serve", path, "--supervise", "--addr", "127.0.0.1:0", "--host-id", "sv", "--quiet", "--state-dir", "off")
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &supervised{cmd: cmd, stderr: &syncBuf{}, out: &syncBuf{}, outDone: make(chan struct{}), client: &http.Client{Timeout: timeout}}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base, lines := testutil.Serving(t, stdout, serveStartTimeout, func() string { _ = cmd.Process.Kill(); _ = cmd.Wait(); return s.stderr.String() })
	s.base = base
	go func() {
		defer close(s.outDone)
		for lines.Scan() {
			_, _ = s.out.Write([]byte(lines.Text() + "\n"))
		}
	}()
	return s
}

// readAnswer reads resp's status and body.
func readAnswer(resp *http.Response, err error) (int, string) {
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var sb strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
	return resp.StatusCode, sb.String()
}

// get is GET path: the status and the body (status 0 and the error when
// there was no answer).
func (s *supervised) get(path string) (int, string) {
	return readAnswer(s.client.Get(s.base + path))
}

// run calls session with input (nil for none).
func (s *supervised) run(session string, input []byte) (int, string) {
	return readAnswer(s.client.Post(s.base+"/v1/sessions/"+session+"/run", "application/octet-stream", strings.NewReader(string(input))))
}

// workers is GET /v1/workers by worker name, and the body; nil when it
// did not answer 200 with workers.
func (s *supervised) workers() (map[string]workerJSON, string) {
	code, body := s.get("/v1/workers")
	var ws struct{ Workers []workerJSON }
	if code != 200 || json.Unmarshal([]byte(body), &ws) != nil {
		return nil, body
	}
	m := map[string]workerJSON{}
	for _, w := range ws.Workers {
		m[w.Name] = w
	}
	return m, body
}

// stop sends SIGTERM and fails the test unless the process exits 0.
func (s *supervised) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Wait(); err != nil {
		t.Fatalf("serve --supervise exited with %v\n%s", err, s.stderr.String())
	}
}

// stopAll is stop, once the process's stdout ended: it returns all of it
// after the serving line (the workers' stopped lines included).
func (s *supervised) stopAll(t *testing.T) string {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-s.outDone
	if err := s.cmd.Wait(); err != nil {
		t.Fatalf("serve --supervise exited with %v\n%s", err, s.stderr.String())
	}
	return s.out.String()
}
