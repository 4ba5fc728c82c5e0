package sim

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/internal/retire"
)

// opKind is what a ring slot holds.
type opKind uint8

const (
	opNone   opKind = iota // free or already released
	opLaunch               // a program launch
	opWrite                // host → buffer
	opRead                 // buffer → host
)

// slot is one ring entry. A command is copied in whole, arguments and
// deadline included, so submitting allocates nothing and the caller may
// reuse its Command at once. (Its Shape is checked above the backend and
// not copied: a sim kernel runs once over the whole launch.)
type slot struct {
	kind  opKind
	nargs int
	prog  *Program
	args  [hw.MaxArgs]hw.Arg
	grid  [3]uint32
	dl    time.Time // a launch's hw.Command.Deadline (zero: none)
	buf   *Buffer   // write/read target
	off   int       // write/read offset in buf
	host  []byte    // write source / read destination
	at    int64     // submission time (see mono), on a device with latency
}

// epoch anchors mono.
var epoch = time.Now()

// mono is the monotonic clock, in nanoseconds since epoch.
func mono() int64 { return int64(time.Since(epoch)) }

// Stream is an ordered command queue on a simulated device, with one
// worker goroutine that runs the commands in submission order. It
// implements [hw.Stream] and [hw.Retirer]; its methods are safe for
// concurrent use.
//
// Commands are numbered 1, 2, 3... in submission order. Because they
// retire in order, the stream's state is two watermarks, kept with the
// failures and the waiters in a [retire.Record] (the one hw/cuda's streams
// keep too): submitted (the last sequence number handed out, stored under
// mu) and retired (every command up to it has retired, moved by the worker
// under mu). A command's slot is ring[seq % len(ring)]; it is owned by
// Submit until submitted moves past it, then by the worker until retired
// does.
//
// The ring starts small and doubles, under mu, when a submission finds it
// full, up to the device's queue depth (see [DeviceConfig.WithInitialQueueDepth]). A
// grown ring takes over the queued commands' slots, but not the one the
// worker holds (held): the worker reads that slot, outside mu, in the old
// ring, which stays alive through the worker's pointer until the command
// retires.
type Stream struct {
	dev    *Device
	id     uint64
	name   string // String's result, made once: waits pass it along
	ring   []slot // replaced only under mu, when it grows
	faults faultState
	wake   chan struct{} // capacity 1: "there may be work" for the worker
	done   chan struct{} // closed when the worker exits

	// Owned by the worker goroutine.
	launch Launch
	timer  *time.Timer
	free   int64 // on a device with latency: when the worker last finished a command or a hang (mono)

	// rec holds the watermarks, failures and waiters. Waiters spin
	// briefly on the retired watermark, then sleep until the worker's
	// Advance (or markDead's Wake) wakes them; with nobody asleep,
	// retiring costs two atomic operations.
	rec retire.Record
	// dead is set under mu when the device is lost; retired never moves
	// after that. Lock-free readers load dead before retired (see Retired).
	dead atomic.Bool

	mu      sync.Mutex
	held    uint64 // the last command the worker took (its slot is cur)
	cur     *slot  // the slot of held, in the ring it was taken from
	closing bool   // Close was called: no more submissions
	closed  bool   // Close finished
}

var (
	_ hw.Stream  = (*Stream)(nil)
	_ hw.Retirer = (*Stream)(nil)
)

func newStream(d *Device, id uint64) *Stream {
	s := &Stream{
		dev:  d,
		id:   id,
		name: "sim:" + d.name + "/stream" + strconv.FormatUint(id, 10),
		ring: make([]slot, d.initDepth),
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	s.launch.dev = d
	return s
}

// Device is the stream's device.
func (s *Stream) Device() hw.Device { return s.dev }

// String names the stream, for messages.
func (s *Stream) String() string { return s.name }

// Submitted reports how many commands have been accepted.
func (s *Stream) Submitted() uint64 { return s.rec.Submitted() }

// RetiredCount reports how many commands the worker has retired,
// successfully or not. Commands failed by a device loss are not counted.
func (s *Stream) RetiredCount() uint64 { return s.rec.Retired() }

// Inject injects a fault into this stream only (FailVisibility and Lose
// concern the whole device). See [Device.Inject] for release.
func (s *Stream) Inject(f Fault) (release func()) {
	return s.dev.inject(&s.faults, f)
}

func (s *Stream) errorf(class error, format string, args ...any) error {
	return errdefs.Errorf(class, "sim: %s: "+format, append([]any{s}, args...)...)
}

// Submit copies cmd into the queue. The program must be a [*Program] of
// this device, there may be at most [hw.MaxArgs] arguments, and every
// buffer argument must be a [*Buffer] of this device (a [Shared] view
// counts) with 0 ≤ Offset, 0 ≤ Length and Offset+Length ≤ Size. A program
// of the op library (hw/internal/ops) is also checked against its op's
// contract (counts, lengths, dims, overlaps) here, before it is enqueued.
//
// # Errors
//
// [errdefs.ErrInvalidArgument] for a malformed command (naming the argument,
// and for an op the op: "sim: …: softmax: x has 4,096 values, rows*cols =
// 4,097");
// [errdefs.ErrClosed] for a freed buffer or a closed stream; [errdefs.ErrDeviceLost]
// once the device is lost; [errdefs.ErrRejected] for an injected rejection;
// [errdefs.ErrBusy] when the queue is full.
func (s *Stream) Submit(cmd *hw.Command) (hw.Completion, error) {
	if err := s.dev.Err(); err != nil {
		return hw.Completion{}, err
	}
	if cmd == nil {
		return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "nil command")
	}
	p, ok := cmd.Program.(*Program)
	if !ok || p == nil {
		return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "program %v is not a sim program", cmd.Program)
	}
	if p.dev != s.dev {
		return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "program %q was prepared for device %q", p.name, p.dev.name)
	}
	n := len(cmd.Args)
	if n > hw.MaxArgs {
		return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "%d arguments, at most %d allowed", n, hw.MaxArgs)
	}
	for i := range cmd.Args {
		if err := s.checkArg(i, &cmd.Args[i]); err != nil {
			unpinArgs(cmd.Args[:i])
			return hw.Completion{}, err
		}
	}
	if p.check != nil {
		if err := p.check(cmd.Args); err != nil {
			unpinArgs(cmd.Args)
			return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "%w", err)
		}
	}
	s.mu.Lock()
	seq, err := s.admitLocked()
	if err != nil {
		s.mu.Unlock()
		unpinArgs(cmd.Args)
		return hw.Completion{}, err
	}
	sl := &s.ring[seq%uint64(len(s.ring))]
	sl.kind = opLaunch
	sl.prog = p
	sl.nargs = n
	copy(sl.args[:n], cmd.Args)
	sl.grid = cmd.Grid
	sl.dl = cmd.Deadline
	if s.dev.latency > 0 {
		sl.at = mono()
	}
	s.commitLocked(seq)
	return hw.NewCompletion(s, seq), nil
}

// checkArg validates argument i and, for a buffer, pins its memory.
func (s *Stream) checkArg(i int, a *hw.Arg) error {
	if a.Buffer == nil {
		return nil
	}
	b, ok := a.Buffer.(*Buffer)
	if !ok || b == nil {
		return s.errorf(errdefs.ErrInvalidArgument, "argument %d: buffer %v is not a sim buffer", i, a.Buffer)
	}
	if b.dev != s.dev {
		return s.errorf(errdefs.ErrInvalidArgument, "argument %d: buffer belongs to device %q", i, b.dev.name)
	}
	if size := len(b.region.mem); a.Offset < 0 || a.Length < 0 || a.Offset > size || a.Length > size-a.Offset {
		return s.errorf(errdefs.ErrInvalidArgument, "argument %d: range offset %d length %d outside buffer of %d bytes", i, a.Offset, a.Length, size)
	}
	if !b.region.pin() {
		return s.errorf(errdefs.ErrClosed, "argument %d: buffer used after free", i)
	}
	return nil
}

// unpinArgs drops the pins taken by checkArg.
func unpinArgs(args []hw.Arg) {
	for i := range args {
		if b, ok := args[i].Buffer.(*Buffer); ok {
			b.region.unpin()
		}
	}
}

// Write enqueues a copy of src into dst at byte offset off. src must not
// change until the completion retires. Errors are as for [Stream.Submit].
func (s *Stream) Write(dst hw.Buffer, off int, src []byte) (hw.Completion, error) {
	return s.transfer(opWrite, dst, off, src)
}

// Read enqueues a copy of src's bytes at offset off into dst. dst must not
// be touched until the completion retires. Errors are as for
// [Stream.Submit].
func (s *Stream) Read(src hw.Buffer, off int, dst []byte) (hw.Completion, error) {
	return s.transfer(opRead, src, off, dst)
}

func (s *Stream) transfer(kind opKind, buf hw.Buffer, off int, host []byte) (hw.Completion, error) {
	if err := s.dev.Err(); err != nil {
		return hw.Completion{}, err
	}
	a := hw.Arg{Buffer: buf, Offset: off, Length: len(host)}
	if buf == nil {
		return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "argument 0: nil buffer")
	}
	if err := s.checkArg(0, &a); err != nil {
		return hw.Completion{}, err
	}
	b := buf.(*Buffer) // checked by checkArg
	s.mu.Lock()
	seq, err := s.admitLocked()
	if err != nil {
		s.mu.Unlock()
		b.region.unpin()
		return hw.Completion{}, err
	}
	sl := &s.ring[seq%uint64(len(s.ring))]
	sl.kind = kind
	sl.buf = b
	sl.off = off
	sl.host = host
	if s.dev.latency > 0 {
		sl.at = mono()
	}
	s.commitLocked(seq)
	if kind == opWrite {
		s.dev.uploads.Add(1)
		s.dev.uploadBytes.Add(uint64(len(host)))
	}
	return hw.NewCompletion(s, seq), nil
}

// admitLocked decides, under mu, whether one more command may be queued,
// and returns its sequence number.
func (s *Stream) admitLocked() (uint64, error) {
	switch {
	case s.closing:
		return 0, s.errorf(errdefs.ErrClosed, "stream closed")
	case s.dead.Load():
		return 0, s.dev.Err()
	case take(&s.faults.reject) || take(&s.dev.faults.reject):
		return 0, s.errorf(errdefs.ErrRejected, "submission rejected (injected fault)")
	}
	sub := s.rec.Submitted()
	if sub-s.rec.Retired() >= uint64(len(s.ring)) {
		if len(s.ring) >= s.dev.depth {
			return 0, s.errorf(errdefs.ErrBusy, "queue full (%d commands)", s.dev.depth)
		}
		s.growLocked(len(s.ring) + 1)
	}
	return sub + 1, nil
}

// growLocked replaces the ring, under mu, by one of at least n slots
// (doubling, at most the queue depth; n must not exceed it). The queued
// commands' slots move to their places in the new ring, except the one the
// worker holds, which stays where the worker reads it; the new ring's slot
// for it stays empty, and abandonLocked releases it through cur.
func (s *Stream) growLocked(n int) {
	size := len(s.ring)
	for size < n {
		size *= 2
	}
	size = min(size, s.dev.depth)
	ring := make([]slot, size)
	old, oldLen, newLen := s.ring, uint64(len(s.ring)), uint64(size)
	for seq := max(s.rec.Retired(), s.held) + 1; seq <= s.rec.Submitted(); seq++ {
		sl := &old[seq%oldLen]
		ring[seq%newLen] = *sl
		*sl = slot{} // the old ring keeps nothing alive
	}
	s.ring = ring
}

// commitLocked publishes the filled slot seq, releases mu and wakes the
// worker.
func (s *Stream) commitLocked(seq uint64) {
	s.rec.SetSubmitted(seq)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// run is the worker goroutine: it executes commands in order until the
// stream is closed and drained, or the device is lost.
func (s *Stream) run() {
	defer close(s.done)
	for {
		seq, sl, ok := s.next()
		if !ok {
			return
		}
		if !s.awaitHangs() || !s.awaitLatency(sl) {
			continue // lost: next abandons the queue and stops
		}
		err := s.execute(sl, seq)
		if s.dev.latency > 0 {
			s.free = mono() // the next command's latency starts no earlier
		}
		s.release(sl)
		s.retire(seq, err)
	}
}

// next blocks until there is a command to run and returns its sequence
// number and slot, which the worker holds until it retires the command
// (the ring may grow meanwhile: see growLocked), or returns false when the
// worker must stop: the stream is closed and drained, or the device is
// lost (the queue is then abandoned).
func (s *Stream) next() (uint64, *slot, bool) {
	for {
		s.mu.Lock()
		if s.dead.Load() {
			s.abandonLocked()
			s.mu.Unlock()
			return 0, nil, false
		}
		if r := s.rec.Retired(); r < s.rec.Submitted() {
			seq := r + 1
			s.held, s.cur = seq, &s.ring[seq%uint64(len(s.ring))]
			s.mu.Unlock()
			return seq, s.cur, true
		}
		if s.closing {
			s.mu.Unlock()
			return 0, nil, false
		}
		s.mu.Unlock()
		select {
		case <-s.wake:
		case <-s.dev.lostCh:
		}
	}
}

// awaitHangs blocks while a stream or device Hang is in force. It returns
// false if the device is lost meanwhile.
func (s *Stream) awaitHangs() bool {
	for {
		h := s.faults.firstHang()
		if h == nil {
			h = s.dev.faults.firstHang()
		}
		if h == nil {
			return true
		}
		select {
		case <-h.ch:
			if s.dev.latency > 0 {
				s.free = mono() // a hang is not latency
			}
		case <-s.dev.lostCh:
			return false
		}
	}
}

// Latencies are spun out on the monotonic clock: a Go timer or time.Sleep
// fires about 1.1 ms late at best on Linux when the runtime has nothing
// else to wake for (measured on a 2-vCPU VM: a 10 µs sleep takes 1.07 ms,
// longer ones overshoot by 0.1 to 1 ms), which made every sub-millisecond
// latency cost about 1.1 ms. A command with spinBelow or more left to wait
// sleeps until spinTail before its end and spins the rest, so it burns at
// most spinTail of CPU. See "Precise sim latency" in RATIONALE.md.
const (
	spinBelow = 2 * time.Millisecond
	spinTail  = time.Millisecond
)

// awaitLatency spends the device's simulated latency for the command in
// sl. Its latency started when it was submitted, or when the worker
// finished the command before it (or a hang), whichever was later: the
// worker's own wake-up does not add to it. It spins on the monotonic
// clock, yielding the processor at each round, after sleeping on a
// reusable timer through the bulk of a long wait. A device loss interrupts
// it: it returns false then.
func (s *Stream) awaitLatency(sl *slot) bool {
	lat := s.dev.latency
	if lat <= 0 {
		return true
	}
	end := max(sl.at, s.free) + int64(lat)
	if left := time.Duration(end - mono()); left >= spinBelow && !s.sleep(left-spinTail) {
		return false
	}
	for mono() < end {
		if s.dev.lost.Load() != nil {
			return false
		}
		runtime.Gosched()
	}
	return true
}

// sleep waits d on the worker's reusable timer; it returns false if the
// device is lost meanwhile.
func (s *Stream) sleep(d time.Duration) bool {
	if s.timer == nil {
		s.timer = time.NewTimer(d)
	} else {
		s.timer.Reset(d) // Go ≥ 1.23 timers: no stale tick can be pending
	}
	select {
	case <-s.timer.C:
		return true
	case <-s.dev.lostCh:
		s.timer.Stop()
		return false
	}
}

// execute runs the command in sl and returns its error.
func (s *Stream) execute(sl *slot, seq uint64) error {
	if take(&s.faults.failCompletion) || take(&s.dev.faults.failCompletion) {
		return s.errorf(errdefs.ErrFault, "command %d failed (injected fault)", seq)
	}
	switch sl.kind {
	case opWrite:
		copy(sl.buf.region.mem[sl.off:], sl.host)
	case opRead:
		copy(sl.host, sl.buf.region.mem[sl.off:])
	case opLaunch:
		return s.runKernel(sl, seq)
	}
	return nil
}

// runKernel calls the kernel with the stream's reused Launch, turning a
// kernel error or panic into an ErrFault error.
func (s *Stream) runKernel(sl *slot, seq uint64) (err error) {
	l := &s.launch
	l.prog = sl.prog
	l.args = sl.args[:sl.nargs]
	l.grid = sl.grid
	l.deadline = sl.dl
	defer func() {
		l.args, l.deadline = nil, time.Time{}
		if r := recover(); r != nil {
			if le, ok := r.(launchError); ok {
				err = s.errorf(errdefs.ErrFault, "command %d: %w", seq, le.err)
			} else {
				err = s.errorf(errdefs.ErrFault, "command %d: kernel %q panicked: %v", seq, sl.prog.name, r)
			}
		}
	}()
	if kerr := sl.prog.kernel(l); kerr != nil {
		return s.errorf(errdefs.ErrFault, "command %d: kernel %q: %w", seq, sl.prog.name, kerr)
	}
	return nil
}

// release unpins the memory sl references and clears it, so the ring
// keeps nothing alive. Only the worker calls it, on a slot it owns.
func (s *Stream) release(sl *slot) {
	switch sl.kind {
	case opLaunch:
		unpinArgs(sl.args[:sl.nargs])
		clear(sl.args[:sl.nargs])
		sl.prog, sl.dl = nil, time.Time{}
	case opWrite, opRead:
		sl.buf.region.unpin()
		sl.buf = nil
		sl.host = nil
	}
	sl.kind = opNone
}

// retire records the result of command seq and wakes the waiters. After a
// device loss it does nothing: the command failed with the loss.
func (s *Stream) retire(seq uint64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead.Load() {
		return
	}
	if err != nil {
		s.rec.Fail(seq, err)
	}
	s.rec.Advance(seq)
}

// markDead is called by Device.Lose with d.mu held: from now on retired
// never moves and every unretired command reports the loss.
func (s *Stream) markDead() {
	s.mu.Lock()
	s.dead.Store(true)
	s.rec.Wake()
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// abandonLocked releases every command still in the ring after a loss.
// The worker calls it once it has stopped running kernels, so nothing
// touches their memory any more.
func (s *Stream) abandonLocked() {
	if s.cur != nil {
		s.release(s.cur) // a no-op if the worker released it already
		s.cur = nil
	}
	size := uint64(len(s.ring))
	for seq := s.rec.Retired() + 1; seq <= s.rec.Submitted(); seq++ {
		s.release(&s.ring[seq%size])
	}
}

// Retired reports without blocking whether command seq has retired, and
// with what error. A command that had not retired when the device was
// lost reports the loss.
func (s *Stream) Retired(seq uint64) (bool, error) {
	// lostErr loads dead before State loads retired: once dead is set
	// retired is frozen, so a reader that saw dead also sees the final
	// watermark and the answer never changes from "lost" to "succeeded".
	return s.rec.State(seq, s.lostErr())
}

// lostErr is the device's loss once this stream is marked dead, else nil.
func (s *Stream) lostErr() error {
	if s.dead.Load() {
		return s.dev.Err()
	}
	return nil
}

// WaitRetired blocks until command seq retires and returns its error, or
// until the device is lost (an [errdefs.ErrDeviceLost] error) or ctx ends (an
// [errdefs.ErrDeadlineExceeded] error). A seq never handed out is an
// [errdefs.ErrInvalidArgument] error.
func (s *Stream) WaitRetired(ctx context.Context, seq uint64) error {
	if done, err := s.Retired(seq); done {
		return err
	}
	if seq > s.rec.Submitted() {
		return s.errorf(errdefs.ErrInvalidArgument, "command %d was never submitted", seq)
	}
	if err := s.waitFor(ctx, seq); err != nil {
		return err
	}
	return s.rec.FailureOf(seq)
}

// waitFor blocks until every command up to seq has retired (nil), the
// device is lost, or ctx ends.
func (s *Stream) waitFor(ctx context.Context, seq uint64) error {
	return s.rec.Wait(ctx, seq, s.lostErr, s.dev.lostCh, "sim", s.name)
}

// Idle reports whether every command submitted so far has retired (a lost
// device's stream is idle: its commands all failed).
func (s *Stream) Idle() bool { return s.rec.Idle(s.lostErr()) }

// Sync waits until every command submitted so far has retired and returns
// the first failure among them that no earlier Sync returned (each failure
// is returned by Sync once), an [errdefs.ErrDeviceLost] error if the device is
// or gets lost, or an [errdefs.ErrDeadlineExceeded] error if ctx ends first.
// Sync on a closed stream returns an [errdefs.ErrClosed] error.
func (s *Stream) Sync(ctx context.Context) error {
	if err := s.dev.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return s.errorf(errdefs.ErrClosed, "stream closed")
	}
	return s.drain(ctx)
}

func (s *Stream) drain(ctx context.Context) error {
	return s.rec.Sync(ctx, s.waitFor, s.lostErr)
}

// Close stops accepting commands (later submissions fail with
// [errdefs.ErrClosed]), waits for the queue to drain as [Stream.Sync] does, and
// stops the worker. It returns what that Sync would. If ctx ends first it
// returns an [errdefs.ErrDeadlineExceeded] error, the stream stays closing and
// Close may be called again. On a lost device Close returns the loss error
// at once, but still releases the stream. Closing a closed stream returns
// an [errdefs.ErrClosed] error. Completions of a closed stream keep working.
func (s *Stream) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.errorf(errdefs.ErrClosed, "stream closed twice")
	}
	s.closing = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}: // an idle worker must notice closing
	default:
	}
	err := s.drain(ctx)
	if s.dev.Err() == nil {
		if err != nil && errdefs.ClassOf(err) == errdefs.ErrDeadlineExceeded {
			return err
		}
		// Drained: the worker exits as soon as it sees closing.
		select {
		case <-s.done:
		case <-s.dev.lostCh:
		case <-ctx.Done():
			return errdefs.ContextError(ctx, fmt.Sprintf("sim: %s: closing", s))
		}
	}
	if lost := s.dev.Err(); lost != nil {
		err = lost
	}
	s.mu.Lock()
	if s.closed { // a concurrent Close finished first
		s.mu.Unlock()
		return s.errorf(errdefs.ErrClosed, "stream closed twice")
	}
	s.closed = true
	s.mu.Unlock()
	s.dev.removeStream(s)
	return err
}

var _ hw.BatchSubmitter = (*Stream)(nil)

// SubmitBatch enqueues cmds in order, contiguously and all or nothing: it
// validates every command as [Stream.Submit] does, then takes queue slots
// for all of them at once (or fails with [errdefs.ErrBusy], enqueuing nothing).
// The returned completion is the last command's; like the others, each
// command's failure is reported by Sync.
func (s *Stream) SubmitBatch(cmds []hw.Command) (hw.Completion, error) {
	if err := s.dev.Err(); err != nil {
		return hw.Completion{}, err
	}
	if len(cmds) == 0 {
		return hw.Completion{}, nil
	}
	if len(cmds) > s.dev.depth {
		return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "batch of %d commands exceeds the queue depth %d", len(cmds), s.dev.depth)
	}
	unpinUpTo := func(n int) {
		for i := range n {
			unpinArgs(cmds[i].Args)
		}
	}
	for i := range cmds {
		cmd := &cmds[i]
		p, ok := cmd.Program.(*Program)
		switch {
		case !ok || p == nil:
			unpinUpTo(i)
			return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "command %d: program %v is not a sim program", i, cmd.Program)
		case p.dev != s.dev:
			unpinUpTo(i)
			return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "command %d: program %q was prepared for device %q", i, p.name, p.dev.name)
		case len(cmd.Args) > hw.MaxArgs:
			unpinUpTo(i)
			return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "command %d: %d arguments, at most %d allowed", i, len(cmd.Args), hw.MaxArgs)
		}
		for j := range cmd.Args {
			if err := s.checkArg(j, &cmd.Args[j]); err != nil {
				unpinArgs(cmd.Args[:j])
				unpinUpTo(i)
				return hw.Completion{}, fmt.Errorf("command %d: %w", i, err)
			}
		}
		if p.check != nil {
			if err := p.check(cmd.Args); err != nil {
				unpinUpTo(i + 1)
				return hw.Completion{}, s.errorf(errdefs.ErrInvalidArgument, "command %d: %w", i, err)
			}
		}
	}
	s.mu.Lock()
	first, err := s.admitLocked()
	if err == nil {
		switch need := s.rec.Submitted() + uint64(len(cmds)) - s.rec.Retired(); {
		case need > uint64(s.dev.depth):
			err = s.errorf(errdefs.ErrBusy, "queue cannot take a batch of %d commands now", len(cmds))
		case need > uint64(len(s.ring)):
			s.growLocked(int(need))
		}
	}
	if err != nil {
		s.mu.Unlock()
		unpinUpTo(len(cmds))
		return hw.Completion{}, err
	}
	var at int64
	if s.dev.latency > 0 {
		at = mono()
	}
	for i := range cmds {
		sl := &s.ring[(first+uint64(i))%uint64(len(s.ring))]
		sl.kind = opLaunch
		sl.prog = cmds[i].Program.(*Program)
		sl.nargs = len(cmds[i].Args)
		copy(sl.args[:sl.nargs], cmds[i].Args)
		sl.grid = cmds[i].Grid
		sl.dl = cmds[i].Deadline
		sl.at = at
	}
	last := first + uint64(len(cmds)) - 1
	s.commitLocked(last)
	return hw.NewCompletion(s, last), nil
}
