package lattice

import (
	"context"
	"time"
)

// SetLeaving marks h as leaving (or not) without stopping its endpoints:
// the moment between the start of Close and its endpoints stopping,
// which a test cannot otherwise hold open.
func SetLeaving(h *Host, on bool) {
	h.mu.Lock()
	h.closing = on
	h.mu.Unlock()
}

// AsServiceError is the error a [Member] gives the HTTP service for err
// (classError).
func AsServiceError(err error) error { return classError(err) }

// SetOutputKeep sets how long after its answer h deletes an output it
// stored (OutputKeep).
func SetOutputKeep(h *Host, d time.Duration) { h.outputKeep.Store(int64(d)) }

// SetBeforeAnswer makes h run fn after a call's output was stored in the
// payload store and before the call's answer is sent.
func SetBeforeAnswer(h *Host, fn func()) { h.beforeAnswer.Store(&fn) }

// SetHold makes every session call h's endpoints take from the lattice
// run f first, in the endpoint's handler: blocking in f stands for a
// host stopped (SIGSTOP) before it read the call, with the calls sent to
// it meanwhile queued. nil removes it.
func SetHold(h *Host, f func()) {
	if f == nil {
		h.hold.Store(nil)
		return
	}
	h.hold.Store(&f)
}

// SetOnRun makes h call fn with a call's id just before each call it
// took from the lattice starts on an instance (the chaos tests count
// executions by call id with it). nil removes it.
func SetOnRun(h *Host, fn func(callID string)) {
	if fn == nil {
		h.onRun.Store(nil)
		return
	}
	h.onRun.Store(&fn)
}

// CallStatus is what h answers a call status request for id: running,
// answered or unknown.
func CallStatus(h *Host, id string) string { return h.runningIDs.status(id) }

// SetKeepAnswers turns off (or on again) h's keeping of the answers it
// sent, to send again when a front asks.
func SetKeepAnswers(h *Host, on bool) {
	h.runningIDs.mu.Lock()
	h.runningIDs.noKeep = !on
	h.runningIDs.mu.Unlock()
}

// SetApplyHold makes every apply of the lattice's desired module on h
// run f first: blocking in f stands for a host slow to apply, or away.
func SetApplyHold(h *Host, f func()) { h.applyHold.Store(&f) }

// SetModelRetry sets how long after a failed apply of the lattice's
// desired module a host tries again; it returns the previous value.
func SetModelRetry(d time.Duration) time.Duration {
	return time.Duration(modelRetry.Swap(int64(d)))
}

// WaitCommitted waits until h's view of the models bucket shows
// revision rev of session's desired module committed, or ctx ends.
func WaitCommitted(ctx context.Context, h *Host, session string, rev uint64) error {
	return h.models.changed.waitFor(ctx, func() bool { return h.models.committed(session) >= rev })
}
