// Package supervise runs worker processes, typically one `stagehost serve`
// per GPU device, and restarts them, in the style of containerd's shims.
//
// A sticky CUDA fault makes a GPU lost for the rest of the process that
// met it; only a new process recovers it. So each device gets a process of
// its own, and a [Supervisor] restarts the one whose device was lost while
// the others keep serving.
//
// Workers report to their supervisor over a pipe: the supervisor passes
// the write end as the worker's descriptor 3 (exec.Cmd.ExtraFiles) and
// names it in [EnvReportFD]; the worker writes JSON lines:
//
//	{"event":"ready"}
//	{"event":"ready","serving":true,"devices":["cuda0"],"sessions":["classify"],"notes":["..."],"state_revision":3}
//	{"event":"device_lost","device":"cuda0","reason":"..."}
//	{"event":"exiting","reason":"..."}
//
// A worker uses [WorkerReporter] (or [Report]), which does nothing outside
// a supervisor.
//
// The supervisor:
//
//   - starts every worker ([Start]);
//   - moves a worker from starting to ready when it reports ready, and
//     restarts it if it does not within the ready timeout;
//   - restarts a worker that reports device_lost: SIGTERM, then SIGKILL
//     after the stop timeout, then a new process;
//   - restarts a worker whose process exited, for whatever reason, after a
//     backoff of its own (100 ms doubling to 10 s by default, back to the
//     start once a process stayed up 30 s);
//   - records how each process ended ([Exit]): its exit code or signal,
//     and whether it said why ([EventExiting]) or died without a word, in
//     which case the record is synthetic ([Exit.Synthetic]), as containerd
//     records a synthetic exit for a shim that died, with the line of the
//     end of its stderr that best says why in the reason (the last that is
//     not an INFO or DEBUG log line: [Exit.Reason]; [Exit.Stderr] keeps
//     its last lines);
//   - keeps what a worker's ready report says it serves (its devices,
//     sessions, notes: [Reporter.ReadyServing]) until its next one;
//   - keeps each worker's state ([WorkerStatus]: pid, state, restarts,
//     last exit, device losses, uptime) for [Supervisor.Status], and tells
//     of every change ([Supervisor.Changes], [Config.WithOnChange]);
//   - stops everything at [Supervisor.Stop]: SIGTERM, SIGKILL after the
//     stop timeout, every process reaped, every goroutine finished.
//
// Each worker runs in a process group of its own (a terminal's Ctrl-C
// reaches the supervisor, which stops the workers in order), and on Linux
// dies with SIGKILL if the supervisor dies. A worker's own children are
// its business: the supervisor signals the worker's process only.
//
// The package depends on the standard library only, and on Unix systems:
// on others [Start] returns an error.
package supervise
