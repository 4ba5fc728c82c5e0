package deploy

import (
	"context"
	"errors"
	"strings"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/stages"
)

// Class returns the wire class name of a session call's error
// (errdefs.ClassOK for nil): an [*errdefs.RemoteError]'s own class,
// client_error for a [*stages.ClientError], unavailable for
// [ErrUnavailable], the name of its class in [errdefs.Classes], else
// internal. The HTTP service adds its own errors' classes (a limit, a
// route, a token) and maps every class to its HTTP status.
func Class(err error) string {
	var ce *stages.ClientError
	var re *errdefs.RemoteError
	switch {
	case err == nil:
		return errdefs.ClassOK
	case errors.As(err, &re):
		return re.Class
	case errors.As(err, &ce):
		return errdefs.ClassClientError
	case errors.Is(err, ErrUnavailable):
		return errdefs.ClassUnavailable
	}
	if name := errdefs.Name(err); name != "" {
		return name
	}
	return errdefs.ClassInternal
}

// Outcome is Class, except that an error after ctx was cancelled (the
// client went away) is errdefs.ClassClientClosed. It is the outcome
// recorded for a session call, in metrics and in /v1/sessions alike.
func Outcome(ctx context.Context, err error) string {
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return errdefs.ClassClientClosed
	}
	return Class(err)
}

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
