package supervise

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// State is a worker's state.
type State string

// The states of a worker.
const (
	// StateStarting: its process runs and has not reported ready yet.
	StateStarting State = "starting"
	// StateReady: its process reported ready.
	StateReady State = "ready"
	// StateRestarting: the supervisor is stopping its process to restart
	// it (a device was lost, or it was not ready in time): SIGTERM was
	// sent, SIGKILL follows after the stop timeout.
	StateRestarting State = "restarting"
	// StateBackingOff: its process exited; the next starts at NextStart.
	StateBackingOff State = "backing_off"
	// StateStopping: [Supervisor.Stop] is stopping its process.
	StateStopping State = "stopping"
	// StateStopped: it has no process and will not get one again.
	StateStopped State = "stopped"
)

// Exit records how a worker's process ended.
type Exit struct {
	PID int `json:"pid,omitempty"`
	// Code is the exit code, -1 when a signal ended the process or it
	// never started.
	Code int `json:"code"`
	// Signal is the signal that ended the process, 0 if none, and
	// SignalName its name ("SIGKILL").
	Signal     int    `json:"signal,omitempty"`
	SignalName string `json:"signal_name,omitempty"`
	// Synthetic is true when the worker did not report [EventExiting]
	// before it died (it crashed, was killed, or exited without a word):
	// the supervisor made this record from the wait status, as containerd
	// does for a shim that died.
	Synthetic bool `json:"synthetic"`
	// Reason is the worker's own, from [EventExiting], or for a synthetic
	// exit the wait status ("died without reporting: signal: killed"),
	// followed by the line of the end of its stderr (its last
	// [StderrTailBytes] bytes) that best says why, if it wrote any: the
	// last line that is not a log line at level INFO or DEBUG (a WARN or
	// ERROR log line, or one that is no log line: "died without
	// reporting: exit status 65: stagehost serve: ..."), else its last
	// line.
	Reason string `json:"reason"`
	// Stderr is the end of what the process wrote to its stderr: its last
	// lines (at most [StderrTailLines] lines of [StderrTailBytes] bytes),
	// oldest first; nil if it wrote nothing.
	Stderr []string `json:"stderr,omitempty"`
	// Cause is why the supervisor stopped the worker, if it did ("device
	// cuda0 lost: ...", "not ready within 1m0s", "the supervisor is
	// stopping"); empty when the worker ended by itself.
	Cause string `json:"cause,omitempty"`
	// Killed says the supervisor sent SIGKILL (after the stop timeout,
	// when Stop's context ended, or at once for a hung worker:
	// [EventHung]), and KilledAt when: Time minus KilledAt is how long the
	// kernel took to reap the process.
	Killed   bool      `json:"killed,omitempty"`
	KilledAt time.Time `json:"killed_at,omitzero"`
	// StartFailed says the process could not be started at all (Reason
	// holds the error).
	StartFailed bool          `json:"start_failed,omitempty"`
	Time        time.Time     `json:"time"`
	Uptime      time.Duration `json:"uptime_ns"`
}

// DeviceLoss is a worker's report of a lost device.
type DeviceLoss struct {
	PID    int       `json:"pid"`
	Device string    `json:"device"`
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
}

// Hang is a worker's report that device work of its cannot be stopped
// ([EventHung]).
type Hang struct {
	PID    int       `json:"pid"`
	Device string    `json:"device"`
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
}

// WorkerStatus is a snapshot of one worker.
type WorkerStatus struct {
	Name string `json:"name"`
	// Tenant is [Worker.Tenant]: "" for a device's shared worker.
	Tenant string `json:"tenant,omitempty"`
	PID    int    `json:"pid,omitempty"` // 0 while it has no process
	State  State  `json:"state"`
	// Reason says why it is restarting, stopping or backing off.
	Reason string `json:"reason,omitempty"`
	// Restarts counts the restart attempts (every start after the first,
	// including those that failed to start a process).
	Restarts int `json:"restarts"`
	// Started is when its current process started, ReadyAt when that
	// process reported ready (zero until it does), Uptime how long it has
	// run at the snapshot.
	Started time.Time     `json:"started,omitzero"`
	ReadyAt time.Time     `json:"ready_at,omitzero"`
	Uptime  time.Duration `json:"uptime_ns,omitempty"`
	// Backoff is the delay before the next start and NextStart when it
	// comes, while backing off.
	Backoff   time.Duration `json:"backoff_ns,omitempty"`
	NextStart time.Time     `json:"next_start,omitzero"`
	// LastExit is how its last process ended; nil before any did.
	LastExit *Exit `json:"last_exit,omitempty"`
	// DeviceLosses counts its device_lost reports; LastDeviceLoss is the
	// latest.
	DeviceLosses   int         `json:"device_losses"`
	LastDeviceLoss *DeviceLoss `json:"last_device_loss,omitempty"`
	// Hangs counts its hung reports ([EventHung]), each of which ended a
	// process of it with SIGKILL; LastHang is the latest.
	Hangs    int   `json:"hangs"`
	LastHang *Hang `json:"last_hang,omitempty"`
	// Exits counts its processes' exits (a start that failed counts as
	// one), SyntheticExits those of them that were synthetic
	// ([Exit.Synthetic]).
	Exits          int `json:"exits"`
	SyntheticExits int `json:"synthetic_exits"`
	// Reported is true once a process of the worker reported ready with
	// what it serves ([Reporter.ReadyServing]); Devices and Sessions are
	// then those of its latest such report (kept while it restarts), and
	// Notes that report's notes.
	Reported bool     `json:"reported"`
	Devices  []string `json:"devices,omitempty"`
	Sessions []string `json:"sessions,omitempty"`
	Notes    []string `json:"notes,omitempty"`
	// StateRevision is the model state's revision its latest ready report
	// says it restored ([Serving.StateRevision]).
	StateRevision uint64 `json:"state_revision,omitempty"`
}

// Supervisor runs worker processes and restarts them. It is safe for
// concurrent use.
type Supervisor struct {
	cfg     Config
	log     *slog.Logger
	mu      sync.Mutex
	workers []*worker
	changes chan struct{}

	stopping chan struct{} // closed by Stop
	killNow  chan struct{} // closed when Stop's context ended
	stopOnce sync.Once
	killOnce sync.Once
	wg       sync.WaitGroup // every goroutine of the supervisor
	done     chan struct{}  // closed when wg is done, after Stop
}

type worker struct {
	spec Worker
	st   WorkerStatus // guarded by Supervisor.mu
}

// proc is one process of a worker.
type proc struct {
	cmd     *exec.Cmd
	pid     int
	started time.Time
	r       *os.File      // the supervisor's end of the report pipe
	events  chan Event    // reports, closed at the pipe's end
	quit    chan struct{} // closed to stop the reader
	exited  chan struct{} // closed once cmd.Wait returned
	waitErr error         // cmd.Wait's, read after exited
	stderr  *tailWriter   // the end of its stderr
}

// Start validates cfg, starts every worker and supervises them until
// [Supervisor.Stop]. If a worker's first process cannot be started, the
// ones already started are stopped and Start returns the error.
func Start(cfg Config) (*Supervisor, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Supervisor{
		cfg: cfg, log: cfg.logger, changes: make(chan struct{}, 1),
		stopping: make(chan struct{}), killNow: make(chan struct{}), done: make(chan struct{}),
	}
	for _, spec := range cfg.workers {
		s.workers = append(s.workers, &worker{spec: spec, st: WorkerStatus{Name: spec.Name, Tenant: spec.Tenant, State: StateStarting}})
	}
	for _, w := range s.workers {
		p, err := s.spawn(w, false)
		if err != nil {
			_ = s.Stop(context.Background())
			return nil, fmt.Errorf("supervise: worker %s: %w", w.spec.Name, err)
		}
		s.wg.Add(1)
		go s.run(w, p)
	}
	return s, nil
}

func (c Config) validate() error {
	if !supported {
		return errors.New("supervise: workers need a Unix system")
	}
	if len(c.workers) == 0 {
		return errors.New("supervise: no workers")
	}
	seen := map[string]bool{}
	for i, w := range c.workers {
		switch {
		case w.Name == "":
			return fmt.Errorf("supervise: worker %d has no name", i)
		case seen[w.Name]:
			return fmt.Errorf("supervise: two workers are named %s", w.Name)
		case w.Path == "":
			return fmt.Errorf("supervise: worker %s has no path", w.Name)
		}
		seen[w.Name] = true
	}
	switch {
	case c.initial <= 0:
		return fmt.Errorf("supervise: initial backoff %s is not positive", c.initial)
	case c.max < c.initial:
		return fmt.Errorf("supervise: maximum backoff %s is below the initial %s", c.max, c.initial)
	case c.multiplier < 1:
		return fmt.Errorf("supervise: backoff multiplier %g is below 1", c.multiplier)
	case c.stable <= 0:
		return fmt.Errorf("supervise: stable period %s is not positive", c.stable)
	case c.stopTimeout <= 0:
		return fmt.Errorf("supervise: stop timeout %s is not positive", c.stopTimeout)
	case c.readyTimeout < 0:
		return fmt.Errorf("supervise: ready timeout %s is negative", c.readyTimeout)
	}
	return nil
}

// Status returns a snapshot of every worker, in the configuration's order.
func (s *Supervisor) Status() []WorkerStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	out := make([]WorkerStatus, len(s.workers))
	for i, w := range s.workers {
		out[i] = w.snapshot(now)
	}
	return out
}

// Changes returns a channel that receives a value after any worker's
// status changed. It holds one value at most: a reader that falls behind
// sees one wake-up for many changes, then reads [Supervisor.Status].
func (s *Supervisor) Changes() <-chan struct{} { return s.changes }

// Stop stops supervising: every worker gets SIGTERM, and SIGKILL if it has
// not exited within the stop timeout, or at once when ctx ends first;
// Stop returns once every process is reaped and every goroutine of the
// supervisor has finished, with ctx's error if it ended first. Workers
// waiting out a backoff are not started again. Stop may be called more
// than once, and concurrently.
func (s *Supervisor) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		close(s.stopping)
		go func() { s.wg.Wait(); close(s.done) }()
	})
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		s.killOnce.Do(func() { close(s.killNow) })
		<-s.done
		return ctx.Err()
	}
}

func (w *worker) snapshot(now time.Time) WorkerStatus {
	st := w.st
	if st.PID != 0 {
		st.Uptime = now.Sub(st.Started)
	}
	if st.LastExit != nil {
		e := *st.LastExit
		st.LastExit = &e
	}
	if st.LastDeviceLoss != nil {
		l := *st.LastDeviceLoss
		st.LastDeviceLoss = &l
	}
	st.Devices, st.Sessions, st.Notes = clone(st.Devices), clone(st.Sessions), clone(st.Notes)
	return st
}

func clone(s []string) []string {
	if s == nil {
		return nil
	}
	return append([]string{}, s...)
}

// update changes w's status under the lock, then tells the watchers.
func (s *Supervisor) update(w *worker, fn func(*WorkerStatus)) {
	s.mu.Lock()
	fn(&w.st)
	snap := w.snapshot(time.Now())
	s.mu.Unlock()
	select {
	case s.changes <- struct{}{}:
	default:
	}
	if s.cfg.onChange != nil {
		s.cfg.onChange(snap)
	}
}

func (s *Supervisor) isStopping() bool {
	select {
	case <-s.stopping:
		return true
	default:
		return false
	}
}

// spawn starts a process for w, with the write end of a report pipe as its
// descriptor 3.
func (s *Supervisor) spawn(w *worker, restart bool) (*proc, error) {
	r, wr, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(w.spec.Path, w.spec.Args...)
	cmd.Env = append(append(os.Environ(), w.spec.Env...),
		EnvReportFD+"="+strconv.Itoa(3), EnvWorkerName+"="+w.spec.Name)
	cmd.ExtraFiles = []*os.File{wr}
	tail := &tailWriter{w: w.spec.stderr()}
	cmd.Stdout, cmd.Stderr = w.spec.stdout(), tail
	cmd.SysProcAttr = sysProcAttr()
	// Output copied through a pipe (a Stdout that is not a file) is read
	// until every holder closes it; a descendant could hold it forever.
	cmd.WaitDelay = ReportDrainTimeout
	err = cmd.Start()
	_ = wr.Close() // the child has its copy
	if err != nil {
		_ = r.Close()
		return nil, err
	}
	p := &proc{
		cmd: cmd, pid: cmd.Process.Pid, started: time.Now(), r: r, stderr: tail,
		events: make(chan Event), quit: make(chan struct{}), exited: make(chan struct{}),
	}
	s.wg.Add(2)
	go s.read(w, p)
	go func() {
		defer s.wg.Done()
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	s.update(w, func(st *WorkerStatus) {
		st.PID, st.State, st.Reason, st.Started, st.ReadyAt = p.pid, StateStarting, "", p.started, time.Time{}
		st.Backoff, st.NextStart = 0, time.Time{}
		if restart {
			st.Restarts++
		}
	})
	s.log.Info("worker started", "worker", w.spec.Name, "pid", p.pid, "restart", restart)
	return p, nil
}

// read passes the worker's reports to p.events until the pipe ends or
// p.quit is closed.
func (s *Supervisor) read(w *worker, p *proc) {
	defer s.wg.Done()
	defer close(p.events)
	defer p.r.Close()
	sc := bufio.NewScanner(p.r)
	sc.Buffer(make([]byte, 0, 4096), maxReportLine)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Event == "" {
			s.log.Warn("worker report is not an event; ignored", "worker", w.spec.Name, "pid", p.pid, "line", truncate(sc.Text(), 200))
			continue
		}
		select {
		case p.events <- e:
		case <-p.quit:
			return
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, os.ErrClosed) {
		// A line too long: stop reading reports but keep the pipe drained,
		// so the worker never blocks writing to it.
		s.log.Warn("worker reports unreadable; ignoring the rest", "worker", w.spec.Name, "pid", p.pid, "err", err)
		_, _ = io.Copy(io.Discard, p.r)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// run supervises w from its first process p until Stop.
func (s *Supervisor) run(w *worker, p *proc) {
	defer s.wg.Done()
	name := w.spec.Name
	delay := s.cfg.initial
	for {
		exit := s.watch(w, p)
		s.log.Log(context.Background(), exitLevel(exit), "worker exited", "worker", name, "pid", exit.PID,
			"code", exit.Code, "signal", exit.SignalName, "synthetic", exit.Synthetic, "reason", exit.Reason,
			"cause", exit.Cause, "uptime", exit.Uptime, "stderr", strings.Join(exit.Stderr, "\n"))
		if exit.Uptime >= s.cfg.stable {
			delay = s.cfg.initial
		}
		failed := false // the last restart could not start a process
		fresh := true   // exit is not counted yet
		count := func(st *WorkerStatus) {
			if fresh {
				st.Exits++
				if exit.Synthetic {
					st.SyntheticExits++
				}
				fresh = false
			}
		}
		for {
			bump := failed
			failed = false
			if s.isStopping() {
				s.update(w, func(st *WorkerStatus) {
					if bump {
						st.Restarts++
					}
					count(st)
					st.PID, st.State, st.Reason, st.Started, st.ReadyAt = 0, StateStopped, "the supervisor stopped", time.Time{}, time.Time{}
					st.Backoff, st.NextStart, st.LastExit = 0, time.Time{}, &exit
				})
				return
			}
			wait := delay
			delay = min(time.Duration(float64(delay)*s.cfg.multiplier), s.cfg.max)
			next := time.Now().Add(wait)
			s.update(w, func(st *WorkerStatus) {
				if bump {
					st.Restarts++
				}
				count(st)
				st.PID, st.State, st.Started, st.ReadyAt = 0, StateBackingOff, time.Time{}, time.Time{}
				st.Reason = exit.Reason
				if exit.Cause != "" {
					st.Reason = exit.Cause
				}
				st.Backoff, st.NextStart, st.LastExit = wait, next, &exit
			})
			s.log.Info("worker restarts after backoff", "worker", name, "backoff", wait)
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-s.stopping:
				t.Stop()
				continue // to the stopped state above
			}
			if s.isStopping() {
				continue
			}
			np, err := s.spawn(w, true)
			if err == nil {
				p = np
				break
			}
			s.log.Error("worker could not be started", "worker", name, "err", err)
			// Recorded with the next backoff (or the stop), in one change.
			exit = Exit{Code: -1, Reason: "could not start: " + err.Error(), StartFailed: true, Synthetic: true, Time: time.Now()}
			failed, fresh = true, true
		}
	}
}

func exitLevel(e Exit) slog.Level {
	if e.Synthetic || e.Code != 0 {
		return slog.LevelWarn
	}
	return slog.LevelInfo
}

// watch follows p until it is reaped and its reports are read, acting on
// its reports, the ready timeout and Stop, and returns how it ended.
func (s *Supervisor) watch(w *worker, p *proc) Exit {
	name := w.spec.Name
	var readyC <-chan time.Time
	if s.cfg.readyTimeout > 0 {
		t := time.NewTimer(s.cfg.readyTimeout)
		defer t.Stop()
		readyC = t.C
	}
	var (
		killTimer *time.Timer
		killC     <-chan time.Time
		cause     string // why the supervisor stopped it
		killed    bool
		killedAt  time.Time
		reported  bool // it reported exiting (or hung)
		hung      bool // it reported hung: that report's reason is the exit's
		reason    string
		stopping  = s.stopping
		killNow   = s.killNow
		events    = (<-chan Event)(p.events)
	)
	defer func() {
		if killTimer != nil {
			killTimer.Stop()
		}
	}()
	kill := func(why string) {
		if killed {
			return
		}
		killed, killedAt = true, time.Now()
		s.log.Warn("worker killed", "worker", name, "pid", p.pid, "why", why)
		_ = p.cmd.Process.Kill()
	}
	// stop sends SIGTERM once, arms the SIGKILL, and sets the state.
	stop := func(why string, state State) {
		s.update(w, func(st *WorkerStatus) {
			if st.State != StateStopping {
				st.State, st.Reason = state, why
			}
		})
		if cause != "" {
			return
		}
		cause = why
		s.log.Info("worker stopping", "worker", name, "pid", p.pid, "why", why)
		if err := terminate(p.cmd.Process); err != nil && !errors.Is(err, os.ErrProcessDone) {
			kill("SIGTERM failed: " + err.Error())
			return
		}
		killTimer = time.NewTimer(s.cfg.stopTimeout)
		killC = killTimer.C
	}
	handle := func(e Event, alive bool) {
		switch e.Event {
		case EventReady:
			readyC = nil
			s.log.Info("worker ready", "worker", name, "pid", p.pid)
			s.update(w, func(st *WorkerStatus) {
				if st.State == StateStarting {
					st.State, st.ReadyAt = StateReady, time.Now()
				}
				if e.Serving {
					st.Reported = true
					st.Devices, st.Sessions, st.Notes = clone(e.Devices), clone(e.Sessions), clone(e.Notes)
					st.StateRevision = e.StateRevision
				}
			})
		case EventDeviceLost:
			s.log.Warn("worker lost a device", "worker", name, "pid", p.pid, "device", e.Device, "reason", e.Reason)
			loss := DeviceLoss{PID: p.pid, Device: e.Device, Reason: e.Reason, Time: time.Now()}
			s.update(w, func(st *WorkerStatus) { st.DeviceLosses++; st.LastDeviceLoss = &loss })
			if alive {
				stop(fmt.Sprintf("device %s lost: %s", e.Device, e.Reason), StateRestarting)
			}
		case EventHung:
			s.log.Error("worker hung; killing it", "worker", name, "pid", p.pid, "device", e.Device, "reason", e.Reason)
			h := Hang{PID: p.pid, Device: e.Device, Reason: e.Reason, Time: time.Now()}
			why := fmt.Sprintf("hung on device %s: %s", e.Device, e.Reason)
			s.update(w, func(st *WorkerStatus) {
				st.Hangs++
				st.LastHang = &h
				if st.State != StateStopping {
					st.State, st.Reason = StateRestarting, why
				}
			})
			reported, reason, hung = true, why, true
			if cause == "" {
				cause = why
			}
			if alive {
				kill(why)
			}
		case EventExiting:
			if hung {
				break
			}
			reported, reason = true, e.Reason
			s.log.Info("worker exiting", "worker", name, "pid", p.pid, "reason", e.Reason)
		default:
			s.log.Warn("worker reported an unknown event; ignored", "worker", name, "pid", p.pid, "event", e.Event)
		}
	}
	for {
		select {
		case e, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			handle(e, true)
		case <-readyC:
			readyC = nil
			stop(fmt.Sprintf("not ready within %s", s.cfg.readyTimeout), StateRestarting)
		case <-stopping:
			stopping = nil
			stop("the supervisor is stopping", StateStopping)
		case <-killC:
			killC = nil
			kill(fmt.Sprintf("not exited %s after SIGTERM", s.cfg.stopTimeout))
		case <-killNow:
			killNow = nil
			stop("the supervisor is stopping", StateStopping)
			kill("the supervisor's stop deadline passed")
		case <-p.exited:
			if events != nil {
				t := time.NewTimer(ReportDrainTimeout)
			drain:
				for {
					select {
					case e, ok := <-events:
						if !ok {
							break drain
						}
						handle(e, false)
					case <-t.C:
						s.log.Warn("worker's report pipe still open after it exited (a descendant holds it); closed", "worker", name, "pid", p.pid)
						break drain
					}
				}
				t.Stop()
			}
			close(p.quit)
			_ = p.r.Close()
			e := p.exit(reported, reason, cause, killed)
			e.KilledAt = killedAt
			return e
		}
	}
}

// exit makes the record of p's end from its wait status.
func (p *proc) exit(reported bool, reason, cause string, killed bool) Exit {
	now := time.Now()
	e := Exit{PID: p.pid, Code: -1, Synthetic: !reported, Cause: cause, Killed: killed, Time: now, Uptime: now.Sub(p.started)}
	status := "unknown wait status"
	if ps := p.cmd.ProcessState; ps != nil {
		e.Code = ps.ExitCode()
		if sig := exitSignal(ps); sig != 0 {
			e.Signal, e.SignalName = int(sig), signalName(sig)
		}
		status = ps.String()
	} else if p.waitErr != nil {
		status = p.waitErr.Error()
	}
	if p.stderr != nil {
		e.Stderr = p.stderr.lines()
	}
	switch {
	case reported && reason != "":
		e.Reason = reason
	case reported:
		e.Reason = "exiting (" + status + ")"
	default:
		e.Reason = "died without reporting: " + status
		if p.stderr != nil {
			if l := p.stderr.reasonLine(); l != "" {
				e.Reason += ": " + l
			}
		}
	}
	return e
}
