package supervise

import (
	"io"
	"log/slog"
	"os"
	"time"
)

// Worker describes one worker process: typically one `stagehost serve`
// per GPU device, named after the device.
type Worker struct {
	// Name identifies the worker in [Supervisor.Status], logs and
	// [EnvWorkerName]; unique within a supervisor. For a worker per device,
	// the device's name ("cuda0").
	Name string
	// Tenant is the tenant whose sessions the worker serves, "" for the
	// shared worker of its device; shown in [WorkerStatus.Tenant].
	Tenant string
	// Path is the executable; Args its arguments, without argv[0].
	Path string
	Args []string
	// Env is added to the supervisor's own environment ("KEY=value"; a key
	// given here wins). The supervisor adds [EnvReportFD] and
	// [EnvWorkerName] last.
	Env []string
	// Stdout and Stderr receive the worker's output. Nil means the
	// supervisor's own os.Stdout and os.Stderr.
	Stdout, Stderr io.Writer
}

// Config configures a [Supervisor]. It is immutable: every WithX method
// returns a modified copy, so a Config can be shared and reused.
//
//	s, err := supervise.Start(supervise.NewConfig().WithWorkers(workers...))
type Config struct {
	workers      []Worker
	initial      time.Duration
	max          time.Duration
	multiplier   float64
	stable       time.Duration
	stopTimeout  time.Duration
	readyTimeout time.Duration
	logger       *slog.Logger
	onChange     func(WorkerStatus)
}

// Defaults of [NewConfig].
const (
	DefaultBackoffInitial    = 100 * time.Millisecond
	DefaultBackoffMax        = 10 * time.Second
	DefaultBackoffMultiplier = 2.0
	DefaultStablePeriod      = 30 * time.Second
	DefaultStopTimeout       = 10 * time.Second
	DefaultReadyTimeout      = 60 * time.Second
)

// ReportDrainTimeout bounds how long the supervisor keeps reading a
// worker's report pipe once the worker was reaped. A dead worker's end of
// the pipe is closed by the kernel, so the rest of its reports are read
// at once; only a descendant that inherited the pipe can hold it open,
// and past this timeout the supervisor closes its end and stops reading.
const ReportDrainTimeout = time.Second

// NewConfig returns the defaults:
//
//   - no workers (see [Config.WithWorkers]);
//   - restart backoff from [DefaultBackoffInitial] (100 ms), multiplied
//     by [DefaultBackoffMultiplier] (2) at each restart up to
//     [DefaultBackoffMax] (10 s), reset after a worker stayed up
//     [DefaultStablePeriod] (30 s) (see [Config.WithBackoff],
//     [Config.WithStablePeriod]);
//   - [DefaultStopTimeout] (10 s) between SIGTERM and SIGKILL (see
//     [Config.WithStopTimeout]);
//   - [DefaultReadyTimeout] (60 s) for a started worker to report ready
//     (see [Config.WithReadyTimeout]);
//   - slog.Default() for logs;
//   - no change callback (see [Config.WithOnChange]).
func NewConfig() Config {
	return Config{
		initial: DefaultBackoffInitial, max: DefaultBackoffMax, multiplier: DefaultBackoffMultiplier,
		stable: DefaultStablePeriod, stopTimeout: DefaultStopTimeout, readyTimeout: DefaultReadyTimeout,
		logger: slog.Default(),
	}
}

// WithWorkers sets the workers to supervise (replacing any set before).
// [Start] rejects an empty list, a worker without a name or path, and two
// workers of one name.
func (c Config) WithWorkers(ws ...Worker) Config {
	c.workers = append([]Worker(nil), ws...)
	return c
}

// WithBackoff sets the restart backoff: a worker that exited waits
// initial before its first restart, and each further restart waits
// multiplier times longer, up to max. [Start] rejects initial <= 0,
// max < initial and multiplier < 1. Default 100 ms, 10 s, 2.
func (c Config) WithBackoff(initial, max time.Duration, multiplier float64) Config {
	c.initial, c.max, c.multiplier = initial, max, multiplier
	return c
}

// WithStablePeriod sets how long a worker must stay up for its backoff to
// start again from the initial delay when it next exits. [Start] rejects
// d <= 0. Default [DefaultStablePeriod] (30 s).
func (c Config) WithStablePeriod(d time.Duration) Config { c.stable = d; return c }

// WithStopTimeout sets how long a worker has to exit after SIGTERM (at
// [Supervisor.Stop], or when the supervisor restarts it) before it gets
// SIGKILL. [Start] rejects d <= 0. Default [DefaultStopTimeout] (10 s).
func (c Config) WithStopTimeout(d time.Duration) Config { c.stopTimeout = d; return c }

// WithReadyTimeout sets how long a started worker may take to report
// ready; past it the supervisor restarts it (SIGTERM, StopTimeout,
// SIGKILL) with backoff. 0 disables it: the worker may stay starting
// forever. [Start] rejects d < 0. Default [DefaultReadyTimeout] (60 s).
func (c Config) WithReadyTimeout(d time.Duration) Config { c.readyTimeout = d; return c }

// WithLogger sets where the supervisor logs starts, reports, exits and
// restarts. Nil means slog.Default(). Default slog.Default().
func (c Config) WithLogger(l *slog.Logger) Config {
	if l == nil {
		l = slog.Default()
	}
	c.logger = l
	return c
}

// WithOnChange calls fn with a worker's new status after each of its
// changes (state, pid, restarts, exits, device losses), in order for each
// worker. fn is called from the worker's supervising goroutine, so it may
// run concurrently for different workers, must not block for long, and
// must not call [Supervisor.Stop]. Default none; [Supervisor.Changes]
// gives the same news as a channel.
func (c Config) WithOnChange(fn func(WorkerStatus)) Config { c.onChange = fn; return c }

func (w Worker) stdout() io.Writer {
	if w.Stdout == nil {
		return os.Stdout
	}
	return w.Stdout
}

func (w Worker) stderr() io.Writer {
	if w.Stderr == nil {
		return os.Stderr
	}
	return w.Stderr
}
