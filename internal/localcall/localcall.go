// Package localcall is the local transport between `serve --supervise`
// and its workers on the same machine: a framed protocol of its own over
// a Unix domain socket per worker (mode 0600, in a directory of the
// supervisor's, mode 0700), carrying one session call per frame.
//
// A connection carries one call at a time: the client ([Client]) writes
// a call frame (the session, request id, W3C trace context, the call's
// absolute deadline and its input) and reads the answer frame (ok and
// the output, or the error's class, stage code and message) on the
// calling goroutine, then keeps the connection for a later call. The
// worker ([Serve]) reads a connection's calls in a goroutine per
// connection and runs each there. wire.go gives the frames byte by
// byte, with their limits; a frame that breaks them ends its connection.
//
// The lattice (NATS) stays the transport of model control and of calls
// to other hosts; this one only saves a call the hop through the NATS
// server (docs/deploy.md, "Local transport").
package localcall

import (
	"context"
	"net"
	"os"
	"time"
)

// Call is one call as it arrived: its session, request id, W3C trace
// context (traceparent and tracestate) and input.
type Call struct {
	Session, RequestID      string
	Traceparent, Tracestate string
	Input                   []byte
}

// CallFunc runs one call of a session under ctx (with the call's
// deadline): the worker's is lattice.Host.CallLocal, which keeps the
// shared quarantine's refusals.
type CallFunc func(ctx context.Context, c Call) ([]byte, error)

// Grace is how long past a call's deadline a [Client] waits for the
// worker's answer before it answers deadline_exceeded itself: the worker
// has the same deadline and answers at it, unless a call's device work
// outlives it (the worker then ends itself: docs/security.md).
const Grace = 250 * time.Millisecond

// Listen listens on a Unix socket at path, replacing a stale socket file
// there, with mode 0600: only the user the supervisor and its workers
// run as may connect.
//
// # Errors
//
// Those of net.Listen and os.Chmod.
func Listen(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
