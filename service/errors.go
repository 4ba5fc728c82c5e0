package service

import (
	"context"
	"errors"
	"net/http"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
)

// The error contract of the HTTP service: every error has one class, whose
// wire name (errdefs.ClassX, package errdefs's classes.go) is the
// "class" of its JSON error body, and whose HTTP status
// ([errdefs.HTTPStatus]) is the answer's. This file is where the service
// maps errors to classes and classes to HTTP answers; metrics (the
// outcome label of stagehost_session_runs_total), /v1/sessions
// (outcomes) and error bodies all use these names.

// Class returns the class name of err: the service's own errors' class (a
// limit, a route, a token), else [deploy.Class]: errdefs.ClassOK for nil.
func Class(err error) string {
	var se *serviceError
	if errors.As(err, &se) {
		return se.class
	}
	return deploy.Class(err)
}

// Outcome is Class, except that an error after ctx was cancelled (the
// client went away) is errdefs.ClassClientClosed. It is the outcome
// recorded for a request, in metrics and in the access log alike.
func Outcome(ctx context.Context, err error) string {
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return errdefs.ClassClientClosed
	}
	return Class(err)
}

// setRetryAfter sets Retry-After: 1 on an answer of a class worth
// retrying soon: 429, and 503 rejected and closed (not device_lost or
// unavailable: those need an operator).
func setRetryAfter(w http.ResponseWriter, class string) {
	if classStatus(class) == http.StatusTooManyRequests || class == errdefs.ClassRejected || class == errdefs.ClassClosed {
		if w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", "1")
		}
	}
}

// HTTPStatus maps an error to the HTTP status the service answers with
// (see Class).
func HTTPStatus(err error) int { return classStatus(Class(err)) }

// classStatus returns a class's HTTP status (500 for an unknown class):
// [errdefs.HTTPStatus].
func classStatus(class string) int { return errdefs.HTTPStatus(class) }

// serviceError is an error of the service itself (a limit, a route, a
// token), with its class.
type serviceError struct {
	class string
	msg   string
}

func (e *serviceError) Error() string { return e.msg }
