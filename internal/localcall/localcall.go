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

// CallFunc runs one call of a session: the worker's (lattice.Host.Call,
// which keeps the shared quarantine's refusals).
type CallFunc func(ctx context.Context, session string, input []byte) ([]byte, error)

// requestIDKey is the context key of a call's request id.
type requestIDKey struct{}

// RequestID returns the request id a call arrived with, "" for none.
func RequestID(ctx context.Context) string {
	s, _ := ctx.Value(requestIDKey{}).(string)
	return s
}

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
		if id := r.Header.Get(HeaderRequestID); id != "" {
			ctx = context.WithValue(ctx, requestIDKey{}, id)
		}
		input, err := io.ReadAll(io.LimitReader(r.Body, maxInput+1))
		if err != nil {
			return
		}
		if int64(len(input)) > maxInput {
			writeErr(w, errdefs.ClassOutOfBudget, fmt.Sprintf("the input is larger than %d bytes", maxInput), nil)
			return
		}
		out, err := call(ctx, r.PathValue("session"), input)
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
// the call's absolute deadline and requestID as its request id.
//
// # Errors
//
// An [*errdefs.RemoteError] with the worker's class, message and stage
// code; an error that wraps [ErrNotSent] when the worker's socket could
// not be reached; ctx's error when it ended first.
func (c *Client) Call(ctx context.Context, session, requestID string, input []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://worker/call/"+session, bytes.NewReader(input))
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		req.Header.Set(HeaderDeadline, strconv.FormatInt(dl.UnixNano(), 10))
	}
	if requestID != "" {
		req.Header.Set(HeaderRequestID, requestID)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, fmt.Errorf("%w: %s: %v", ErrNotSent, c.path, err)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &errdefs.RemoteError{Class: errdefs.ClassUnavailable, Message: "the worker's connection failed during the call: " + err.Error()}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &errdefs.RemoteError{Class: errdefs.ClassUnavailable, Message: "the worker's answer was cut: " + err.Error()}
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
