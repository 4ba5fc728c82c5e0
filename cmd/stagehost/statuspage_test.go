package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// statusManifest is a manifest for the status page: steady (good calls),
// trap (its stage traps: fault outcomes), liar (its fence lies: its first
// call quarantines it), boot_trap (its stagehost_init traps: failed at
// start) and the resident pingpong.
func statusManifest(t *testing.T) string {
	t.Helper()
	mod := func(name, p string) string {
		a, err := filepath.Abs(filepath.Join("../..", p))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(a)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("[[module]]\nname = %q\npath = %q\nsha256 = %q\n", name, a, stages.SHA256(b))
	}
	src := `version = 1
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
` + mod("good", "stages/testdata/hostile/good_stage.wasm") +
		mod("trap", "stages/testdata/hostile/trap_stage.wasm") +
		mod("lying_fence", "stages/testdata/hostile/lying_fence.wasm") +
		mod("init_trap", "deploy/testdata/init_trap.wasm") + `
[[session]]
name = "steady"
stage = "good"
device = "gpu0"
programs = ["noop"]
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
name = "boot_trap"
stage = "init_trap"
device = "gpu0"
[[resident]]
name = "pingpong"
gpu = "gpu0"
npu = "npu0"
rounds = 16
`
	path := filepath.Join(t.TempDir(), "status.toml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// chromiumPath finds Debian's chromium, skipping the test without it
// unless STAGEHOST_REQUIRE_CHROMIUM=1 (CI) makes that a failure.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("STAGEHOST_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("chromium is not on PATH and STAGEHOST_REQUIRE_CHROMIUM=1 (install it: apt-get install -y chromium)")
	}
	t.Skip("chromium is not on PATH: skipping the headless-browser test of the status page (apt-get install -y chromium; STAGEHOST_REQUIRE_CHROMIUM=1 makes this a failure)")
	return ""
}

// headless runs chromium headless with args and returns its stdout. It
// is bounded: past limit, chromium and every process it started are
// killed.
func headless(t *testing.T, chromium string, limit time.Duration, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, chromium, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("chromium %v ran past %v\nstderr:\n%s", args, limit, stderr.String())
	}
	if err != nil {
		t.Fatalf("chromium %v: %v\nstderr:\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

// TestStatusPageInChromium serves a manifest with a ready, a trapping, a
// quarantined and a failed session and a resident run, and loads the
// status page in a real headless Chromium: the DOM it builds shows every
// device, each device's lanes, each session's state and the verified
// run, and the page's script ran under its CSP. The screenshot is kept
// in $STAGEHOST_ARTIFACTS (or the test's temporary directory).
func TestStatusPageInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and chromium")
	}
	chromium := chromiumPath(t)
	s := startServe(t, statusManifest(t))
	for range 5 {
		if a := s.request(nil, "POST", "/v1/sessions/steady/run", nil); a.code != 200 {
			t.Fatalf("steady: %d %s", a.code, a.body)
		}
	}
	if a := s.request(nil, "POST", "/v1/sessions/trap/run", nil); a.code != 500 {
		t.Fatalf("trap: %d %s", a.code, a.body)
	}
	if a := s.request(nil, "POST", "/v1/sessions/liar/run", nil); a.code != 503 {
		t.Fatalf("liar: %d %s", a.code, a.body)
	}
	if a := s.request(nil, "POST", "/v1/residents/pingpong/start", nil); a.code != 202 {
		t.Fatalf("resident start: %d %s", a.code, a.body)
	}
	var resident []byte
	if !testutil.Poll(30*time.Second, func() bool {
		resident = s.request(nil, "GET", "/v1/residents/pingpong", nil).body
		if strings.Contains(string(resident), `"failed"`) {
			t.Fatalf("resident: %s", resident)
		}
		return strings.Contains(string(resident), `"state": "verified"`)
	}) {
		t.Fatalf("resident not verified within 30s: %s", resident)
	}

	dom := headless(t, chromium, 90*time.Second, "--dump-dom", s.base+"/")
	for _, want := range []string{
		"<title>stagehost status</title>",
		"<td>gpu0</td><td>sim</td><td>gpu</td>", "<td>gpu1</td><td>sim</td><td>gpu</td>", "<td>npu0</td><td>sim</td><td>npu</td>",
		`data-device="gpu0" data-lane="compute"`, `data-device="gpu0" data-lane="upload"`, `data-device="gpu0" data-lane="download"`,
		`data-device="gpu0" data-lane="npu"`, `data-device="gpu1" data-lane="compute"`, `data-device="npu0" data-lane="npu"`,
		`data-session="steady" data-state="ready"`, `data-session="trap" data-state="ready"`,
		`data-session="liar" data-state="quarantined"`, `data-session="boot_trap" data-state="failed"`,
		`<span class="state bad">quarantined</span>`, `<span class="state bad">failed</span>`, `<span class="state good">ready</span>`,
		`<span class="kv goodtext">ok&nbsp;5</span>`, `<span class="kv badtext">fault&nbsp;1</span>`,
		`data-resident="pingpong"`, `<tr class="run" data-state="verified">`,
		`<a id="download-trace" href="debug/trace" download="stagehost-trace.json">`,
		// The script ran (its CSP hash matched): it showed the button.
		`<button id="open-perfetto" type="button">Open in Perfetto</button>`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the DOM lacks %s", want)
		}
	}
	if t.Failed() {
		t.Fatalf("DOM:\n%s", dom)
	}

	dir := os.Getenv("STAGEHOST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot, err := filepath.Abs(filepath.Join(dir, "statuspage.png"))
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(shot)
	headless(t, chromium, 90*time.Second, "--screenshot="+shot, "--window-size=1280,1600", "--hide-scrollbars", s.base+"/?refresh=0")
	png, err := os.ReadFile(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10<<10 {
		t.Fatalf("the screenshot is not a PNG of a page (%d bytes)", len(png))
	}
	t.Logf("status page screenshot: %s (%d KiB)", shot, len(png)>>10)
	s.stop()

	// With tokens, a browser without credentials sees the sign-in form,
	// and nothing of the deployment.
	tokens := filepath.Join(t.TempDir(), "admin.tokens")
	if err := os.WriteFile(tokens, []byte("admin-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = startServe(t, statusManifest(t), "--admin-token-file", tokens)
	dom = headless(t, chromium, 90*time.Second, "--dump-dom", s.base+"/")
	if !strings.Contains(dom, `<input type="password" name="token"`) || strings.Contains(dom, "gpu0") || strings.Contains(dom, "steady") {
		t.Errorf("with tokens, the DOM is not the sign-in form:\n%s", dom)
	}
	s.stop()
}
