// Package errdefs is stagehost's fixed set of error classes: every error
// the host returns wraps one of them ([ClassOf] names it), and callers
// classify errors with errors.Is, as containerd's errdefs does. Package abi
// maps them to guest status codes (abi/status.go). Their wire names, the
// classes only the HTTP service and the lattice add (unavailable,
// client_closed, …), each class's HTTP status, and [RemoteError], an error
// another host of a lattice answered, are in classes.go; the HTTP service
// maps errors to those classes in service/errors.go. Nothing else
// translates them.
package errdefs

import (
	"context"
	"errors"
	"fmt"
)

// The fixed set of error classes. Every error that stagehost returns wraps
// one of them, so callers classify failures with [errors.Is]:
//
//	if errors.Is(err, errdefs.ErrDeviceLost) { ... }
//
// An error made by [Errorf] whose message wraps a cause with %w also
// matches the cause's class; [ClassOf] names the one it was given.
//
// The ABI maps these classes onto guest status codes in one place
// (package abi); nothing else translates them.
var (
	// ErrBusy: the resource is in use or the call would re-enter a runtime
	// that is already running a stage on this call path. Retrying later may
	// succeed.
	ErrBusy = errors.New("busy")
	// ErrDeviceLost: the device, or the owner of the resource, can no longer
	// be trusted: the device faulted or was lost, or the owner is
	// quarantined. Nothing on it will ever succeed again.
	ErrDeviceLost = errors.New("device lost")
	// ErrUnsupported: the backend or device cannot do this at all.
	ErrUnsupported = errors.New("unsupported")
	// ErrInvalidArgument: the request is malformed: out-of-range buffer,
	// wrong device, bad size, unknown enum value.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: a named program, device, stream or handle does not exist.
	ErrNotFound = errors.New("not found")
	// ErrOutOfBudget: a memory budget or the submission capacity cannot
	// accommodate the request.
	ErrOutOfBudget = errors.New("out of budget")
	// ErrDeadlineExceeded: a deadline or cancellation ended the wait. Errors
	// of this class also match the context error that caused them.
	ErrDeadlineExceeded = errors.New("deadline exceeded")
	// ErrRejected: the device refused to accept a submission. Nothing was
	// queued.
	ErrRejected = errors.New("rejected by device")
	// ErrFault: submitted work failed on the device (a failed completion),
	// without losing the device.
	ErrFault = errors.New("device fault")
	// ErrClosed: the object was closed or freed by its owner.
	ErrClosed = errors.New("closed")
)

// ErrFailedPrecondition: the request is well formed, but what it needs is
// not there: a module declares requirements (its stagehost.requires
// section, abi/ABI.md §7) that the session, or the host, does not meet.
// It is a class of the host's only, outside [Classes]: no ABI status
// code maps to it, since no guest call can fail with it (a guest status
// of such an error would read FAULT). Its wire name is
// [ClassFailedPrecondition]; its HTTP status 409.
var ErrFailedPrecondition = errors.New("failed precondition")

// Classes lists every error class, in a fixed order.
var Classes = []error{
	ErrBusy, ErrDeviceLost, ErrUnsupported, ErrInvalidArgument, ErrNotFound,
	ErrOutOfBudget, ErrDeadlineExceeded, ErrRejected, ErrFault, ErrClosed,
}

// Errorf returns an error of the given class with a formatted message. The
// message may use %w to wrap a cause as well.
//
//	return errdefs.Errorf(errdefs.ErrInvalidArgument, "buffer range [%d,%d) exceeds size %d", off, end, size)
func Errorf(class error, format string, args ...any) error {
	return newClassed(class, fmt.Errorf(format, args...))
}

// ContextError converts a finished context's error into ErrDeadlineExceeded
// that also matches the context's own error (context.DeadlineExceeded or
// context.Canceled).
func ContextError(ctx context.Context, what string) error {
	cause := context.Cause(ctx)
	if cause == nil {
		cause = ctx.Err()
	}
	return newClassed(ErrDeadlineExceeded, fmt.Errorf("%s: %w", what, cause))
}

// ClassOf returns the class an error belongs to, or nil if it belongs to
// none of [Classes]. For an error made by [Errorf] it is the class given
// there, even when the message wraps a cause of another class.
func ClassOf(err error) error {
	var c *classed
	if errors.As(err, &c) {
		return c.wrapped[0]
	}
	for _, c := range Classes {
		if errors.Is(err, c) {
			return c
		}
	}
	return nil
}

type classed struct {
	wrapped [2]error // the class, then the formatted error
}

func newClassed(class, inner error) *classed {
	return &classed{wrapped: [2]error{class, inner}}
}

func (e *classed) Error() string { return e.wrapped[1].Error() }

// Unwrap returns a slice of the error's own array, so errors.Is allocates
// nothing.
func (e *classed) Unwrap() []error { return e.wrapped[:] }
