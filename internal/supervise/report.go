package supervise

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
)

// The environment the supervisor gives each worker.
const (
	// EnvReportFD names the file descriptor of the worker's end of its
	// report pipe (always 3: the first of exec.Cmd.ExtraFiles).
	EnvReportFD = "STAGEHOST_SUPERVISE_FD"
	// EnvWorkerName is the worker's [Worker.Name].
	EnvWorkerName = "STAGEHOST_SUPERVISE_WORKER"
)

// The events a worker reports, one JSON object a line:
//
//	{"event":"ready"}
//	{"event":"device_lost","device":"cuda0","reason":"sticky CUDA fault: illegal address"}
//	{"event":"hung","device":"cuda0","reason":"session a: a call's device work outlived its deadline by 100ms"}
//	{"event":"exiting","reason":"SIGTERM"}
const (
	// EventReady: the worker serves. The supervisor moves it from starting
	// to ready.
	EventReady = "ready"
	// EventDeviceLost: one of the worker's devices is lost for the rest of
	// the process (a sticky CUDA fault). The supervisor records the loss
	// and restarts the worker: SIGTERM, [Config.WithStopTimeout], SIGKILL,
	// then a new process after the backoff.
	EventDeviceLost = "device_lost"
	// EventHung: device work of the worker's cannot be proven finished
	// and cannot be stopped from inside its process (a kernel still
	// running past its call's deadline and grace). The supervisor records
	// it and sends SIGKILL at once, with no SIGTERM and no stop timeout
	// (the end of the process is what stops a hung kernel), then restarts
	// the worker after the backoff. The exit counts as reported, not
	// synthetic.
	EventHung = "hung"
	// EventExiting: the worker is about to exit, and why. An exit not
	// announced by it is recorded as synthetic ([Exit.Synthetic]).
	EventExiting = "exiting"
)

// maxReportLine is the longest report line the supervisor reads.
const maxReportLine = 64 << 10

// Event is one report from a worker to its supervisor.
type Event struct {
	Event  string `json:"event"`
	Device string `json:"device,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Devices and Sessions, on a ready event ([Reporter.ReadyServing]),
	// are the devices the worker opened and the sessions it serves: the
	// supervisor's view of the worker follows them ([WorkerStatus.Sessions]).
	// Notes are what the worker wants its supervisor to show beside its
	// state (a persisted module it could not restore).
	Devices  []string `json:"devices,omitempty"`
	Sessions []string `json:"sessions,omitempty"`
	Notes    []string `json:"notes,omitempty"`
	// Serving marks a ready event that lists what the worker serves
	// (Sessions may then be empty).
	Serving bool `json:"serving,omitempty"`
	// StateRevision is the revision of the model state the worker
	// restored before it reported ready (package modelctl), 0 for none.
	StateRevision uint64 `json:"state_revision,omitempty"`
}

// Serving is what a worker's ready report says it serves
// ([Reporter.ReadyServing]).
type Serving struct {
	Devices, Sessions, Notes []string
	// StateRevision is the revision of the model state it restored.
	StateRevision uint64
}

// Reporter writes a worker's reports to its supervisor. Its methods are
// safe for concurrent use; on a nil Reporter, or one made outside a
// supervisor, they do nothing and return nil.
type Reporter struct {
	mu  sync.Mutex
	f   *os.File
	err error // why reports cannot be written: a bad EnvReportFD
}

var (
	reporterOnce sync.Once
	reporter     *Reporter
)

// WorkerReporter returns the process's reporter. In a process started by
// a [Supervisor] it writes to the descriptor named by [EnvReportFD]; it
// marks that descriptor close-on-exec and unsets [EnvReportFD], so the
// worker's own children neither inherit the pipe nor report on it.
// Outside a supervisor (no [EnvReportFD]) it is a no-op.
func WorkerReporter() *Reporter {
	reporterOnce.Do(func() { reporter = newReporterFromEnv() })
	return reporter
}

func newReporterFromEnv() *Reporter {
	v, ok := os.LookupEnv(EnvReportFD)
	if !ok {
		return &Reporter{}
	}
	_ = os.Unsetenv(EnvReportFD)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return &Reporter{err: fmt.Errorf("supervise: %s=%q is not a report descriptor", EnvReportFD, v)}
	}
	closeOnExec(fd)
	return &Reporter{f: os.NewFile(uintptr(fd), "supervise-report")}
}

// Supervised says whether the process reports to a supervisor.
func (r *Reporter) Supervised() bool { return r != nil && (r.f != nil || r.err != nil) }

// Report writes e as one line. It returns an error when the supervisor's
// end is gone (the supervisor died) or the descriptor is bad.
func (r *Reporter) Report(e Event) error {
	if r == nil {
		return nil
	}
	if e.Event == "" {
		return errors.New("supervise: an event needs a name")
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if len(b)+1 > maxReportLine {
		return fmt.Errorf("supervise: a report of %d bytes is longer than %d", len(b)+1, maxReportLine)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	if r.f == nil {
		return nil
	}
	_, err = r.f.Write(append(b, '\n'))
	if err != nil {
		return fmt.Errorf("supervise: report %s: %w", e.Event, err)
	}
	return nil
}

// Ready reports [EventReady].
func (r *Reporter) Ready() error { return r.Report(Event{Event: EventReady}) }

// ReadyServing reports [EventReady] with the devices the worker opened,
// the sessions it serves (the supervisor lists these, and no others, for
// the worker from then on: [WorkerStatus.Sessions]), notes to show
// beside its state ([WorkerStatus.Notes]) and the model state's revision
// it restored.
func (r *Reporter) ReadyServing(s Serving) error {
	return r.Report(Event{Event: EventReady, Devices: s.Devices, Sessions: s.Sessions, Notes: s.Notes, Serving: true, StateRevision: s.StateRevision})
}

// DeviceLost reports [EventDeviceLost] for device.
func (r *Reporter) DeviceLost(device, reason string) error {
	return r.Report(Event{Event: EventDeviceLost, Device: device, Reason: reason})
}

// Hung reports [EventHung] for device: the worker asks to be killed.
func (r *Reporter) Hung(device, reason string) error {
	return r.Report(Event{Event: EventHung, Device: device, Reason: reason})
}

// Exiting reports [EventExiting].
func (r *Reporter) Exiting(reason string) error {
	return r.Report(Event{Event: EventExiting, Reason: reason})
}

// Report writes e with the process's [WorkerReporter]; a no-op outside a
// supervisor.
func Report(e Event) error { return WorkerReporter().Report(e) }
