package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// Tuning of a stream's driver thread.
const (
	// eventEvery bounds how many commands one CUevent covers. Commands
	// retire in order, so one event after a burst retires the whole burst;
	// a burst ends when the queue runs empty or after eventEvery commands.
	eventEvery = 64
	// spinWindow is how long the driver thread keeps polling (without
	// parking) after its last activity: parking and waking a locked OS
	// thread costs more than a short kernel takes.
	spinWindow = 50 * time.Microsecond
	// Once the spin window has passed and nobody waits, the driver thread
	// polls its events with a backoff between these bounds. This bounds how
	// stale Retired, Done and Idle can be.
	minBackoff = 20 * time.Microsecond
	maxBackoff = time.Millisecond
	// waitHot is how long the driver thread polls without parking once a
	// waiter arrives; a longer wait falls back to the backoff (so a wait on
	// a long kernel does not burn a core).
	waitHot = 2 * time.Millisecond
	// flushDelay is how long after its last command the driver thread
	// records the event that retires it when nobody waits: a burst that
	// goes on within it (the MLP stage queues an upload, a batch and a
	// download a microsecond or two apart) gets one event, not one per
	// command. A waiter has it recorded at once.
	flushDelay = 10 * time.Microsecond
	// waitSpin is how long WaitRetired spins before it blocks. A waiter
	// that sleeps is woken by a channel close, which on the H200 host
	// added about 60 µs (docs/gpu.md, run 9: the MLP call's one wait of
	// ~25 µs, past a 20 µs spin, took 90 µs). The spin yields every 64
	// rounds, so it does not starve the driver thread.
	waitSpin = 100 * time.Microsecond
)

type opKind uint8

const (
	opLaunch  opKind = iota + 1
	opWrite          // cuMemcpyHtoDAsync_v2
	opRead           // cuMemcpyDtoHAsync_v2
	opMarker         // no driver work (empty copies); retires in order
	opGraph          // cuGraphLaunch
	opCapture        // record a graph (no device work)
	opBatch          // several launches, or one replay of a cached graph
)

// op is one queued command, copied by value into the stream's queue.
type op struct {
	kind    opKind
	seq     uint64
	l       launch
	dptr    cuDevicePtr
	host    unsafe.Pointer
	n       uintptr
	pin     *runtime.Pinner
	graph   *Graph
	capture *captureReq
	batch   *batchReq
	// pageable: a read into memory this platform did not pin, which the
	// driver copies synchronously (see retireSynchronous).
	pageable bool
}

type mark struct {
	seq uint64
	ev  cuEvent
}

type pinRec struct {
	seq uint64
	pin *runtime.Pinner
}

// Stream is an ordered command queue on one device, served by one
// goroutine locked to its OS thread with the device's context current:
// every driver call for the stream runs there. Submit, Write and Read
// validate on the caller's goroutine, take a sequence number and hand the
// command over a channel; the driver thread launches it, records a CUevent
// after each burst and polls those events to advance the stream's retired
// sequence number, which Retired and Idle read without any driver call. It
// implements [hw.Stream] and [hw.Retirer].
type Stream struct {
	dev  *Device
	ops  chan op
	quit chan struct{} // closed by the final Close
	done chan struct{} // closed when the driver thread exits

	submitMu   sync.Mutex
	closing    bool // no more submissions
	final      bool // released
	retirement      // submitted/retired watermarks, failures, waiters

	kick    chan struct{}
	waiters atomic.Int32 // goroutines in wait: the driver thread records its event at once

	errBusy error // made once: retrying on a full queue allocates nothing

	// startState settles who won the race between a cuStreamCreate that
	// returns and NewStream giving up on it: createPending, then
	// createDone (the driver thread got there first) or createAbandoned.
	startState atomic.Int32

	// Owned by the driver thread.
	cs         cuStream
	pb         *paramBlock
	pbPin      runtime.Pinner
	last       uint64 // last executed seq
	marked     uint64 // last seq covered by a recorded event
	sinceEvent int
	pending    ring[mark]
	pins       ring[pinRec]
	freeEvents []cuEvent
	graphs     graphCache
	blasWS     cuDevicePtr // cuBLAS workspace, allocated at the first fast gemm
	// Staging rings for small copies (staging.go), allocated on first use.
	up, down      *stagingRing
	stagingMem    unsafe.Pointer // both rings' pinned allocation
	stagingFailed bool
	copyOuts      ring[copyOut] // staged downloads not yet retired

	// Batch counters, written by the driver thread (tests, docs).
	batchDirect  atomic.Uint64 // batches issued launch by launch
	batchReplays atomic.Uint64 // batches issued as one cached-graph launch
	batchCapture atomic.Uint64 // graphs captured for batches
	syncRetires  atomic.Uint64 // retirements by a synchronous download, no event polled
	blasFailures atomic.Uint64 // cuBLAS calls that returned an error status
}

var (
	_ hw.Stream         = (*Stream)(nil)
	_ hw.Retirer        = (*Stream)(nil)
	_ hw.BatchSubmitter = (*Stream)(nil)
)

var pinners = sync.Pool{New: func() any { return new(runtime.Pinner) }}

const (
	createPending int32 = iota
	createDone
	createAbandoned
)

// NewStream creates a non-blocking CUDA stream and its driver thread.
//
// It waits at most the platform's stream creation timeout (see
// [Config.WithStreamCreateTimeout]) for cuStreamCreate. Past it, it returns an
// [errdefs.ErrDeadlineExceeded] error and leaves behind the driver thread that
// is still inside the driver: one goroutine and its locked OS thread,
// blocked until the driver returns, if ever (then the thread destroys the
// stream and exits). Nothing else waits on it.
func (d *Device) NewStream() (hw.Stream, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	depth := d.plat.cfg.queueDepth
	if depth <= 0 {
		depth = DefaultQueueDepth
	}
	s := &Stream{
		dev:  d,
		ops:  make(chan op, depth),
		quit: make(chan struct{}),
		done: make(chan struct{}),
		kick: make(chan struct{}, 1),

		retirement: newRetirement(),
	}
	s.errBusy = errdefs.Errorf(errdefs.ErrBusy, "cuda: %s: stream queue full (%d commands)", d.name, depth)
	ready := make(chan error, 1)
	go s.run(ready)
	timeout := d.plat.cfg.createTimeout
	if timeout <= 0 {
		timeout = DefaultStreamCreateTimeout
	}
	timer := time.NewTimer(timeout)
	var err error
	select {
	case err = <-ready:
	case <-timer.C:
		if s.startState.CompareAndSwap(createPending, createAbandoned) {
			return nil, errdefs.Errorf(errdefs.ErrDeadlineExceeded, "cuda: %s: cuStreamCreate did not return within %v (its OS thread stays blocked in the driver); while resident kernels are parked the driver may never return it", d.name, timeout)
		}
		err = <-ready // the driver thread settled first: its answer is on the way
	}
	timer.Stop()
	if err != nil {
		<-s.done
		return nil, err
	}
	d.streamsMu.Lock()
	d.streams[s] = struct{}{}
	d.streamsMu.Unlock()
	d.live.Add(1)
	return s, nil
}

// pendingWork is one stream's last queued command at a moment.
type pendingWork struct {
	s   waiter
	seq uint64
}

// snapshot returns, for every open stream of d with unretired work, its
// last queued sequence number. Taking each stream's submit lock orders
// the snapshot against concurrent enqueues (see Stream.enqueue).
func (d *Device) snapshot(out []pendingWork) []pendingWork {
	d.streamsMu.Lock()
	defer d.streamsMu.Unlock()
	for s := range d.streams {
		s.submitMu.Lock()
		seq := s.rec.Submitted()
		s.submitMu.Unlock()
		if seq > s.rec.Retired() {
			out = append(out, pendingWork{s, seq})
		}
	}
	return out
}

// Device is the stream's device.
func (s *Stream) Device() hw.Device { return s.dev }

// Submit validates cmd (program of this device, argument kinds, buffer
// ownership and ranges, sizes implied by scalars, alignment) and enqueues
// the launch. It allocates nothing.
//
// # Errors
//
// [errdefs.ErrInvalidArgument] (naming the argument index), [errdefs.ErrClosed] for a
// freed buffer or a closed stream, [errdefs.ErrDeviceLost], [errdefs.ErrBusy] when
// the stream's queue is full (see [Config.WithQueueDepth]). A launch the driver
// refuses fails its completion with [errdefs.ErrRejected].
func (s *Stream) Submit(cmd *hw.Command) (hw.Completion, error) {
	var o op
	o.kind = opLaunch
	gen := s.dev.freeGen.Load()
	if err := s.dev.prepareLaunch(cmd, &o.l); err != nil {
		return hw.Completion{}, err
	}
	return s.enqueue(&o, gen, cmd.Args, nil, nil)
}

// batchReq carries a validated batch to the driver thread. Batches are
// pooled, so a steady stream of batches allocates nothing.
type batchReq struct {
	launches []launch
}

var batchPool = sync.Pool{New: func() any { return new(batchReq) }}

// SubmitBatch validates every command like [Stream.Submit] and, only if
// all are valid, hands them to the driver thread as one queued command:
// one channel hand-off and one sequence number for the whole batch. The
// completion retires when the last launch has, with the first failure;
// a launch the driver refuses fails the completion with [errdefs.ErrRejected]
// and skips the rest of the batch.
//
// The driver thread keeps a small per-stream cache of CUDA graphs (see
// [Config.WithBatchGraphs]): a batch seen before with exactly the same launches
// (kernels, sizes and argument values, buffer addresses included) is
// captured into a graph on its second submission and replayed with one
// cuGraphLaunch from then on. Replaying is exact: the graph holds the very
// parameters the batch validated, and every buffer they address was
// checked live at this submission.
//
// # Errors
//
// As for Submit, naming the command's index; [errdefs.ErrBusy] when the queue
// is full (nothing is enqueued).
func (s *Stream) SubmitBatch(cmds []hw.Command) (hw.Completion, error) {
	if len(cmds) == 0 {
		return hw.Completion{}, nil
	}
	gen := s.dev.freeGen.Load()
	b := batchPool.Get().(*batchReq)
	if cap(b.launches) < len(cmds) {
		b.launches = make([]launch, len(cmds))
	}
	b.launches = b.launches[:len(cmds)]
	for i := range cmds {
		if err := s.dev.prepareLaunch(&cmds[i], &b.launches[i]); err != nil {
			batchPool.Put(b)
			return hw.Completion{}, errdefs.Errorf(errdefs.ClassOf(err), "cuda: batch command %d: %w", i, err)
		}
	}
	o := op{kind: opBatch, batch: b}
	c, err := s.enqueue(&o, gen, nil, nil, cmds)
	if err != nil {
		batchPool.Put(b)
	}
	return c, err
}

// copyTarget validates a Write or Read target range.
func (s *Stream) copyTarget(what string, b hw.Buffer, off, n int) (*buffer, error) {
	buf, ok := b.(*buffer)
	switch {
	case !ok:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: buffer %T is not a CUDA buffer", what, b)
	case buf.dev != s.dev:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: buffer belongs to %s, not %s", what, buf.dev.name, s.dev.name)
	case buf.isFreed():
		return nil, errdefs.Errorf(errdefs.ErrClosed, "cuda: %s: buffer was freed", what)
	case off < 0 || off > buf.size || n > buf.size-off:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: range [%d,+%d) outside buffer of %d bytes", what, off, n, buf.size)
	}
	return buf, nil
}

// Write enqueues an upload of src into dst at off (cuMemcpyHtoDAsync_v2).
// src is pinned until the copy retires and must stay unchanged until then.
func (s *Stream) Write(dst hw.Buffer, off int, src []byte) (hw.Completion, error) {
	gen := s.dev.freeGen.Load()
	b, err := s.copyTarget("write", dst, off, len(src))
	if err != nil {
		return hw.Completion{}, err
	}
	return s.enqueueCopy(opWrite, b, off, src, gen)
}

// Read enqueues a download of src at off into dst (cuMemcpyDtoHAsync_v2).
// dst is pinned until the copy retires and must not be touched until then.
func (s *Stream) Read(src hw.Buffer, off int, dst []byte) (hw.Completion, error) {
	gen := s.dev.freeGen.Load()
	b, err := s.copyTarget("read", src, off, len(dst))
	if err != nil {
		return hw.Completion{}, err
	}
	return s.enqueueCopy(opRead, b, off, dst, gen)
}

// enqueueCopy queues an upload or download. A download into memory that
// this platform did not pin is marked pageable: the driver returns from it
// only once it has completed, which retires the stream up to it without
// an event.
func (s *Stream) enqueueCopy(kind opKind, b *buffer, off int, host []byte, gen uint64) (hw.Completion, error) {
	o := op{kind: opMarker}
	if len(host) > 0 {
		pin := pinners.Get().(*runtime.Pinner)
		pin.Pin(&host[0])
		o = op{kind: kind, dptr: b.ptr + cuDevicePtr(off), host: unsafe.Pointer(&host[0]), n: uintptr(len(host)), pin: pin}
		o.pageable = kind == opRead && !s.dev.plat.pinned.overlaps(o.host, len(host))
	}
	bs := [1]*buffer{b}
	c, err := s.enqueue(&o, gen, nil, bs[:], nil)
	if err != nil && o.pin != nil {
		o.pin.Unpin()
		pinners.Put(o.pin)
	}
	return c, err
}

// enqueue assigns the next sequence number and queues o, in one critical
// section so that queue order is sequence order. gen is the device's free
// generation read before validation: if a buffer was freed since, the
// command's buffers (args, bufs, and every command of a batch) are checked
// again under the lock, which is what makes Free's snapshot of queued work
// complete (see buffer.Free).
func (s *Stream) enqueue(o *op, gen uint64, args []hw.Arg, bufs []*buffer, batch []hw.Command) (hw.Completion, error) {
	s.submitMu.Lock()
	if s.closing {
		s.submitMu.Unlock()
		return hw.Completion{}, errdefs.Errorf(errdefs.ErrClosed, "cuda: %s: stream is closed", s.dev.name)
	}
	if err := s.dev.Err(); err != nil {
		s.submitMu.Unlock()
		return hw.Completion{}, err
	}
	if s.dev.freeGen.Load() != gen {
		if err := stillAlive(args, bufs); err != nil {
			s.submitMu.Unlock()
			return hw.Completion{}, err
		}
		for i := range batch {
			if err := stillAlive(batch[i].Args, nil); err != nil {
				s.submitMu.Unlock()
				return hw.Completion{}, errdefs.Errorf(errdefs.ErrClosed, "cuda: batch command %d: %w", i, err)
			}
		}
	}
	seq := s.rec.Submitted() + 1
	o.seq = seq
	select {
	case s.ops <- *o:
	default:
		s.submitMu.Unlock()
		return hw.Completion{}, s.errBusy
	}
	s.rec.SetSubmitted(seq)
	s.submitMu.Unlock()
	return hw.NewCompletion(s, seq), nil
}

// stillAlive reports a buffer among args and bufs freed after validation.
func stillAlive(args []hw.Arg, bufs []*buffer) error {
	for _, b := range bufs {
		if b.isFreed() {
			return errdefs.Errorf(errdefs.ErrClosed, "cuda: buffer was freed")
		}
	}
	for i := range args {
		if ab, ok := args[i].Buffer.(*buffer); ok && ab.isFreed() {
			return errdefs.Errorf(errdefs.ErrClosed, "cuda: argument %d: buffer was freed", i)
		}
	}
	return nil
}

// Retired reports from cached state, without any driver call, whether
// command seq has retired and with what error.
func (s *Stream) Retired(seq uint64) (bool, error) { return s.state(seq, s.dev.Err()) }

// WaitRetired blocks until command seq retires (returning its error), the
// device is lost ([errdefs.ErrDeviceLost]) or ctx ends ([errdefs.ErrDeadlineExceeded];
// the command keeps running). It spins briefly, then sleeps until the
// driver thread reports progress; no CUDA callback ever calls into Go.
func (s *Stream) WaitRetired(ctx context.Context, seq uint64) error {
	if err := s.wait(ctx, seq); err != nil {
		return err
	}
	_, err := s.Retired(seq)
	return err
}

// wait returns nil once seq retired, or the loss or context error. It
// wakes the driver thread first if it sleeps (it polls hot for waitHot).
func (s *Stream) wait(ctx context.Context, seq uint64) error {
	if seq <= s.rec.Retired() {
		return nil
	}
	s.waiters.Add(1)
	defer s.waiters.Add(-1)
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return s.retirement.wait(ctx, seq, s.dev.Err, s.dev.lostCh, s.dev.name)
}

// Idle reports, from cached state, whether everything submitted retired
// (or the device is lost).
func (s *Stream) Idle() bool { return s.idle(s.dev.Err()) }

// Sync waits until everything submitted so far retired and returns the
// first command failure that no earlier Sync reported, an
// [errdefs.ErrDeviceLost] error, or an [errdefs.ErrDeadlineExceeded] error.
func (s *Stream) Sync(ctx context.Context) error { return s.sync(ctx, s.wait, s.dev.Err) }

// Close stops new submissions, waits for the stream to drain (as Sync with
// ctx) and destroys it. If ctx ends first, the stream stays open (closed
// to submissions) and Close may be called again; on a lost device it is
// released at once. Closing a released stream returns [errdefs.ErrClosed].
func (s *Stream) Close(ctx context.Context) error {
	s.submitMu.Lock()
	if s.final {
		s.submitMu.Unlock()
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: %s: stream already closed", s.dev.name)
	}
	s.closing = true
	s.submitMu.Unlock()
	err := s.Sync(ctx)
	if errors.Is(err, errdefs.ErrDeadlineExceeded) && s.dev.Err() == nil {
		return err
	}
	s.submitMu.Lock()
	if s.final {
		s.submitMu.Unlock()
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: %s: stream already closed", s.dev.name)
	}
	s.final = true
	close(s.quit)
	<-s.done
	s.submitMu.Unlock()
	// Lock order: streamsMu before submitMu (Device.snapshot).
	s.dev.streamsMu.Lock()
	delete(s.dev.streams, s)
	s.dev.streamsMu.Unlock()
	s.dev.live.Add(-1)
	return err
}

// ---- driver thread ----

func (s *Stream) run(ready chan<- error) {
	// The goroutine stays locked to its thread until it exits, so that
	// thread (with the context current) serves only this stream and is
	// retired with it.
	runtime.LockOSThread()
	defer close(s.done)
	d := s.dev
	if err := d.enter(); err != nil {
		ready <- err
		return
	}
	cs, r := d.drv.StreamCreate(cuStreamNonBlocking)
	if !s.startState.CompareAndSwap(createPending, createDone) {
		// NewStream gave up on us: nobody will use or close this stream.
		if r == cudaSuccess {
			d.drv.StreamDestroy(cs)
		}
		return
	}
	if err := d.check("cuStreamCreate", r, errdefs.ErrFault); err != nil {
		ready <- err
		return
	}
	s.cs = cs
	s.pb = new(paramBlock)
	s.pbPin.Pin(s.pb)
	s.pb.init()
	ready <- nil
	s.loop()
	s.teardown()
}

func (s *Stream) loop() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	backoff := minBackoff
	// The clock is read only after activity and every 16 idle rounds
	// (cheap as time.Now is, a hot loop need not pay it every round).
	hotUntil := time.Now().Add(spinWindow)
	execAt := hotUntil // when the last command was issued (plus spinWindow)
	rounds := 0
	eager := s.dev.plat.cfg.eagerEvents
	for {
		select {
		case o := <-s.ops:
			s.exec(&o)
			// Take the rest of a burst before looking at the clock.
			for i := 0; i < eventEvery && s.execNext(); i++ {
			}
			hotUntil = time.Now().Add(spinWindow)
			execAt = hotUntil
			backoff = minBackoff
			rounds = 0
			continue
		default:
		}
		// Record the event covering what was issued when someone waits,
		// or once no command followed for flushDelay (the clock is read
		// every 16 rounds anyway; the loop stays hot for spinWindow, far
		// longer, so it never parks with commands unrecorded).
		if s.last > s.marked && (eager || s.waiters.Load() > 0 ||
			rounds%16 == 15 && time.Until(execAt) <= spinWindow-flushDelay) {
			s.flushEvent()
		}
		if s.poll() {
			hotUntil = time.Now().Add(spinWindow)
			backoff = minBackoff
			rounds = 0
		}
		rounds++
		if rounds%16 != 0 || time.Now().Before(hotUntil) {
			// Hot: keep polling without parking the thread.
			select {
			case <-s.quit:
				return
			case <-s.kick:
				hotUntil = time.Now().Add(waitHot)
			default:
			}
			continue
		}
		if s.pending.len() == 0 {
			select {
			case o := <-s.ops:
				s.exec(&o)
				hotUntil = time.Now().Add(spinWindow)
				execAt = hotUntil
			case <-s.kick:
				hotUntil = time.Now().Add(waitHot)
			case <-s.quit:
				return
			}
			continue
		}
		timer.Reset(backoff)
		select {
		case o := <-s.ops:
			s.exec(&o)
			hotUntil = time.Now().Add(spinWindow)
			execAt = hotUntil
			backoff = minBackoff
		case <-s.kick:
			hotUntil = time.Now().Add(waitHot)
		case <-timer.C:
			backoff = min(backoff*2, maxBackoff)
		case <-s.quit:
			return
		}
	}
}

// execNext issues the next queued command, if there is one.
func (s *Stream) execNext() bool {
	select {
	case o := <-s.ops:
		s.exec(&o)
		return true
	default:
		return false
	}
}

// exec issues one command on the driver thread.
func (s *Stream) exec(o *op) {
	d := s.dev
	s.last = o.seq
	if d.Err() != nil {
		// Lost: nothing more reaches the driver; Retired reports the loss.
		s.release(o)
		return
	}
	var r cuResult
	call := ""
	switch o.kind {
	case opLaunch:
		r, call = s.issue(&o.l)
	case opWrite:
		src := o.host
		if staged := s.stageWrite(o); staged != nil {
			src = staged // pinned: the copy is asynchronous
		}
		r = d.drv.MemcpyHtoDAsync(o.dptr, src, o.n, s.cs)
		runtime.KeepAlive(o.host)
		call = "cuMemcpyHtoDAsync_v2"
	case opRead:
		if staged := s.stageRead(o); staged != nil {
			// Into pinned memory: asynchronous; copied out at retirement.
			r = d.drv.MemcpyDtoHAsync(staged, o.dptr, o.n, s.cs)
			if r == cudaSuccess {
				s.copyOuts.push(copyOut{seq: o.seq, src: staged, dst: o.host, n: o.n})
			}
			o.pageable = false
		} else {
			r = d.drv.MemcpyDtoHAsync(o.host, o.dptr, o.n, s.cs)
		}
		runtime.KeepAlive(o.host)
		call = "cuMemcpyDtoHAsync_v2"
	case opGraph:
		r = d.drv.GraphLaunch(o.graph.exec, s.cs)
		o.graph.inflight.Add(-1)
		call = "cuGraphLaunch"
	case opCapture:
		o.capture.reply <- s.capture(o.capture)
	case opBatch:
		r, call = s.execBatch(o.batch.launches)
		s.sinceEvent += len(o.batch.launches) - 1
		clear(o.batch.launches)
		batchPool.Put(o.batch)
	}
	if o.pin != nil {
		s.pins.push(pinRec{o.seq, o.pin})
	}
	if r != cudaSuccess {
		if err := d.check(call, r, errdefs.ErrRejected); d.Err() == nil {
			s.recordFailure(o.seq, err)
		}
	} else if o.pageable && d.Err() == nil {
		// The download has completed, and everything before it.
		s.retireSynchronous(o.seq)
		return
	}
	s.sinceEvent++
	if s.sinceEvent >= eventEvery {
		s.flushEvent()
	}
}

// issue launches l on the stream (driver thread): its kernel, or its
// cuBLAS gemm (with the stream's workspace, allocated at the first). It
// returns the call's result and name; a cuBLAS status other than success
// is reported as CUDA_ERROR_INVALID_VALUE: the launch fails with
// [errdefs.ErrRejected], the device stays usable.
func (s *Stream) issue(l *launch) (cuResult, string) {
	d := s.dev
	if l.blas {
		if s.blasWS == 0 {
			ws, r := d.drv.MemAlloc(blasWorkspaceBytes)
			if r != cudaSuccess {
				return r, "cuMemAlloc_v2 (cuBLAS workspace)"
			}
			s.blasWS = ws
		}
		if st := d.blas.gemm(s.cs, s.blasWS, l); st != blasSuccess {
			s.blasFailures.Add(1)
			return cudaErrorInvalidValue, fmt.Sprintf("cuBLAS (status %d)", st)
		}
		return cudaSuccess, ""
	}
	n := l.nparams
	copy(s.pb.vals[:n], l.params[:n])
	r := d.drv.LaunchKernel(l.fn, l.grid, l.block, l.shared, s.cs, s.pb, n)
	runtime.KeepAlive(s.pb)
	return r, "cuLaunchKernel"
}

// release drops what a command holds without running it.
func (s *Stream) release(o *op) {
	if o.pin != nil {
		o.pin.Unpin()
		pinners.Put(o.pin)
	}
	switch o.kind {
	case opGraph:
		o.graph.inflight.Add(-1)
	case opCapture:
		o.capture.reply <- captureResult{err: s.dev.Err()}
	case opBatch:
		batchPool.Put(o.batch)
	}
}

// flushEvent records an event covering every command executed so far.
func (s *Stream) flushEvent() {
	if s.last <= s.marked {
		return
	}
	d := s.dev
	s.sinceEvent = 0
	upTo := s.last
	s.marked = upTo
	if d.Err() != nil {
		return
	}
	var ev cuEvent
	if n := len(s.freeEvents); n > 0 {
		ev = s.freeEvents[n-1]
		s.freeEvents = s.freeEvents[:n-1]
	} else {
		var r cuResult
		ev, r = d.drv.EventCreate(cuEventDisableTiming)
		if err := d.check("cuEventCreate", r, errdefs.ErrFault); err != nil {
			s.syncFallback(upTo, err)
			return
		}
	}
	if err := d.check("cuEventRecord", d.drv.EventRecord(ev, s.cs), errdefs.ErrFault); err != nil {
		d.drv.EventDestroy(ev)
		s.syncFallback(upTo, err)
		return
	}
	s.pending.push(mark{upTo, ev})
}

// syncFallback retires up to seq by synchronizing the stream when no
// event could be recorded (never expected; keeps Sync from hanging).
func (s *Stream) syncFallback(seq uint64, cause error) {
	if s.dev.Err() != nil {
		return
	}
	if err := s.dev.check("cuStreamSynchronize", s.dev.drv.StreamSynchronize(s.cs), errdefs.ErrFault); err != nil {
		if s.dev.Err() != nil {
			return
		}
		cause = err
	}
	// Everything before the last recorded event retires with it; only
	// the unrecorded tail is marked failed.
	for s.pending.len() > 0 {
		m := s.pending.pop()
		s.freeEvents = append(s.freeEvents, m.ev)
	}
	s.recordFailure(seq, cause)
	s.advance(seq)
}

// poll queries pending events in order and advances the retired sequence
// number. It reports whether anything retired.
func (s *Stream) poll() bool {
	d := s.dev
	progressed := false
	for s.pending.len() > 0 {
		if d.Err() != nil {
			return progressed
		}
		m := s.pending.front()
		r := d.drv.EventQuery(m.ev)
		if r == cudaErrorNotReady {
			break
		}
		if r != cudaSuccess {
			err := d.check("cuEventQuery", r, errdefs.ErrFault)
			if d.Err() != nil {
				return progressed
			}
			s.recordFailure(m.seq, err)
		}
		s.pending.pop()
		s.freeEvents = append(s.freeEvents, m.ev)
		s.advance(m.seq)
		progressed = true
	}
	return progressed
}

// advance publishes seq as retired, releases pinned host memory of the
// retired copies, and wakes waiters.
func (s *Stream) advance(seq uint64) {
	s.retireStaged(seq) // before the pins go: copies staged downloads out
	for s.pins.len() > 0 && s.pins.front().seq <= seq {
		p := s.pins.pop()
		p.pin.Unpin()
		pinners.Put(p.pin)
	}
	s.retirement.advance(seq)
}

func (s *Stream) teardown() {
	d := s.dev
	for {
		select {
		case o := <-s.ops:
			s.release(&o)
			continue
		default:
		}
		break
	}
	healthy := d.Err() == nil
	s.graphs.destroy(d, healthy)
	for s.pending.len() > 0 {
		m := s.pending.pop()
		if healthy {
			d.drv.EventDestroy(m.ev)
		}
	}
	for _, ev := range s.freeEvents {
		if healthy {
			d.drv.EventDestroy(ev)
		}
	}
	s.freeEvents = nil
	if healthy {
		d.drv.StreamDestroy(s.cs)
		if s.blasWS != 0 {
			d.drv.MemFree(s.blasWS)
		}
	}
	s.closeStaging(healthy)
	// Pageable Go memory is staged by the driver during the copy call, so
	// nothing touches it once the call returned; unpinning is safe even
	// for copies that never retired.
	for s.pins.len() > 0 {
		p := s.pins.pop()
		p.pin.Unpin()
		pinners.Put(p.pin)
	}
	s.pbPin.Unpin()
	if s.dev.Err() != nil {
		s.wake()
	}
}

// ring is a growable FIFO queue.
type ring[T any] struct {
	buf  []T
	head int
	n    int
}

func (r *ring[T]) len() int { return r.n }

func (r *ring[T]) push(v T) {
	if r.n == len(r.buf) {
		nb := make([]T, max(16, 2*len(r.buf)))
		for i := range r.n {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = v
	r.n++
}

func (r *ring[T]) front() T { return r.buf[r.head] }

func (r *ring[T]) pop() T {
	v := r.buf[r.head]
	var zero T
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return v
}
