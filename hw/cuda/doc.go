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
// z are ignored), a zero Grid covers the element count. (The op library's
// reductions and gemm run a block of 256 threads per output or 64×64
// tile; softmax, log_softmax, layernorm and rmsnorm a warp of 32 per row
// of at most 1,024 values (8 rows per block) and a block of 256 per
// longer row; blocks and warps stride over them: a zero Grid gives one
// block or warp to each, up to 65,536 blocks; Grid[0] still counts
// threads. Any grid gives the same results.)
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
// # The op library
//
// Every program of the op library (package hw/internal/ops: exp, add,
// softmax, layernorm, gemm, conv2d, cast, ... at f32, f16 and bf16 storage,
// named OP, OP.f16, OP.bf16, and gemm*.fast, conv2d.fast) is a kernel of
// the module. Submit validates its arguments with the library's own rules
// (the simulator and the SDK emulator run the same ones), so a shape the
// op refuses is an [errdefs.ErrInvalidArgument] error naming the op and the
// argument ("cuda: softmax: x has 4,096 values, rows*cols = 4,097"), and
// nothing is enqueued. Results:
//
//   - Exact tier: bit-identical to the library's reference (and so to
//     the simulator), NaN payloads excepted: the kernels use correctly
//     rounded intrinsics, never a fused multiply-add, and every row or
//     axis reduction the library's fixed 256-lane order (a block of 256
//     threads per row or output, or a warp holding 8 of the 256 lane
//     sums per thread, which adds in the same order).
//   - Bounded ops (exp, log, tanh, sigmoid, silu, gelu_*, softmax,
//     log_softmax) use CUDA's float32 functions: within [OpBounds] and
//     [SoftmaxBound] of the float64 result.
//   - Fast tier: gemm.fast, gemm.f16.fast and gemm.bf16.fast call
//     cublasGemmStridedBatchedEx (float32 compute, no TF32) on the
//     launch's stream, within [FastGemmBound]. cuBLAS is loaded at the
//     first use of a fast program (libcublas.so.13, then .12: the
//     loader's search, LD_LIBRARY_PATH included, then the CUDA toolkit's
//     directories; [Config.WithBLASLibrary] names a file, or "-" for none); one
//     handle per device, bound to each launch's stream and to that
//     stream's own 32 MiB workspace (allocated at its first fast gemm) on
//     its driver thread. Without cuBLAS the fast programs run the exact
//     kernels: the process logs that once, and [Platform.BLAS] reports
//     why. conv2d.fast is the exact kernel. Batches holding a cuBLAS gemm
//     are issued call by call, never cached as graphs, and
//     [Stream.RecordGraph] records a fast gemm as the exact kernel.
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
// and replayed with one cuGraphLaunch from then on (see [Config.WithBatchGraphs]).
package cuda
