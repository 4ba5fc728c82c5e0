package sim

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// Shared is a host-coherent allocation made by [Platform.AllocShared]: one
// anonymous shared mapping that the host and every listed device access
// directly. It implements [hw.Shared].
type Shared struct {
	region  *region
	devices []*Device
	views   []*Buffer // views[i] is the allocation as a buffer of devices[i]
}

var _ hw.Shared = (*Shared)(nil)

func newShared(r *region, devs []*Device) *Shared {
	sh := &Shared{region: r, devices: devs, views: make([]*Buffer, len(devs))}
	for i, d := range devs {
		sh.views[i] = &Buffer{dev: d, region: r, shared: sh}
	}
	return sh
}

// Size is the size in bytes.
func (sh *Shared) Size() int { return len(sh.region.mem) }

// Bytes is the host mapping. It must not be used after [Shared.Free].
func (sh *Shared) Bytes() []byte { return sh.region.mem }

// Devices lists the devices that can access the allocation, in the order
// given at allocation.
func (sh *Shared) Devices() []hw.Device {
	out := make([]hw.Device, len(sh.devices))
	for i, d := range sh.devices {
		out[i] = d
	}
	return out
}

// word returns the uint32 at byte offset off. Misuse is a programming
// error, so it panics: off not a multiple of 4, off outside the
// allocation, or the allocation already freed (checked on a best-effort
// basis: freeing concurrently with a store is a race in the caller).
func (sh *Shared) word(off int) *uint32 {
	if off < 0 || off%4 != 0 || off > len(sh.region.mem)-4 {
		panic(fmt.Sprintf("sim: shared word at offset %d: want a multiple of 4 in [0, %d]", off, len(sh.region.mem)-4))
	}
	if sh.region.freed() {
		panic("sim: shared word used after Free")
	}
	// The mapping is page-aligned, so off%4 == 0 makes the word aligned.
	return (*uint32)(unsafe.Pointer(&sh.region.mem[off]))
}

// Store32Release atomically stores v at byte offset off. Go's atomics are
// sequentially consistent, which includes release ordering. It panics on
// misuse (see word above): an unaligned or out-of-range offset, or a freed
// allocation.
func (sh *Shared) Store32Release(off int, v uint32) { atomic.StoreUint32(sh.word(off), v) }

// Load32Acquire atomically loads the word at byte offset off. It panics on
// misuse, as Store32Release does.
func (sh *Shared) Load32Acquire(off int) uint32 { return atomic.LoadUint32(sh.word(off)) }

// View returns the allocation as a [*Buffer] of dev, for use as a program
// argument on dev's streams. The same view is returned on every call;
// freeing it is a no-op.
//
// # Errors
//
// [errdefs.ErrInvalidArgument] when dev was not listed at allocation;
// [errdefs.ErrClosed] once the allocation is freed.
func (sh *Shared) View(dev hw.Device) (hw.Buffer, error) {
	i := sh.index(dev)
	if i < 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: shared allocation: device %v was not listed at allocation", dev)
	}
	if sh.region.freed() {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "sim: shared allocation used after free")
	}
	return sh.views[i], nil
}

func (sh *Shared) index(dev hw.Device) int {
	for i, d := range sh.devices {
		if hw.Device(d) == dev {
			return i
		}
	}
	return -1
}

// PrepareRelease prepares the action that makes host stores in
// [off, off+length) visible to dev. On the simulator memory is fully
// coherent, so executing it is a full memory barrier (an atomic add on the
// device's visibility counter, see [Device.VisibilityReleases]); it fails
// with an [errdefs.ErrFault] error for an injected FailVisibility fault, an
// [errdefs.ErrDeviceLost] error once dev is lost and an [errdefs.ErrClosed] error
// once the allocation is freed. Executing allocates nothing.
//
// # Errors
//
// [errdefs.ErrInvalidArgument] for a device not listed at allocation or a range
// outside the allocation; [errdefs.ErrClosed] once freed.
func (sh *Shared) PrepareRelease(dev hw.Device, off, length int) (hw.VisibilityAction, error) {
	i := sh.index(dev)
	if i < 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: shared allocation: device %v was not listed at allocation", dev)
	}
	if size := len(sh.region.mem); off < 0 || length < 0 || off > size || length > size-off {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim: shared release range offset %d length %d outside allocation of %d bytes", off, length, size)
	}
	if sh.region.freed() {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "sim: shared allocation used after free")
	}
	return &visibilityAction{dev: sh.devices[i], region: sh.region}, nil
}

// Free unmaps the allocation and releases its budget charge (once no
// queued command uses one of its views any more). Freeing twice returns an
// [errdefs.ErrClosed] error.
func (sh *Shared) Free() error {
	if !sh.region.free() {
		return errdefs.Errorf(errdefs.ErrClosed, "sim: shared allocation freed twice")
	}
	return nil
}

type visibilityAction struct {
	dev    *Device
	region *region
}

func (a *visibilityAction) Execute() error {
	if a.region.freed() {
		return errdefs.Errorf(errdefs.ErrClosed, "sim: visibility action on a freed shared allocation")
	}
	if err := a.dev.Err(); err != nil {
		return err
	}
	if take(&a.dev.faults.failVisibility) {
		return errdefs.Errorf(errdefs.ErrFault, "sim: device %q: visibility action failed (injected fault)", a.dev.name)
	}
	a.dev.visibility.Add(1) // a sequentially consistent RMW: a full barrier
	return nil
}
