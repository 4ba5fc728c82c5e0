package localcall

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/stages"
)

// watchAfter is how long a call runs before its server starts watching
// its connection for the client's end (see [Serve]).
const watchAfter = time.Millisecond

// Serve serves calls with call on the connections ln accepts, in a
// goroutine of its own, until stop is called. Each connection gets a
// goroutine that reads its calls one after another and runs each on
// that goroutine, under a context with the call's absolute deadline
// (a call without one has none but the worker's own). A call's input may
// be at most maxInput bytes.
//
// A call that runs longer than 1 ms has its connection watched: when
// the client closes it (its context was cancelled), the call's context
// is cancelled.
//
// stop closes ln and every connection, and cancels the context of every
// call in progress; it does not wait for them: their answers are not
// delivered (the client sees the connection end). Accepting ends, and
// ln is closed, at an accept error other than a temporary one (out of
// file descriptors: retried after 5 ms, doubling up to 1 s).
//
// # Errors
//
// Per connection, not returned: a frame that breaks the wire format
// ends its connection without an answer; an input over maxInput is
// answered out_of_budget, naming the limit, and then ends its
// connection. A call's error is answered with its class
// (deploy.Class), its public message (deploy.PublicMessage) and, for a
// stage's client_error, its stage code.
func Serve(ln net.Listener, call CallFunc, maxInput int64) (stop func()) {
	s := &server{ln: ln, call: call, maxInput: maxInput, conns: map[net.Conn]struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.accept()
	return s.stop
}

type server struct {
	ln       net.Listener
	call     CallFunc
	maxInput int64
	ctx      context.Context // cancelled by stop
	cancel   context.CancelFunc

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func (s *server) stop() {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	_ = s.ln.Close()
	s.cancel()
	for c := range conns {
		_ = c.Close()
	}
}

func (s *server) accept() {
	var backoff time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if isTemporary(err) {
				// Out of file descriptors and the like: wait, as
				// net/http's server does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
					continue
				case <-s.ctx.Done():
					return
				}
			}
			_ = s.ln.Close()
			return
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// isTemporary is an accept error to retry: the deprecated Temporary
// method, which accept's EMFILE and ENFILE still have.
func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

func (s *server) serveConn(c net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close()
	}()
	r := bufio.NewReaderSize(c, 4<<10)
	var hdr []byte
	for {
		f, err := readCall(r, s.maxInput)
		var big *inputTooLarge
		if errors.As(err, &big) {
			// The input stays unread: answer, then end the connection.
			a := answer{class: errdefs.ClassOutOfBudget}
			_, _ = writeAnswer(c, &a, fmt.Appendf(nil, "session %q: the input of %d bytes is larger than %d bytes (the worker's limit)", f.Session, big.size, big.limit), hdr)
			return
		}
		if err != nil {
			return
		}
		out, err, ok := s.run(c, &f)
		if !ok {
			return
		}
		var a answer
		if err == nil {
			a.ok = true
		} else {
			a.class = deploy.Class(err)
			if !validClass(a.class) || len(a.class) > maxClass {
				a.class = errdefs.ClassInternal
			}
			var ce *stages.ClientError
			var re *errdefs.RemoteError
			if errors.As(err, &ce) {
				a.code = &ce.Code
			} else if errors.As(err, &re) {
				a.code = re.Code
			}
			out = []byte(deploy.PublicMessage(err))
		}
		hdr, err = writeAnswer(c, &a, out, hdr)
		if err != nil {
			return
		}
	}
}

// writeAnswer writes an answer with body to c in one write (two buffers
// for a large body), reusing hdr's storage for the header.
func writeAnswer(c net.Conn, a *answer, body []byte, hdr []byte) ([]byte, error) {
	hdr = appendAnswerHeader(hdr[:0], a, len(body))
	if len(body) <= 4<<10 {
		hdr = append(hdr, body...)
		_, err := c.Write(hdr)
		return hdr, err
	}
	bufs := net.Buffers{hdr, body}
	_, err := bufs.WriteTo(c)
	return hdr, err
}

// run runs one call under a context with its deadline, watching c for
// the client's end once it ran watchAfter. ok is false when c must be
// ended: the client closed it, or wrote to it during the call.
func (s *server) run(c net.Conn, f *callFrame) (out []byte, err error, ok bool) {
	ctx, cancel := s.ctx, context.CancelFunc(nil)
	if f.deadline != 0 {
		ctx, cancel = context.WithDeadline(ctx, time.Unix(0, f.deadline))
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	w := &watch{c: c, cancel: cancel}
	t := time.AfterFunc(watchAfter, w.start)
	out, err = s.call(ctx, f.Call)
	t.Stop()
	return out, err, w.end()
}

// watch reads a connection while its call runs: the client writes
// nothing until the answer, so anything it reads (a byte, the end, an
// error) means the client gave up: the call's context is cancelled.
type watch struct {
	c      net.Conn
	cancel context.CancelFunc

	mu      sync.Mutex
	ended   bool          // the call returned
	reading chan struct{} // closed when the read returned; nil: none started
	lost    bool          // the read returned other than by end's deadline
}

func (w *watch) start() {
	w.mu.Lock()
	if w.ended {
		w.mu.Unlock()
		return
	}
	done := make(chan struct{})
	w.reading = done
	w.mu.Unlock()
	var b [1]byte
	n, err := w.c.Read(b[:])
	if n > 0 || !errors.Is(err, errDeadlinePassed) {
		w.lost = true
		w.cancel()
	}
	close(done)
}

// end stops the watch; it reports whether the connection may serve the
// next call.
func (w *watch) end() bool {
	w.mu.Lock()
	w.ended = true
	done := w.reading
	w.mu.Unlock()
	if done == nil {
		return true
	}
	_ = w.c.SetReadDeadline(aLongTimeAgo)
	<-done
	if w.lost {
		return false
	}
	return w.c.SetReadDeadline(time.Time{}) == nil
}
