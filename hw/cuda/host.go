package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// HostDeviceName is the name of the platform's host device.
const HostDeviceName = "host0"

// HostProgram is a program for the host device: Go code run on a host
// stream's worker goroutine, in submission order. It reads its arguments
// through l, which is valid only until it returns; slices obtained from l
// must not be kept either.
//
// A returned error (or a panic) retires the command with an [errdefs.ErrFault]
// error that wraps it; the device stays healthy. A program that may run
// for long (a resident participant polling shared memory, for instance)
// must watch [HostLaunch.Lost] and return once it is closed.
type HostProgram func(l *HostLaunch) error

var hostRegistry struct {
	sync.RWMutex
	m map[string]HostProgram
}

// RegisterHostProgram adds a program under name to the process-wide
// registry that [HostDevice.Prepare] looks programs up in, as GPU kernels
// are looked up by name. It is meant for init functions and panics on an
// empty name, a nil program or a name registered before.
func RegisterHostProgram(name string, fn HostProgram) {
	if name == "" || fn == nil {
		panic("cuda: RegisterHostProgram: empty name or nil program")
	}
	hostRegistry.Lock()
	defer hostRegistry.Unlock()
	if hostRegistry.m == nil {
		hostRegistry.m = make(map[string]HostProgram)
	}
	if _, dup := hostRegistry.m[name]; dup {
		panic(fmt.Sprintf("cuda: RegisterHostProgram: %q registered twice", name))
	}
	hostRegistry.m[name] = fn
}

// HostPrograms lists the registered host program names, sorted.
func HostPrograms() []string {
	hostRegistry.RLock()
	defer hostRegistry.RUnlock()
	names := make([]string, 0, len(hostRegistry.m))
	for n := range hostRegistry.m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func init() {
	RegisterHostProgram("noop", func(*HostLaunch) error { return nil })
	RegisterHostProgram("spin", hostSpin)
}

// hostSpin is the host twin of the GPU's spin kernel: (buf, off, want)
// polls the uint32 at byte off of buf with acquire loads until it equals
// want, or the host device is lost.
func hostSpin(l *HostLaunch) error {
	if len(l.args) != 3 || l.args[0].Buffer == nil || l.args[1].Buffer != nil || l.args[2].Buffer != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: host spin takes (buffer, offset, value)")
	}
	b, off, want := l.Bytes(0), l.Uint(1), uint32(l.Uint(2))
	if len(b) < 4 || off > uint64(len(b)-4) || uintptr(unsafe.Pointer(&b[off]))%4 != 0 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: host spin: word at %d outside a %d-byte range or unaligned", off, len(b))
	}
	w := (*uint32)(unsafe.Pointer(&b[off]))
	for i := 0; atomic.LoadUint32(w) != want; i++ {
		if i%64 == 63 {
			select {
			case <-l.dev.lostCh:
				return l.dev.Err()
			default:
			}
			runtime.Gosched()
		}
	}
	return nil
}

// HostLaunch is one running host program: its device and arguments.
type HostLaunch struct {
	dev  *HostDevice
	args []hw.Arg
	grid [3]uint32
}

// Device is the host device.
func (l *HostLaunch) Device() *HostDevice { return l.dev }

// Args are the command's arguments (validated at submission: buffers are
// the host device's and their ranges lie inside them).
func (l *HostLaunch) Args() []hw.Arg { return l.args }

// Grid is the command's Grid.
func (l *HostLaunch) Grid() [3]uint32 { return l.grid }

// Lost is closed when the host device is lost; long-running programs must
// return once it is.
func (l *HostLaunch) Lost() <-chan struct{} { return l.dev.lostCh }

// Bytes returns the memory of buffer argument i's range (nil when the
// argument is a scalar or i is out of range). For a view of a shared
// allocation it is the pinned host mapping the GPUs see too.
func (l *HostLaunch) Bytes(i int) []byte {
	if i < 0 || i >= len(l.args) {
		return nil
	}
	a := l.args[i]
	hb, ok := a.Buffer.(*hostBuffer)
	if !ok {
		return nil
	}
	return hb.mem[a.Offset : a.Offset+a.Length : a.Offset+a.Length]
}

// Uint returns scalar argument i (0 when it is a buffer or out of range).
func (l *HostLaunch) Uint(i int) uint64 {
	if i < 0 || i >= len(l.args) || l.args[i].Buffer != nil {
		return 0
	}
	return l.args[i].Value
}

// Float32 returns scalar argument i as a float32 (see [hw.Float32]).
func (l *HostLaunch) Float32(i int) float32 {
	return hw.Arg{Value: l.Uint(i)}.Float32Value()
}

// HostDevice is the platform's CPU device, named "host0"
// ([hw.EngineCPU]). It stands in for an NPU on machines without one: its
// streams run registered Go programs ([RegisterHostProgram]) in order on a
// worker goroutine, over host memory. Its buffers are Go memory; a view of
// a shared allocation ([Platform.AllocShared] listing it) is the same
// pinned, device-mapped memory the GPUs access, so a host program and a
// GPU kernel can exchange data through it. It implements [hw.Device].
//
// The host device is lost only by [HostDevice.Lose]: a GPU's loss does
// not affect it, nor does a failing program.
type HostDevice struct {
	plat *Platform

	lost     atomic.Pointer[error]
	lostOnce sync.Once
	lostCh   chan struct{}

	live    atomic.Int64
	closed  atomic.Bool
	freeGen atomic.Uint64

	streamsMu sync.Mutex
	streams   map[*HostStream]struct{}
}

var _ hw.Device = (*HostDevice)(nil)

func newHostDevice(p *Platform) *HostDevice {
	return &HostDevice{plat: p, lostCh: make(chan struct{}), streams: make(map[*HostStream]struct{})}
}

// Name is "host0".
func (d *HostDevice) Name() string { return HostDeviceName }

// Engine is [hw.EngineCPU].
func (d *HostDevice) Engine() hw.Engine { return hw.EngineCPU }

// Err is nil until [HostDevice.Lose].
func (d *HostDevice) Err() error {
	if p := d.lost.Load(); p != nil {
		return *p
	}
	return nil
}

func (d *HostDevice) usable() error {
	if d.closed.Load() {
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: %s is closed", HostDeviceName)
	}
	return d.Err()
}

// Lose marks the host device lost with cause: every pending and later
// call fails with [errdefs.ErrDeviceLost], waits return at once and running
// programs see [HostLaunch.Lost] closed. (Tests use it to stop parked
// programs; nothing in the backend calls it.)
func (d *HostDevice) Lose(cause string) {
	d.lostOnce.Do(func() {
		err := errdefs.Errorf(errdefs.ErrDeviceLost, "cuda: %s lost: %s", HostDeviceName, cause)
		d.lost.Store(&err)
		close(d.lostCh)
	})
}

// Prepare looks up a registered host program.
func (d *HostDevice) Prepare(name string) (hw.Program, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	hostRegistry.RLock()
	fn, ok := hostRegistry.m[name]
	hostRegistry.RUnlock()
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "cuda: %s: no host program %q", HostDeviceName, name)
	}
	return &hostProgram{dev: d, name: name, fn: fn}, nil
}

// Alloc allocates size zeroed bytes of Go memory, charging budget. Every
// host buffer is host-visible, so [hw.AllocHostVisible] is accepted and
// changes nothing.
func (d *HostDevice) Alloc(size int, flags hw.AllocFlags, budget *hw.Budget) (hw.Buffer, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: allocation of %d bytes", HostDeviceName, size)
	}
	if flags&^hw.AllocHostVisible != 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: unknown allocation flags %#x", HostDeviceName, uint32(flags))
	}
	if err := budget.Charge(int64(size)); err != nil {
		return nil, err
	}
	d.live.Add(1)
	return &hostBuffer{dev: d, mem: make([]byte, size), budget: budget}, nil
}

// Close releases the device. Streams and buffers must be closed first
// ([errdefs.ErrBusy] otherwise); closing twice returns [errdefs.ErrClosed].
func (d *HostDevice) Close() error {
	if n := d.live.Load(); n > 0 {
		return errdefs.Errorf(errdefs.ErrBusy, "cuda: %s: %d stream(s) or allocation(s) still open", HostDeviceName, n)
	}
	if !d.closed.CompareAndSwap(false, true) {
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: %s is already closed", HostDeviceName)
	}
	return nil
}

// snapshot: see Device.snapshot.
func (d *HostDevice) snapshot(out []pendingWork) []pendingWork {
	d.streamsMu.Lock()
	defer d.streamsMu.Unlock()
	for s := range d.streams {
		s.submitMu.Lock()
		seq := s.rec.Submitted()
		s.submitMu.Unlock()
		if seq > s.rec.Retired() {
			out = append(out, pendingWork{quiescer{s}, seq})
		}
	}
	return out
}

// quiescer waits until a host stream's worker has really finished command
// seq, even on a lost device (where a program still running may touch its
// memory until it notices the loss): memory is released only then. A
// program that ignores the loss keeps its memory for good.
type quiescer struct{ s *HostStream }

func (q quiescer) wait(ctx context.Context, seq uint64) error {
	if !q.s.rec.Quiesce(ctx, seq, time.Millisecond) {
		return errdefs.ContextError(ctx, "cuda: host0: waiting for a stream to go quiet")
	}
	return nil
}

type hostProgram struct {
	dev  *HostDevice
	name string
	fn   HostProgram
}

func (p *hostProgram) Name() string      { return p.name }
func (p *hostProgram) Device() hw.Device { return p.dev }

// hostBuffer is host memory of the host device: Go memory from Alloc, or
// a view of a shared allocation (mem is then its pinned mapping).
type hostBuffer struct {
	dev    *HostDevice
	mem    []byte
	budget *hw.Budget
	freed  atomic.Bool
	shared *sharedMem // non-nil for views
}

var _ hw.Buffer = (*hostBuffer)(nil)

func (b *hostBuffer) Device() hw.Device { return b.dev }
func (b *hostBuffer) Size() int         { return len(b.mem) }

func (b *hostBuffer) isFreed() bool {
	if b.shared != nil {
		return b.shared.freed.Load()
	}
	return b.freed.Load()
}

// HostBytes returns the buffer's memory.
func (b *hostBuffer) HostBytes() ([]byte, error) {
	if b.isFreed() {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "cuda: buffer was freed")
	}
	return b.mem, nil
}

// Free releases the buffer once the host work queued before it retired;
// later commands using it fail with [errdefs.ErrClosed]. Freeing a shared view
// is a no-op.
func (b *hostBuffer) Free() error {
	if b.shared != nil {
		return nil
	}
	if !b.freed.CompareAndSwap(false, true) {
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: buffer freed twice")
	}
	d := b.dev
	d.freeGen.Add(1)
	afterQueued([]queueOwner{d}, func() {
		b.budget.Release(int64(len(b.mem)))
		d.live.Add(-1)
	})
	return nil
}

type hostOpKind uint8

const (
	hostLaunch hostOpKind = iota + 1
	hostCopy
	hostMarker
)

// hostOp is one queued host command, copied by value into the queue.
type hostOp struct {
	kind  hostOpKind
	seq   uint64
	prog  *hostProgram
	nargs int
	args  [hw.MaxArgs]hw.Arg
	grid  [3]uint32
	dst   []byte
	src   []byte
}

// HostStream is an ordered queue of host programs and copies on the host
// device, run by one worker goroutine. It keeps the semantics of the GPU
// streams: sequence-numbered completions read from cached state, Idle
// without progress, Sync reporting each failure once, waits bounded by a
// context and ended by device loss. It implements [hw.Stream] and
// [hw.Retirer].
type HostStream struct {
	dev  *HostDevice
	ops  chan hostOp
	quit chan struct{}
	done chan struct{}

	submitMu   sync.Mutex
	closing    bool
	final      bool
	retirement // submitted/retired watermarks, failures, waiters

	errBusy error

	launch HostLaunch // reused by the worker
}

var (
	_ hw.Stream  = (*HostStream)(nil)
	_ hw.Retirer = (*HostStream)(nil)
)

// NewStream creates a host stream and its worker goroutine.
func (d *HostDevice) NewStream() (hw.Stream, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	depth := d.plat.cfg.queueDepth
	if depth <= 0 {
		depth = DefaultQueueDepth
	}
	s := &HostStream{
		dev: d, ops: make(chan hostOp, depth), quit: make(chan struct{}), done: make(chan struct{}),
		retirement: newRetirement(),
	}
	s.launch.dev = d
	s.errBusy = errdefs.Errorf(errdefs.ErrBusy, "cuda: %s: stream queue full (%d commands)", HostDeviceName, depth)
	d.streamsMu.Lock()
	d.streams[s] = struct{}{}
	d.streamsMu.Unlock()
	d.live.Add(1)
	go s.run()
	return s, nil
}

// Device is the host device.
func (s *HostStream) Device() hw.Device { return s.dev }

// hostBufferOf validates that b is a live host buffer; arg is the
// argument's index for messages, or -1 for a copy's buffer.
func (d *HostDevice) hostBufferOf(b hw.Buffer, arg int) (*hostBuffer, error) {
	what := "copy"
	hb, ok := b.(*hostBuffer)
	if !ok || hb.dev != d || hb.isFreed() {
		if arg >= 0 {
			what = fmt.Sprintf("argument %d", arg)
		}
	}
	switch {
	case !ok:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: buffer %T is not a %s buffer", what, b, HostDeviceName)
	case hb.dev != d:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: buffer of another platform's host device", what)
	case hb.isFreed():
		return nil, errdefs.Errorf(errdefs.ErrClosed, "cuda: %s: buffer was freed", what)
	}
	return hb, nil
}

// Submit validates cmd (a host program of this device, at most
// [hw.MaxArgs] arguments, buffers of the host device with their ranges
// inside them) and enqueues it. Programs check their own argument
// conventions when they run. It allocates nothing.
func (s *HostStream) Submit(cmd *hw.Command) (hw.Completion, error) {
	if cmd == nil || cmd.Program == nil {
		return hw.Completion{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: command has no program")
	}
	prog, ok := cmd.Program.(*hostProgram)
	if !ok || prog.dev != s.dev {
		return hw.Completion{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: program %q is not a program of %s", cmd.Program.Name(), HostDeviceName)
	}
	if len(cmd.Args) > hw.MaxArgs {
		return hw.Completion{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %d arguments, at most %d", len(cmd.Args), hw.MaxArgs)
	}
	gen := s.dev.freeGen.Load()
	o := hostOp{kind: hostLaunch, prog: prog, nargs: len(cmd.Args), grid: cmd.Grid}
	for i, a := range cmd.Args {
		if a.Buffer != nil {
			hb, err := s.dev.hostBufferOf(a.Buffer, i)
			if err != nil {
				return hw.Completion{}, err
			}
			if err := checkRange(i, a.Offset, a.Length, len(hb.mem)); err != nil {
				return hw.Completion{}, err
			}
		}
		o.args[i] = a
	}
	return s.enqueue(&o, gen)
}

// Write enqueues a copy of src into dst at off. src must stay unchanged
// until the completion retires.
func (s *HostStream) Write(dst hw.Buffer, off int, src []byte) (hw.Completion, error) {
	return s.copyOp("write", dst, off, src, true)
}

// Read enqueues a copy of src at off into dst. dst must not be touched
// until the completion retires.
func (s *HostStream) Read(src hw.Buffer, off int, dst []byte) (hw.Completion, error) {
	return s.copyOp("read", src, off, dst, false)
}

func (s *HostStream) copyOp(what string, b hw.Buffer, off int, host []byte, write bool) (hw.Completion, error) {
	gen := s.dev.freeGen.Load()
	hb, err := s.dev.hostBufferOf(b, -1)
	if err != nil {
		return hw.Completion{}, err
	}
	if off < 0 || off > len(hb.mem) || len(host) > len(hb.mem)-off {
		return hw.Completion{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: range [%d,+%d) outside buffer of %d bytes", what, off, len(host), len(hb.mem))
	}
	o := hostOp{kind: hostMarker}
	if len(host) > 0 {
		o.kind = hostCopy
		o.args[0] = hw.Arg{Buffer: hb}
		o.nargs = 1
		if write {
			o.dst, o.src = hb.mem[off:off+len(host)], host
		} else {
			o.dst, o.src = host, hb.mem[off:off+len(host)]
		}
	}
	return s.enqueue(&o, gen)
}

func (s *HostStream) enqueue(o *hostOp, gen uint64) (hw.Completion, error) {
	s.submitMu.Lock()
	defer s.submitMu.Unlock()
	if s.closing {
		return hw.Completion{}, errdefs.Errorf(errdefs.ErrClosed, "cuda: %s: stream is closed", HostDeviceName)
	}
	if err := s.dev.Err(); err != nil {
		return hw.Completion{}, err
	}
	if s.dev.freeGen.Load() != gen {
		for i := range o.nargs {
			if hb, ok := o.args[i].Buffer.(*hostBuffer); ok && hb.isFreed() {
				return hw.Completion{}, errdefs.Errorf(errdefs.ErrClosed, "cuda: argument %d: buffer was freed", i)
			}
		}
	}
	seq := s.rec.Submitted() + 1
	o.seq = seq
	select {
	case s.ops <- *o:
	default:
		return hw.Completion{}, s.errBusy
	}
	s.rec.SetSubmitted(seq)
	return hw.NewCompletion(s, seq), nil
}

// Retired reports from cached state whether command seq has retired.
func (s *HostStream) Retired(seq uint64) (bool, error) { return s.state(seq, s.dev.Err()) }

// WaitRetired blocks until command seq retires, the host device is lost
// or ctx ends ([errdefs.ErrDeadlineExceeded]; the command keeps running).
func (s *HostStream) WaitRetired(ctx context.Context, seq uint64) error {
	if err := s.wait(ctx, seq); err != nil {
		return err
	}
	_, err := s.Retired(seq)
	return err
}

func (s *HostStream) wait(ctx context.Context, seq uint64) error {
	return s.retirement.wait(ctx, seq, s.dev.Err, s.dev.lostCh, HostDeviceName)
}

// Idle reports, from cached state, whether everything submitted retired
// (or the device is lost).
func (s *HostStream) Idle() bool { return s.idle(s.dev.Err()) }

// Sync waits until everything submitted so far retired and returns the
// first failure no earlier Sync reported, an [errdefs.ErrDeviceLost] error or an
// [errdefs.ErrDeadlineExceeded] error.
func (s *HostStream) Sync(ctx context.Context) error { return s.sync(ctx, s.wait, s.dev.Err) }

// Close stops new submissions, waits for the stream to drain (as Sync with
// ctx) and stops its worker. If ctx ends first, the stream stays open
// (closed to submissions) and Close may be called again; on a lost device
// it is released at once. Closing a released stream returns [errdefs.ErrClosed].
func (s *HostStream) Close(ctx context.Context) error {
	s.submitMu.Lock()
	if s.final {
		s.submitMu.Unlock()
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: %s: stream already closed", HostDeviceName)
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
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: %s: stream already closed", HostDeviceName)
	}
	s.final = true
	close(s.quit)
	s.submitMu.Unlock()
	if s.dev.Err() == nil {
		<-s.done
	}
	// On a lost device a program may still be running (it watches Lost
	// and returns soon); the worker exits after it without touching the
	// stream's state again.
	s.dev.streamsMu.Lock()
	delete(s.dev.streams, s)
	s.dev.streamsMu.Unlock()
	s.dev.live.Add(-1)
	return err
}

func (s *HostStream) run() {
	defer close(s.done)
	for {
		select {
		case o := <-s.ops:
			s.exec(&o)
		case <-s.quit:
			// Closed: on a healthy device the queue is empty; on a lost
			// one, retire what is left without running it.
			for {
				select {
				case o := <-s.ops:
					s.exec(&o)
				default:
					return
				}
			}
		}
	}
}

func (s *HostStream) exec(o *hostOp) {
	var err error
	if s.dev.Err() == nil {
		switch o.kind {
		case hostLaunch:
			err = s.call(o)
		case hostCopy:
			copy(o.dst, o.src)
		}
	}
	switch lost := s.dev.Err(); {
	case lost != nil:
		// Skipped or cut short by the loss: it failed with it.
		s.recordFailure(o.seq, lost)
	case err != nil:
		if !errors.Is(err, errdefs.ErrFault) {
			err = errdefs.Errorf(errdefs.ErrFault, "cuda: %s: program %q failed: %w", HostDeviceName, o.prog.name, err)
		}
		s.recordFailure(o.seq, err)
	}
	seq := o.seq
	*o = hostOp{} // drop references to buffers and memory
	s.advance(seq)
}

// call runs one program, turning a panic into its error.
func (s *HostStream) call(o *hostOp) (err error) {
	l := &s.launch
	l.args, l.grid = o.args[:o.nargs], o.grid
	defer func() {
		l.args = nil
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return o.prog.fn(l)
}
