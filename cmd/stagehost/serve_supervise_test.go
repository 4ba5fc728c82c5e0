package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
)

// superviseManifest writes a manifest of two sim gpus, session a on gpu0
// and b and echo (the echo module) on gpu1; with lose, gpu0 is lost at
// start-up (a lose fault).
func superviseManifest(t *testing.T, path string, lose bool) {
	t.Helper()
	good, goodSHA := hostileModule(t, "good_stage")
	echo, echoSHA := hostileModule(t, "echo")
	fault := ""
	if lose {
		fault = "[[device.sim.fault]]\nkind = \"lose\"\n"
	}
	body := fmt.Sprintf(`version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
%s[[device]]
name = "gpu1"
backend = "sim"
engine = "gpu"
[[module]]
name = "good"
path = %q
sha256 = %q
[[session]]
name = "a"
stage = "good"
device = "gpu0"
programs = ["noop"]
[[session]]
name = "b"
stage = "good"
device = "gpu1"
programs = ["noop"]
[[module]]
name = "echo"
path = %q
sha256 = %q
[[session]]
name = "echo"
stage = "echo"
device = "gpu1"
max_input = "16MiB"
`, fault, good, goodSHA, echo, echoSHA)
	// Written aside and renamed: a worker starting meanwhile reads the
	// old manifest or the new one, never half of one.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// workerJSON is one worker of GET /v1/workers.
type workerJSON struct {
	Name           string
	Tenant         string
	Sessions       []string
	PID            int
	State          string
	Restarts       int
	DeviceLosses   int `json:"device_losses"`
	SyntheticExits int `json:"synthetic_exits"`
	Hangs          int `json:"hangs"`
	LastExit       *struct {
		PID        int
		Synthetic  bool
		SignalName string `json:"signal_name"`
		Reason     string
		Cause      string
		Killed     bool
		KilledAt   time.Time `json:"killed_at"`
		Time       time.Time
	} `json:"last_exit"`
}

// TestServeSupervise runs `serve --supervise` over two sim gpus, one
// worker process each, on its embedded NATS server: gpu0's device is
// lost at start, so its worker reports device_lost and is restarted with
// backoff while b (gpu1) is served and /readyz stays ready with gpu0 in
// degraded; once the manifest no longer loses gpu0, its worker serves a.
// A SIGKILL of gpu0's worker is a synthetic exit: that worker alone
// restarts (new pid, one more restart; gpu1 keeps its pid), b answers
// 200 throughout, and a serves again. SIGTERM stops it all, exit 0.
func TestServeSupervise(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path := filepath.Join(t.TempDir(), "supervise.toml")
	superviseManifest(t, path, true)
	cmd := exec.Command(stagehostBinary(t), "serve", path, "--supervise", "--addr", "127.0.0.1:0", "--host-id", "sv", "--quiet")
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuf{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base, lines := testutil.Serving(t, stdout, serveStartTimeout, func() string { _ = cmd.Process.Kill(); _ = cmd.Wait(); return stderr.String() })
	rest := make(chan string, 1)
	go func() {
		var sb strings.Builder
		for lines.Scan() {
			sb.WriteString(lines.Text() + "\n")
		}
		rest <- sb.String()
	}()
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(path string) (int, string) {
		resp, err := client.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		var sb strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
		return resp.StatusCode, sb.String()
	}
	call := func(session string) (int, string) {
		resp, err := client.Post(base+"/v1/sessions/"+session+"/run", "application/octet-stream", nil)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		var sb strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
		return resp.StatusCode, sb.String()
	}
	workers := func() (map[string]workerJSON, string) {
		code, body := get("/v1/workers")
		var ws struct{ Workers []workerJSON }
		if code != 200 || json.Unmarshal([]byte(body), &ws) != nil {
			return nil, body
		}
		out := map[string]workerJSON{}
		for _, w := range ws.Workers {
			out[w.Name] = w
		}
		return out, body
	}
	const limit = 20 * time.Second

	// 1. gpu0 is lost at start: its worker reports it and is restarted
	// with backoff; gpu1's serves b, and the front is ready, degraded.
	pollFor(t, limit, "gpu0's worker reports its device lost, gpu1's is ready", func() (bool, string) {
		ws, body := workers()
		return ws != nil && ws["gpu0"].DeviceLosses >= 1 && ws["gpu1"].State == "ready", body
	})
	// The front sees gpu1's heartbeat a moment after the worker reports
	// ready.
	pollFor(t, limit, "b served while gpu0 is lost", func() (bool, string) {
		code, body := call("b")
		return code == 200 && body == "ok", body
	})
	if code, body := get("/readyz"); code != 200 || !strings.Contains(body, `"degraded"`) || !strings.Contains(body, "worker gpu0 is") {
		t.Errorf("/readyz while gpu0's worker restarts: %d %s", code, body)
	}
	if code, body := get("/v1/sessions/a/ready"); code != 503 {
		t.Errorf("a's readiness while no worker serves it: %d %s", code, body)
	}
	if code, body := get("/v1/sessions/b/ready"); code != 200 {
		t.Errorf("b's readiness: %d %s", code, body)
	}
	if code, body := call("a"); code != 503 {
		t.Errorf("a while gpu0 is lost: %d %s", code, body)
	}
	// Every call goes through the lattice here: an input and an output
	// larger than the embedded server's 8 MiB messages go through its
	// payload store, unchanged.
	big := make([]byte, 12<<20)
	for i := range big {
		big[i] = byte(i * 7 / 5)
	}
	if resp, err := client.Post(base+"/v1/sessions/echo/run", "application/octet-stream", bytes.NewReader(big)); err != nil {
		t.Errorf("a 12 MiB echo: %v", err)
	} else {
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil || !bytes.Equal(out, big) {
			t.Errorf("a 12 MiB echo: %d, %d bytes back, equal %v, %v", resp.StatusCode, len(out), bytes.Equal(out, big), err)
		}
	}
	// The supervisor applies the manifest session's max_input (16 MiB)
	// before it routes a call: at once from Content-Length, and as a
	// streamed body passes it.
	over := bytes.NewReader(make([]byte, 16<<20+1))
	for _, body := range []io.Reader{over, io.MultiReader(bytes.NewReader(make([]byte, 16<<20)), strings.NewReader("x"))} {
		resp, err := client.Post(base+"/v1/sessions/echo/run", "application/octet-stream", body)
		if err != nil {
			t.Errorf("16 MiB + 1 byte: %v", err)
			continue
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// "the request body": the supervisor's refusal, not the worker's
		// ("the input of N bytes").
		if resp.StatusCode != 413 || !strings.Contains(string(out), `the request body`) || !strings.Contains(string(out), `session \"echo\"'s max_input of 16777216 bytes`) {
			t.Errorf("16 MiB + 1 byte: %d %s", resp.StatusCode, out)
		}
	}
	if _, body := get("/metrics"); !strings.Contains(body, `stagehost_worker_up{worker="gpu1"} 1`) ||
		strings.Contains(body, `stagehost_worker_device_losses_total{worker="gpu0"} 0`) {
		t.Errorf("metrics while gpu0 is lost:\n%s", grepLines(body, "stagehost_worker"))
	}
	// The sessions' series, from the workers' heartbeats: b is up and
	// gpu1's worker counts its calls (a heartbeat after them), a is down.
	pollFor(t, limit, "b's calls in the supervisor's metrics", func() (bool, string) {
		_, body := get("/metrics")
		return regexp.MustCompile(`stagehost_lattice_session_runs_total\{host="sv-gpu1",outcome="ok",session="b"\} [1-9]`).MatchString(body) &&
				strings.Contains(body, `stagehost_lattice_session_up{session="b"} 1`) && strings.Contains(body, `stagehost_lattice_session_up{session="a"} 0`),
			grepLines(body, "stagehost_lattice_session")
	})

	// 2. The manifest no longer loses gpu0: its next worker serves a.
	superviseManifest(t, path, false)
	pollFor(t, limit, "a served by gpu0's worker", func() (bool, string) {
		code, body := call("a")
		return code == 200 && body == "ok", body
	})
	// The worker joins the lattice, then reports ready: a call can reach
	// it a moment before the supervisor has read the report.
	pollFor(t, limit, "gpu0's worker ready", func() (bool, string) {
		ws, body := workers()
		return ws != nil && ws["gpu0"].State == "ready", body
	})
	before, body := workers()
	if before["gpu0"].State != "ready" || before["gpu1"].Restarts != 0 {
		t.Fatalf("before the kill: %s", body)
	}
	var list struct {
		Sessions []struct {
			Name  string
			State string
			Hosts []string
		}
	}
	if code, body := get("/v1/sessions"); code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Sessions) != 3 ||
		fmt.Sprint(list.Sessions[0].Hosts) != "[sv-gpu0]" || fmt.Sprint(list.Sessions[1].Hosts) != "[sv-gpu1]" || fmt.Sprint(list.Sessions[2].Hosts) != "[sv-gpu1]" {
		t.Errorf("/v1/sessions: %d %s", code, body)
	}

	// 3. SIGKILL gpu0's worker while b is called all along.
	var bOK, bFailed atomic.Int64
	var bErr atomic.Value
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if code, body := call("b"); code == 200 {
				bOK.Add(1)
			} else {
				bFailed.Add(1)
				bErr.Store(fmt.Sprintf("%d %s", code, body))
			}
		}
	}()
	if err := syscall.Kill(before["gpu0"].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := bOK.Load()
	var after map[string]workerJSON
	pollFor(t, limit, "gpu0's worker restarted after the SIGKILL", func() (bool, string) {
		var body string
		after, body = workers()
		g := after["gpu0"]
		return after != nil && g.State == "ready" && g.PID != before["gpu0"].PID && g.Restarts == before["gpu0"].Restarts+1, body
	})
	pollFor(t, limit, "a served again", func() (bool, string) {
		code, body := call("a")
		return code == 200 && body == "ok", body
	})
	duringRestart := bOK.Load() - killed
	close(done)
	wg.Wait()
	g0, g1 := after["gpu0"], after["gpu1"]
	if e := g0.LastExit; e == nil || e.PID != before["gpu0"].PID || !e.Synthetic || e.SignalName != "SIGKILL" || g0.SyntheticExits < 1 {
		t.Errorf("gpu0's last exit %+v, synthetic exits %d; want pid %d's SIGKILL, synthetic", e, g0.SyntheticExits, before["gpu0"].PID)
	}
	if g1.PID != before["gpu1"].PID || g1.Restarts != 0 || g1.State != "ready" {
		t.Errorf("gpu1's worker changed: %+v, before %+v", g1, before["gpu1"])
	}
	if n := bFailed.Load(); n != 0 || duringRestart == 0 {
		t.Errorf("b: %d calls failed (last %v), %d answered 200 while gpu0's worker restarted; want none failed, some answered", n, bErr.Load(), duringRestart)
	}
	t.Logf("b answered %d calls in all, %d while gpu0's worker restarted", bOK.Load(), duringRestart)
	if _, body := get("/metrics"); !strings.Contains(body, `stagehost_worker_synthetic_exits_total{worker="gpu0"} 1`) ||
		!strings.Contains(body, `stagehost_worker_restarts_total{worker="gpu1"} 0`) || !strings.Contains(body, `stagehost_worker_up{worker="gpu0"} 1`) {
		t.Errorf("metrics after the restart:\n%s", grepLines(body, "stagehost_worker"))
	}

	// 4. SIGTERM: the service drains, the workers stop, exit 0.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	out := <-rest
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve --supervise exited with %v\n%s%s", err, out, stderr.String())
	}
	if !strings.Contains(out, "stopped: ") || !strings.Contains(out, "worker gpu1 stopped: SIGTERM") {
		t.Errorf("stdout after SIGTERM:\n%s", out)
	}
	for _, w := range after {
		if err := syscall.Kill(w.PID, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("worker %s (pid %d) outlived its supervisor: %v", w.Name, w.PID, err)
		}
	}
}

// syncBuf is a bytes.Buffer safe for a process's writes and the test's
// reads.
type syncBuf struct {
	mu sync.Mutex
	sb strings.Builder
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.String()
}

// TestServeWorkerFlags: --worker excludes --supervise, needs a device of
// the manifest, and a lattice to join (its supervisor's URL in the
// environment, or a [lattice] url); --supervise refuses a session name
// that cannot be a NATS subject token.
func TestServeWorkerFlags(t *testing.T) {
	t.Setenv(envLatticeURL, "")
	path := filepath.Join(t.TempDir(), "supervise.toml")
	superviseManifest(t, path, false)
	// The same manifest with session b named "b.v2".
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dotted := filepath.Join(t.TempDir(), "dotted.toml")
	if err := os.WriteFile(dotted, []byte(strings.Replace(string(body), `name = "b"`, `name = "b.v2"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	// check passes it, with a note.
	if code, out, _ := runCLI(t, "check", dotted); code != exitOK || !strings.Contains(out, `note: session "b.v2" is not a NATS subject token`) {
		t.Errorf("check of a dotted name: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", path, "--worker", "gpu0", "--supervise"}, "exclude each other"},
		{[]string{"serve", path, "--worker", "gpu9"}, `no device "gpu9"`},
		{[]string{"serve", path, "--worker", "gpu0"}, envLatticeURL + " is not set"},
		{[]string{"serve", dotted, "--supervise"}, `session "b.v2": under a supervisor`},
	} {
		code, _, stderr := runCLI(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, code, stderr, exitUsage, c.want)
		}
	}

}
