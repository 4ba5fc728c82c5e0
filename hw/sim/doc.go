// Package sim is stagehost's simulated hardware backend: a concurrent,
// deterministic implementation of the [hw] contract that runs "kernels"
// written in Go on the host.
//
// A [Platform] holds named [Device]s. Every device offers ordered
// [Stream]s, each with one worker goroutine that executes commands strictly
// in submission order from a bounded ring. The ring starts small
// ([DefaultInitialQueueDepth] slots, about 5.6 KiB) and doubles when a
// submission finds it full, up to the queue depth ([DeviceConfig.WithQueueDepth]), the
// limit beyond which submissions fail with [errdefs.ErrBusy]; it never shrinks.
// Submit, Write and Read allocate only when they double the ring. Buffers
// and [Shared] allocations are real memory (anonymous shared mappings) and
// are always host-visible.
//
// A device may have a latency ([DeviceConfig.WithLatency]): every command then takes
// that long, held to within microseconds by the stream's worker spinning
// on the monotonic clock (a timer would fire about a millisecond late).
// The spin burns a CPU per busy stream while a command waits out its
// latency; only latencies of 2 ms or more sleep, for all but their last
// millisecond.
//
// Programs are looked up by name in a process-wide kernel registry (see
// [Register] and [Kernel]). The package registers a small library in its
// init: noop, fill, copy, saxpy, matmul, bias, relu, argmax, mlp_forward
// and spin; see [Kernels] for the list and the kernels' documentation in
// kernels.go. It also registers every program of the device op library
// (hw/internal/ops: softmax, gemm.bf16, conv2d, …; docs/kernels.md), whose
// launches [Stream.Submit] and [Stream.SubmitBatch] check against the op's
// contract before enqueuing anything, and which run the library's
// reference implementation.
//
// Faults can be injected per device or per stream (see [Fault]): rejected
// submissions, failed completions, hung workers, failed visibility actions
// and device loss. A lost device fails every pending and later command with
// an [errdefs.ErrDeviceLost] error, and no wait on it ever hangs.
//
// Usage:
//
//	p := sim.New()
//	defer p.Close()
//	dev, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig().WithLatency(time.Millisecond))
//	st, _ := dev.NewStream()
//	defer st.Close(ctx)
//	buf, _ := dev.Alloc(64, hw.AllocHostVisible, nil)
//	defer buf.Free()
//	fill, _ := dev.Prepare("fill")
//	c, err := st.Submit(&hw.Command{
//		Program: fill,
//		Args:    []hw.Arg{hw.BufferArg(buf, 0, -1), hw.Float32(1.5)},
//	})
//	if err == nil {
//		err = c.Wait(ctx)
//	}
//	b, _ := buf.HostBytes() // 16 float32 values of 1.5
//
// # Lock ordering
//
// Device.mu may be held while acquiring a Stream.mu (device loss marks
// every stream dead that way); a Stream.mu is never held while acquiring
// Device.mu or Platform.mu. Platform.mu is never held while calling into a
// device. The fault-hang lock is a leaf. Buffers have no locks: their
// lifetime is one atomic word (see region).
package sim
