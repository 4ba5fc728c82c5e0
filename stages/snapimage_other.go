//go:build !linux

package stages

import "sync/atomic"

// memImage holds a snapshot's linear memory. Off Linux it is a copy in Go
// memory, and every instance gets its own copy.
type memImage struct {
	refs atomic.Int64 // holds: see drop
	data []byte
	size int
}

func newMemImage(_ string, data []byte) (*memImage, error) {
	img := &memImage{data: append([]byte(nil), data...), size: len(data)}
	img.refs.Store(1)
	return img, nil
}

func (img *memImage) close() {}

func (img *memImage) mapInstance(max uint64) ([]byte, bool) {
	n := max
	if n < uint64(img.size) {
		n = uint64(img.size)
	}
	buf := make([]byte, n)
	copy(buf, img.data)
	return buf, false
}

func (img *memImage) copyInto(dst []byte) error { copy(dst, img.data); return nil }

func (img *memImage) resetMapping([]byte, *[]byte) error { return nil }

func (img *memImage) unmap([]byte, bool) {}
