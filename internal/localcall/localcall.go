// Package localcall is the local transport between `serve --supervise`
// and its workers on the same machine: HTTP/1.1 over a Unix domain
// socket per worker (mode 0600, in a directory of the supervisor's),
// carrying one session call per request.
//
// A request is POST /call/{session} with the input as its body and the
// headers Stagehost-Deadline (the call's absolute deadline, Unix
// nanoseconds; none: no deadline but the worker's own) and
// Stagehost-Request-Id. The answer is 200 with the output, or the
// error's HTTP status (errdefs.HTTPStatus of its class) with the headers
// Stagehost-Class and, for a stage's client_error, Stagehost-Code, and
// the error's message as the body.
//
// The lattice (NATS) stays the transport of model control and of calls
// to other hosts; this one only saves a call the hop through the NATS
// server (docs/deploy.md, "Local transport").
package localcall

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/stages"
)

// The headers of a call and its answer.
const (
	HeaderDeadline  = "Stagehost-Deadline"
	HeaderRequestID = "Stagehost-Request-Id"
	HeaderClass     = "Stagehost-Class"
	HeaderCode      = "Stagehost-Code"
)

// Call is one call as it arrived: its session, request id, W3C trace
// context (traceparent and tracestate headers) and input.
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

// Handler serves calls with call.
func Handler(call CallFunc, maxInput int64) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /call/{session}", func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if v := r.Header.Get(HeaderDeadline); v != "" {
			ns, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				http.Error(w, "bad "+HeaderDeadline, http.StatusBadRequest)
				return
			}
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, time.Unix(0, ns))
			defer cancel()
		}
		input, err := io.ReadAll(io.LimitReader(r.Body, maxInput+1))
		if err != nil {
			return
		}
		if int64(len(input)) > maxInput {
			writeErr(w, errdefs.ClassOutOfBudget, fmt.Sprintf("the input is larger than %d bytes", maxInput), nil)
			return
		}
		out, err := call(ctx, Call{Session: r.PathValue("session"), RequestID: r.Header.Get(HeaderRequestID),
			Traceparent: r.Header.Get("traceparent"), Tracestate: r.Header.Get("tracestate"), Input: input})
		if err != nil {
			var code *int32
			var ce *stages.ClientError
			var re *errdefs.RemoteError
			if errors.As(err, &ce) {
				code = &ce.Code
			} else if errors.As(err, &re) {
				code = re.Code
			}
			writeErr(w, deploy.Class(err), deploy.PublicMessage(err), code)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		_, _ = w.Write(out)
	})
	return mux
}

func writeErr(w http.ResponseWriter, class, msg string, code *int32) {
	w.Header().Set(HeaderClass, class)
	if code != nil {
		w.Header().Set(HeaderCode, strconv.Itoa(int(*code)))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(errdefs.HTTPStatus(class))
	_, _ = io.WriteString(w, msg)
}

// Client calls one worker over its socket. It is safe for concurrent use
// and keeps its connections open between calls.
type Client struct {
	path string
	hc   *http.Client
}

// NewClient returns a client of the worker listening at path.
func NewClient(path string) *Client {
	var d net.Dialer
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Client{path: path, hc: &http.Client{Transport: tr}}
}

// ErrNotSent marks a call that never reached the worker (its socket
// refused the connection): it did not run, so it may go another way.
var ErrNotSent = errors.New("localcall: not sent")

// Call runs a call of session on the worker, with ctx's deadline sent as
// the call's absolute deadline, requestID as its request id and the
// headers of carrier (the trace context: traceparent, tracestate). Past
// the deadline it waits [Grace] for the worker's answer.
//
// # Errors
//
// An [*errdefs.RemoteError] with the worker's class, message and stage
// code; deadline_exceeded when the worker did not answer within the
// deadline plus [Grace]; an error that wraps [ErrNotSent] when the
// worker's socket could not be reached; client_closed when ctx was
// cancelled.
func (c *Client) Call(ctx context.Context, session, requestID string, carrier map[string][]string, input []byte) ([]byte, error) {
	// The request outlives ctx's deadline by Grace (the worker answers
	// at the deadline), not its cancellation.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	dl, hasDeadline := ctx.Deadline()
	if hasDeadline {
		var cancelDL context.CancelFunc
		rctx, cancelDL = context.WithDeadline(rctx, dl.Add(Grace))
		defer cancelDL()
	}
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	defer stop()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, "http://worker/call/"+session, bytes.NewReader(input))
	if err != nil {
		return nil, err
	}
	for k, v := range carrier {
		req.Header[k] = v
	}
	if hasDeadline {
		req.Header.Set(HeaderDeadline, strconv.FormatInt(dl.UnixNano(), 10))
	}
	if requestID != "" {
		req.Header.Set(HeaderRequestID, requestID)
	}
	failed := func(what string, err error) error {
		switch {
		case errors.Is(rctx.Err(), context.DeadlineExceeded):
			return &errdefs.RemoteError{Class: errdefs.ClassDeadlineExceeded, Message: fmt.Sprintf("session %q: the worker did not answer within the deadline and %v", session, Grace)}
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			// The worker ended after the call's deadline: a worker
			// is ended (SIGKILL) for a call still running its
			// hang_grace past its deadline.
			return &errdefs.RemoteError{Class: errdefs.ClassDeadlineExceeded, Message: fmt.Sprintf("session %q: the worker ended after the call's deadline: %s: %v", session, what, err)}
		case ctx.Err() != nil:
			return &errdefs.RemoteError{Class: errdefs.ClassClientClosed, Message: fmt.Sprintf("session %q: %v", session, ctx.Err())}
		}
		return &errdefs.RemoteError{Class: errdefs.ClassUnavailable, Message: fmt.Sprintf("session %q: %s: %v", session, what, err)}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, fmt.Errorf("%w: %s: %v", ErrNotSent, c.path, err)
		}
		return nil, failed("the worker's connection failed during the call", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, failed("the worker's answer was cut", err)
	}
	if resp.StatusCode == http.StatusOK {
		return body, nil
	}
	re := &errdefs.RemoteError{Class: resp.Header.Get(HeaderClass), Message: string(body)}
	if re.Class == "" {
		re.Class = errdefs.ClassInternal
	}
	if v := resp.Header.Get(HeaderCode); v != "" {
		if n, err := strconv.ParseInt(v, 10, 32); err == nil {
			code := int32(n)
			re.Code = &code
		}
	}
	return nil, re
}

// Close closes the client's idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }
