package cuda

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/hw"
)

// retirement is a stream's record of its commands: how many were submitted
// and retired (commands retire in order, so two watermarks say it all),
// which failed, which failures Sync already reported, and the waiters to
// wake when the watermark moves. The GPU streams and the host streams
// share it.
type retirement struct {
	submitted atomic.Uint64
	retired   atomic.Uint64

	sleepers atomic.Int32 // waiters blocked on notify
	nmu      sync.Mutex
	notify   chan struct{} // closed and replaced when retired advances while someone sleeps

	failMu       sync.Mutex
	nfail        atomic.Int32
	fails        []seqErr // sorted by seq
	syncMu       sync.Mutex
	syncReported uint64
}

func newRetirement() retirement { return retirement{notify: make(chan struct{})} }

// state reports from cached state, without any driver call, whether
// command seq has retired and with what error; devErr is the device's
// loss, if any.
func (r *retirement) state(seq uint64, devErr error) (bool, error) {
	if seq <= r.retired.Load() {
		if r.nfail.Load() == 0 {
			return true, nil
		}
		return true, r.failureOf(seq)
	}
	if devErr != nil {
		return true, devErr
	}
	return false, nil
}

// idle reports whether everything submitted retired (or the device is
// lost).
func (r *retirement) idle(devErr error) bool {
	return r.retired.Load() >= r.submitted.Load() || devErr != nil
}

// wait returns nil once seq retired, or the device's loss (devErr, woken by
// lost) or the context's error. It spins on the cached watermark first
// (most waits end within microseconds), looking at the clock and the
// context and yielding every 64 rounds (measured on the H200, run 2 vs run
// 3 in docs/gpu.md: this beat a spin without yields, which slowed the
// driver thread), then sleeps until advance wakes it. With one P it sleeps
// at once.
func (r *retirement) wait(ctx context.Context, seq uint64, devErr func() error, lost <-chan struct{}, name string) error {
	if seq <= r.retired.Load() {
		return nil
	}
	if err := devErr(); err != nil {
		return err
	}
	if runtime.GOMAXPROCS(0) > 1 {
		start := time.Now()
		for i := 1; ; i++ {
			if seq <= r.retired.Load() {
				return nil
			}
			if i%64 == 0 {
				if err := devErr(); err != nil {
					return err
				}
				if ctx.Err() != nil || time.Since(start) > waitSpin {
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
		// sleepers was raised before this load and advance stores retired
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
			return hw.ContextError(ctx, fmt.Sprintf("cuda: %s: waiting for command %d", name, seq))
		}
	}
}

// current returns the channel advance closes next.
func (r *retirement) current() chan struct{} {
	r.nmu.Lock()
	defer r.nmu.Unlock()
	return r.notify
}

// sync waits (with wait) until everything submitted so far retired and
// returns the first failure no earlier sync reported.
func (r *retirement) sync(ctx context.Context, wait func(context.Context, uint64) error, devErr func() error) error {
	target := r.submitted.Load()
	if err := wait(ctx, target); err != nil {
		return err
	}
	if err := devErr(); err != nil {
		return err
	}
	r.syncMu.Lock()
	defer r.syncMu.Unlock()
	from := r.syncReported
	if target <= from {
		return nil
	}
	r.syncReported = target
	if r.nfail.Load() == 0 {
		return nil
	}
	r.failMu.Lock()
	defer r.failMu.Unlock()
	i := sort.Search(len(r.fails), func(i int) bool { return r.fails[i].seq > from })
	if i < len(r.fails) && r.fails[i].seq <= target {
		return r.fails[i].err
	}
	return nil
}

func (r *retirement) failureOf(seq uint64) error {
	r.failMu.Lock()
	defer r.failMu.Unlock()
	i := sort.Search(len(r.fails), func(i int) bool { return r.fails[i].seq >= seq })
	if i < len(r.fails) && r.fails[i].seq == seq {
		return r.fails[i].err
	}
	return nil
}

// recordFailure notes that seq failed with err; the first record wins.
func (r *retirement) recordFailure(seq uint64, err error) {
	r.failMu.Lock()
	defer r.failMu.Unlock()
	i := sort.Search(len(r.fails), func(i int) bool { return r.fails[i].seq >= seq })
	if i < len(r.fails) && r.fails[i].seq == seq {
		return
	}
	r.fails = append(r.fails, seqErr{})
	copy(r.fails[i+1:], r.fails[i:])
	r.fails[i] = seqErr{seq, err}
	r.nfail.Add(1)
}

// advance publishes seq as retired and wakes the sleepers.
func (r *retirement) advance(seq uint64) {
	r.retired.Store(seq)
	if r.sleepers.Load() > 0 {
		r.wake()
	}
}

// wake wakes every sleeper to look again.
func (r *retirement) wake() {
	r.nmu.Lock()
	close(r.notify)
	r.notify = make(chan struct{})
	r.nmu.Unlock()
}
