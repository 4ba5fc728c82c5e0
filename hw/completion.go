package hw

import "context"

// Retirer is implemented by a backend's streams: it answers for commands
// identified by a per-stream sequence number.
type Retirer interface {
	// Retired reports, without blocking or making progress, whether the
	// command seq has retired, and with what error.
	Retired(seq uint64) (done bool, err error)
	// WaitRetired blocks until the command seq retires (returning its
	// error), the device is lost, or ctx ends.
	WaitRetired(ctx context.Context, seq uint64) error
}

// Completion tracks one submitted command. It is a small value: copying it
// is free and making one allocates nothing. The zero Completion is already
// complete with no error.
type Completion struct {
	r   Retirer
	seq uint64
}

// NewCompletion is used by backends to hand out completions.
func NewCompletion(r Retirer, seq uint64) Completion { return Completion{r: r, seq: seq} }

// Done reports whether the command has retired, successfully or not. It
// never blocks and makes no progress.
func (c Completion) Done() bool {
	if c.r == nil {
		return true
	}
	done, _ := c.r.Retired(c.seq)
	return done
}

// Err returns the command's failure once it has retired, and nil before.
func (c Completion) Err() error {
	if c.r == nil {
		return nil
	}
	_, err := c.r.Retired(c.seq)
	return err
}

// Wait blocks until the command retires and returns its error.
//
// # Errors
//
//   - [errdefs.ErrDeadlineExceeded] when ctx ends first; the command keeps running.
//   - [errdefs.ErrDeviceLost] when the device is lost before the command was seen
//     to retire. A command whose retirement the backend recorded before
//     the loss keeps its own result.
//   - [errdefs.ErrFault] when the command failed on the device.
func (c Completion) Wait(ctx context.Context) error {
	if c.r == nil {
		return nil
	}
	return c.r.WaitRetired(ctx, c.seq)
}
