package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
)

// supervisor is a running `serve --supervise` of a test.
type supervisor struct {
	t      *testing.T
	cmd    *exec.Cmd
	base   string
	stderr *syncBuf
	rest   chan string
	client *http.Client
}

func startSupervisor(t *testing.T, path, stateDir string) *supervisor {
	t.Helper()
	cmd := exec.Command(stagehostBinary(t), "serve", path, "--supervise", "--addr", "127.0.0.1:0", "--host-id", "sv", "--quiet", "--state-dir", stateDir)
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &supervisor{t: t, cmd: cmd, stderr: &syncBuf{}, rest: make(chan string, 1), client: &http.Client{Timeout: 10 * time.Second}}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base, lines := testutil.Serving(t, stdout, serveStartTimeout, func() string { _ = cmd.Process.Kill(); _ = cmd.Wait(); return s.stderr.String() })
	s.base = base
	go func() {
		var sb strings.Builder
		for lines.Scan() {
			sb.WriteString(lines.Text() + "\n")
		}
		s.rest <- sb.String()
	}()
	return s
}

func (s *supervisor) do(method, path, body string) (int, string) {
	req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// admin runs `stagehost admin --addr BASE args...`.
func (s *supervisor) admin(args ...string) (int, string, string) {
	return runCLI(s.t, append([]string{"admin", "--addr", s.base}, args...)...)
}

// status is GET /v1/status's workers, by name.
type statusWorker struct {
	Name           string
	PID            int
	State          string
	Restarts       int
	Devices        []string
	Sessions       []string
	LastExit       string   `json:"last_exit"`
	LastExitReason string   `json:"last_exit_reason"`
	LastExitStderr []string `json:"last_exit_stderr"`
	Notes          []string
}

func (s *supervisor) status() (map[string]statusWorker, string) {
	code, body := s.do("GET", "/v1/status", "")
	var st struct {
		Devices []struct{ Name, Health string }
		Workers []statusWorker
	}
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		return nil, body
	}
	out := map[string]statusWorker{}
	for _, w := range st.Workers {
		out[w.Name] = w
	}
	return out, body
}

func (s *supervisor) stop() string {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatal(err)
	}
	out := <-s.rest
	if err := s.cmd.Wait(); err != nil {
		s.t.Fatalf("serve --supervise exited with %v\n%s%s", err, out, s.stderr.String())
	}
	return out
}

// TestServeSuperviseModelControl: under serve --supervise, admin
// modules, upload, swap and reset reach the workers and answer with
// their results (a worker's refusal keeps its status); /v1/status and
// the status page show the workers with their devices and sessions; a
// swap survives a SIGKILL of its worker and a restart of the
// supervisor; a corrupt persisted module and a corrupt manifest are
// reported with their reasons; a worker that re-read a manifest without
// a session takes it out of the supervisor's list.
func TestServeSuperviseModelControl(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path := filepath.Join(t.TempDir(), "supervise.toml")
	superviseManifest(t, path, false)
	stateDir := filepath.Join(t.TempDir(), "state")
	echo, echoSHA := hostileModule(t, "echo")
	const limit = 20 * time.Second

	sv := startSupervisor(t, path, stateDir)
	ready := func(s *supervisor, what string) map[string]statusWorker {
		var ws map[string]statusWorker
		pollFor(t, limit, what, func() (bool, string) {
			var body string
			ws, body = s.status()
			return ws != nil && ws["gpu0"].State == "ready" && ws["gpu1"].State == "ready", body
		})
		return ws
	}
	ws := ready(sv, "both workers ready")
	// The devices, from the workers' heartbeats.
	pollFor(t, limit, "both devices ok in /v1/status", func() (bool, string) {
		code, body := sv.do("GET", "/v1/status", "")
		var st struct {
			Devices []struct{ Name, Health string }
		}
		if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
			return false, body
		}
		return fmt.Sprint(st.Devices) == "[{gpu0 ok} {gpu1 ok}]", body
	})
	if g := ws["gpu1"]; fmt.Sprint(g.Devices, g.Sessions) != "[gpu1] [b echo]" || g.PID == 0 {
		t.Errorf("gpu1 in /v1/status: %+v", g)
	}
	// The page shows the workers, their devices and sessions.
	if code, page := sv.do("GET", "/", ""); code != 200 || !strings.Contains(page, `data-worker="gpu1"`) ||
		strings.Contains(page, "no devices") || strings.Contains(page, "no sessions") || !strings.Contains(page, `data-session="b"`) {
		t.Errorf("status page: %d\n%s", code, page)
	}
	if code, out, errOut := sv.admin("workers"); code != 0 || !regexp.MustCompile(`(?m)^gpu1 +[0-9]+ +ready +0 +\S+ +gpu1 +b,echo +-$`).MatchString(out) {
		t.Errorf("admin workers: %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := sv.admin("status"); code != 0 || !strings.Contains(out, `"workers"`) {
		t.Errorf("admin status: %d\n%s", code, out)
	}
	call := func(s *supervisor, session, in string) (int, string) {
		return s.do("POST", "/v1/sessions/"+session+"/run", in)
	}
	// A session's call reaches its worker a moment after the worker is
	// ready (its heartbeat).
	pollFor(t, limit, "b answers", func() (bool, string) { code, body := call(sv, "b", "hi"); return code == 200 && body == "ok", body })

	// modules: the workers' modules, not an empty table.
	if code, out, errOut := sv.admin("modules"); code != 0 || !strings.Contains(out, "good *") || !strings.Contains(out, "echo *") {
		t.Fatalf("admin modules: %d\n%s%s", code, out, errOut)
	}
	// upload, then swap b (good: "ok") to it (echo: the input back).
	t0 := time.Now()
	if code, out, errOut := sv.admin("upload", "v2", echo); code != 0 || !strings.Contains(out, echoSHA) {
		t.Fatalf("admin upload: %d %s %s", code, out, errOut)
	}
	// load: a file on the supervisor's machine, loaded by the workers.
	if code, out, errOut := sv.admin("load", "v3", echo); code != 0 || !strings.Contains(out, `"ref": "v3@`+echoSHA) || !strings.Contains(out, `"source": "path"`) {
		t.Fatalf("admin load: %d %s %s", code, out, errOut)
	}
	if code, out, _ := sv.admin("modules"); code != 0 || !strings.Contains(out, "v2 *") || !strings.Contains(out, "v3 *") {
		t.Errorf("admin modules after the upload and the load:\n%s", out)
	}
	// unload: from every worker, and from the state.
	if code, out, errOut := sv.admin("unload", "v3"); code != 0 || !strings.Contains(out, `"ref": "v3@`+echoSHA) {
		t.Errorf("admin unload: %d %s %s", code, out, errOut)
	}
	if code, out, _ := sv.admin("modules"); code != 0 || strings.Contains(out, "v3") {
		t.Errorf("admin modules after the unload:\n%s", out)
	}
	if b, err := os.ReadFile(filepath.Join(stateDir, "state.json")); err != nil || strings.Contains(string(b), `"v3"`) || !strings.Contains(string(b), `"v2"`) {
		t.Errorf("state.json after the unload: %s %v", b, err)
	}
	tUpload := time.Since(t0)
	t0 = time.Now()
	if code, out, errOut := sv.admin("swap", "b", "v2"); code != 0 || !strings.Contains(out, `"to": "v2@`+echoSHA) {
		t.Fatalf("admin swap: %d %s %s", code, out, errOut)
	}
	t.Logf("through the supervisor: admin upload (2 workers) %v, admin swap (1 worker) %v", tUpload, time.Since(t0))
	if code, body := call(sv, "b", "hello"); code != 200 || body != "hello" {
		t.Fatalf("b after the swap: %d %q", code, body)
	}
	if code, out, errOut := sv.admin("reset", "b"); code != 0 || !strings.Contains(out, `"session": "b"`) {
		t.Errorf("admin reset: %d %s %s", code, out, errOut)
	}
	// Refusals keep their class: an unknown session (the supervisor's
	// 404), an unknown module (the worker's 404), a fence for a stage.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"swap", "nope", "v2"}, `no session "nope" (class not_found, HTTP 404`},
		{[]string{"reset", "nope"}, `no session "nope" (class not_found, HTTP 404`},
		{[]string{"swap", "b", "nope"}, `worker gpu1: `},
		{[]string{"swap", "b", "nope"}, `(class not_found, HTTP 404`},
	} {
		if code, _, errOut := sv.admin(c.args...); code != exitFailed || !strings.Contains(errOut, c.want) {
			t.Errorf("admin %v: %d %s; want %q", c.args, code, errOut, c.want)
		}
	}

	// A SIGKILL of gpu1's worker: the new process restores the upload and
	// the swap before it serves.
	before := ws["gpu1"]
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	pollFor(t, limit, "gpu1's worker restarted", func() (bool, string) {
		ws, body := sv.status()
		return ws != nil && ws["gpu1"].State == "ready" && ws["gpu1"].PID != before.PID, body
	})
	pollFor(t, limit, "b served by the new worker, swapped", func() (bool, string) {
		code, body := call(sv, "b", "again")
		return code == 200 && body == "again", body
	})
	t.Logf("SIGKILL of gpu1's worker to b answered by the swapped version again: %v", time.Since(t0))

	// A restart of the supervisor: the swap holds.
	if out := sv.stop(); !strings.Contains(out, "worker gpu1: restored swap of b to v2@"+echoSHA) ||
		!strings.Contains(out, "worker gpu1: restored module v2@"+echoSHA) {
		t.Errorf("no restored swap on stdout:\n%s", out)
	}
	sv = startSupervisor(t, path, stateDir)
	ready(sv, "both workers ready after the supervisor's restart")
	pollFor(t, limit, "b swapped after the supervisor's restart", func() (bool, string) {
		code, body := call(sv, "b", "back")
		return code == 200 && body == "back", body
	})
	if code, out, _ := sv.admin("modules"); code != 0 || !strings.Contains(out, "v2 *") {
		t.Errorf("admin modules after the supervisor's restart:\n%s", out)
	}

	// A corrupt module file in the state: the restarted worker says so,
	// and b is served from the manifest's module.
	if err := os.WriteFile(filepath.Join(stateDir, "modules", echoSHA+".wasm"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	ws, _ = sv.status()
	if err := syscall.Kill(ws["gpu1"].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	pollFor(t, limit, "the corrupt module reported", func() (bool, string) {
		ws, body := sv.status()
		g := ws["gpu1"]
		return g.State == "ready" && g.PID != ws["gpu0"].PID && slices.ContainsFunc(g.Notes, func(n string) bool {
			return strings.Contains(n, "module v2@"+echoSHA+" not restored") && strings.Contains(n, "corrupt")
		}), body
	})

	// A corrupt manifest: gpu1's worker exits 65; its reason is shown.
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	writeManifest := func(body string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	writeManifest("version = 1\n[[device]\n")
	ws, _ = sv.status()
	killed := ws["gpu1"].PID
	if err := syscall.Kill(killed, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	pollFor(t, limit, "gpu1's exit 65 and its reason in /v1/status", func() (bool, string) {
		ws, body := sv.status()
		g := ws["gpu1"]
		return strings.HasPrefix(g.LastExit, "exit status 65") && strings.Contains(g.LastExitReason, "died without reporting: exit status 65: ") &&
			strings.Contains(g.LastExitReason, "supervise.toml"), body
	})
	if code, page := sv.do("GET", "/", ""); code != 200 || !strings.Contains(page, "exit status 65") {
		t.Errorf("status page without the exit: %d", code)
	}
	if code, out, _ := sv.admin("workers"); code != 0 || !strings.Contains(out, "gpu1: ") || !strings.Contains(out, "exit status 65: ") {
		t.Errorf("admin workers after the exit 65:\n%s", out)
	}

	// A manifest without session echo: the next gpu1 worker serves b
	// only, and the supervisor no longer lists echo.
	i := strings.Index(string(good), "[[session]]\nname = \"echo\"")
	if i < 0 {
		t.Fatal("no echo session in the manifest")
	}
	writeManifest(string(good[:i]))
	pollFor(t, limit, "echo no longer listed", func() (bool, string) {
		code, body := sv.do("GET", "/v1/sessions", "")
		ws, _ := sv.status()
		return code == 200 && ws["gpu1"].State == "ready" && !strings.Contains(body, `"echo"`) && strings.Contains(body, `"b"`), body
	})
	if code, body := sv.do("GET", "/v1/sessions/echo", ""); code != 404 {
		t.Errorf("GET /v1/sessions/echo after it was dropped: %d %s", code, body)
	}
	if code, body := call(sv, "echo", "x"); code != 404 {
		t.Errorf("a call of echo after it was dropped: %d %s", code, body)
	}
	sv.stop()
}

// TestServeStateDir: a plain serve with --state-dir records an upload
// and a swap, and applies them when it starts again; without
// --state-dir it starts from the manifest.
func TestServeStateDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "supervise.toml")
	superviseManifest(t, path, false)
	stateDir := filepath.Join(t.TempDir(), "state")
	echo, echoSHA := hostileModule(t, "echo")
	client := &http.Client{Timeout: 10 * time.Second}
	call := func(s *server, in string) (int, string) {
		resp, err := client.Post(s.base+"/v1/sessions/b/run", "application/octet-stream", strings.NewReader(in))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	s := startServe(t, path, "--state-dir", stateDir, "--quiet")
	for _, args := range [][]string{{"upload", "v2", echo}, {"swap", "b", "v2"}} {
		if code, out, errOut := runCLI(t, append([]string{"admin", "--addr", s.base}, args...)...); code != 0 {
			t.Fatalf("admin %v: %d %s %s", args, code, out, errOut)
		}
	}
	if code, body := call(s, "one"); code != 200 || body != "one" {
		t.Fatalf("b after the swap: %d %q", code, body)
	}
	s.stop()
	s = startServe(t, path, "--state-dir", stateDir, "--quiet")
	if code, body := call(s, "two"); code != 200 || body != "two" {
		t.Errorf("b after a restart: %d %q; want the swap restored", code, body)
	}
	s.stop()
	// Without --state-dir: the manifest's module.
	s = startServe(t, path, "--quiet")
	if code, body := call(s, "three"); code != 200 || body != "ok" {
		t.Errorf("b without --state-dir: %d %q", code, body)
	}
	s.stop()
	// A corrupt module file: reported on stderr, b from the manifest.
	if err := os.WriteFile(filepath.Join(stateDir, "modules", echoSHA+".wasm"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = startServe(t, path, "--state-dir", stateDir, "--quiet")
	if code, body := call(s, "four"); code != 200 || body != "ok" {
		t.Errorf("b with a corrupt module file: %d %q", code, body)
	}
	if _, errOut := s.stop(); !strings.Contains(errOut, "model state: module v2@"+echoSHA+" not restored") || !strings.Contains(errOut, "corrupt") {
		t.Errorf("stderr without the corrupt module:\n%s", errOut)
	}
}
