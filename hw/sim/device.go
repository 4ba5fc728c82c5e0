package sim

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// Device is a simulated device. It implements [hw.Device]; its streams are
// [*Stream]s and its buffers [*Buffer]s. Its methods are safe for
// concurrent use.
type Device struct {
	platform  *Platform
	name      string
	engine    hw.Engine
	latency   time.Duration
	depth     int // the most commands a stream holds: its ring's largest size
	initDepth int // a new stream's ring size, at most depth

	// lost is nil while the device is healthy. It is set once, under mu,
	// and lostCh is closed right after every stream has been marked dead.
	lost   atomic.Pointer[lostInfo]
	lostCh chan struct{}

	faults      faultState    // device-wide injected faults
	liveBuffers atomic.Int64  // allocated and not yet freed (views excluded)
	visibility  atomic.Uint64 // executed visibility actions
	nextStream  atomic.Uint64 // stream ids, for messages
	uploads     atomic.Uint64 // uploads (Stream.Write) enqueued, see Uploads
	uploadBytes atomic.Uint64

	mu      sync.Mutex // guards streams and closed; see the lock order in doc.go
	streams map[*Stream]struct{}
	closed  bool
}

type lostInfo struct{ err error }

var _ hw.Device = (*Device)(nil)

func newDevice(p *Platform, name string, engine hw.Engine, cfg DeviceConfig) *Device {
	return &Device{
		platform:  p,
		name:      name,
		engine:    engine,
		latency:   cfg.latency,
		depth:     cfg.queueDepth,
		initDepth: min(cfg.initDepth, cfg.queueDepth),
		lostCh:    make(chan struct{}),
		streams:   make(map[*Stream]struct{}),
	}
}

// Name is the device's name within its platform.
func (d *Device) Name() string { return d.name }

// Engine is the engine kind given at [Platform.AddDevice].
func (d *Device) Engine() hw.Engine { return d.engine }

// Latency is the simulated time each command takes (see [DeviceConfig.WithLatency]).
func (d *Device) Latency() time.Duration { return d.latency }

// QueueDepth is the per-stream queue depth (see [DeviceConfig.WithQueueDepth]).
func (d *Device) QueueDepth() int { return d.depth }

// InitialQueueDepth is the number of slots a new stream's ring starts with
// (see [DeviceConfig.WithInitialQueueDepth]), at most [Device.QueueDepth].
func (d *Device) InitialQueueDepth() int { return d.initDepth }

// String returns the device's name, for messages.
func (d *Device) String() string { return "sim:" + d.name }

// Err returns nil while the device is healthy and an [errdefs.ErrDeviceLost]
// error naming the first cause once it is lost.
func (d *Device) Err() error {
	if l := d.lost.Load(); l != nil {
		return l.err
	}
	return nil
}

// usable returns the device's loss error, or an [errdefs.ErrClosed] error if it
// is closed, or nil.
func (d *Device) usable() error {
	if err := d.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errdefs.Errorf(errdefs.ErrClosed, "sim: device %q closed", d.name)
	}
	return nil
}

// NewStream creates a stream and starts its worker. The result is a
// [*Stream].
//
// # Errors
//
// [errdefs.ErrDeviceLost] once the device is lost; [errdefs.ErrClosed] once it is
// closed.
func (d *Device) NewStream() (hw.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// Checked under mu: Lose sets lost under mu too, so a stream is either
	// registered before the loss (and marked dead by it) or refused.
	if err := d.Err(); err != nil {
		return nil, err
	}
	if d.closed {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "sim: device %q closed", d.name)
	}
	s := newStream(d, d.nextStream.Add(1))
	d.streams[s] = struct{}{}
	go s.run()
	return s, nil
}

// Alloc maps size bytes of zeroed memory, charging size bytes to budget
// (nil: none) before mapping. Every sim buffer is host-visible; flags may
// only contain [hw.AllocHostVisible]. The result is a [*Buffer].
//
// # Errors
//
// [errdefs.ErrInvalidArgument] for size ≤ 0 or unknown flags;
// [errdefs.ErrOutOfBudget] when the budget (or the system) cannot supply the
// memory; [errdefs.ErrDeviceLost] or [errdefs.ErrClosed] for a lost or closed device.
func (d *Device) Alloc(size int, flags hw.AllocFlags, budget *hw.Budget) (hw.Buffer, error) {
	if err := d.Err(); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: device %q: allocation of %d bytes", d.name, size)
	}
	if flags&^hw.AllocHostVisible != 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: device %q: unknown allocation flags %#x", d.name, uint32(flags))
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrClosed, "sim: device %q closed", d.name)
	}
	d.liveBuffers.Add(1) // under mu, so Close sees it
	d.mu.Unlock()
	r, err := mapRegion(size, budget)
	if err != nil {
		d.liveBuffers.Add(-1)
		return nil, err
	}
	return &Buffer{dev: d, region: r}, nil
}

// Uploads reports the uploads ([Stream.Write]) enqueued on the device's
// streams since it was made: how many, and their bytes. Tests count
// with it what a host uploads.
func (d *Device) Uploads() (count, bytes uint64) {
	return d.uploads.Load(), d.uploadBytes.Load()
}

// Prepare looks program up in the kernel registry (see [Register]). The
// result is a [*Program].
//
// # Errors
//
// [errdefs.ErrNotFound] for an unregistered name; [errdefs.ErrDeviceLost] or
// [errdefs.ErrClosed] for a lost or closed device.
func (d *Device) Prepare(program string) (hw.Program, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	e, ok := lookupKernel(program)
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sim: device %q: no kernel %q", d.name, program)
	}
	return &Program{dev: d, name: program, kernel: e.k, check: e.check, info: e.info}, nil
}

// Lose marks the device lost with cause (the first cause wins; later calls
// do nothing). Every queued and executing command on every stream fails
// with an [errdefs.ErrDeviceLost] error, every waiter wakes, hangs are released,
// kernels see [Launch.Lost] closed, and every later NewStream, Alloc,
// Prepare, Submit, Write, Read, Sync and visibility action fails at once.
// Commands that retired before the loss keep their results. Closing and
// freeing still work, so owners can clean up.
func (d *Device) Lose(cause string) {
	d.mu.Lock()
	if d.lost.Load() != nil {
		d.mu.Unlock()
		return
	}
	d.lost.Store(&lostInfo{err: errdefs.Errorf(errdefs.ErrDeviceLost, "sim: device %q lost: %s", d.name, cause)})
	streams := make([]*Stream, 0, len(d.streams))
	for s := range d.streams {
		s.markDead() // lock order: d.mu, then s.mu
		streams = append(streams, s)
	}
	d.mu.Unlock()
	// Wakes the workers blocked in a latency timer, a hang or a kernel
	// watching Launch.Lost, and any waiter still selecting on it.
	close(d.lostCh)
	d.faults.releaseHangs()
	for _, s := range streams {
		s.faults.releaseHangs()
	}
}

// Inject injects a fault into every stream of the device (or, for
// FailVisibility, into the device's visibility actions). Counted faults
// add up with earlier ones of the same kind. For a Hang, release resumes
// the workers; it is idempotent. For any other kind release is a no-op.
// An unknown kind panics.
func (d *Device) Inject(f Fault) (release func()) {
	return d.inject(&d.faults, f)
}

func (d *Device) inject(fs *faultState, f Fault) func() {
	n := int64(f.Count)
	if n < 1 {
		n = 1
	}
	switch f.Kind {
	case RejectSubmit:
		fs.reject.Add(n)
	case FailCompletion:
		fs.failCompletion.Add(n)
	case FailVisibility:
		// Visibility actions belong to a device, so this is device-wide
		// even when injected through a stream.
		d.faults.failVisibility.Add(n)
	case Hang:
		if d.Err() != nil {
			return noRelease // a lost device never hangs
		}
		return fs.addHang()
	case Lose:
		d.Lose("injected Lose fault")
	default:
		panic(fmt.Sprintf("sim: Inject: unknown fault kind %d", f.Kind))
	}
	return noRelease
}

// VisibilityReleases reports how many visibility actions (see
// [Shared.PrepareRelease]) have executed successfully on the device.
func (d *Device) VisibilityReleases() uint64 { return d.visibility.Load() }

// Close closes the device; later NewStream, Alloc and Prepare calls fail
// with [errdefs.ErrClosed]. A lost device can be closed too.
//
// # Errors
//
// [errdefs.ErrBusy] while streams are open or buffers are allocated (close and
// free them first; [Shared] views do not count); [errdefs.ErrClosed] when
// closed twice.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errdefs.Errorf(errdefs.ErrClosed, "sim: device %q closed twice", d.name)
	}
	if n, b := len(d.streams), d.liveBuffers.Load(); n > 0 || b > 0 {
		return errdefs.Errorf(errdefs.ErrBusy, "sim: device %q still has %d open streams and %d live buffers", d.name, n, b)
	}
	d.closed = true
	return nil
}

func (d *Device) removeStream(s *Stream) {
	d.mu.Lock()
	delete(d.streams, s)
	d.mu.Unlock()
}

// PrepareKernel prepares a kernel that is not in the process-wide
// registry (a vendor kernel a manifest ships) for this device, under
// info.Name. Its commands are checked at submit against info: the
// argument count, each argument's kind (buffer or scalar), and, for a
// buffer of f32 or i32 values, that its length is a multiple of 4.
//
// # Errors
//
//   - [errdefs.ErrInvalidArgument]: an empty name, a nil kernel, or a
//     variadic info.
//   - [errdefs.ErrDeviceLost]: the device is lost.
func (d *Device) PrepareKernel(info hw.KernelInfo, k Kernel) (*Program, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	if info.Name == "" || k == nil || info.Variadic {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: device %q: PrepareKernel needs a name, a kernel and a fixed argument list", d.name)
	}
	return &Program{dev: d, name: info.Name, kernel: k, check: checkAgainst(info), info: &info}, nil
}

// checkAgainst returns the submit check of a kernel described by info.
func checkAgainst(info hw.KernelInfo) func([]hw.Arg) error {
	return func(args []hw.Arg) error {
		if len(args) != len(info.Args) {
			return badArgs("kernel %q takes %d arguments, got %d", info.Name, len(info.Args), len(args))
		}
		for i, a := range info.Args {
			isBuf := args[i].Buffer != nil
			switch {
			case a.Kind == hw.KindBuffer && !isBuf:
				return badArgs("kernel %q: argument %d (%s) is a buffer, got a scalar", info.Name, i, a.Name)
			case a.Kind != hw.KindBuffer && isBuf:
				return badArgs("kernel %q: argument %d (%s) is %s scalar, got a buffer", info.Name, i, a.Name, hw.WithArticle(a.Type))
			case isBuf && (a.Type == "f32" || a.Type == "i32") && args[i].Length%4 != 0:
				return badArgs("kernel %q: argument %d (%s): %d bytes is not a whole number of %s values", info.Name, i, a.Name, args[i].Length, a.Type)
			}
		}
		return nil
	}
}
