package host

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// Owner holds a session's private device resources: streams, buffers,
// shared allocations and prepared programs, and the budget they are
// charged to. Resources made through an Owner are what its fence must
// drain and what quarantine keeps.
//
// An Owner is safe for concurrent use.
type Owner struct {
	name   string
	budget *hw.Budget

	mu          sync.Mutex
	streams     []hw.Stream
	buffers     []hw.Buffer
	shared      []hw.Shared
	programs    []hw.Program
	quarantined bool
	closed      bool
	faults      []error // the first maxFaults device failures recorded
	nfaults     int     // every device failure recorded, kept or not

	// Lock-free copies for the checks made on every stage call (each
	// uncontended lock pair costs tens of nanoseconds on some hosts):
	// written under mu, read without it.
	unusable    atomic.Bool                 // quarantined or closed
	faultsSeen  atomic.Bool                 // nfaults > 0
	streamsSnap atomic.Pointer[[]hw.Stream] // streams, copied on write
}

// maxFaults bounds the device failures an owner keeps between two
// [Owner.TakeFaults]: a stage that fails a million commands costs eight
// errors of memory, and the count of the rest.
const maxFaults = 8

// NewOwner returns an empty owner whose allocations charge budget (nil:
// unlimited).
func NewOwner(name string, budget *hw.Budget) *Owner {
	return &Owner{name: name, budget: budget}
}

// Name is the owner's name, as shown in traces and errors.
func (o *Owner) Name() string { return o.name }

// Budget is the budget the owner's allocations charge.
func (o *Owner) Budget() *hw.Budget { return o.budget }

// Err returns nil while o can make resources and run work, an
// [errdefs.ErrDeviceLost] error once it is quarantined, or an [errdefs.ErrClosed]
// error once it is closed.
func (o *Owner) Err() error {
	if !o.unusable.Load() {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.usable()
}

func (o *Owner) usable() error {
	if o.quarantined {
		return errdefs.Errorf(errdefs.ErrDeviceLost, "owner %q is quarantined", o.name)
	}
	if o.closed {
		return errdefs.Errorf(errdefs.ErrClosed, "owner %q is closed", o.name)
	}
	return nil
}

// NewStream creates a stream on dev owned by o.
func (o *Owner) NewStream(dev hw.Device) (hw.Stream, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.usable(); err != nil {
		return nil, err
	}
	s, err := dev.NewStream()
	if err != nil {
		return nil, err
	}
	o.streams = append(o.streams, s)
	snap := append([]hw.Stream(nil), o.streams...)
	o.streamsSnap.Store(&snap)
	return s, nil
}

// Alloc allocates a buffer on dev owned by o, charged to o's budget.
func (o *Owner) Alloc(dev hw.Device, size int, flags hw.AllocFlags) (hw.Buffer, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.usable(); err != nil {
		return nil, err
	}
	b, err := dev.Alloc(size, flags, o.budget)
	if err != nil {
		return nil, err
	}
	o.buffers = append(o.buffers, b)
	return b, nil
}

// AllocShared allocates host-coherent memory on p for devices, owned by o.
func (o *Owner) AllocShared(p hw.Platform, size int, devices []hw.Device) (hw.Shared, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.usable(); err != nil {
		return nil, err
	}
	s, err := p.AllocShared(size, devices, o.budget)
	if err != nil {
		return nil, err
	}
	o.shared = append(o.shared, s)
	return s, nil
}

// Prepare prepares a program on dev owned by o.
func (o *Owner) Prepare(dev hw.Device, program string) (hw.Program, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.usable(); err != nil {
		return nil, err
	}
	p, err := dev.Prepare(program)
	if err != nil {
		return nil, err
	}
	o.programs = append(o.programs, p)
	return p, nil
}

// FreeBuffer frees a buffer owned by o before the owner closes.
//
// # Errors
//
// [errdefs.ErrNotFound] if o does not own b; [errdefs.ErrDeviceLost] if o is
// quarantined (its memory is kept); [errdefs.ErrClosed] once o is closed;
// otherwise the error of b's Free.
func (o *Owner) FreeBuffer(b hw.Buffer) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.usable(); err != nil {
		return err
	}
	for i, have := range o.buffers {
		if have == b {
			o.buffers = append(o.buffers[:i], o.buffers[i+1:]...)
			return b.Free()
		}
	}
	return errdefs.Errorf(errdefs.ErrNotFound, "owner %q does not own that buffer", o.name)
}

// Buffers returns how many buffers o owns: allocated and not yet freed
// through it.
func (o *Owner) Buffers() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.buffers)
}

// Streams returns the owned streams, in creation order.
func (o *Owner) Streams() []hw.Stream {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]hw.Stream(nil), o.streams...)
}

// Drain is the built-in fence: it syncs every owned stream, attempting all
// of them even when one fails. A command that failed on the device
// ([errdefs.ErrFault]) has still retired, so it does not make the drain fail:
// the fence proves the work is finished, not that it succeeded. Such a
// failure is not forgotten either: Drain records it as [Owner.NoteFault]
// does, so that whoever runs the fence reports it with [Owner.TakeFaults]
// and failed device work never reaches a caller as success.
//
// # Errors
//
// Any failure other than a retired fault (device lost, deadline, closed
// stream) means the drain cannot be proven; those are returned joined,
// one per stream that failed.
func (o *Owner) Drain(ctx context.Context) error {
	streams := o.snapshot()
	var errs []error
	for _, s := range streams {
		for {
			err := s.Sync(ctx)
			if err == nil {
				break
			}
			if errdefs.ClassOf(err) != errdefs.ErrFault {
				errs = append(errs, err)
				break
			}
			// A retired failure: record it. Sync reports each failure
			// once, so look again for the next.
			o.NoteFault(err)
		}
	}
	return errors.Join(errs...)
}

// NoteFault records err, a failure of device work submitted through o
// (typically an [errdefs.ErrFault] error that a stream's Sync or a completion
// returned), until [Owner.TakeFaults] collects it. Drain records the
// failures it finds itself; code that syncs o's streams on its own (a
// guest's stream_sync, a custom fence) records what it saw here. The first
// eight failures are kept, the rest only counted. A nil err records
// nothing.
func (o *Owner) NoteFault(err error) {
	if err == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.faults) < maxFaults {
		o.faults = append(o.faults, err)
	}
	o.nfaults++
	o.faultsSeen.Store(true)
}

// TakeFaults returns the failures recorded since the last call (see
// [Owner.NoteFault] and [Owner.Drain]) and forgets them.
//
// # Errors
//
// nil when none was recorded; otherwise one [errdefs.ErrFault] error that
// joins the recorded failures (so [errors.Is] matches each of them) and
// says how many more were only counted.
func (o *Owner) TakeFaults() error {
	if !o.faultsSeen.Load() {
		return nil
	}
	o.mu.Lock()
	faults, n := o.faults, o.nfaults
	o.faults, o.nfaults = nil, 0
	o.faultsSeen.Store(false)
	o.mu.Unlock()
	if n == 0 {
		return nil
	}
	msg := "owner %q: %d device command(s) failed: %w"
	args := []any{o.name, n, errors.Join(faults...)}
	if more := n - len(faults); more > 0 {
		msg += " (and %d more, not kept)"
		args = append(args, more)
	}
	return errdefs.Errorf(errdefs.ErrFault, msg, args...)
}

// VerifyIdle checks that every owned stream has retired all its work. The
// host calls it after a fence reports success: a fence that lies fails
// here.
//
// # Errors
//
// [errdefs.ErrDeviceLost] naming the first busy stream.
func (o *Owner) VerifyIdle() error {
	for i, s := range o.snapshot() {
		if !s.Idle() {
			return errdefs.Errorf(errdefs.ErrDeviceLost, "owner %q: stream %d on %s still has work after the fence", o.name, i, s.Device().Name())
		}
	}
	return nil
}

// snapshot returns the owned streams without locking.
func (o *Owner) snapshot() []hw.Stream {
	if p := o.streamsSnap.Load(); p != nil {
		return *p
	}
	return nil
}

// Quarantined reports whether o was quarantined.
func (o *Owner) Quarantined() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.quarantined
}

// Quarantine marks o as quarantined: from now on nothing of it is freed
// (Close and FreeBuffer refuse with [errdefs.ErrDeviceLost]), nothing new is
// made through it, and its budget charges stay. Use it when device work
// that may still touch o's memory cannot be proven finished. It returns
// the bytes left charged.
func (o *Owner) Quarantine() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.quarantined = true
	o.unusable.Store(true)
	var bytes int64
	for _, b := range o.buffers {
		bytes += int64(b.Size())
	}
	for _, s := range o.shared {
		bytes += int64(s.Size())
	}
	return bytes
}

// Close drains and closes every stream, then frees every allocation,
// releasing their budget charges. A quarantined owner frees nothing:
// device work may still touch its memory.
//
// # Errors
//
// [errdefs.ErrDeviceLost] for a quarantined owner, or the joined errors of
// closing and freeing.
func (o *Owner) Close(ctx context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.quarantined {
		return errdefs.Errorf(errdefs.ErrDeviceLost, "owner %q is quarantined: its resources are kept", o.name)
	}
	if o.closed {
		return nil
	}
	o.closed = true
	o.unusable.Store(true)
	var errs []error
	for _, s := range o.streams {
		if err := s.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// A stream that would not drain may still write into our memory.
		o.quarantined = true
		o.unusable.Store(true)
		return errdefs.Errorf(errdefs.ErrDeviceLost, "owner %q: streams did not drain on close, resources kept: %w", o.name, errors.Join(errs...))
	}
	for _, b := range o.buffers {
		if err := b.Free(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range o.shared {
		if err := s.Free(); err != nil {
			errs = append(errs, err)
		}
	}
	o.streams, o.buffers, o.shared, o.programs = nil, nil, nil, nil
	return errors.Join(errs...)
}
