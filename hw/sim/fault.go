package sim

import (
	"sync"
	"sync/atomic"
)

// FaultKind selects an injected fault.
type FaultKind uint8

const (
	// RejectSubmit: the next Count submissions, writes and reads fail at
	// submit with an [errdefs.ErrRejected] error; nothing is queued.
	RejectSubmit FaultKind = iota + 1
	// FailCompletion: the next Count commands (launches, writes or reads)
	// the worker reaches retire with an [errdefs.ErrFault] error instead of
	// running. They still take the device's latency.
	FailCompletion
	// Hang: the worker stops before its next command until the release
	// function returned by Inject is called (or the device is lost). A
	// command already executing finishes. Count is ignored.
	Hang
	// FailVisibility: the next Count [hw.VisibilityAction] Execute calls
	// for the device fail with an [errdefs.ErrFault] error. It is always
	// device-wide, even when injected through a stream.
	FailVisibility
	// Lose: the device is lost, as by [Device.Lose]. Count is ignored.
	Lose
)

func (k FaultKind) String() string {
	switch k {
	case RejectSubmit:
		return "reject-submit"
	case FailCompletion:
		return "fail-completion"
	case Hang:
		return "hang"
	case FailVisibility:
		return "fail-visibility"
	case Lose:
		return "lose"
	}
	return "fault(?)"
}

// Fault is an injected fault. Count applies to RejectSubmit,
// FailCompletion and FailVisibility; a Count below 1 counts as 1.
type Fault struct {
	Kind  FaultKind
	Count int
}

var noRelease = func() {}

// faultState is one scope's (a device's or a stream's) pending faults. The
// counters are read on every submission and command, so they are atomics;
// the hang list is behind a leaf mutex, only taken when nhang > 0.
type faultState struct {
	reject         atomic.Int64
	failCompletion atomic.Int64
	failVisibility atomic.Int64 // used on the device's state only

	nhang  atomic.Int32
	hangMu sync.Mutex
	hangs  []*hang
}

// take consumes one unit of counter c, reporting whether there was one.
func take(c *atomic.Int64) bool {
	for {
		n := c.Load()
		if n <= 0 {
			return false
		}
		if c.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// hang is one injected Hang: its channel is closed on release.
type hang struct {
	ch    chan struct{}
	once  sync.Once
	owner *faultState
}

func (fs *faultState) addHang() func() {
	h := &hang{ch: make(chan struct{}), owner: fs}
	fs.hangMu.Lock()
	fs.hangs = append(fs.hangs, h)
	fs.nhang.Add(1)
	fs.hangMu.Unlock()
	return h.release
}

// release resumes the workers held by h. Safe to call more than once.
func (h *hang) release() {
	h.once.Do(func() {
		fs := h.owner
		fs.hangMu.Lock()
		for i, x := range fs.hangs {
			if x == h {
				fs.hangs = append(fs.hangs[:i], fs.hangs[i+1:]...)
				fs.nhang.Add(-1)
				break
			}
		}
		fs.hangMu.Unlock()
		close(h.ch)
	})
}

// firstHang returns an unreleased hang, or nil. The common case, no hang,
// is one atomic load.
func (fs *faultState) firstHang() *hang {
	if fs.nhang.Load() == 0 {
		return nil
	}
	fs.hangMu.Lock()
	defer fs.hangMu.Unlock()
	if len(fs.hangs) == 0 {
		return nil
	}
	return fs.hangs[0]
}

func (fs *faultState) releaseHangs() {
	for {
		h := fs.firstHang()
		if h == nil {
			return
		}
		h.release()
	}
}
