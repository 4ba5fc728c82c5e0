package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	"github.com/stagehost/stagehost/internal/testutil"
)

// buildBinary builds the stagehost command once per test binary.
var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// startBinary starts the built binary with args and returns it, its
// stdout pipe and what it writes on stderr; the test's end kills it.
func startBinary(t *testing.T, args ...string) (*exec.Cmd, io.Reader, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(stagehostBinary(t), args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := new(bytes.Buffer)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, stdout, stderr
}

// serveStartTimeout bounds how long a test waits for serve's serving
// line (the modules it loads compile first).
const serveStartTimeout = 2 * time.Minute

func stagehostBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv(envTestBinary); bin != "" {
		return bin // a pre-built binary (bench/cuda/tenants.sh)
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "stagehost-bin-*")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "stagehost")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// counted is an HTTP client that counts every response it receives.
type counted struct {
	c         *http.Client
	responses atomic.Uint64
}

func (c *counted) do(req *http.Request) (int, []byte, error) {
	resp, err := c.c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	c.responses.Add(1)
	return resp.StatusCode, body, nil
}

func (c *counted) post(base, path string, body []byte) (int, []byte, error) {
	req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
	return c.do(req)
}

func (c *counted) get(base, path string) (int, []byte, error) {
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	return c.do(req)
}

func TestServeEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	cmd, stdout, stderr := startBinary(t, "serve", "testdata/serve.toml", "--addr", "127.0.0.1:0", "--grace", "30s")
	base, lines := testutil.Serving(t, stdout, serveStartTimeout, func() string { _ = cmd.Process.Kill(); _ = cmd.Wait(); return stderr.String() })
	client := &counted{c: &http.Client{Timeout: 60 * time.Second}}

	// 8 concurrent clients on the healthy sessions; every MLP answer must
	// match the Go reference.
	inputs := model.TestInputs(8)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			session := []string{"mlp1", "mlp2", "fill"}[i%3]
			for range 10 {
				in := model.EncodeInput(inputs[i])
				if session == "fill" {
					in = nil
				}
				code, out, err := client.post(base, "/v1/sessions/"+session+"/run", in)
				if err != nil || code != http.StatusOK {
					errs <- fmt.Errorf("%s: %d %s %v", session, code, out, err)
					return
				}
				if session != "fill" {
					if want, _ := model.Predict(in); !bytes.Equal(out, want) {
						errs <- fmt.Errorf("%s: wrong classification", session)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// The liar's fence cannot be proven: only it is quarantined.
	code, body, err := client.post(base, "/v1/sessions/liar/run", nil)
	if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(string(body), `"class": "device_lost"`) {
		t.Fatalf("liar: %d %s %v", code, body, err)
	}
	code, body, err = client.get(base, "/v1/sessions")
	if err != nil || code != http.StatusOK {
		t.Fatalf("list: %d %v", code, err)
	}
	var list struct {
		Sessions []struct{ Name, State string } `json:"sessions"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Sessions {
		if (s.State == "quarantined") != (s.Name == "liar") {
			t.Fatalf("session %s is %s", s.Name, s.State)
		}
	}
	if code, _, err := client.post(base, "/v1/sessions/mlp1/run", model.EncodeInput(inputs[0])); err != nil || code != http.StatusOK {
		t.Fatalf("mlp1 after the quarantine: %d %v", code, err)
	}

	// A resident session, started and polled.
	code, body, err = client.post(base, "/v1/residents/pingpong/start", nil)
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("resident start: %d %s %v", code, body, err)
	}
	if !testutil.Poll(30*time.Second, func() bool {
		_, body, err = client.get(base, "/v1/residents/pingpong")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(body), `"failed"`) {
			t.Fatalf("resident: %s", body)
		}
		return strings.Contains(string(body), `"state": "verified"`)
	}) {
		t.Fatalf("resident not verified within 30s: %s", body)
	}

	code, body, err = client.get(base, "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("metrics: %d %v", code, err)
	}
	for _, want := range []string{
		`stagehost_session_runs_total{outcome="ok",session="fill"} 20`,
		`stagehost_session_runs_total{outcome="ok",session="mlp1"} 31`,
		`stagehost_session_runs_total{outcome="ok",session="mlp2"} 30`,
		`stagehost_session_runs_total{outcome="device_lost",session="liar"} 1`,
		`stagehost_quarantined_owners 1`,
		`stagehost_lane_occupancies_total{device="npu0",lane="npu"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("metrics lack %q", want)
		}
	}
	if code, body, err := client.get(base, "/debug/trace"); err != nil || code != http.StatusOK || !strings.Contains(string(body), "traceEvents") {
		t.Fatalf("trace: %d %v", code, err)
	}

	// SIGTERM in the middle of load: every accepted request is answered.
	var sent atomic.Int64
	loaded := make(chan struct{})
	var loadedOnce sync.Once
	stop := make(chan struct{})
	var load sync.WaitGroup
	for i := range 8 {
		load.Add(1)
		go func() {
			defer load.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				session := []string{"mlp1", "mlp2", "fill"}[i%3]
				code, _, err := client.post(base, "/v1/sessions/"+session+"/run", model.EncodeInput(inputs[i]))
				if err != nil {
					return // the server stopped accepting: expected after SIGTERM
				}
				if code != http.StatusOK {
					t.Errorf("%s during shutdown: %d", session, code)
					return
				}
				if sent.Add(1) == 40 {
					loadedOnce.Do(func() { close(loaded) })
				}
			}
		}()
	}
	select {
	case <-loaded:
	case <-time.After(60 * time.Second):
		t.Fatal("no load")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var rest bytes.Buffer
	for lines.Scan() {
		rest.WriteString(lines.Text() + "\n")
	}
	err = cmd.Wait()
	close(stop)
	load.Wait()
	if err != nil {
		t.Fatalf("serve exited with %v\nstdout: %s\nstderr: %s", err, rest.String(), stderr.String())
	}
	m := regexp.MustCompile(`stopped: (\d+) requests? accepted, (\d+) answered`).FindStringSubmatch(rest.String())
	if m == nil {
		t.Fatalf("no shutdown report: %s", rest.String())
	}
	accepted, _ := strconv.ParseUint(m[1], 10, 64)
	answered, _ := strconv.ParseUint(m[2], 10, 64)
	if accepted != answered {
		t.Fatalf("%d requests accepted but %d answered", accepted, answered)
	}
	if got := client.responses.Load(); got != answered {
		t.Fatalf("the server answered %d requests, the clients received %d responses", answered, got)
	}
	t.Logf("%d requests answered, %d of them during the shutdown load", answered, sent.Load())
}

// envTestBinary names a pre-built stagehost binary for the tests that
// run one, instead of building it (on a machine without Go).
const envTestBinary = "STAGEHOST_TEST_BINARY"
