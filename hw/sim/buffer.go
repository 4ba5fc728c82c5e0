package sim

import (
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// region is one anonymous shared mapping: the memory behind a [Buffer] or
// a [Shared] allocation (and that allocation's views).
//
// Its lifetime is a single atomic word, state = pins<<1 | freed:
//   - every queued or executing command pins each region it references
//     (one pin per buffer argument), so that freeing a buffer that device
//     work still uses cannot unmap memory under a kernel;
//   - free sets the freed bit; pinning fails from then on;
//   - whoever leaves the word at exactly "freed, no pins" (free itself, or
//     the last unpin after it) unmaps the memory and releases the budget.
//
// Exactly one caller observes that transition, so the unmap happens once.
type region struct {
	mapping []byte // the whole mapping, as returned by unix.Mmap
	mem     []byte // mapping[:size:size]
	budget  *hw.Budget
	charge  int64
	state   atomic.Int64
}

const freedBit = 1

var pageSize = unix.Getpagesize()

// roundUpToPage rounds n up to a multiple of the system page size.
func roundUpToPage(n int) int {
	return (n + pageSize - 1) &^ (pageSize - 1)
}

// mapRegion charges size bytes to budget and then maps
// roundUpToPage(size) bytes of zeroed memory.
func mapRegion(size int, budget *hw.Budget) (*region, error) {
	// The charge is the requested size, not the page-rounded one, so that
	// accounting is identical on every page size and every backend.
	if err := budget.Charge(int64(size)); err != nil {
		return nil, err
	}
	m, err := unix.Mmap(-1, 0, roundUpToPage(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANON)
	if err != nil {
		budget.Release(int64(size))
		return nil, errdefs.Errorf(errdefs.ErrOutOfBudget, "sim: mapping %d bytes: %w", size, err)
	}
	return &region{mapping: m, mem: m[:size:size], budget: budget, charge: int64(size)}, nil
}

// pin records one more command using the region. It fails once the region
// has been freed.
func (r *region) pin() bool {
	for {
		s := r.state.Load()
		if s&freedBit != 0 {
			return false
		}
		if r.state.CompareAndSwap(s, s+2) {
			return true
		}
	}
}

// unpin drops a pin taken by pin, unmapping the region if it was freed
// meanwhile and this was the last pin.
func (r *region) unpin() {
	if r.state.Add(-2) == freedBit {
		r.unmap()
	}
}

// free marks the region freed, unmapping it now if nothing pins it.
func (r *region) free() bool {
	for {
		s := r.state.Load()
		if s&freedBit != 0 {
			return false
		}
		if r.state.CompareAndSwap(s, s|freedBit) {
			if s == 0 {
				r.unmap()
			}
			return true
		}
	}
}

func (r *region) freed() bool { return r.state.Load()&freedBit != 0 }

func (r *region) unmap() {
	// Munmap only fails for arguments we never pass; there is nothing
	// useful to do about it here.
	_ = unix.Munmap(r.mapping)
	r.budget.Release(r.charge)
}

// Buffer is a device allocation, or a view of a [Shared] allocation, on a
// simulated device. It implements [hw.Buffer]. Every sim buffer is
// host-visible, whatever the flags it was allocated with.
type Buffer struct {
	dev    *Device
	region *region
	shared *Shared // non-nil for a view: Free is then a no-op
}

var _ hw.Buffer = (*Buffer)(nil)

// Device is the device the buffer belongs to.
func (b *Buffer) Device() hw.Device { return b.dev }

// Size is the size in bytes that was asked for.
func (b *Buffer) Size() int { return len(b.region.mem) }

// HostBytes returns the buffer's memory. It fails with an [errdefs.ErrClosed]
// error once the buffer (or, for a view, its [Shared]) is freed. The slice
// must not be used after Free: the memory is unmapped then (or, if commands
// still referenced it, as soon as they retire).
func (b *Buffer) HostBytes() ([]byte, error) {
	if b.region.freed() {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "sim: buffer on %q used after free", b.dev.name)
	}
	return b.region.mem, nil
}

// Free releases the buffer: the memory is unmapped and the budget charge
// released at once, or, if queued or executing commands still reference
// the buffer, when the last of them retires. Freeing twice returns an
// [errdefs.ErrClosed] error. Freeing a [Shared] view is a no-op.
func (b *Buffer) Free() error {
	if b.shared != nil {
		return nil
	}
	if !b.region.free() {
		return errdefs.Errorf(errdefs.ErrClosed, "sim: buffer on %q freed twice", b.dev.name)
	}
	b.dev.liveBuffers.Add(-1)
	return nil
}
