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
// connection and runs each there.
//
// # Frames
//
// Every integer is little-endian. A call (client → worker) is a
// 26-byte header and its fields:
//
//	0      version (1)
//	1      kind (1: call)
//	2:4    session length, 1 to MaxSession (256)
//	4:6    request id length, at most MaxField (1 KiB)
//	6:8    traceparent length, at most MaxField
//	8:10   tracestate length, at most MaxField
//	10:18  the call's absolute deadline, Unix nanoseconds (int64; 0: none; < 0 refused)
//	18:26  input length (uint64), at most the worker's maxInput
//	then the session, request id, traceparent, tracestate and input bytes.
//
// An answer (worker → client) is an 18-byte header and its fields:
//
//	0      version (1)
//	1      kind (2: answer)
//	2      status (0: ok, 1: error)
//	3      flags (bit 0: a stage code is present; the other bits 0)
//	4:8    the stage code (int32; 0 unless present)
//	8      class length (0 for ok; 1 to 64 for an error, lower-case letters and '_')
//	9      reserved (0)
//	10:18  body length (uint64): the output, or the error's message; at most the client's limit
//	then the class and the body.
//
// Every length is checked before anything it counts is read or
// allocated. A frame that breaks these rules ends its connection, with
// two exceptions that are answered: an input over the worker's limit is
// answered out_of_budget, naming the limit, before the connection ends
// (its input unread); an answer body over the client's limit is refused
// by the client (internal, naming the limit), which reads nothing of it
// beyond its 4 KiB buffer and closes the connection.
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
