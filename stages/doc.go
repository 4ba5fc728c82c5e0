// Package stages loads, validates and instantiates WebAssembly stage and
// fence modules, and runs them in sessions that the host wraps on every
// call.
//
// An [Engine] owns the wazero runtime, its compilation cache and the
// stagehost_v1 host module (ABI v1, see abi/ABI.md). [Engine.Load]
// validates a module before anything is instantiated: its sha256, the ABI
// marker, its imports (ABI functions with their exact types and granted
// WASI functions only), its exports and its memory limit; it then caps the
// module's memory, merges its data segments and compiles it once.
// [Engine.NewSession] creates a [Session]: the module's instance plus the
// session's own device resources (an [host.Owner]) and handle table.
//
// Every [Session.Run] goes through a [NativeSession]: re-entrancy guard,
// admission, compute lease, the call under its deadline, the fence (the
// module's, a fence module's, or the built-in drain) under its own
// deadline, a check that every owned stream is idle, quarantine when the
// fence cannot be proven, and a trace record. A trapped or timed-out
// instance is replaced; the session's resources and handles stay.
//
// [NativeSession] is also the Go API for stages written in Go.
//
//	eng, _ := stages.NewEngine(ctx, stages.NewEngineConfig())
//	mod, err := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("mlp"))
//	sess, err := eng.NewSession(ctx, rt, mod, stages.NewSessionConfig("classify", gpu).WithStreams("s0"))
//	out, err := sess.Run(ctx, input, nil)
package stages
