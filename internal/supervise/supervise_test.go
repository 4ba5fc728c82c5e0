//go:build unix

package supervise

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
)

// The test binary is its own worker: with SUPERVISE_TEST_WORKER set,
// TestMain runs workerMain in that mode instead of the tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("SUPERVISE_TEST_WORKER"); mode != "" {
		workerMain(mode)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// workerMain is a worker. Modes:
//
//	ready        report ready; on SIGTERM report exiting and exit 0
//	lost-once    the first process (per SUPERVISE_TEST_MARKER) reports
//	             ready then device_lost; later ones as ready
//	exit3        exit 3 without reporting
//	stderr65     write two lines to stderr, exit 65 without reporting
//	serving      report ready with devices, sessions and notes
//	hung-once    the first process (per SUPERVISE_TEST_MARKER) ignores
//	             SIGTERM, reports ready then hung, and sleeps; later ones
//	             as ready
//	sigkill      report ready, then SIGKILL itself
//	ignore-term  ignore SIGTERM, report ready, sleep
//	never-ready  report nothing; on SIGTERM exit 0 without reporting
//	descendant   exit 0 at once; a child reports exiting 200 ms later and
//	             holds the pipe 3 s
//	garbage      write a line that is not JSON and an unknown event, then as ready
func workerMain(mode string) {
	rep := WorkerReporter()
	if !rep.Supervised() {
		fmt.Fprintln(os.Stderr, "test worker: not supervised")
		os.Exit(100)
	}
	terms := make(chan os.Signal, 1)
	serve := func() {
		must(rep.Ready())
		<-terms
		must(rep.Exiting("SIGTERM"))
		os.Exit(0)
	}
	switch mode {
	case "ready":
		signal.Notify(terms, syscall.SIGTERM)
		serve()
	case "lost-once":
		signal.Notify(terms, syscall.SIGTERM)
		f, err := os.OpenFile(os.Getenv("SUPERVISE_TEST_MARKER"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			_ = f.Close()
			must(rep.Ready())
			must(rep.DeviceLost("cuda0", "sticky CUDA fault (test)"))
			<-terms
			must(rep.Exiting("SIGTERM after device loss"))
			os.Exit(0)
		}
		serve()
	case "hung-once":
		f, err := os.OpenFile(os.Getenv("SUPERVISE_TEST_MARKER"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			_ = f.Close()
			signal.Ignore(syscall.SIGTERM)
			must(rep.Ready())
			must(rep.Hung("cuda0", "a kernel outlived its deadline (test)"))
			time.Sleep(time.Hour)
		}
		signal.Notify(terms, syscall.SIGTERM)
		serve()
	case "exit3":
		os.Exit(3)
	case "stderrwarn":
		fmt.Fprintln(os.Stderr, `time=2026-12-03T18:00:00Z level=INFO msg="loading module" module=m`)
		fmt.Fprintln(os.Stderr, `time=2026-12-03T18:00:01Z level=WARN msg="worker: a warning" worker=w`)
		for i := range 10 {
			fmt.Fprintf(os.Stderr, "time=2026-12-03T18:00:02Z level=INFO msg=\"http request\" n=%d\n", i)
		}
		os.Exit(1)
	case "stderr65":
		fmt.Fprintln(os.Stderr, "first line")
		fmt.Fprintln(os.Stderr, "stagehost serve: m.toml:3: not TOML")
		os.Exit(65)
	case "serving":
		signal.Notify(terms, syscall.SIGTERM)
		must(rep.ReadyServing(Serving{Devices: []string{"cuda0"}, Sessions: []string{"a", "b"}, Notes: []string{"a note"}, StateRevision: 7}))
		<-terms
		must(rep.Exiting("SIGTERM"))
		os.Exit(0)
	case "sigkill":
		must(rep.Ready())
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		must(rep.Ready())
		time.Sleep(time.Hour)
	case "never-ready":
		signal.Notify(terms, syscall.SIGTERM)
		<-terms
		os.Exit(0)
	case "descendant":
		// A child that inherits the report pipe reports after this process
		// exited, then holds the pipe open past ReportDrainTimeout.
		cmd := exec.Command("/bin/sh", "-c", `sleep 0.2; echo '{"event":"exiting","reason":"from a descendant"}' >&3; exec sleep 3`)
		cmd.ExtraFiles = []*os.File{os.NewFile(3, "report")}
		must(cmd.Start())
		os.Exit(0)
	case "garbage":
		signal.Notify(terms, syscall.SIGTERM)
		f := os.NewFile(3, "report")
		_, err := f.WriteString("not json\n" + `{"event":"bogus"}` + "\n")
		must(err)
		serve()
	default:
		fmt.Fprintln(os.Stderr, "test worker: unknown mode", mode)
		os.Exit(101)
	}
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "test worker:", err)
		os.Exit(102)
	}
}

func testWorker(t *testing.T, name, mode string, env ...string) Worker {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Under -race, a process that exits 0 sleeps atexit_sleep_ms (1 s by
	// default) first; the workers must exit at once.
	race := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	return Worker{Name: name, Path: exe, Args: []string{"-test.run=^$"},
		Env: append([]string{"SUPERVISE_TEST_WORKER=" + mode, "GORACE=" + race}, env...)}
}

// recorder keeps every status change, and wakes waiters at each.
type recorder struct {
	mu      sync.Mutex
	changes []WorkerStatus
	wake    chan struct{}
}

func newRecorder() *recorder { return &recorder{wake: make(chan struct{})} }

func (r *recorder) add(st WorkerStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, st)
	close(r.wake)
	r.wake = make(chan struct{})
}

// of returns the changes of one worker, in order.
func (r *recorder) of(name string) []WorkerStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []WorkerStatus
	for _, c := range r.changes {
		if c.Name == name {
			out = append(out, c)
		}
	}
	return out
}

// waitFor waits, at most d, for a change of worker name that satisfies
// ok, and returns it.
func (r *recorder) waitFor(t *testing.T, name string, d time.Duration, what string, ok func(WorkerStatus) bool) WorkerStatus {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	seen := 0
	for {
		r.mu.Lock()
		wake := r.wake
		changes := r.changes[seen:]
		seen = len(r.changes)
		r.mu.Unlock()
		for _, c := range changes {
			if c.Name == name && ok(c) {
				return c
			}
		}
		select {
		case <-wake:
		case <-deadline.C:
			t.Fatalf("worker %s: no change within %s where %s; its changes: %s", name, d, what, describe(r.of(name)))
		}
	}
}

func describe(sts []WorkerStatus) string {
	var b strings.Builder
	for _, st := range sts {
		fmt.Fprintf(&b, "\n  %s pid %d restarts %d reason %q", st.State, st.PID, st.Restarts, st.Reason)
		if st.LastExit != nil {
			fmt.Fprintf(&b, " last exit %+v", *st.LastExit)
		}
	}
	return b.String()
}

// harness starts a supervisor with a recorder and checks, at cleanup, that
// Stop leaves no child unreaped and no goroutine behind.
type harness struct {
	t   *testing.T
	s   *Supervisor
	rec *recorder
}

const waitLong = 30 * time.Second // a bound on waits, never reached when all is well

func start(t *testing.T, cfg Config) *harness {
	t.Helper()
	base := runtime.NumGoroutine()
	rec := newRecorder()
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := Start(cfg.WithOnChange(rec.add).WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, s: s, rec: rec}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
		h.checkReaped()
		// The goroutine that closes Stop's done channel ends just after;
		// wait for it, bounded.
		testutil.Poll(5*time.Second, func() bool { return runtime.NumGoroutine() <= base })
		if n := runtime.NumGoroutine(); n > base {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines after Stop, %d before Start:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		}
	})
	return h
}

// checkReaped checks that every process the supervisor started is reaped:
// wait4 says it is no child of ours any more (a zombie would be).
func (h *harness) checkReaped() {
	h.t.Helper()
	pids := map[int]bool{}
	h.rec.mu.Lock()
	defer h.rec.mu.Unlock()
	for _, c := range h.rec.changes {
		if c.PID != 0 {
			pids[c.PID] = true
		}
	}
	for _, st := range h.s.Status() {
		if st.State != StateStopped || st.PID != 0 {
			h.t.Errorf("worker %s after Stop: state %s pid %d", st.Name, st.State, st.PID)
		}
	}
	for pid := range pids {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if !errors.Is(err, syscall.ECHILD) {
			h.t.Errorf("process %d after Stop: wait4 = %d, %v; want ECHILD (reaped)", pid, got, err)
		}
	}
}

func (h *harness) status(name string) WorkerStatus {
	h.t.Helper()
	for _, st := range h.s.Status() {
		if st.Name == name {
			return st
		}
	}
	h.t.Fatalf("no worker %s", name)
	return WorkerStatus{}
}

func isReady(st WorkerStatus) bool { return st.State == StateReady }

// A worker that reports device_lost is stopped and started again, and
// reaches ready again, while another worker keeps its process.
func TestDeviceLostRestartsThatWorkerOnly(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "lost")
	h := start(t, NewConfig().WithBackoff(10*time.Millisecond, time.Second, 2).WithWorkers(
		testWorker(t, "cuda0", "lost-once", "SUPERVISE_TEST_MARKER="+marker),
		testWorker(t, "cuda1", "ready"),
	))
	other := h.rec.waitFor(t, "cuda1", waitLong, "ready", isReady)
	first := h.rec.waitFor(t, "cuda0", waitLong, "ready", isReady)
	again := h.rec.waitFor(t, "cuda0", waitLong, "ready after a restart", func(st WorkerStatus) bool {
		return isReady(st) && st.Restarts == 1
	})
	if again.PID == first.PID {
		t.Errorf("cuda0 restarted with the same pid %d", again.PID)
	}
	if again.DeviceLosses != 1 || again.LastDeviceLoss == nil || again.LastDeviceLoss.Device != "cuda0" ||
		again.LastDeviceLoss.PID != first.PID || !strings.Contains(again.LastDeviceLoss.Reason, "sticky") {
		t.Errorf("cuda0 device losses %d, last %+v; want 1, cuda0 by pid %d", again.DeviceLosses, again.LastDeviceLoss, first.PID)
	}
	e := again.LastExit
	if e == nil || e.PID != first.PID || e.Synthetic || e.Code != 0 || e.Killed ||
		!strings.HasPrefix(e.Cause, "device cuda0 lost") || e.Reason != "SIGTERM after device loss" {
		t.Errorf("cuda0 last exit %+v; want pid %d, code 0, reported, caused by the device loss", e, first.PID)
	}
	if again.Exits != 1 || again.SyntheticExits != 0 {
		t.Errorf("cuda0 exits %d, synthetic %d; want 1 reported exit", again.Exits, again.SyntheticExits)
	}
	// The restart went through restarting and backing_off.
	var states []State
	for _, c := range h.rec.of("cuda0") {
		if len(states) == 0 || states[len(states)-1] != c.State {
			states = append(states, c.State)
		}
	}
	if want := []State{StateStarting, StateReady, StateRestarting, StateBackingOff, StateStarting, StateReady}; fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("cuda0 went through %v; want %v", states, want)
	}
	// cuda1 kept its process all along.
	for _, c := range h.rec.of("cuda1") {
		if c.PID != other.PID || c.Restarts != 0 || (c.State != StateStarting && c.State != StateReady) {
			t.Errorf("cuda1 changed while cuda0 restarted: %s", describe([]WorkerStatus{c}))
		}
	}
	if st := h.status("cuda1"); st.PID != other.PID || st.State != StateReady || st.Restarts != 0 || st.Uptime <= 0 {
		t.Errorf("cuda1 now: %s uptime %s; want pid %d ready", describe([]WorkerStatus{st}), st.Uptime, other.PID)
	}
}

// A worker that reports hung is killed at once (SIGKILL: it ignores
// SIGTERM and the stop timeout is an hour), its hang counted, its exit
// reported (not synthetic), and it restarts.
func TestHungWorkerKilledAtOnce(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "hung")
	h := start(t, NewConfig().WithStopTimeout(time.Hour).WithBackoff(10*time.Millisecond, time.Second, 2).WithWorkers(
		testWorker(t, "cuda0", "hung-once", "SUPERVISE_TEST_MARKER="+marker),
	))
	first := h.rec.waitFor(t, "cuda0", waitLong, "ready", isReady)
	again := h.rec.waitFor(t, "cuda0", waitLong, "ready after a restart", func(st WorkerStatus) bool {
		return isReady(st) && st.Restarts == 1
	})
	if again.Hangs != 1 || again.LastHang == nil || again.LastHang.PID != first.PID || again.LastHang.Device != "cuda0" ||
		!strings.Contains(again.LastHang.Reason, "outlived its deadline") {
		t.Errorf("hangs %d, last %+v; want 1 by pid %d", again.Hangs, again.LastHang, first.PID)
	}
	e := again.LastExit
	if e == nil || e.PID != first.PID || e.Synthetic || !e.Killed || e.Signal != int(syscall.SIGKILL) ||
		!strings.HasPrefix(e.Cause, "hung on device cuda0: ") || !strings.HasPrefix(e.Reason, "hung on device cuda0: ") ||
		e.KilledAt.IsZero() || e.Time.Before(e.KilledAt) {
		t.Errorf("last exit %+v; want pid %d killed (SIGKILL) by the supervisor at once for its hang, reported", e, first.PID)
	} else {
		t.Logf("SIGKILL to reaped: %v", e.Time.Sub(e.KilledAt))
	}
	if again.Exits != 1 || again.SyntheticExits != 0 || again.DeviceLosses != 0 {
		t.Errorf("exits %d, synthetic %d, device losses %d; want 1, 0, 0", again.Exits, again.SyntheticExits, again.DeviceLosses)
	}
}

// A worker killed without reporting gets a synthetic exit with the signal.
func TestSyntheticExitOnSignal(t *testing.T) {
	h := start(t, NewConfig().WithBackoff(time.Minute, time.Minute, 2).WithWorkers(testWorker(t, "w", "sigkill")))
	st := h.rec.waitFor(t, "w", waitLong, "an exit", func(st WorkerStatus) bool { return st.LastExit != nil })
	e := st.LastExit
	if !e.Synthetic || e.Signal != int(syscall.SIGKILL) || e.SignalName != "SIGKILL" || e.Code != -1 ||
		e.Cause != "" || e.Killed || e.Reason != "died without reporting: signal: killed" {
		t.Errorf("exit %+v; want synthetic, SIGKILL, not caused nor killed by the supervisor", *e)
	}
	if st.State != StateBackingOff || st.Backoff != time.Minute || st.PID != 0 {
		t.Errorf("after the exit: %s backoff %s", describe([]WorkerStatus{st}), st.Backoff)
	}
	if st.Exits != 1 || st.SyntheticExits != 1 {
		t.Errorf("exits %d, synthetic %d; want 1, 1", st.Exits, st.SyntheticExits)
	}
}

// A worker that exits with a code without reporting gets a synthetic exit
// with the code.
func TestSyntheticExitCode(t *testing.T) {
	h := start(t, NewConfig().WithBackoff(time.Minute, time.Minute, 2).WithWorkers(testWorker(t, "w", "exit3")))
	e := h.rec.waitFor(t, "w", waitLong, "an exit", func(st WorkerStatus) bool { return st.LastExit != nil }).LastExit
	if !e.Synthetic || e.Code != 3 || e.Signal != 0 || e.Reason != "died without reporting: exit status 3" {
		t.Errorf("exit %+v; want synthetic, code 3", *e)
	}
}

// The backoff between crash-loop restarts grows: the recorded gaps between
// an exit and the next start, and the delays chosen.
func TestBackoffGrows(t *testing.T) {
	const initial = 50 * time.Millisecond
	h := start(t, NewConfig().WithBackoff(initial, time.Second, 2).WithWorkers(testWorker(t, "w", "exit3")))
	h.rec.waitFor(t, "w", waitLong, "4 restarts", func(st WorkerStatus) bool { return st.Restarts == 4 && st.State == StateStarting })
	var (
		gaps, delays []time.Duration
		exit         time.Time
	)
	for _, c := range h.rec.of("w") {
		switch c.State {
		case StateBackingOff:
			exit = c.LastExit.Time
			delays = append(delays, c.Backoff)
		case StateStarting:
			if !exit.IsZero() {
				gaps = append(gaps, c.Started.Sub(exit))
				exit = time.Time{}
			}
		}
	}
	if want := []time.Duration{initial, 2 * initial, 4 * initial, 8 * initial}; fmt.Sprint(delays) != fmt.Sprint(want) {
		t.Errorf("backoffs %v; want %v", delays, want)
	}
	if len(gaps) != 4 {
		t.Fatalf("%d gaps between an exit and the next start (%v); want 4", len(gaps), gaps)
	}
	for i, g := range gaps {
		if g < delays[i] {
			t.Errorf("restart %d came %s after the exit, before its backoff %s", i+1, g, delays[i])
		}
		if i > 0 && g <= gaps[i-1] {
			t.Errorf("gaps between exit and restart do not grow: %v", gaps)
		}
	}
	if st := h.status("w"); st.Restarts < 4 {
		t.Errorf("restarts %d; want at least 4", st.Restarts)
	}
	// Each exit counts once, as synthetic (exit 3 without a report).
	n := 0
	for _, c := range h.rec.of("w") {
		if c.State == StateBackingOff {
			n++
			if c.Exits != n || c.SyntheticExits != n {
				t.Errorf("at backoff %d: exits %d, synthetic %d; want %d", n, c.Exits, c.SyntheticExits, n)
			}
		}
	}
}

// A worker that stayed up the stable period restarts after the initial
// backoff again.
func TestBackoffResetsAfterStablePeriod(t *testing.T) {
	// never-ready workers are stopped by the ready timeout (200 ms), after
	// more than the stable period (100 ms): every restart waits the
	// initial delay, although the multiplier is 4.
	const initial = 20 * time.Millisecond
	h := start(t, NewConfig().WithBackoff(initial, time.Second, 4).WithStablePeriod(100*time.Millisecond).
		WithReadyTimeout(200*time.Millisecond).WithWorkers(testWorker(t, "w", "never-ready")))
	h.rec.waitFor(t, "w", waitLong, "3 restarts", func(st WorkerStatus) bool { return st.Restarts == 3 })
	backoffs := 0
	for _, c := range h.rec.of("w") {
		if c.State == StateBackingOff {
			backoffs++
			if c.Backoff != initial {
				t.Errorf("backoff %s after an uptime of %s; want %s", c.Backoff, c.LastExit.Uptime, initial)
			}
		}
	}
	if backoffs != 3 {
		t.Errorf("%d backoffs before the third restart; want 3", backoffs)
	}
}

// A worker that does not report ready within the ready timeout is
// restarted.
func TestReadyTimeoutRestarts(t *testing.T) {
	h := start(t, NewConfig().WithBackoff(10*time.Millisecond, time.Second, 2).
		WithReadyTimeout(200*time.Millisecond).WithWorkers(testWorker(t, "w", "never-ready")))
	st := h.rec.waitFor(t, "w", waitLong, "a restart", func(st WorkerStatus) bool { return st.Restarts == 1 })
	e := st.LastExit
	// Stopped with SIGTERM: the worker exits 0 from its handler, or,
	// when the signal came before a slow start installed the handler
	// (a loaded machine), dies of the signal; never a SIGKILL.
	stopped := e != nil && (e.Code == 0 || e.SignalName == "SIGTERM") && !e.Killed
	if e == nil || e.Cause != "not ready within 200ms" || !e.Synthetic || !stopped || e.Uptime < 200*time.Millisecond {
		t.Errorf("exit %+v; want one stopped by SIGTERM (code 0, or the signal before its handler), synthetic, caused by the ready timeout after 200ms", e)
	}
}

// Reports still in the pipe when the worker was reaped are read, until
// the pipe ends or ReportDrainTimeout; then the supervisor closes its end
// (a descendant held it), and no goroutine is left reading.
func TestReportsDrainedAfterExit(t *testing.T) {
	h := start(t, NewConfig().WithBackoff(time.Minute, time.Minute, 2).WithWorkers(testWorker(t, "w", "descendant")))
	st := h.rec.waitFor(t, "w", waitLong, "an exit", func(st WorkerStatus) bool { return st.LastExit != nil })
	if e := st.LastExit; e.Synthetic || e.Reason != "from a descendant" || e.Code != 0 {
		t.Errorf("exit %+v; want the report read after the exit", *e)
	}
	// Nothing reads the pipe any more, although the descendant still
	// holds it: Stop has no process and no reader to wait for.
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := h.s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 2*time.Second {
		t.Errorf("Stop took %s: something still waited on the pipe", took)
	}
}

// Lines that are not events are ignored.
func TestBadReportsIgnored(t *testing.T) {
	h := start(t, NewConfig().WithWorkers(testWorker(t, "w", "garbage")))
	h.rec.waitFor(t, "w", waitLong, "ready", isReady)
}

// Changes wakes a reader after changes, and a status is JSON the front
// can publish.
func TestChangesAndJSON(t *testing.T) {
	h := start(t, NewConfig().WithWorkers(testWorker(t, "cuda0", "ready")))
	h.rec.waitFor(t, "cuda0", waitLong, "ready", isReady)
	select {
	case <-h.s.Changes():
	case <-time.After(waitLong):
		t.Fatal("no wake-up on Changes after the worker started and became ready")
	}
	b, err := json.Marshal(h.s.Status())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"name":"cuda0"`, `"state":"ready"`, `"restarts":0`, `"pid":`, `"started":`, `"ready_at":`, `"device_losses":0`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("status JSON %s lacks %s", b, want)
		}
	}
	if strings.Contains(string(b), "last_exit") || strings.Contains(string(b), "next_start") {
		t.Errorf("status JSON %s shows an exit or a next start it does not have", b)
	}
}

// Stop sends SIGTERM, and SIGKILL after the stop timeout to a worker that
// ignores SIGTERM; a worker that heeds it exits cleanly.
func TestStopEscalatesToSIGKILL(t *testing.T) {
	const stopTimeout = 300 * time.Millisecond
	h := start(t, NewConfig().WithStopTimeout(stopTimeout).WithWorkers(
		testWorker(t, "stubborn", "ignore-term"), testWorker(t, "polite", "ready")))
	h.rec.waitFor(t, "stubborn", waitLong, "ready", isReady)
	h.rec.waitFor(t, "polite", waitLong, "ready", isReady)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	t0 := time.Now()
	if err := h.s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	s := h.status("stubborn").LastExit
	if s == nil || !s.Killed || s.Signal != int(syscall.SIGKILL) || !s.Synthetic || s.Cause != "the supervisor is stopping" {
		t.Fatalf("stubborn's exit %+v; want SIGKILL by the supervisor at Stop", s)
	}
	if d := s.Time.Sub(t0); d < stopTimeout {
		t.Errorf("stubborn killed %s after Stop; want after the stop timeout %s", d, stopTimeout)
	}
	if took > stopTimeout+5*time.Second {
		t.Errorf("Stop took %s with a stop timeout of %s", took, stopTimeout)
	}
	p := h.status("polite").LastExit
	if p == nil || p.Killed || p.Synthetic || p.Code != 0 || p.Reason != "SIGTERM" {
		t.Errorf("polite's exit %+v; want a reported exit 0 after SIGTERM", p)
	}
}

// When Stop's context ends before the stop timeout, stragglers get SIGKILL
// at once.
func TestStopContextKillsAtOnce(t *testing.T) {
	h := start(t, NewConfig().WithStopTimeout(time.Hour).WithWorkers(testWorker(t, "stubborn", "ignore-term")))
	h.rec.waitFor(t, "stubborn", waitLong, "ready", isReady)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := h.s.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v; want the context's deadline", err)
	}
	if e := h.status("stubborn").LastExit; e == nil || !e.Killed || e.Signal != int(syscall.SIGKILL) {
		t.Errorf("exit %+v; want SIGKILL", e)
	}
}

// Stop during a backoff starts nothing again.
func TestStopDuringBackoff(t *testing.T) {
	h := start(t, NewConfig().WithBackoff(time.Hour, time.Hour, 2).WithWorkers(testWorker(t, "w", "exit3")))
	h.rec.waitFor(t, "w", waitLong, "backing off", func(st WorkerStatus) bool { return st.State == StateBackingOff })
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := h.s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if st := h.status("w"); st.State != StateStopped || st.Restarts != 0 || st.LastExit == nil || st.LastExit.Code != 3 {
		t.Errorf("after Stop: %s", describe([]WorkerStatus{st}))
	}
}

// A restart whose process cannot start is recorded, counted and backed off
// like an exit.
func TestRestartThatCannotStart(t *testing.T) {
	w := testWorker(t, "w", "exit3")
	exe, err := os.ReadFile(w.Path)
	if err != nil {
		t.Fatal(err)
	}
	w.Path = filepath.Join(t.TempDir(), "worker")
	if err := os.WriteFile(w.Path, exe, 0o700); err != nil {
		t.Fatal(err)
	}
	// The executable goes away while the worker backs off (1 s, a margin,
	// not a synchronisation: the removal follows the change at once).
	h := start(t, NewConfig().WithBackoff(time.Second, time.Minute, 2).WithWorkers(w))
	h.rec.waitFor(t, "w", waitLong, "backing off", func(st WorkerStatus) bool { return st.State == StateBackingOff })
	if err := os.Remove(w.Path); err != nil {
		t.Fatal(err)
	}
	st := h.rec.waitFor(t, "w", waitLong, "a failed restart", func(st WorkerStatus) bool {
		return st.LastExit != nil && st.LastExit.StartFailed
	})
	if st.Restarts != 1 || st.PID != 0 || !strings.Contains(st.LastExit.Reason, "could not start") {
		t.Errorf("after the failed restart: %s", describe([]WorkerStatus{st}))
	}
	st = h.rec.waitFor(t, "w", waitLong, "backing off again", func(st WorkerStatus) bool {
		return st.State == StateBackingOff && st.LastExit.StartFailed
	})
	if st.Backoff != 2*time.Second {
		t.Errorf("backoff after the failed restart %s; want 2s", st.Backoff)
	}
}

func TestConfigRejected(t *testing.T) {
	w := Worker{Name: "a", Path: "/bin/true"}
	for name, cfg := range map[string]Config{
		"no workers":     NewConfig(),
		"no name":        NewConfig().WithWorkers(Worker{Path: "/bin/true"}),
		"no path":        NewConfig().WithWorkers(Worker{Name: "a"}),
		"duplicate":      NewConfig().WithWorkers(w, w),
		"initial 0":      NewConfig().WithWorkers(w).WithBackoff(0, time.Second, 2),
		"max < initial":  NewConfig().WithWorkers(w).WithBackoff(time.Second, time.Millisecond, 2),
		"multiplier < 1": NewConfig().WithWorkers(w).WithBackoff(time.Millisecond, time.Second, 0.5),
		"stop timeout 0": NewConfig().WithWorkers(w).WithStopTimeout(0),
		"stable 0":       NewConfig().WithWorkers(w).WithStablePeriod(0),
		"ready < 0":      NewConfig().WithWorkers(w).WithReadyTimeout(-1),
	} {
		if s, err := Start(cfg); err == nil {
			_ = s.Stop(context.Background())
			t.Errorf("%s: Start accepted it", name)
		}
	}
}

// A worker whose first process cannot start fails Start, and the workers
// already started are stopped.
func TestStartFailsOnBadPath(t *testing.T) {
	rec := newRecorder()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))
	_, err := Start(NewConfig().WithOnChange(rec.add).WithLogger(logger).WithWorkers(testWorker(t, "good", "ready"),
		Worker{Name: "bad", Path: filepath.Join(t.TempDir(), "missing")}))
	if err == nil || !strings.Contains(err.Error(), "worker bad") {
		t.Fatalf("Start = %v; want worker bad's error", err)
	}
	var pid int
	for _, c := range rec.of("good") {
		pid = max(pid, c.PID)
	}
	if last := rec.of("good"); len(last) == 0 || last[len(last)-1].State != StateStopped {
		t.Errorf("good after the failed Start: %s", describe(last))
	}
	if _, err := syscall.Wait4(pid, nil, syscall.WNOHANG, nil); !errors.Is(err, syscall.ECHILD) {
		t.Errorf("good's process %d not reaped: %v", pid, err)
	}
}

// The reporter writes one JSON line per event, and does nothing outside a
// supervisor.
func TestReporter(t *testing.T) {
	t.Setenv(EnvReportFD, "")
	os.Unsetenv(EnvReportFD)
	if r := newReporterFromEnv(); r.Supervised() || r.Ready() != nil {
		t.Errorf("without %s: supervised %v", EnvReportFD, r.Supervised())
	}
	var nilRep *Reporter
	if nilRep.Ready() != nil || nilRep.Supervised() {
		t.Error("a nil reporter does something")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fd, err := syscall.Dup(int(w.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	t.Setenv(EnvReportFD, fmt.Sprint(fd))
	rep := newReporterFromEnv()
	if _, still := os.LookupEnv(EnvReportFD); still || !rep.Supervised() {
		t.Errorf("reporter: supervised %v, %s still set %v", rep.Supervised(), EnvReportFD, still)
	}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(rep.Ready())
	must(rep.DeviceLost("cuda1", "illegal address"))
	must(rep.Exiting("bye"))
	_ = rep.f.Close()
	buf := make([]byte, 4096)
	n, _ := r.Read(buf)
	want := `{"event":"ready"}` + "\n" + `{"event":"device_lost","device":"cuda1","reason":"illegal address"}` + "\n" + `{"event":"exiting","reason":"bye"}` + "\n"
	if got := string(buf[:n]); got != want {
		t.Errorf("reports %q; want %q", got, want)
	}
	t.Setenv(EnvReportFD, "x")
	if err := newReporterFromEnv().Ready(); err == nil {
		t.Error("a bad descriptor reports without error")
	}
}

// A worker that dies without reporting has the end of its stderr in its
// exit record, and its last line in the reason.
func TestSyntheticExitStderr(t *testing.T) {
	h := start(t, NewConfig().WithBackoff(time.Minute, time.Minute, 2).WithWorkers(testWorker(t, "w", "stderr65")))
	st := h.rec.waitFor(t, "w", waitLong, "an exit", func(st WorkerStatus) bool { return st.LastExit != nil })
	e := st.LastExit
	if !e.Synthetic || e.Code != 65 || e.Reason != "died without reporting: exit status 65: stagehost serve: m.toml:3: not TOML" ||
		fmt.Sprint(e.Stderr) != "[first line stagehost serve: m.toml:3: not TOML]" {
		t.Errorf("exit %+v; want code 65 with the last stderr line in the reason", *e)
	}
	if st.State != StateBackingOff || !strings.Contains(st.Reason, "m.toml:3: not TOML") {
		t.Errorf("state %s reason %q; want backing off with the stderr line", st.State, st.Reason)
	}
}

// A worker that dies without reporting, whose stderr ends with INFO log
// lines, has its last WARN line in the reason, even past the lines kept
// in Stderr.
func TestSyntheticExitPrefersWarning(t *testing.T) {
	h := start(t, NewConfig().WithBackoff(time.Minute, time.Minute, 2).WithWorkers(testWorker(t, "w", "stderrwarn")))
	st := h.rec.waitFor(t, "w", waitLong, "an exit", func(st WorkerStatus) bool { return st.LastExit != nil })
	e := st.LastExit
	if !e.Synthetic || e.Reason != `died without reporting: exit status 1: time=2026-12-03T18:00:01Z level=WARN msg="worker: a warning" worker=w` ||
		len(e.Stderr) != StderrTailLines || !strings.Contains(e.Stderr[StderrTailLines-1], "n=9") {
		t.Errorf("exit %+v; want the WARN line in the reason, the last lines in stderr", *e)
	}
}

// reasonLine: the last line that is not an INFO or DEBUG log line (text
// or JSON), else the last line.
func TestReasonLine(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"a\nb\n", "b"},
		{"level=ERROR msg=x\ntime=t level=INFO msg=y\n", "level=ERROR msg=x"},
		{"time=t level=WARN msg=x\ntime=t level=DEBUG-4 msg=y\n", "time=t level=WARN msg=x"},
		{`{"time":"t","level":"ERROR","msg":"x"}` + "\n" + `{"time":"t","level":"INFO","msg":"y"}` + "\n", `{"time":"t","level":"ERROR","msg":"x"}`},
		{"time=t level=WARN msg=x\nstagehost serve: m.toml:3: not TOML\ntime=t level=INFO msg=y\n", "stagehost serve: m.toml:3: not TOML"},
		{"time=t level=INFO msg=x\ntime=t level=INFO msg=y\n", "time=t level=INFO msg=y"},
	} {
		tw := &tailWriter{w: io.Discard}
		_, _ = tw.Write([]byte(c.in))
		if got := tw.reasonLine(); got != c.want {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
}

// A ready report with what the worker serves is the worker's status.
func TestReadyServing(t *testing.T) {
	h := start(t, NewConfig().WithWorkers(testWorker(t, "w", "serving")))
	st := h.rec.waitFor(t, "w", waitLong, "ready", func(st WorkerStatus) bool { return st.State == StateReady })
	if !st.Reported || fmt.Sprint(st.Devices, st.Sessions, st.Notes, st.StateRevision) != "[cuda0] [a b] [a note] 7" {
		t.Errorf("ready status %+v; want its devices, sessions and notes", st)
	}
}
