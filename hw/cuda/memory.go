package cuda

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// hostAllocFlags: pinned, usable from every context, mapped into the
// device address space (so kernels can read it through a device pointer).
const hostAllocFlags = cuMemHostAllocPortable | cuMemHostAllocDeviceMap

// buffer is a device allocation (cuMemAlloc_v2), a host-mapped pinned
// allocation (cuMemHostAlloc, for hw.AllocHostVisible), or a view of a
// shared allocation on one device.
type buffer struct {
	dev    *Device
	size   int
	ptr    cuDevicePtr
	host   unsafe.Pointer // host mapping; nil for device memory
	budget *hw.Budget
	freed  atomic.Bool
	shared *sharedMem // non-nil for views
}

var _ hw.Buffer = (*buffer)(nil)

func (b *buffer) Device() hw.Device { return b.dev }
func (b *buffer) Size() int         { return b.size }

func (b *buffer) isFreed() bool {
	if b.shared != nil {
		return b.shared.freed.Load()
	}
	return b.freed.Load()
}

// HostBytes returns the host mapping of a host-visible buffer or shared
// view, and an [errdefs.ErrUnsupported] error for device memory.
func (b *buffer) HostBytes() ([]byte, error) {
	if b.host == nil {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: %s: device memory has no host mapping (allocate with hw.AllocHostVisible)", b.dev.name)
	}
	if b.isFreed() {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "cuda: buffer was freed")
	}
	return unsafe.Slice((*byte)(b.host), b.size), nil
}

// Free releases the buffer. Commands already queued may still use it, so
// the memory (and the budget charge) is released at once only when no
// stream of the device has unretired work; otherwise when the work queued
// before Free has retired (or the device is lost). Commands submitted
// after Free fail with [errdefs.ErrClosed]. Freeing twice returns an
// [errdefs.ErrClosed] error; freeing a shared view is a no-op.
func (b *buffer) Free() error {
	if b.shared != nil {
		return nil
	}
	if !b.freed.CompareAndSwap(false, true) {
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: buffer freed twice")
	}
	d := b.dev
	d.freeGen.Add(1)
	afterQueued([]queueOwner{d}, b.release)
	return nil
}

// waiter is a stream whose queued work can be waited for.
type waiter interface {
	wait(ctx context.Context, seq uint64) error
}

// queueOwner is a device whose streams' queued work can be snapshot.
type queueOwner interface {
	snapshot(out []pendingWork) []pendingWork
}

// afterQueued runs release now if no stream of owners has unretired work,
// else on a goroutine once the work queued so far on all of them retired
// (or the device is lost). A kernel that never retires keeps the memory
// for good: storage a device may still touch is never freed.
func afterQueued(owners []queueOwner, release func()) {
	var waits []pendingWork
	for _, d := range owners {
		waits = d.snapshot(waits)
	}
	if len(waits) == 0 {
		release()
		return
	}
	go func() {
		for _, w := range waits {
			w.s.wait(context.Background(), w.seq)
		}
		release()
	}()
}

func (b *buffer) release() {
	d := b.dev
	runtime.LockOSThread()
	if d.Err() == nil && d.drv.CtxSetCurrent(d.ctx) == cudaSuccess {
		if b.host != nil {
			d.drv.MemFreeHost(b.host)
			d.plat.pinned.remove(b.host)
		} else {
			d.drv.MemFree(b.ptr)
		}
	}
	runtime.UnlockOSThread()
	b.budget.Release(int64(b.size))
	d.live.Add(-1)
}

// Alloc allocates size bytes, zeroed: device memory, or with [hw.AllocHostVisible]
// pinned host memory mapped into the device (cuMemHostAlloc with
// PORTABLE|DEVICEMAP), whose [hw.Buffer.HostBytes] works. It charges
// budget first.
//
// # Errors
//
// [errdefs.ErrInvalidArgument] for a size ≤ 0 or unknown flags;
// [errdefs.ErrOutOfBudget] when the budget or the device is out of memory;
// [errdefs.ErrDeviceLost] or [errdefs.ErrClosed] for a lost or closed device.
func (d *Device) Alloc(size int, flags hw.AllocFlags, budget *hw.Budget) (hw.Buffer, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: allocation of %d bytes", d.name, size)
	}
	if flags&^hw.AllocHostVisible != 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: unknown allocation flags %#x", d.name, uint32(flags))
	}
	if err := budget.Charge(int64(size)); err != nil {
		return nil, err
	}
	b, err := d.alloc(size, flags)
	if err != nil {
		budget.Release(int64(size))
		return nil, err
	}
	b.budget = budget
	d.live.Add(1)
	return b, nil
}

func (d *Device) alloc(size int, flags hw.AllocFlags) (*buffer, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return nil, err
	}
	b := &buffer{dev: d, size: size}
	if flags&hw.AllocHostVisible == 0 {
		p, r := d.drv.MemAlloc(uintptr(size))
		if err := d.check("cuMemAlloc_v2", r, errdefs.ErrFault); err != nil {
			return nil, err
		}
		// New memory starts zeroed: the driver may hand back memory this
		// process freed, and sessions must not see each other's data.
		// cuMemsetD8 runs on the legacy NULL stream, which the
		// non-blocking streams do not wait for: finish it here.
		err := d.check("cuMemsetD8_v2", d.drv.MemsetD8(p, 0, uintptr(size)), errdefs.ErrFault)
		if err == nil {
			err = d.check("cuStreamSynchronize(NULL)", d.drv.StreamSynchronize(0), errdefs.ErrFault)
		}
		if err != nil {
			d.drv.MemFree(p)
			return nil, err
		}
		b.ptr = p
		return b, nil
	}
	host, r := d.drv.MemHostAlloc(uintptr(size), hostAllocFlags)
	if err := d.check("cuMemHostAlloc", r, errdefs.ErrFault); err != nil {
		return nil, err
	}
	p, r := d.drv.MemHostGetDevicePointer(host)
	if err := d.check("cuMemHostGetDevicePointer_v2", r, errdefs.ErrFault); err != nil {
		d.drv.MemFreeHost(host)
		return nil, err
	}
	clear(unsafe.Slice((*byte)(host), size))
	d.plat.pinned.add(host, size)
	b.host, b.ptr = host, p
	return b, nil
}

// sharedMem is one pinned, host-mapped allocation (cuMemHostAlloc with
// PORTABLE|DEVICEMAP) with a device-pointer view per GPU and, when the
// host device is listed, a host view over the same mapping. Mapped pinned
// memory is coherent: device acquire loads observe host release stores
// without any flush.
type sharedMem struct {
	plat     *Platform
	host     unsafe.Pointer
	size     int
	devices  []hw.Device
	views    map[*Device]*buffer
	hostDev  *HostDevice // non-nil when the host device is listed
	hostView *hostBuffer
	extra    *Device // the allocating GPU when no GPU is listed (kept open)
	budget   *hw.Budget
	freed    atomic.Bool
}

var _ hw.Shared = (*sharedMem)(nil)

// AllocShared allocates size bytes of pinned host memory that every listed
// device maps, charging budget. The devices may include the host device
// ([Platform.Host]): its view is a buffer over the host mapping, so a host
// program and GPU kernels share the memory. See [hw.Shared].
//
// # Errors
//
// [errdefs.ErrInvalidArgument] for a size ≤ 0, no devices, or a device that is
// not one of this platform's; [errdefs.ErrOutOfBudget]; [errdefs.ErrDeviceLost].
func (p *Platform) AllocShared(size int, devices []hw.Device, budget *hw.Budget) (hw.Shared, error) {
	if size <= 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: shared allocation of %d bytes", size)
	}
	if len(devices) == 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: shared allocation for no device")
	}
	s := &sharedMem{plat: p, size: size, views: make(map[*Device]*buffer, len(devices)), budget: budget}
	var ds []*Device
	for i, hd := range devices {
		if h, ok := hd.(*HostDevice); ok && h.plat == p {
			if err := h.usable(); err != nil {
				return nil, err
			}
			if s.hostDev == nil {
				s.hostDev = h
				s.devices = append(s.devices, h)
			}
			continue
		}
		d, ok := hd.(*Device)
		if !ok || d.plat != p {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: shared allocation: device %d (%v) is not a device of this platform", i, deviceName(hd))
		}
		if err := d.usable(); err != nil {
			return nil, err
		}
		if _, dup := s.views[d]; dup {
			continue
		}
		s.views[d] = nil
		ds = append(ds, d)
		s.devices = append(s.devices, d)
	}
	if err := budget.Charge(int64(size)); err != nil {
		return nil, err
	}
	if err := s.alloc(ds); err != nil {
		budget.Release(int64(size))
		return nil, err
	}
	for _, d := range ds {
		d.live.Add(1)
	}
	if s.extra != nil {
		s.extra.live.Add(1)
	}
	if s.hostDev != nil {
		s.hostView = &hostBuffer{dev: s.hostDev, mem: unsafe.Slice((*byte)(s.host), s.size), shared: s}
		s.hostDev.live.Add(1)
	}
	return s, nil
}

func deviceName(d hw.Device) string {
	if d == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s %T", d.Name(), d)
}

// allocator is the GPU whose context allocates and frees the mapping: the
// first listed GPU, or the platform's first healthy GPU when only the host
// device is listed (PORTABLE memory belongs to every context).
func (s *sharedMem) allocator(ds []*Device) (*Device, error) {
	if len(ds) > 0 {
		return ds[0], nil
	}
	for _, d := range s.plat.devices {
		if d.usable() == nil {
			return d, nil
		}
	}
	return nil, errdefs.Errorf(errdefs.ErrDeviceLost, "cuda: no usable GPU to allocate shared memory with")
}

func (s *sharedMem) alloc(ds []*Device) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	first, err := s.allocator(ds)
	if err != nil {
		return err
	}
	if len(ds) == 0 {
		s.extra = first
	}
	if err := first.enter(); err != nil {
		return err
	}
	host, r := first.drv.MemHostAlloc(uintptr(s.size), hostAllocFlags)
	if err := first.check("cuMemHostAlloc", r, errdefs.ErrFault); err != nil {
		return err
	}
	s.host = host
	for _, d := range ds {
		err := d.enter()
		if err == nil {
			var p cuDevicePtr
			p, r = d.drv.MemHostGetDevicePointer(host)
			err = d.check("cuMemHostGetDevicePointer_v2", r, errdefs.ErrFault)
			s.views[d] = &buffer{dev: d, size: s.size, ptr: p, host: host, shared: s}
		}
		if err != nil {
			if first.enter() == nil {
				first.drv.MemFreeHost(host)
			}
			return err
		}
	}
	// Fresh memory starts zeroed, like every other backend's.
	clear(unsafe.Slice((*byte)(host), s.size))
	s.plat.pinned.add(host, s.size)
	return nil
}

func (s *sharedMem) Size() int { return s.size }

// Bytes is the host mapping. It must not be used after Free.
func (s *sharedMem) Bytes() []byte { return unsafe.Slice((*byte)(s.host), s.size) }

func (s *sharedMem) Devices() []hw.Device { return append([]hw.Device(nil), s.devices...) }

func (s *sharedMem) word(off int) *uint32 {
	if off < 0 || off%4 != 0 || off > s.size-4 {
		panic(fmt.Sprintf("cuda: shared word at offset %d outside [0,%d) or unaligned", off, s.size))
	}
	if s.freed.Load() {
		panic("cuda: shared allocation used after Free")
	}
	return (*uint32)(unsafe.Add(s.host, off))
}

// Store32Release atomically stores v at off (a multiple of 4).
func (s *sharedMem) Store32Release(off int, v uint32) { atomic.StoreUint32(s.word(off), v) }

// Load32Acquire atomically loads the word at off.
func (s *sharedMem) Load32Acquire(off int) uint32 { return atomic.LoadUint32(s.word(off)) }

// mapped reports whether dev is one of the allocation's devices.
func (s *sharedMem) mapped(dev hw.Device) bool {
	if h, ok := dev.(*HostDevice); ok {
		return h != nil && h == s.hostDev
	}
	d, _ := dev.(*Device)
	_, ok := s.views[d]
	return ok && d != nil
}

// PrepareRelease returns dev's visibility action: a store fence. Mapped
// pinned memory is coherent with the device (and the host device reads the
// mapping itself), so ordering the host's stores is all a release needs.
func (s *sharedMem) PrepareRelease(dev hw.Device, off, length int) (hw.VisibilityAction, error) {
	if !s.mapped(dev) {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: shared allocation is not mapped on %v", deviceName(dev))
	}
	if off < 0 || length < 0 || off > s.size || length > s.size-off {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: release range [%d,+%d) outside %d bytes", off, length, s.size)
	}
	return &storeFence{dev: dev}, nil
}

// View returns the allocation as a buffer of dev: for a GPU its device
// pointer from cuMemHostGetDevicePointer_v2, for the host device the host
// mapping. Freeing the view is a no-op.
func (s *sharedMem) View(dev hw.Device) (hw.Buffer, error) {
	if !s.mapped(dev) {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: shared allocation is not mapped on %v", deviceName(dev))
	}
	if s.freed.Load() {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "cuda: shared allocation was freed")
	}
	if _, ok := dev.(*HostDevice); ok {
		return s.hostView, nil
	}
	return s.views[dev.(*Device)], nil
}

// Free releases the allocation. As for buffers, the memory and the budget
// charge are released once the work queued so far on its devices has
// retired; views become unusable at once.
func (s *sharedMem) Free() error {
	if !s.freed.CompareAndSwap(false, true) {
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: shared allocation freed twice")
	}
	var owners []queueOwner
	var devs []*Device // listed GPUs, then the allocating one
	for _, hd := range s.devices {
		switch d := hd.(type) {
		case *Device:
			d.freeGen.Add(1)
			devs = append(devs, d)
			owners = append(owners, d)
		case *HostDevice:
			d.freeGen.Add(1)
			owners = append(owners, d)
		}
	}
	if s.extra != nil {
		devs = append(devs, s.extra)
	}
	afterQueued(owners, func() {
		runtime.LockOSThread()
		// Any healthy context frees PORTABLE memory; a lost one cannot.
		for _, d := range devs {
			if d.Err() == nil && d.drv.CtxSetCurrent(d.ctx) == cudaSuccess {
				d.drv.MemFreeHost(s.host)
				s.plat.pinned.remove(s.host)
				break
			}
		}
		runtime.UnlockOSThread()
		s.budget.Release(int64(s.size))
		for _, d := range devs {
			d.live.Add(-1)
		}
		if s.hostDev != nil {
			s.hostDev.live.Add(-1)
		}
	})
	return nil
}

// fenceWord is the target of the full barrier in storeFence.
var fenceWord atomic.Uint32

// storeFence orders every earlier host store before later ones: a locked
// read-modify-write is a full fence on every architecture Go supports.
type storeFence struct{ dev hw.Device }

func (f *storeFence) Execute() error {
	fenceWord.Add(1)
	return f.dev.Err()
}
