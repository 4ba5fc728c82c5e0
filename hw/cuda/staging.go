package cuda

import (
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Small uploads and downloads on the MLP stage's path (issue 9): an
// upload is staged through pinned memory so that its copy is truly
// asynchronous, and a download into pageable memory retires the stream up
// to it as soon as the driver call returns, with no event recorded or
// polled. See RATIONALE.md, "One wait per MLP call".

// DefaultUploadStaging is the size of each stream's pinned upload staging
// unless [WithUploadStaging] says otherwise.
const DefaultUploadStaging = 64 << 10

// maxStagedWrite is the largest upload that goes through the staging: a
// larger one is copied by the driver from the caller's memory as before
// (its own staging then costs about what ours would).
const maxStagedWrite = 4 << 10

// stageAlign keeps staged uploads 16-byte aligned.
const stageAlign = 16

// WithUploadStaging sets the size of each GPU stream's pinned upload
// staging (default [DefaultUploadStaging]); 0 turns it off. An upload of
// at most 4 KiB is copied into the staging on the stream's driver thread
// and uploaded from there (cuMemcpyHtoDAsync from pinned memory is
// asynchronous; from pageable memory the driver first synchronizes the
// stream and stages the bytes itself). Staging space is reused once the
// upload has retired; when it is full, uploads take the pageable path.
func WithUploadStaging(bytes int) Option {
	return func(c *config) { c.uploadStaging = max(bytes, 0) }
}

// uploadStaging is a stream's pinned upload ring (driver thread only).
// Uploads retire in order, so space is handed out in order and given back
// in order: recs holds the live allocations, oldest first, and newest is
// the last one handed out.
type uploadStaging struct {
	host   unsafe.Pointer
	size   int
	recs   ring[stageRec]
	newest stageRec
	used   atomic.Uint64 // uploads that went through the staging (tests, docs)
}

type stageRec struct {
	seq        uint64
	start, end int // [start, end), end aligned
}

// alloc returns the offset of n free bytes, or false when there is no
// room (the upload then takes the pageable path).
func (u *uploadStaging) alloc(n int) (int, bool) {
	n = (n + stageAlign - 1) &^ (stageAlign - 1)
	if n <= 0 || n > u.size {
		return 0, false
	}
	start := 0
	if u.recs.len() > 0 {
		oldest, newest := u.recs.front().start, u.newest
		if newest.start >= oldest {
			// Live space is [oldest, newest.end): free after it, or
			// before oldest.
			switch {
			case newest.end+n <= u.size:
				start = newest.end
			case n <= oldest:
				start = 0
			default:
				return 0, false
			}
		} else {
			// Wrapped: live space is [oldest, size) and [0, newest.end).
			if newest.end+n > oldest {
				return 0, false
			}
			start = newest.end
		}
	}
	return start, true
}

// stage copies the upload's bytes into the staging and returns the pinned
// source to upload from, or nil.
func (s *Stream) stage(o *op) unsafe.Pointer {
	u := s.staging
	if u == nil || o.n > maxStagedWrite {
		return nil
	}
	off, ok := u.alloc(int(o.n))
	if !ok {
		return nil
	}
	dst := unsafe.Add(u.host, off)
	copy(unsafe.Slice((*byte)(dst), o.n), unsafe.Slice((*byte)(o.host), o.n))
	u.newest = stageRec{seq: o.seq, start: off, end: off + (int(o.n)+stageAlign-1)&^(stageAlign-1)}
	u.recs.push(u.newest)
	u.used.Add(1)
	return dst
}

// releaseStaged gives back the staging of uploads retired up to seq.
func (u *uploadStaging) releaseStaged(seq uint64) {
	for u.recs.len() > 0 && u.recs.front().seq <= seq {
		u.recs.pop()
	}
}

// openStaging allocates the stream's upload staging (driver thread, with
// the context current). Without it uploads take the pageable path.
func (s *Stream) openStaging() {
	size := s.dev.plat.cfg.uploadStaging
	if size <= 0 {
		return
	}
	d := s.dev
	host, r := d.drv.MemHostAlloc(uintptr(size), hostAllocFlags)
	if r != cudaSuccess {
		return
	}
	d.plat.pinned.add(host, size)
	s.staging = &uploadStaging{host: host, size: size}
}

// closeStaging frees the staging at teardown. On a lost device the memory
// stays allocated (and registered as pinned).
func (s *Stream) closeStaging(healthy bool) {
	if s.staging == nil || !healthy {
		return
	}
	s.dev.drv.MemFreeHost(s.staging.host)
	s.dev.plat.pinned.remove(s.staging.host)
}

// pinnedRanges is the platform's record of the page-locked host memory it
// allocated (cuMemHostAlloc): host-visible buffers, shared allocations and
// upload staging. This package never registers other memory with the
// driver (no cuMemHostRegister), so memory outside these ranges is
// pageable to CUDA. Reads consult it on every call, so it is a
// copy-on-write snapshot: lookups take no lock.
type pinnedRanges struct {
	mu   sync.Mutex
	snap atomic.Pointer[[]hostRange]
}

type hostRange struct{ start, end uintptr }

func (p *pinnedRanges) add(host unsafe.Pointer, size int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var cur []hostRange
	if s := p.snap.Load(); s != nil {
		cur = *s
	}
	start := uintptr(host)
	next := append(slices.Clone(cur), hostRange{start, start + uintptr(size)})
	slices.SortFunc(next, func(a, b hostRange) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	p.snap.Store(&next)
}

func (p *pinnedRanges) remove(host unsafe.Pointer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.snap.Load()
	if s == nil {
		return
	}
	next := slices.DeleteFunc(slices.Clone(*s), func(r hostRange) bool { return r.start == uintptr(host) })
	p.snap.Store(&next)
}

// overlaps reports whether [host, host+n) touches pinned memory.
func (p *pinnedRanges) overlaps(host unsafe.Pointer, n int) bool {
	s := p.snap.Load()
	if s == nil || n <= 0 {
		return false
	}
	lo, hi := uintptr(host), uintptr(host)+uintptr(n)
	rs := *s
	// The first range ending after lo is the only candidate below hi
	// (ranges do not overlap one another).
	i, _ := slices.BinarySearchFunc(rs, lo, func(r hostRange, t uintptr) int {
		if r.end <= t {
			return -1
		}
		return 1
	})
	return i < len(rs) && rs[i].start < hi
}

// retireSynchronous retires everything up to seq at once (driver thread):
// a download into pageable memory returns only once the copy has
// completed (CUDA's "API synchronization behavior"), and the stream runs
// in order, so every earlier command has completed too. Events recorded
// for them are recycled without being queried.
func (s *Stream) retireSynchronous(seq uint64) {
	for s.pending.len() > 0 {
		m := s.pending.pop()
		s.freeEvents = append(s.freeEvents, m.ev)
	}
	s.marked = max(s.marked, seq)
	s.sinceEvent = 0
	s.syncRetires.Add(1)
	s.advance(seq)
}
