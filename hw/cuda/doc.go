// Package cuda is stagehost's NVIDIA backend: an [hw.Platform] over the
// CUDA driver API, loaded at run time from libcuda.so.1 with purego, so
// binaries stay cgo-free (CGO_ENABLED=0 builds work; without a driver,
// [Open] fails with [errdefs.ErrUnsupported]).
//
// # Model
//
//   - One [Device] per GPU, named cuda0, cuda1, ... ([hw.EngineGPU]), each
//     with its primary context retained for the platform's life and the
//     kernel module (embedded PTX) loaded eagerly at [Open] (every kernel's
//     function is fetched there, which is what loads it under CUDA's lazy
//     loading: no launch waits for a load behind a parked resident kernel).
//   - One [HostDevice], "host0" ([hw.EngineCPU]), standing in for an NPU:
//     its streams run Go programs registered with [RegisterHostProgram], in
//     order, on a worker goroutine, with the same completion semantics; a
//     shared allocation listing it ([Platform.AllocShared]) is the pinned
//     memory the GPUs map, seen by host programs through its host view.
//   - CUDA's current context is per OS thread. Every [Stream] is served by
//     one goroutine locked to its own OS thread with the context current;
//     all driver calls for the stream run there. Device-level calls (Alloc,
//     Free, Close) lock the calling goroutine to its thread and make the
//     context current for the duration of the call.
//   - Completions are a per-stream sequence number. The driver thread
//     records a CUevent after each burst of commands and polls the events
//     (cuEventQuery, never a callback into Go), advancing a cached retired
//     counter that [Stream.Retired], [hw.Completion.Done] and
//     [Stream.Idle] read without a driver call.
//   - Sticky CUDA errors (illegal address, launch failure, ECC, ...) lose
//     the device: the first one is recorded (with cuGetErrorName) in
//     [Device.Err], every pending and later call fails at once with
//     [errdefs.ErrDeviceLost], and waits return immediately.
//   - Memory: device buffers (cuMemAlloc_v2); buffers allocated with
//     [hw.AllocHostVisible] and shared allocations ([Platform.AllocShared])
//     are pinned host memory mapped into every device
//     (cuMemHostAlloc with PORTABLE|DEVICEMAP), coherent with the device.
//     New memory is zeroed. Free defers the real release until the work
//     queued before it has retired, so a use-after-free by queued commands
//     cannot fault the device; later commands using it fail with
//     [errdefs.ErrClosed].
//
// # Programs
//
// The module holds the simulator's kernels (hw/sim), with its names and
// argument conventions, plus fault. Arguments are validated at Submit, not
// when the kernel runs: kinds, device ownership, ranges, the sizes the
// scalars imply, 4-byte alignment of float32 ranges; a violation is an
// [errdefs.ErrInvalidArgument] error naming the argument. The element counts
// the kernels need are appended by the host. All are one-dimensional
// grid-stride loops: a non-zero Command.Grid[0] is the thread count (y and
// z are ignored), a zero Grid covers the element count.
//
//	noop                        does nothing; takes and ignores any arguments
//	fill    (buf, value f32)    buf[i] = value
//	copy    (dst, src)          src's bytes into dst; equal lengths; may
//	                            overlap (then one thread copies, memmove-style)
//	saxpy   (a f32, x, y)       y = a*x + y; equal lengths
//	matmul  (A, B, C, M, N, K)  C(MxN) = A(MxK)·B(KxN), row-major float32;
//	                            ranges hold exactly those sizes
//	bias    (x, b, M, N)        x[i][j] += b[j]; x MxN, b N values exactly
//	relu    (x)                 negative values become 0 (-0 and NaN stay)
//	argmax  (x, out)            sequential-scan argmax of non-empty x (first
//	                            largest; NaN never larger, a NaN x[0] wins):
//	                            out[0:4] index, out[4:8] value bits, both LE
//	mlp_forward (x, W1, b1, W2, b2, scores, out, I, H, C)
//	                            a two-layer perceptron on one row in one
//	                            launch, bit for bit matmul, bias, relu,
//	                            matmul, bias, argmax (docs/kernels.md)
//	spin    (buf, off, want)    polls the uint32 at byte off of buf with
//	                            acquire loads (system scope) until it equals
//	                            want; never gives up (a device loss ends it)
//	fault   ()                  stores through an invalid address: loses the
//	                            device (for tests)
//	resident_gpu_exchange (line, payload, rounds)
//	                            the GPU participant of a resident exchange
//	                            (package sessions, NewCUDAExchange): one
//	                            thread polls line's word (acquire, system
//	                            scope); RUN (1) runs the credit ping-pong over
//	                            payload (≥ 192 bytes, not overlapping line),
//	                            anything else retires at once
//
// # Graphs
//
// [Stream.RecordGraph] captures a fixed sequence of launches into a CUDA
// graph once; [Stream.SubmitGraph] replays it with one cuGraphLaunch.
//
// # Batches
//
// [Stream.SubmitBatch] ([hw.BatchSubmitter]) validates a whole batch and
// hands it to the driver thread as one queued command. A batch submitted
// again with exactly the same launches is captured into a CUDA graph once
// and replayed with one cuGraphLaunch from then on (see [WithBatchGraphs]).
package cuda
