package deploy

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/stages"
)

// The error contract of the HTTP service: every error class, its JSON
// class name and its HTTP status, in this one table. The class names are
// the ABI's status names (abi/status.go) in snake case, plus the classes
// only the service has. Metrics (the outcome label of
// stagehost_session_runs_total), /v1/sessions (outcomes) and error
// bodies all use these names.
const (
	ClassOK               = "ok"
	ClassBusy             = "busy"              // errdefs.ErrBusy, and the service's own limits: 429
	ClassDeviceLost       = "device_lost"       // errdefs.ErrDeviceLost (the session is quarantined or its device lost): 503
	ClassUnsupported      = "unsupported"       // errdefs.ErrUnsupported: 501
	ClassInvalidArgument  = "invalid_argument"  // errdefs.ErrInvalidArgument: 400
	ClassNotFound         = "not_found"         // errdefs.ErrNotFound, and unknown routes: 404
	ClassOutOfBudget      = "out_of_budget"     // errdefs.ErrOutOfBudget, and a request body over the session's max_input: 413
	ClassDeadlineExceeded = "deadline_exceeded" // errdefs.ErrDeadlineExceeded: 504
	ClassRejected         = "rejected"          // errdefs.ErrRejected (the device refused the submission; retry): 503
	ClassFault            = "fault"             // errdefs.ErrFault (a trap, a failed command): 500
	ClassClosed           = "closed"            // errdefs.ErrClosed (the session is closing): 503
	ClassClientError      = "client_error"      // *stages.ClientError (the stage returned non-zero): 422
	ClassUnavailable      = "unavailable"       // ErrUnavailable (the session could not be created): 503
	ClassClientClosed     = "client_closed"     // the client went away before the answer: 499 (never delivered)
	ClassMethodNotAllowed = "method_not_allowed"
	ClassUnauthenticated  = "unauthenticated" // no or wrong bearer token: 401
	ClassPermissionDenied = "permission_denied"
	ClassInternal         = "internal" // an error of no class: 500
)

// StatusClientClosed is the status recorded (in the access log) for a
// request whose client went away first: nginx's 499. No client sees it.
const StatusClientClosed = 499

// classStatus maps every class to its HTTP status.
var classStatus = map[string]int{
	ClassBusy:             http.StatusTooManyRequests,
	ClassDeviceLost:       http.StatusServiceUnavailable,
	ClassUnsupported:      http.StatusNotImplemented,
	ClassInvalidArgument:  http.StatusBadRequest,
	ClassNotFound:         http.StatusNotFound,
	ClassOutOfBudget:      http.StatusRequestEntityTooLarge,
	ClassDeadlineExceeded: http.StatusGatewayTimeout,
	ClassRejected:         http.StatusServiceUnavailable,
	ClassFault:            http.StatusInternalServerError,
	ClassClosed:           http.StatusServiceUnavailable,
	ClassClientError:      http.StatusUnprocessableEntity,
	ClassUnavailable:      http.StatusServiceUnavailable,
	ClassClientClosed:     StatusClientClosed,
	ClassMethodNotAllowed: http.StatusMethodNotAllowed,
	ClassUnauthenticated:  http.StatusUnauthorized,
	ClassPermissionDenied: http.StatusForbidden,
	ClassInternal:         http.StatusInternalServerError,
}

// hwClasses names the hw error classes.
var hwClasses = map[error]string{
	errdefs.ErrBusy:             ClassBusy,
	errdefs.ErrDeviceLost:       ClassDeviceLost,
	errdefs.ErrUnsupported:      ClassUnsupported,
	errdefs.ErrInvalidArgument:  ClassInvalidArgument,
	errdefs.ErrNotFound:         ClassNotFound,
	errdefs.ErrOutOfBudget:      ClassOutOfBudget,
	errdefs.ErrDeadlineExceeded: ClassDeadlineExceeded,
	errdefs.ErrRejected:         ClassRejected,
	errdefs.ErrFault:            ClassFault,
	errdefs.ErrClosed:           ClassClosed,
}

// Class returns the service's class name of err: ClassOK for nil.
func Class(err error) string {
	var ce *stages.ClientError
	var se *serviceError
	switch {
	case err == nil:
		return ClassOK
	case errors.As(err, &se):
		return se.class
	case errors.As(err, &ce):
		return ClassClientError
	case errors.Is(err, ErrUnavailable):
		return ClassUnavailable
	}
	if name, ok := hwClasses[errdefs.ClassOf(err)]; ok {
		return name
	}
	return ClassInternal
}

// Outcome is Class, except that an error after ctx was cancelled (the
// client went away) is ClassClientClosed. It is the outcome recorded for
// a session call, in metrics and in /v1/sessions alike.
func Outcome(ctx context.Context, err error) string {
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return ClassClientClosed
	}
	return Class(err)
}

// setRetryAfter sets Retry-After: 1 on an answer of a class worth
// retrying soon: 429, and 503 rejected and closed (not device_lost or
// unavailable: those need an operator).
func setRetryAfter(w http.ResponseWriter, class string) {
	if ClassStatus(class) == http.StatusTooManyRequests || class == ClassRejected || class == ClassClosed {
		if w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", "1")
		}
	}
}

// HTTPStatus maps an error to the HTTP status the service answers with
// (see Class).
func HTTPStatus(err error) int { return ClassStatus(Class(err)) }

// ClassStatus returns a class's HTTP status (500 for an unknown class).
func ClassStatus(class string) int {
	if st, ok := classStatus[class]; ok {
		return st
	}
	return http.StatusInternalServerError
}

// serviceError is an error of the service itself (a limit, a route, a
// token), with its class.
type serviceError struct {
	class string
	msg   string
}

func (e *serviceError) Error() string { return e.msg }

// PublicMessage is the message a client is given for err: its first line,
// without any guest or Wasm stack trace (which go to the log).
func PublicMessage(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "wasm stack trace"); i >= 0 {
		msg = msg[:i]
	}
	msg, _, _ = strings.Cut(msg, "\n")
	return strings.TrimRight(strings.TrimSpace(msg), ":")
}
