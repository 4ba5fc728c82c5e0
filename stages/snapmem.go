package stages

import (
	"github.com/tetratelabs/wazero/experimental"
)

// snapMemory is the linear memory of one instance made from a snapshot.
// It is its own [experimental.MemoryAllocator]: the session passes it in
// the instantiation context, and wazero asks it for the memory once.
//
// Its pages start as the snapshot's (see memImage): on Linux a private
// copy-on-write mapping of the snapshot, so instantiation copies nothing
// and an instance holds only the pages it wrote; elsewhere a copy.
//
// wazero's Free does not release the memory: a command still in flight
// on the device may write into it (a download whose wait was cut short
// by a deadline). The session releases it with release once its streams
// are idle (see Session.retire).
type snapMemory struct {
	img     *memImage
	mapping []byte // the whole reservation, up to the memory's maximum
	mapped  bool   // mapping is an mmap (else Go memory)
	size    uint64 // the length wazero sees
	scratch []byte // for reset
}

var _ experimental.MemoryAllocator = (*snapMemory)(nil)

// newSnapMemory returns a memory of img, which it holds until release.
func newSnapMemory(img *memImage) *snapMemory {
	img.refs.Add(1)
	return &snapMemory{img: img}
}

// drop lets go of one hold on img: the module's, or a memory's. The last
// one closes it, so an image stays readable (a reset copies from it) as
// long as an instance's memory maps it, even past the engine's Close.
func (img *memImage) drop() {
	if img.refs.Add(-1) == 0 {
		img.close()
	}
}

// Allocate implements [experimental.MemoryAllocator].
func (m *snapMemory) Allocate(_, max uint64) experimental.LinearMemory {
	if m.mapping == nil {
		m.mapping, m.mapped = m.img.mapInstance(max)
	}
	return m
}

// Reallocate implements [experimental.LinearMemory]: the memory never
// moves; growing it exposes more of the reservation, whose pages past the
// snapshot are zero.
func (m *snapMemory) Reallocate(size uint64) []byte {
	if size > uint64(len(m.mapping)) {
		return nil
	}
	m.size = size
	return m.mapping[:size:size]
}

// Free implements [experimental.LinearMemory]. It releases nothing: see
// the type's comment.
func (m *snapMemory) Free() {}

// grown reports whether the instance grew its memory past the snapshot.
func (m *snapMemory) grown() bool { return m.size > uint64(m.img.size) }

// reset returns the memory to the snapshot's contents. The memory must
// not have grown.
func (m *snapMemory) reset() error {
	if m.mapped {
		return m.img.resetMapping(m.mapping, &m.scratch)
	}
	return m.img.copyInto(m.mapping[:m.img.size])
}

// release gives the memory back to the system. The instance must be
// closed and no device command may still write into it.
func (m *snapMemory) release() {
	if m.img == nil {
		return
	}
	if m.mapping != nil {
		m.img.unmap(m.mapping, m.mapped)
		m.mapping = nil
	}
	m.img.drop()
	m.img = nil
}
