package cuda

import (
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Small uploads and downloads (issue 9) can go through a stream's pinned
// staging rings, so that both copies are truly asynchronous: from or into
// pageable memory the driver synchronizes with the stream and stages the
// bytes itself, and a download into pageable memory returns only once it
// has completed. A staged download retires through the stream's events
// like a launch; its bytes are copied out of the ring when it retires,
// before anyone is told. A download into pageable memory that is not
// staged retires the stream up to it as soon as the driver call returns,
// with no event recorded or polled. On the H200 the staging measured
// slightly slower than none for the MLP stage's call (docs/gpu.md, run 9;
// RATIONALE.md, "One wait per MLP call").

// DefaultCopyStaging is the size of each of a stream's two staging rings
// unless [Config.WithCopyStaging] says otherwise.
const DefaultCopyStaging = 16 << 10

// maxStagedCopy is the largest copy that goes through a staging ring: a
// larger one is made by the driver from or into the caller's memory as
// before (its own staging then costs about what ours would).
const maxStagedCopy = 4 << 10

// stageAlign keeps staged copies 16-byte aligned.
const stageAlign = 16

// WithCopyStaging sets the size of each GPU stream's two pinned staging
// rings, one for uploads and one for downloads (default
// [DefaultCopyStaging]; allocated on a stream's first small copy); 0
// turns staging off. A copy of at most 4 KiB goes through a ring: an
// upload's bytes are copied into it on the stream's driver thread and
// uploaded from there, a download lands in it and is copied to the
// caller's memory when it retires. Ring space is reused once its copy has
// retired; when a ring is full, copies take the pageable path.
func (c Config) WithCopyStaging(bytes int) Config {
	c = c.orDefaults()
	c.copyStaging = max(bytes, 0)
	return c
}

// stagingRing is pinned memory handed out in order and given back in
// order, as the stream's copies retire (driver thread only): recs holds
// the live allocations, oldest first, and newest is the last one handed
// out.
type stagingRing struct {
	host   unsafe.Pointer
	size   int
	recs   ring[stageRec]
	newest stageRec
	used   atomic.Uint64 // copies that went through the ring (tests, docs)
}

type stageRec struct {
	seq        uint64
	start, end int // [start, end), end aligned
}

// copyOut is a staged download to copy to its destination at retirement.
type copyOut struct {
	seq      uint64
	src, dst unsafe.Pointer
	n        uintptr
}

// alloc returns the offset of n free bytes, or false when there is no
// room (the copy then takes the pageable path).
func (u *stagingRing) alloc(n int) (int, bool) {
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

// take hands out n bytes for command seq and returns where they are, or
// nil when the ring is full.
func (u *stagingRing) take(seq uint64, n uintptr) unsafe.Pointer {
	off, ok := u.alloc(int(n))
	if !ok {
		return nil
	}
	u.newest = stageRec{seq: seq, start: off, end: off + (int(n)+stageAlign-1)&^(stageAlign-1)}
	u.recs.push(u.newest)
	u.used.Add(1)
	return unsafe.Add(u.host, off)
}

// release gives back the space of copies retired up to seq.
func (u *stagingRing) release(seq uint64) {
	for u.recs.len() > 0 && u.recs.front().seq <= seq {
		u.recs.pop()
	}
}

// stagingFor returns the stream's upload or download ring, allocating both on
// first use (driver thread, context current); nil when staging is off,
// the copy is too large, or the pinned memory could not be allocated.
func (s *Stream) stagingFor(kind opKind, n uintptr) *stagingRing {
	size := s.dev.plat.cfg.copyStaging
	if size <= 0 || n > maxStagedCopy || s.stagingFailed {
		return nil
	}
	if s.up == nil {
		d := s.dev
		host, r := d.drv.MemHostAlloc(uintptr(2*size), hostAllocFlags)
		if r != cudaSuccess {
			s.stagingFailed = true
			return nil
		}
		d.plat.pinned.add(host, 2*size)
		s.stagingMem = host
		s.up = &stagingRing{host: host, size: size}
		s.down = &stagingRing{host: unsafe.Add(host, size), size: size}
	}
	if kind == opRead {
		return s.down
	}
	return s.up
}

// stageWrite copies an upload's bytes into the upload ring and returns the
// pinned source to upload from, or nil.
func (s *Stream) stageWrite(o *op) unsafe.Pointer {
	u := s.stagingFor(opWrite, o.n)
	if u == nil {
		return nil
	}
	p := u.take(o.seq, o.n)
	if p != nil {
		copy(unsafe.Slice((*byte)(p), o.n), unsafe.Slice((*byte)(o.host), o.n))
	}
	return p
}

// stageRead returns where in the download ring a download lands, or nil.
func (s *Stream) stageRead(o *op) unsafe.Pointer {
	u := s.stagingFor(opRead, o.n)
	if u == nil {
		return nil
	}
	return u.take(o.seq, o.n)
}

// retireStaged runs before seq is published as retired: staged downloads
// up to seq are copied to their destinations, and the rings' space up to
// seq is given back.
func (s *Stream) retireStaged(seq uint64) {
	for s.copyOuts.len() > 0 && s.copyOuts.front().seq <= seq {
		c := s.copyOuts.pop()
		copy(unsafe.Slice((*byte)(c.dst), c.n), unsafe.Slice((*byte)(c.src), c.n))
	}
	if s.up != nil {
		s.up.release(seq)
		s.down.release(seq)
	}
}

// closeStaging frees the rings at teardown. On a lost device the memory
// stays allocated (and registered as pinned).
func (s *Stream) closeStaging(healthy bool) {
	if s.stagingMem == nil || !healthy {
		return
	}
	s.dev.drv.MemFreeHost(s.stagingMem)
	s.dev.plat.pinned.remove(s.stagingMem)
}

// pinnedRanges is the platform's record of the page-locked host memory it
// allocated (cuMemHostAlloc): host-visible buffers, shared allocations and
// the streams' staging rings (uploads and downloads). This package never registers other memory with the
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
