package sim

import (
	"errors"
	"sync"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// Platform is a set of simulated devices plus the (fully coherent) memory
// fabric between them. It implements [hw.Platform]. Its methods are safe
// for concurrent use.
type Platform struct {
	mu      sync.Mutex
	devices []*Device // insertion order; devices are never removed
	closed  bool
}

var _ hw.Platform = (*Platform)(nil)

// New returns an empty platform; add devices with [Platform.AddDevice].
func New() *Platform { return &Platform{} }

// DeviceConfig configures a device at [Platform.AddDevice]. It is
// immutable: every WithX method returns a modified copy, so a DeviceConfig
// can be shared between calls. A zero DeviceConfig means
// [NewDeviceConfig]'s defaults. A WithX method called on a zero value starts from
// those defaults.
//
//	dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig().WithLatency(time.Millisecond))
type DeviceConfig struct {
	set        bool // made by NewDeviceConfig; false: the zero value
	latency    time.Duration
	queueDepth int
	initDepth  int
}

// NewDeviceConfig returns the default configuration:
//
//   - latency 0 (see [DeviceConfig.WithLatency]);
//   - queue depth [DefaultQueueDepth] (see [DeviceConfig.WithQueueDepth]);
//   - initial queue depth [DefaultInitialQueueDepth] (see
//     [DeviceConfig.WithInitialQueueDepth]).
func NewDeviceConfig() DeviceConfig {
	return DeviceConfig{set: true, queueDepth: DefaultQueueDepth, initDepth: DefaultInitialQueueDepth}
}

// orDefaults is c, or [NewDeviceConfig]'s defaults when c is the zero value, so
// that a WithX method called on a zero DeviceConfig keeps the other defaults.
func (c DeviceConfig) orDefaults() DeviceConfig {
	if !c.set {
		return NewDeviceConfig()
	}
	return c
}

// DefaultQueueDepth is the queue depth of a device made without
// [DeviceConfig.WithQueueDepth].
const DefaultQueueDepth = 1024

// MaxQueueDepth bounds [DeviceConfig.WithQueueDepth] and [DeviceConfig.WithInitialQueueDepth]: the
// most slots a stream's ring may grow to.
const MaxQueueDepth = 1 << 16

// DefaultInitialQueueDepth is the number of slots a stream's ring starts
// with on a device made without [DeviceConfig.WithInitialQueueDepth]. A slot holds a
// whole command (752 bytes: its arguments, grid and deadline), so a new
// stream's ring costs about 5.9 KiB; it doubles when a submission finds
// it full.
const DefaultInitialQueueDepth = 8

// WithLatency sets the simulated time every command (launch, write or read)
// takes on the device's streams, spent on the stream's worker before the
// command runs. A command's latency starts when it is submitted or when the
// worker finished the command before it (or was released from a hang),
// whichever is later: commands submitted back to back run one latency
// apart, and one submitted to an idle stream retires about one latency
// after its submission, however long the worker took to wake up.
//
// The worker holds the latency precisely, on the monotonic clock, by
// spinning (yielding the processor at every round), because timers fire
// about a millisecond late: it burns a CPU while a command waits out its
// latency, except that with 2 ms or more to go it sleeps until 1 ms before
// the end. Default 0: commands run as soon as the worker reaches them, with
// no clock read at all. A negative latency makes AddDevice fail.
func (c DeviceConfig) WithLatency(d time.Duration) DeviceConfig {
	c = c.orDefaults()
	c.latency = d
	return c
}

// WithQueueDepth sets how many commands (queued plus executing) one stream
// of the device may hold; a submission beyond that fails with an
// [errdefs.ErrBusy] error. Default [DefaultQueueDepth]. It must lie in
// [1, MaxQueueDepth] or AddDevice fails. The depth is a limit, not an
// allocation: a stream's ring starts at [DeviceConfig.WithInitialQueueDepth] slots and
// doubles on demand up to it (it never shrinks).
func (c DeviceConfig) WithQueueDepth(n int) DeviceConfig {
	c = c.orDefaults()
	c.queueDepth = n
	return c
}

// WithInitialQueueDepth sets how many command slots a stream's ring starts
// with; it grows (doubling) as submissions need, up to the queue depth.
// Default [DefaultInitialQueueDepth]. It must lie in [1, MaxQueueDepth] or
// AddDevice fails; a value above the queue depth means the queue depth.
// Setting it to the queue depth preallocates the whole ring, as streams
// did before rings grew.
func (c DeviceConfig) WithInitialQueueDepth(n int) DeviceConfig {
	c = c.orDefaults()
	c.initDepth = n
	return c
}

// AddDevice adds a device named name offering engine, configured by cfg
// (a zero DeviceConfig means [NewDeviceConfig]'s defaults).
//
// # Errors
//
// [errdefs.ErrInvalidArgument] for an empty or duplicate name or an invalid
// configuration value; [errdefs.ErrClosed] once the platform is closed.
func (p *Platform) AddDevice(name string, engine hw.Engine, cfg DeviceConfig) (*Device, error) {
	if !cfg.set {
		cfg = NewDeviceConfig()
	}
	switch {
	case name == "":
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: empty device name")
	case cfg.latency < 0:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: device %q: negative latency %v", name, cfg.latency)
	case cfg.queueDepth < 1 || cfg.queueDepth > MaxQueueDepth:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: device %q: queue depth %d outside [1, %d]", name, cfg.queueDepth, MaxQueueDepth)
	case cfg.initDepth < 1 || cfg.initDepth > MaxQueueDepth:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: device %q: initial queue depth %d outside [1, %d]", name, cfg.initDepth, MaxQueueDepth)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "sim: platform closed")
	}
	for _, d := range p.devices {
		if d.name == name {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: duplicate device name %q", name)
		}
	}
	d := newDevice(p, name, engine, cfg)
	p.devices = append(p.devices, d)
	return d, nil
}

// Devices lists every device in the order they were added.
func (p *Platform) Devices() []hw.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]hw.Device, len(p.devices))
	for i, d := range p.devices {
		out[i] = d
	}
	return out
}

// Device returns the device called name, or an [errdefs.ErrNotFound] error.
func (p *Platform) Device(name string) (hw.Device, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.devices {
		if d.name == name {
			return d, nil
		}
	}
	return nil, errdefs.Errorf(errdefs.ErrNotFound, "sim: no device %q", name)
}

// AllocShared allocates size bytes of host-coherent memory that every
// device in devices can access (through [Shared.View]), charging budget
// (nil for none) with size bytes.
//
// # Errors
//
// [errdefs.ErrInvalidArgument] for size ≤ 0, no devices, a duplicate device or
// one that is not of this platform; [errdefs.ErrDeviceLost] or [errdefs.ErrClosed]
// when a listed device is lost or closed; [errdefs.ErrOutOfBudget] when the
// budget or the system cannot supply the memory.
func (p *Platform) AllocShared(size int, devices []hw.Device, budget *hw.Budget) (hw.Shared, error) {
	if size <= 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: shared allocation of %d bytes", size)
	}
	if len(devices) == 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: shared allocation needs at least one device")
	}
	devs := make([]*Device, 0, len(devices))
	for i, hd := range devices {
		d, ok := hd.(*Device)
		if !ok || d == nil || d.platform != p {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: shared allocation: device %d (%v) is not a device of this platform", i, hd)
		}
		for _, prev := range devs {
			if prev == d {
				return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: shared allocation: device %q listed twice", d.name)
			}
		}
		if err := d.usable(); err != nil {
			return nil, err
		}
		devs = append(devs, d)
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "sim: platform closed")
	}
	r, err := mapRegion(size, budget)
	if err != nil {
		return nil, err
	}
	return newShared(r, devs), nil
}

// Close closes every device that is not closed yet (see [Device.Close])
// and then the platform. It returns the devices' errors joined; the
// platform is closed even then. Closing twice returns an [errdefs.ErrClosed]
// error.
func (p *Platform) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrClosed, "sim: platform closed twice")
	}
	p.closed = true
	devs := append([]*Device(nil), p.devices...)
	p.mu.Unlock()
	var errs []error
	for _, d := range devs {
		if err := d.Close(); err != nil && !errors.Is(err, errdefs.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
