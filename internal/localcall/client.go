package localcall

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// The defaults of a [ClientConfig].
const (
	// DefaultMaxAnswer is the largest answer body a client takes by
	// default: 16 MiB (the default output_limit of a session) and 64 KiB
	// for an error's message.
	DefaultMaxAnswer = 16<<20 + 64<<10
	// DefaultMaxIdle is how many idle connections a client keeps by
	// default.
	DefaultMaxIdle = 256
)

// ClientConfig configures a [Client]. It is immutable: each WithX
// returns a copy. The zero ClientConfig is [NewClientConfig]'s.
type ClientConfig struct {
	set       bool
	maxAnswer int64
	maxIdle   int
	worker    string
}

// NewClientConfig returns a configuration with the defaults:
//
//   - answers of at most [DefaultMaxAnswer] bytes (see
//     [ClientConfig.WithMaxAnswer]);
//   - at most [DefaultMaxIdle] idle connections kept (see
//     [ClientConfig.WithMaxIdle]).
func NewClientConfig() ClientConfig {
	return ClientConfig{set: true, maxAnswer: DefaultMaxAnswer, maxIdle: DefaultMaxIdle}
}

func (c ClientConfig) orDefault() ClientConfig {
	if !c.set {
		return NewClientConfig()
	}
	return c
}

// WithMaxAnswer bounds the body of an answer (an output, or an error's
// message) the client reads: a larger one is refused after its header
// is read (class internal, naming the limit) and its connection closed.
// Default [DefaultMaxAnswer]. It panics if bytes < 0.
func (c ClientConfig) WithMaxAnswer(bytes int64) ClientConfig {
	if bytes < 0 {
		panic(fmt.Sprintf("localcall: WithMaxAnswer(%d): the limit is negative", bytes))
	}
	c = c.orDefault()
	c.maxAnswer = bytes
	return c
}

// WithWorker names the worker the client calls in the messages of its
// errors ("its worker gpu0-acme ended during the call"). Default none:
// they say "the worker".
func (c ClientConfig) WithWorker(name string) ClientConfig {
	c = c.orDefault()
	c.worker = name
	return c
}

// WithMaxIdle bounds how many idle connections the client keeps for
// later calls; a connection freed beyond it is closed. Default
// [DefaultMaxIdle]. It panics if n < 0.
func (c ClientConfig) WithMaxIdle(n int) ClientConfig {
	if n < 0 {
		panic(fmt.Sprintf("localcall: WithMaxIdle(%d): the count is negative", n))
	}
	c = c.orDefault()
	c.maxIdle = n
	return c
}

// Client calls one worker over its socket. It is safe for concurrent
// use. Each call takes an idle connection (or dials one), writes its
// call and reads the answer on the calling goroutine, then gives the
// connection back for a later call; a connection carries one call at a
// time, and one that failed in any way is closed, never reused.
type Client struct {
	addr *net.UnixAddr
	cfg  ClientConfig

	mu   sync.Mutex
	idle []*conn
}

// conn is one connection to the worker.
type conn struct {
	c           *net.UnixConn
	r           *bufio.Reader
	buf         []byte // a call's header, fields and small input
	hasDeadline bool   // a deadline is set on c
}

// NewClient returns a client of the worker listening at path, with cfg.
func NewClient(path string, cfg ClientConfig) *Client {
	return &Client{addr: &net.UnixAddr{Name: path, Net: "unix"}, cfg: cfg.orDefault()}
}

// ConnError is a call's failure that the client saw on its connection
// (it ended during the call, or an answer broke the wire format): the
// [*errdefs.RemoteError] it unwraps to has the class and a message for
// the caller, which names the worker but not the socket nor the
// connection's error; Err is that error, for the log.
type ConnError struct {
	*errdefs.RemoteError
	// Err is the connection's error (a net.OpError naming the socket),
	// or the wire format's.
	Err error
}

// Unwrap returns the RemoteError.
func (e *ConnError) Unwrap() error { return e.RemoteError }

// ErrNotSent marks a call that never reached the worker: its socket
// refused the connection, or the connection ended before the whole call
// was written. A worker runs a call only once it has read all of it, so
// the call did not run and may go another way.
var ErrNotSent = errors.New("localcall: not sent")

var (
	aLongTimeAgo      = time.Unix(1, 0)
	errDeadlinePassed = os.ErrDeadlineExceeded
)

// Call runs a call of session on the worker, with ctx's deadline sent as
// the call's absolute deadline, requestID as its request id and the
// trace context of carrier (its traceparent and tracestate; a field over
// [MaxField] bytes is left out, and the worker's span then starts a
// trace of its own). Past the deadline it waits [Grace] for the
// worker's answer.
//
// A call on an idle connection that the worker had closed (it
// restarted, or stopped serving) is made again once on a new
// connection: the worker read none of it, so it did not run.
//
// # Errors
//
//   - an [*errdefs.RemoteError] with the worker's class, message and
//     stage code, when the worker answered with an error;
//   - an error that wraps [ErrNotSent] when the worker's socket could
//     not be reached, or the connection ended before the whole call was
//     written;
//   - deadline_exceeded when the worker did not answer within the
//     deadline plus [Grace], or its connection ended after the deadline
//     (a worker that is ended for a call that outlived its deadline);
//   - client_closed when ctx was cancelled before the answer was read:
//     the connection is closed at once;
//   - unavailable when the connection ended before the deadline, after
//     the whole call was written: the call may have run, and is never
//     sent twice;
//   - the deadline_exceeded and unavailable errors of a connection that
//     ended, and the internal error of an answer that breaks the wire
//     format, are a [*ConnError]: its message names the worker
//     ([ClientConfig.WithWorker]), its Err is the connection's error;
//   - invalid_argument for a session name of 0 or over [MaxSession]
//     bytes, or a request id over [MaxField] bytes (not sent);
//   - internal for an answer over the client's limit
//     ([ClientConfig.WithMaxAnswer]), or one that breaks the wire
//     format.
func (c *Client) Call(ctx context.Context, session, requestID string, carrier map[string][]string, input []byte) ([]byte, error) {
	switch {
	case len(session) == 0 || len(session) > MaxSession:
		return nil, &errdefs.RemoteError{Class: errdefs.ClassInvalidArgument, Message: fmt.Sprintf("session %q: a session name of %d bytes (1 to %d)", trim(session), len(session), MaxSession)}
	case len(requestID) > MaxField:
		return nil, &errdefs.RemoteError{Class: errdefs.ClassInvalidArgument, Message: fmt.Sprintf("session %q: a request id of %d bytes (at most %d)", session, len(requestID), MaxField)}
	}
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, &errdefs.RemoteError{Class: errdefs.ClassClientClosed, Message: fmt.Sprintf("session %q: %v", session, err)}
	}
	tp, ts := traceField(carrier, "traceparent", "Traceparent"), traceField(carrier, "tracestate", "Tracestate")
	for attempt := 0; ; attempt++ {
		cn, pooled, err := c.get(attempt > 0)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrNotSent, c.addr.Name, err)
		}
		out, err, again := c.roundTrip(ctx, cn, session, requestID, tp, ts, input)
		if again && pooled && attempt == 0 {
			continue
		}
		if again {
			return nil, fmt.Errorf("%w: %s: %v", ErrNotSent, c.addr.Name, err)
		}
		return out, err
	}
}

func traceField(carrier map[string][]string, key, canonical string) string {
	v := carrier[key]
	if len(v) == 0 {
		v = carrier[canonical]
	}
	if len(v) == 0 || len(v[0]) > MaxField {
		return ""
	}
	return v[0]
}

func trim(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// get takes an idle connection, or dials one; with fresh, it dials.
func (c *Client) get(fresh bool) (cn *conn, pooled bool, err error) {
	c.mu.Lock()
	if n := len(c.idle); n > 0 && !fresh {
		cn = c.idle[n-1]
		c.idle[n-1] = nil
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return cn, true, nil
	}
	c.mu.Unlock()
	uc, err := net.DialUnix("unix", nil, c.addr)
	if err != nil {
		return nil, false, err
	}
	return &conn{c: uc, r: bufio.NewReaderSize(uc, 4<<10)}, false, nil
}

// put gives an idle connection back.
func (c *Client) put(cn *conn) {
	c.mu.Lock()
	if len(c.idle) < c.cfg.maxIdle {
		c.idle = append(c.idle, cn)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	_ = cn.c.Close()
}

// Close closes the client's idle connections. The client stays usable:
// a later call dials again.
func (c *Client) Close() {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.mu.Unlock()
	for _, cn := range idle {
		_ = cn.c.Close()
	}
}

// The states of a call's cancellation.
const (
	running = iota
	aborted // ctx was cancelled: the connection's deadline is now past
	done    // the answer was read, or the call failed otherwise
)

// roundTrip makes one call on cn. again reports a call that did not
// reach the worker (the connection ended before the whole call was
// written, and the worker answered nothing): err is then the
// connection's error.
func (c *Client) roundTrip(ctx context.Context, cn *conn, session, requestID, tp, ts string, input []byte) (_ []byte, _ error, again bool) {
	dl, hasDL := ctx.Deadline()
	var dlNS int64
	switch {
	case hasDL:
		dlNS = max(dl.UnixNano(), 1)
		_ = cn.c.SetDeadline(dl.Add(Grace))
		cn.hasDeadline = true
	case cn.hasDeadline:
		_ = cn.c.SetDeadline(time.Time{})
		cn.hasDeadline = false
	}
	// ctx's cancellation (not its deadline: the worker answers at it,
	// and the connection's deadline is Grace past it) ends the call at
	// once.
	state := new(atomic.Int32)
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() {
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) && state.CompareAndSwap(running, aborted) {
				_ = cn.c.SetDeadline(aLongTimeAgo)
			}
		})
	}
	end := func() bool {
		if stop != nil {
			stop()
		}
		return state.CompareAndSwap(running, done)
	}
	failed := func(err error) error {
		_ = cn.c.Close()
		switch {
		case state.Load() == aborted:
			return &errdefs.RemoteError{Class: errdefs.ClassClientClosed, Message: fmt.Sprintf("session %q: %v", session, context.Cause(ctx))}
		case errors.Is(err, errDeadlinePassed):
			return &errdefs.RemoteError{Class: errdefs.ClassDeadlineExceeded, Message: fmt.Sprintf("session %q: %s did not answer within the call's deadline and %v", session, c.worker(), Grace)}
		case hasDL && !time.Now().Before(dl):
			return &ConnError{&errdefs.RemoteError{Class: errdefs.ClassDeadlineExceeded, Message: fmt.Sprintf("session %q: %s ended after the call's deadline", session, c.worker())}, err}
		}
		return &ConnError{&errdefs.RemoteError{Class: errdefs.ClassUnavailable, Message: fmt.Sprintf("session %q: %s ended during the call; the call may have run", session, c.worker())}, err}
	}

	cn.buf = appendCallHeader(cn.buf[:0], session, requestID, tp, ts, dlNS, len(input))
	total := int64(len(cn.buf) + len(input))
	var n int64
	var err error
	if len(input) <= 4<<10 {
		cn.buf = append(cn.buf, input...)
		var k int
		k, err = cn.c.Write(cn.buf)
		n = int64(k)
	} else {
		bufs := net.Buffers{cn.buf, input}
		n, err = bufs.WriteTo(cn.c)
	}
	if err != nil {
		if !errors.Is(err, errDeadlinePassed) {
			// A worker that refused the call (its input is over the
			// worker's limit) answered before it ended the connection.
			if a, rerr := readAnswer(cn.r, c.cfg.maxAnswer); rerr == nil && !a.ok {
				end()
				_ = cn.c.Close()
				return nil, remoteError(&a), false
			}
		}
		if n < total && !errors.Is(err, errDeadlinePassed) && end() {
			_ = cn.c.Close()
			return nil, err, true
		}
		end()
		return nil, failed(err), false
	}
	a, err := readAnswer(cn.r, c.cfg.maxAnswer)
	if !end() && err == nil {
		err = context.Cause(ctx)
	}
	if err != nil {
		var big *tooLargeAnswer
		switch {
		case errors.As(err, &big):
			_ = cn.c.Close()
			return nil, &errdefs.RemoteError{Class: errdefs.ClassInternal, Message: fmt.Sprintf("session %q: an answer of %d bytes from %s is larger than this client's limit of %d bytes", session, big.size, c.worker(), big.limit)}, false
		case errors.Is(err, errFrame):
			_ = cn.c.Close()
			return nil, &ConnError{&errdefs.RemoteError{Class: errdefs.ClassInternal, Message: fmt.Sprintf("session %q: the answer of %s breaks the local transport's format", session, c.worker())}, err}, false
		}
		return nil, failed(err), false
	}
	c.put(cn)
	if a.ok {
		return a.body, nil, false
	}
	return nil, remoteError(&a), false
}

// worker is how the client's errors name its worker: "its worker NAME",
// or "the worker".
func (c *Client) worker() string {
	if c.cfg.worker == "" {
		return "the worker"
	}
	return "its worker " + c.cfg.worker
}

func remoteError(a *answer) error {
	return &errdefs.RemoteError{Class: a.class, Message: string(a.body), Code: a.code}
}
