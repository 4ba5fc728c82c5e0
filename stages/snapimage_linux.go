//go:build linux

package stages

import (
	"bytes"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// memImage holds a snapshot's linear memory. On Linux it is a memfd
// written once, at load, with only the pages that are not all zero (the
// others stay holes); every instance maps it privately, copy on write.
type memImage struct {
	fd   int
	size int // bytes, a multiple of 64 KiB
}

func newMemImage(name string, data []byte) (*memImage, error) {
	fd, err := unix.MemfdCreate("stagehost-snapshot:"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	img := &memImage{fd: fd, size: len(data)}
	if err := unix.Ftruncate(fd, int64(len(data))); err != nil {
		img.close()
		return nil, fmt.Errorf("ftruncate: %w", err)
	}
	page := os.Getpagesize()
	for off := 0; off < len(data); off += page {
		p := data[off:min(off+page, len(data))]
		if allZero(p) {
			continue
		}
		if _, err := unix.Pwrite(fd, p, int64(off)); err != nil {
			img.close()
			return nil, fmt.Errorf("writing the snapshot: %w", err)
		}
	}
	return img, nil
}

var zeroPage [64 << 10]byte

func allZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeroPage))
		if !bytes.Equal(p[:n], zeroPage[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}

func (img *memImage) close() {
	if img.fd >= 0 {
		_ = unix.Close(img.fd)
		img.fd = -1
	}
}

// mapInstance reserves max bytes of address space (at least the image)
// and maps the image privately over its start. Pages past the image are
// anonymous zero pages. Nothing is touched, so the instance costs no
// memory until it reads or writes. If mapping fails (address space or
// map count exhausted), it falls back to a copy in Go memory.
func (img *memImage) mapInstance(max uint64) ([]byte, bool) {
	n := max
	if n < uint64(img.size) {
		n = uint64(img.size)
	}
	if n > 0 {
		m, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err == nil {
			if img.size == 0 {
				return m, true
			}
			_, err = unix.MmapPtr(img.fd, 0, unsafe.Pointer(&m[0]), uintptr(img.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_FIXED)
			if err == nil {
				return m, true
			}
			_ = unix.Munmap(m)
		}
	}
	buf := make([]byte, img.size, n)
	if err := img.copyInto(buf); err != nil {
		return nil, false // Reallocate then fails, and so does the instantiation
	}
	return buf[:cap(buf)], false
}

// copyInto copies the image into dst (len(dst) == img.size).
func (img *memImage) copyInto(dst []byte) error {
	for off := 0; off < len(dst); {
		n, err := unix.Pread(img.fd, dst[off:], int64(off))
		if err != nil {
			return err
		}
		if n == 0 {
			clear(dst[off:])
			break
		}
		off += n
	}
	return nil
}

// resetMapping drops every page an instance wrote in the image's range,
// which then reads as the image again.
func (img *memImage) resetMapping(m []byte) error {
	if img.size == 0 {
		return nil
	}
	return unix.Madvise(m[:img.size], unix.MADV_DONTNEED)
}

func (img *memImage) unmap(m []byte, mapped bool) {
	if mapped {
		_ = unix.Munmap(m)
	}
}
