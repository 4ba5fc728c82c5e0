package stages

import (
	"context"

	"golang.org/x/sys/unix"

	"github.com/tetratelabs/wazero/experimental"
)

// withKernelMemory returns ctx with a new [kernelMemory] as the memory
// allocator of the instance instantiated with it.
func withKernelMemory(ctx context.Context) context.Context {
	return experimental.WithMemoryAllocator(ctx, &kernelMemory{})
}

// kernelMemory is the linear memory of one launch of a vendor kernel,
// and its own [experimental.MemoryAllocator]: [WasmKernel.run] passes a
// new one in each instantiation's context. It reserves the memory's
// maximum (the kernel memory limit) as an anonymous mapping, which costs
// nothing until a page is touched; growing exposes more of it, zero
// pages, without moving or copying what is there; and wazero's Free,
// when the launch's instance is closed, unmaps it, so the pages the
// launch touched go back to the system at once.
//
// Without it wazero grows a memory by appending to a Go slice: a kernel
// that grows one page at a time to 256 MiB allocates about 1.4 GiB of Go
// memory in one launch, and the process keeps the heap that took until
// the Go runtime returns it, long after the launch.
//
// If the reservation cannot be made (address space or map count
// exhausted), the memory is Go memory that grows as wazero's own does.
type kernelMemory struct {
	mapping []byte // the whole reservation (mapped), or the Go buffer
	mapped  bool
}

// Allocate implements [experimental.MemoryAllocator].
func (m *kernelMemory) Allocate(_, max uint64) experimental.LinearMemory {
	if max > 0 {
		b, err := unix.Mmap(-1, 0, int(max), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err == nil {
			m.mapping, m.mapped = b, true
		}
	}
	return m
}

// Reallocate implements [experimental.LinearMemory]: size bytes, the old
// ones kept and the new ones zero; nil past the reservation.
func (m *kernelMemory) Reallocate(size uint64) []byte {
	if m.mapped {
		if size > uint64(len(m.mapping)) {
			return nil
		}
		return m.mapping[:size:size]
	}
	if size > uint64(cap(m.mapping)) {
		m.mapping = append(m.mapping[:cap(m.mapping)], make([]byte, size-uint64(cap(m.mapping)))...)
	}
	m.mapping = m.mapping[:size]
	return m.mapping
}

// Free implements [experimental.LinearMemory]: it unmaps the reservation.
// The launch has copied its buffers out before its instance is closed,
// and nothing else holds the memory.
func (m *kernelMemory) Free() {
	if m.mapped {
		_ = unix.Munmap(m.mapping)
	}
	m.mapping, m.mapped = nil, false
}
