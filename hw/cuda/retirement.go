package cuda

import (
	"context"

	"github.com/stagehost/stagehost/hw/internal/retire"
)

// retirement is a stream's record of its commands (watermarks, failures,
// waiters): a [retire.Record], the one hw/sim's streams keep too, behind
// the names the GPU and host streams call. Its record is a named field,
// not an embedded one, so that the Record's exported methods do not join
// the streams' method sets.
type retirement struct {
	rec retire.Record
}

func newRetirement() retirement { return retirement{rec: retire.Record{Spin: waitSpin}} }

// state reports from cached state, without any driver call, whether
// command seq has retired and with what error; devErr is the device's
// loss, if any.
func (r *retirement) state(seq uint64, devErr error) (bool, error) { return r.rec.State(seq, devErr) }

// idle reports whether everything submitted retired (or the device is
// lost).
func (r *retirement) idle(devErr error) bool { return r.rec.Idle(devErr) }

// wait returns nil once seq retired, or the device's loss (devErr, woken by
// lost) or the context's error; see [retire.Record.Wait].
func (r *retirement) wait(ctx context.Context, seq uint64, devErr func() error, lost <-chan struct{}, name string) error {
	return r.rec.Wait(ctx, seq, devErr, lost, "cuda", name)
}

// sync waits (with wait) until everything submitted so far retired and
// returns the first failure no earlier sync reported.
func (r *retirement) sync(ctx context.Context, wait func(context.Context, uint64) error, devErr func() error) error {
	return r.rec.Sync(ctx, wait, devErr)
}

// recordFailure notes that seq failed with err; the first record wins.
func (r *retirement) recordFailure(seq uint64, err error) { r.rec.Fail(seq, err) }

// advance publishes seq as retired and wakes the sleepers.
func (r *retirement) advance(seq uint64) { r.rec.Advance(seq) }

// wake wakes every sleeper to look again.
func (r *retirement) wake() { r.rec.Wake() }
