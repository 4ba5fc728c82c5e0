// Package retire is the record a stream keeps of its commands' retirement,
// shared by the simulated backend (hw/sim) and the CUDA backend (hw/cuda).
//
// A stream numbers its commands 1, 2, 3... in submission order, and they
// retire in order, so two watermarks say which have: Submitted (the last
// number handed out) and Retired (every command up to it retired). A
// [Record] holds them, the failures of the commands that failed (by
// sequence number), how far [Record.Sync] has reported them, and the
// waiters to wake when Retired moves. Everything a stream asks on its hot
// path (State, Idle, Advance, and Wait when the command is done or retires
// within the spin window) reads atomics and allocates nothing.
//
// The device's loss is the stream's business: the methods take it as an
// error (or a function returning it) and a channel closed when it happens.
// A stream whose Retired may still move after the loss is seen must load
// the loss before the watermark (pass devErr already evaluated, as
// [Record.State] takes it) if a "lost" answer must never turn into
// "succeeded".
package retire

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// DefaultSpin is how long [Record.Wait] spins on the watermark before it
// sleeps, when [Record.Spin] is zero.
const DefaultSpin = 20 * time.Microsecond

// Record is a stream's record of its commands. The zero Record is ready to
// use (nothing submitted). It must not be copied after first use.
type Record struct {
	// Spin is how long Wait spins before it sleeps (DefaultSpin when
	// zero). Set it before first use.
	Spin time.Duration

	submitted atomic.Uint64 // stored by the stream, under its submit lock
	retired   atomic.Uint64 // moved only by Advance

	sleepers atomic.Int32 // waiters blocked on notify
	nmu      sync.Mutex
	notify   chan struct{} // nil, or closed and dropped when retired advances while someone sleeps

	failMu   sync.Mutex
	nfail    atomic.Int64 // len(fails), so lookups skip failMu while no command failed
	fails    []failure    // sorted by seq
	reported uint64       // the seq of the last failure Sync returned
}

type failure struct {
	seq uint64
	err error
}

// Submitted is the last sequence number handed out.
func (r *Record) Submitted() uint64 { return r.submitted.Load() }

// SetSubmitted publishes seq as the last sequence number handed out. The
// stream calls it, under its own submission lock, once the command is
// queued where the retirer will find it.
func (r *Record) SetSubmitted(seq uint64) { r.submitted.Store(seq) }

// Retired is the retired watermark: every command up to it retired.
func (r *Record) Retired() uint64 { return r.retired.Load() }

// State reports, without blocking, whether command seq has retired and
// with what error; devErr is the device's loss, if any, which every
// command not retired yet failed with.
func (r *Record) State(seq uint64, devErr error) (bool, error) {
	if seq <= r.retired.Load() {
		return true, r.FailureOf(seq)
	}
	if devErr != nil {
		return true, devErr
	}
	return false, nil
}

// Idle reports whether everything submitted retired (or the device is
// lost: devErr is not nil).
func (r *Record) Idle(devErr error) bool {
	return r.retired.Load() >= r.submitted.Load() || devErr != nil
}

// Wait returns nil once command seq retired, devErr's error once it
// reports one (lost is closed when it may start to), or an
// [errdefs.ErrDeadlineExceeded] error naming "backend: name" if ctx ends first.
// It spins on the watermark first (most waits end within microseconds),
// looking at the clock, devErr and the context and yielding every 64
// rounds (measured on the H200, run 2 vs run 3 in docs/gpu.md: this beat
// a spin without yields, which slowed the CUDA driver thread), then sleeps
// until [Record.Advance] or [Record.Wake] wakes it. With one P it sleeps
// at once. It allocates only when it sleeps.
func (r *Record) Wait(ctx context.Context, seq uint64, devErr func() error, lost <-chan struct{}, backend, name string) error {
	if seq <= r.retired.Load() {
		return nil
	}
	if err := devErr(); err != nil {
		return err
	}
	if spin := r.spin(); runtime.GOMAXPROCS(0) > 1 {
		start := time.Now()
		for i := 1; ; i++ {
			if seq <= r.retired.Load() {
				return nil
			}
			if i%64 == 0 {
				if err := devErr(); err != nil {
					return err
				}
				if ctx.Err() != nil || time.Since(start) > spin {
					break
				}
				runtime.Gosched()
			}
		}
	}
	r.sleepers.Add(1)
	defer r.sleepers.Add(-1)
	for {
		ch := r.current()
		// sleepers was raised before this load and Advance stores retired
		// before it reads sleepers: one of the two sees the other.
		if seq <= r.retired.Load() {
			return nil
		}
		if err := devErr(); err != nil {
			return err
		}
		select {
		case <-ch:
		case <-lost:
		case <-ctx.Done():
			if seq <= r.retired.Load() {
				return nil
			}
			if err := devErr(); err != nil {
				return err
			}
			return errdefs.ContextError(ctx, fmt.Sprintf("%s: %s: waiting for command %d", backend, name, seq))
		}
	}
}

// Quiesce blocks until command seq retired, whatever happens to the device
// (for a stream whose worker goes on retiring after a loss), re-checking
// at least every poll. It returns false if ctx ends first.
func (r *Record) Quiesce(ctx context.Context, seq uint64, poll time.Duration) bool {
	r.sleepers.Add(1)
	defer r.sleepers.Add(-1)
	for {
		ch := r.current()
		if seq <= r.retired.Load() {
			return true
		}
		select {
		case <-ch:
		case <-time.After(poll):
		case <-ctx.Done():
			return false
		}
	}
}

func (r *Record) spin() time.Duration {
	if r.Spin > 0 {
		return r.Spin
	}
	return DefaultSpin
}

// current returns the channel Advance or Wake closes next.
func (r *Record) current() chan struct{} {
	r.nmu.Lock()
	defer r.nmu.Unlock()
	if r.notify == nil {
		r.notify = make(chan struct{})
	}
	return r.notify
}

// Sleepers reports how many waiters are asleep (past their spin), for
// tests.
func (r *Record) Sleepers() int { return int(r.sleepers.Load()) }

// Sync waits (with wait, the stream's own Wait) until everything submitted
// so far retired, then returns devErr's error if it reports one, else the
// earliest failure among those commands that no earlier Sync returned:
// each failure is returned by one Sync, in order.
func (r *Record) Sync(ctx context.Context, wait func(context.Context, uint64) error, devErr func() error) error {
	target := r.submitted.Load()
	if err := wait(ctx, target); err != nil {
		return err
	}
	if err := devErr(); err != nil {
		return err
	}
	if r.nfail.Load() == 0 {
		return nil
	}
	r.failMu.Lock()
	defer r.failMu.Unlock()
	i := sort.Search(len(r.fails), func(i int) bool { return r.fails[i].seq > r.reported })
	if i < len(r.fails) && r.fails[i].seq <= target {
		r.reported = r.fails[i].seq
		return r.fails[i].err
	}
	return nil
}

// FailureOf returns the recorded failure of command seq, or nil.
func (r *Record) FailureOf(seq uint64) error {
	if r.nfail.Load() == 0 {
		return nil
	}
	r.failMu.Lock()
	defer r.failMu.Unlock()
	i := sort.Search(len(r.fails), func(i int) bool { return r.fails[i].seq >= seq })
	if i < len(r.fails) && r.fails[i].seq == seq {
		return r.fails[i].err
	}
	return nil
}

// Fail records that command seq failed with err; the first record of a
// seq wins. Record a command's failure before Advance moves past it.
func (r *Record) Fail(seq uint64, err error) {
	r.failMu.Lock()
	defer r.failMu.Unlock()
	i := sort.Search(len(r.fails), func(i int) bool { return r.fails[i].seq >= seq })
	if i < len(r.fails) && r.fails[i].seq == seq {
		return
	}
	r.fails = append(r.fails, failure{})
	copy(r.fails[i+1:], r.fails[i:])
	r.fails[i] = failure{seq, err}
	r.nfail.Add(1)
}

// Advance publishes seq as retired (the watermark never moves back: seq
// is at least Retired) and wakes the sleepers.
func (r *Record) Advance(seq uint64) {
	r.retired.Store(seq)
	if r.sleepers.Load() > 0 {
		r.Wake()
	}
}

// Wake wakes every sleeper to look again (at the watermark and the
// device's loss).
func (r *Record) Wake() {
	r.nmu.Lock()
	if r.notify != nil {
		close(r.notify)
		r.notify = nil
	}
	r.nmu.Unlock()
}
