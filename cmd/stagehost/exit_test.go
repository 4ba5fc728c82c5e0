package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
)

// runBinary runs the built stagehost with args and returns its exit code
// and output.
func runBinary(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(stagehostBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// TestBinaryExitCodes runs the real binary: bad usage exits 64, an invalid
// manifest 65, and a crash (here the Go runtime's SIGQUIT dump) 2, a code
// that stagehost never uses itself.
func TestBinaryExitCodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("version = 1\n[runtime]\ncapacity = \"lots\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 64, "Usage"},
		{[]string{"frobnicate"}, 64, "unknown command"},
		{[]string{"check"}, 64, "exactly one FILE"},
		{[]string{"run", "--turbo", bad}, 64, "flag provided but not defined"},
		{[]string{"check", bad}, 65, "bad.toml:3: runtime.capacity: must be an integer"},
		{[]string{"run", bad}, 65, "bad.toml:3: runtime.capacity"},
		{[]string{"serve", bad}, 65, "bad.toml:3: runtime.capacity"},
		{[]string{"check", "../../manifest/testdata/bad/file_kinds.toml"}, 65, `"/dev/zero" is not a regular file`},
		{[]string{"check", "../../host.toml"}, 0, "ok"},
	} {
		code, out, errs := runBinary(t, tc.args...)
		if code != tc.code || !strings.Contains(out+errs, tc.want) {
			t.Errorf("stagehost %v: exit %d (want %d), output lacks %q:\n%s%s", tc.args, code, tc.code, tc.want, out, errs)
		}
	}

	// The Go runtime exits with 2 when the process crashes; SIGQUIT makes
	// it dump its goroutines and exit the same way.
	cmd, stdout, stderr := startBinary(t, "serve", "testdata/failing.toml", "--addr", "127.0.0.1:0")
	if base, _ := serving(cmd, stdout); base == "" {
		_ = cmd.Wait()
		t.Fatalf("no serving line; stderr:\n%s", stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != exitCrash {
		t.Fatalf("a crash exited with %d, want %d", code, exitCrash)
	}
	if !strings.Contains(stderr.String(), "goroutine") {
		t.Errorf("no crash dump on stderr:\n%s", stderr.String())
	}
}

// serving reads the serve command's output up to its serving line and
// returns the base URL and the scanner. When there was none within
// serveStartTimeout, or the output ended first, the base URL is "" and
// cmd is killed, so that the caller's cmd.Wait returns.
func serving(cmd *exec.Cmd, stdout io.Reader) (string, *bufio.Scanner) {
	base, lines := testutil.ServingLine(stdout, serveStartTimeout)
	if base == "" {
		_ = cmd.Process.Kill()
	}
	return base, lines
}

// TestServeWithSessionsThatCannotBeCreated runs the real binary on a
// manifest where one session's stagehost_init traps and another's never
// returns (init_timeout 200ms): serve still listens, lists both as failed
// with their reasons, answers 503 for them and runs the good session.
func TestServeWithSessionsThatCannotBeCreated(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	cmd, stdout, stderr := startBinary(t, "serve", "testdata/failing.toml", "--addr", "127.0.0.1:0")
	base, lines := serving(cmd, stdout)
	if base == "" {
		_ = cmd.Wait()
		t.Fatalf("no serving line; stderr:\n%s", stderr.String())
	}
	client := &counted{c: &http.Client{Timeout: 60 * time.Second}}

	code, body, err := client.get(base, "/v1/sessions")
	if err != nil || code != http.StatusOK {
		t.Fatalf("list: %d %s %v", code, body, err)
	}
	var list struct {
		Sessions []struct{ Name, State, Reason string } `json:"sessions"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{ state, reason string }{
		"boot_trap": {"failed", "stagehost_init"},
		"boot_loop": {"failed", "deadline"},
		"steady":    {"ready", ""},
	}
	if len(list.Sessions) != len(want) {
		t.Fatalf("sessions: %s", body)
	}
	for _, s := range list.Sessions {
		w := want[s.Name]
		if s.State != w.state || !strings.Contains(s.Reason, w.reason) {
			t.Errorf("session %s: state %q reason %q, want %q with %q", s.Name, s.State, s.Reason, w.state, w.reason)
		}
	}
	for _, name := range []string{"boot_trap", "boot_loop"} {
		code, body, err := client.get(base, "/v1/sessions/"+name)
		if err != nil || code != http.StatusOK || !strings.Contains(string(body), `"state": "failed"`) {
			t.Errorf("get %s: %d %s %v", name, code, body, err)
		}
		code, body, err = client.post(base, "/v1/sessions/"+name+"/run", nil)
		var e struct{ Error, Class string }
		if err != nil || code != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil ||
			e.Class != "unavailable" || !strings.Contains(e.Error, "could not be created") || !strings.Contains(e.Error, want[name].reason) {
			t.Errorf("run %s: %d %s %v", name, code, body, err)
		}
	}
	if code, body, err := client.post(base, "/v1/sessions/steady/run", nil); err != nil || code != http.StatusOK || string(body) != "ok" {
		t.Fatalf("steady: %d %s %v", code, body, err)
	}
	code, body, err = client.get(base, "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("metrics: %d %v", code, err)
	}
	for _, w := range []string{
		`stagehost_session_up{session="boot_loop"} 0`,
		`stagehost_session_up{session="boot_trap"} 0`,
		`stagehost_session_up{session="steady"} 1`,
		`stagehost_session_runs_total{outcome="ok",session="steady"} 1`,
	} {
		if !strings.Contains(string(body), w) {
			t.Errorf("metrics lack %q", w)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve exited with %v\nstderr: %s", err, stderr.String())
	}
	for _, w := range []string{"session boot_trap could not be created", "session boot_loop could not be created"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
		}
	}
}

// TestRunWithSessionsThatCannotBeCreated: run runs the good session,
// reports the two that could not be created, and exits 3.
func TestRunWithSessionsThatCannotBeCreated(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	code, out, errs := runBinary(t, "run", "testdata/failing.toml")
	if code != exitStartup {
		t.Fatalf("exit %d, want %d\n%s%s", code, exitStartup, out, errs)
	}
	for _, w := range []string{
		"session boot_trap: FAILED: could not be created: ",
		"session steady: ok",
		"session boot_loop: FAILED: could not be created: ",
		"exceeded its deadline of 200ms",
		"lane summary:",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if !strings.Contains(errs, "2 of 3 sessions could not be created") {
		t.Errorf("stderr:\n%s", errs)
	}
	// Only the good session: it runs, and nothing failed.
	if code, out, errs := runBinary(t, "run", "testdata/failing.toml", "--session", "steady"); code != exitOK {
		t.Errorf("--session steady: exit %d\n%s%s", code, out, errs)
	}
}
