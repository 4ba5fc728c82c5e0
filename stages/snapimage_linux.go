//go:build linux

package stages

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// memImage holds a snapshot's linear memory. On Linux it is a memfd
// written once, at load, with only the pages that are not all zero (the
// others stay holes); every instance maps it privately, copy on write.
type memImage struct {
	refs atomic.Int64 // holds: see drop
	fd   int
	size int // bytes, a multiple of 64 KiB
	// view maps the image read-only and shared: the page cache's copy,
	// which resetMapping copies pages back from. nil if it could not be
	// mapped.
	view []byte
	// nonzero[i] says whether page i of the image holds anything.
	nonzero []bool
}

func newMemImage(name string, data []byte) (*memImage, error) {
	fd, err := unix.MemfdCreate("stagehost-snapshot:"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	img := &memImage{fd: fd, size: len(data)}
	img.refs.Store(1)
	if err := unix.Ftruncate(fd, int64(len(data))); err != nil {
		img.close()
		return nil, fmt.Errorf("ftruncate: %w", err)
	}
	page := os.Getpagesize()
	img.nonzero = make([]bool, (len(data)+page-1)/page)
	for off := 0; off < len(data); off += page {
		p := data[off:min(off+page, len(data))]
		if allZero(p) {
			continue
		}
		img.nonzero[off/page] = true
		if _, err := unix.Pwrite(fd, p, int64(off)); err != nil {
			img.close()
			return nil, fmt.Errorf("writing the snapshot: %w", err)
		}
	}
	if len(data) > 0 {
		if v, err := unix.Mmap(fd, 0, len(data), unix.PROT_READ, unix.MAP_SHARED); err == nil {
			img.view = v
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
	if img.view != nil {
		_ = unix.Munmap(img.view)
		img.view = nil
	}
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

// resetMapping returns an instance's mapping of the image to the image's
// contents. The pages the instance wrote are the private (anonymous)
// pages in the image's range, which /proc/self/pagemap tells apart from
// the page cache's: those are copied back from the image (or zeroed) in
// place, so the next call does not fault them in again. Without pagemap
// it drops every page written (madvise), which then read as the image
// again, at the cost of a fault each.
func (img *memImage) resetMapping(m []byte, scratch *[]byte) error {
	if img.size == 0 {
		return nil
	}
	if img.view != nil && pagemap() != nil {
		if err := img.restoreWritten(m[:img.size], scratch); err == nil {
			return nil
		}
	}
	return unix.Madvise(m[:img.size], unix.MADV_DONTNEED)
}

const (
	pmPresent   = 1 << 63
	pmFileShare = 1 << 61 // file page or shared anonymous
)

// restoreWritten copies back every private page of m. *scratch is a
// buffer for pagemap entries, kept from call to call.
func (img *memImage) restoreWritten(m []byte, scratch *[]byte) error {
	page := os.Getpagesize()
	n := len(m) / page
	if len(*scratch) < 8*min(n, 512) {
		*scratch = make([]byte, 8*min(n, 512))
	}
	buf := (*scratch)[:8*min(n, 512)]
	base := uintptr(unsafe.Pointer(&m[0])) / uintptr(page)
	for first := 0; first < n; first += len(buf) / 8 {
		k := min(n-first, len(buf)/8)
		if _, err := unix.Pread(int(pagemap().Fd()), buf[:8*k], int64(8*(base+uintptr(first)))); err != nil {
			return err
		}
		for i := range k {
			e := binary.LittleEndian.Uint64(buf[8*i:])
			if e&pmPresent == 0 || e&pmFileShare != 0 {
				continue // never written: the page cache's page, or none
			}
			p := first + i
			dst := m[p*page : (p+1)*page]
			if img.nonzero[p] {
				copy(dst, img.view[p*page:(p+1)*page])
			} else {
				clear(dst)
			}
		}
	}
	return nil
}

var pagemapFile = sync.OnceValue(func() *os.File {
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil
	}
	return f
})

// pagemap is /proc/self/pagemap, or nil where it cannot be read.
func pagemap() *os.File { return pagemapFile() }

func (img *memImage) unmap(m []byte, mapped bool) {
	if mapped {
		_ = unix.Munmap(m)
	}
}
