package localcall_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/localcall"
	"github.com/stagehost/stagehost/stages"
)

// testServer is a worker's side of the transport in a test.
type testServer struct {
	path    string
	accepts *atomic.Int32 // connections accepted
	stop    func()
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// sockPath is a socket path in a new temporary directory (short enough
// for a Unix socket's name).
func sockPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "w.sock")
}

// serveAt serves call at path with inputs of at most 1 MiB.
func serveAt(t testing.TB, path string, call localcall.CallFunc) *testServer {
	t.Helper()
	ln, err := localcall.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{path: path, accepts: new(atomic.Int32)}
	s.stop = localcall.Serve(countingListener{ln, s.accepts}, call, 1<<20)
	t.Cleanup(s.stop)
	return s
}

// serve starts a server of call on a socket in a temporary directory and
// returns its path.
func serve(t testing.TB, call localcall.CallFunc) string {
	t.Helper()
	return serveAt(t, sockPath(t), call).path
}

func newClient(path string) *localcall.Client {
	return localcall.NewClient(path, localcall.NewClientConfig())
}

func class(err error) string {
	var re *errdefs.RemoteError
	if errors.As(err, &re) {
		return re.Class
	}
	return ""
}

// TestRoundTrip: the session, input, request id and absolute deadline
// reach the worker; the output comes back; an error comes back with its
// class and stage code; the socket is mode 0600; a socket nobody listens
// on is ErrNotSent.
func TestRoundTrip(t *testing.T) {
	deadline := time.Now().Add(time.Minute).Truncate(time.Nanosecond)
	stuck := make(chan struct{}) // device work that outlives its deadline, until the test ends
	t.Cleanup(func() { close(stuck) })
	path := serve(t, func(ctx context.Context, c localcall.Call) ([]byte, error) {
		dl, ok := ctx.Deadline()
		session, input := c.Session, c.Input
		switch {
		case session == "hang":
			<-stuck
			return nil, nil
		case session == "fail":
			return nil, &stages.ClientError{Code: 7}
		case session == "lost":
			return nil, errdefs.Errorf(errdefs.ErrDeviceLost, "device gpu0 lost")
		case !ok || !dl.Equal(deadline) || c.RequestID != "r1" || c.Traceparent != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" || c.Tracestate != "k=v":
			return nil, errors.New("deadline, request id or trace context not carried")
		}
		return append([]byte(session+":"), input...), nil
	})
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	c := newClient(path)
	defer c.Close()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	tc := map[string][]string{"traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, "Tracestate": {"k=v"}}
	out, err := c.Call(ctx, "echo", "r1", tc, []byte("hi"))
	if err != nil || string(out) != "echo:hi" {
		t.Fatalf("echo: %q %v", out, err)
	}
	_, err = c.Call(ctx, "fail", "r1", tc, nil)
	var re *errdefs.RemoteError
	if !errors.As(err, &re) || re.Class != errdefs.ClassClientError || re.Code == nil || *re.Code != 7 {
		t.Fatalf("fail: %#v", err)
	}
	_, err = c.Call(ctx, "lost", "r1", tc, nil)
	if !errors.Is(err, errdefs.ErrDeviceLost) || !errors.As(err, &re) || re.Code != nil || !strings.Contains(re.Message, "device gpu0 lost") {
		t.Fatalf("lost: %#v", err)
	}
	_, err = c.Call(ctx, "big", "r1", tc, make([]byte, 1<<20+1))
	if !errors.Is(err, errdefs.ErrOutOfBudget) || !strings.Contains(err.Error(), "larger than 1048576 bytes") {
		t.Fatalf("big: %v", err)
	}
	// A large input and output, past the small-frame path.
	large := []byte(strings.Repeat("0123456789", 100_000))
	out, err = c.Call(ctx, "echo", "r1", tc, large)
	if err != nil || string(out) != "echo:"+string(large) {
		t.Fatalf("large echo: %d bytes, %v", len(out), err)
	}
	gone := newClient(filepath.Join(t.TempDir(), "none.sock"))
	if _, err := gone.Call(ctx, "echo", "", nil, nil); !errors.Is(err, localcall.ErrNotSent) {
		t.Fatalf("no listener: %v", err)
	}
	// A call whose work outlives its deadline is answered
	// deadline_exceeded by the client at the deadline plus Grace.
	t0 := time.Now() // before the deadline is set: took counts from no later than it
	hctx, hcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer hcancel()
	_, err = c.Call(hctx, "hang", "", nil, nil)
	if took := time.Since(t0); !errors.Is(err, errdefs.ErrDeadlineExceeded) || took < 100*time.Millisecond+localcall.Grace || took > 100*time.Millisecond+localcall.Grace+2*time.Second {
		t.Fatalf("hang: %v after %v", err, took)
	}
}

// TestLimits: a session name, request id or answer over its limit is
// refused with the limit named; an input over the worker's limit is
// answered out_of_budget and the next call still works.
func TestLimits(t *testing.T) {
	path := serve(t, func(ctx context.Context, c localcall.Call) ([]byte, error) {
		if c.Session == "fail" {
			return nil, errors.New(strings.Repeat("m", 200))
		}
		return make([]byte, len(c.Input)*2), nil
	})
	c := localcall.NewClient(path, localcall.NewClientConfig().WithMaxAnswer(100))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Call(ctx, strings.Repeat("s", localcall.MaxSession+1), "", nil, nil); class(err) != errdefs.ClassInvalidArgument || !strings.Contains(err.Error(), "(1 to 256)") {
		t.Fatalf("long session: %v", err)
	}
	if _, err := c.Call(ctx, "", "", nil, nil); class(err) != errdefs.ClassInvalidArgument {
		t.Fatalf("empty session: %v", err)
	}
	if _, err := c.Call(ctx, "s", strings.Repeat("r", localcall.MaxField+1), nil, nil); class(err) != errdefs.ClassInvalidArgument || !strings.Contains(err.Error(), "at most 1024") {
		t.Fatalf("long request id: %v", err)
	}
	if out, err := c.Call(ctx, strings.Repeat("s", localcall.MaxSession), strings.Repeat("r", localcall.MaxField), nil, make([]byte, 50)); err != nil || len(out) != 100 {
		t.Fatalf("at the limits: %d bytes, %v", len(out), err)
	}
	if _, err := c.Call(ctx, "s", "", nil, make([]byte, 51)); class(err) != errdefs.ClassInternal || !strings.Contains(err.Error(), "an answer of 102 bytes from the worker is larger than this client's limit of 100 bytes") {
		t.Fatalf("answer over the cap: %v", err)
	}
	if _, err := c.Call(ctx, "fail", "", nil, nil); class(err) != errdefs.ClassInternal || !strings.Contains(err.Error(), "limit of 100 bytes") {
		t.Fatalf("error message over the cap: %v", err)
	}
	// Input over the worker's limit, small enough to be written whole
	// before the worker reads it, and large enough not to be.
	for _, n := range []int{1<<20 + 1, 8 << 20} {
		if _, err := c.Call(ctx, "s", "", nil, make([]byte, n)); !errors.Is(err, errdefs.ErrOutOfBudget) || !strings.Contains(err.Error(), fmt.Sprintf("the input of %d bytes is larger than 1048576 bytes", n)) {
			t.Fatalf("input of %d bytes: %v", n, err)
		}
		if out, err := c.Call(ctx, "s", "", nil, make([]byte, 3)); err != nil || len(out) != 6 {
			t.Fatalf("after an input over the limit: %v", err)
		}
	}
}

// TestBrokenConnection: a worker whose connection ends during a call
// is unavailable before the call's deadline, deadline_exceeded after it
// (a worker ended for a call that outlived its deadline); the message
// names the worker, never the socket or the connection's error, which
// the ConnError keeps.
func TestBrokenConnection(t *testing.T) {
	for _, after := range []bool{false, true} {
		t.Run(fmt.Sprint("after deadline ", after), func(t *testing.T) {
			started, release := make(chan struct{}, 1), make(chan struct{})
			defer close(release)
			s := serveAt(t, sockPath(t), func(ctx context.Context, c localcall.Call) ([]byte, error) {
				started <- struct{}{}
				<-release // hung device work: it ignores ctx
				return nil, nil
			})
			c := localcall.NewClient(s.path, localcall.NewClientConfig().WithWorker("gpu0-acme"))
			defer c.Close()
			d := time.Minute
			if after {
				d = 100 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			dl, _ := ctx.Deadline()
			go func() {
				<-started
				if after {
					time.Sleep(time.Until(dl) + 10*time.Millisecond) // the worker ends after the deadline
				}
				s.stop()
			}()
			t0 := time.Now()
			_, err := c.Call(ctx, "s", "", nil, nil)
			took := time.Since(t0)
			var ce *localcall.ConnError
			switch {
			case !after && (class(err) != errdefs.ClassUnavailable || err.Error() != `session "s": its worker gpu0-acme ended during the call; the call may have run`):
				t.Fatalf("before the deadline: %v", err)
			case after && (class(err) != errdefs.ClassDeadlineExceeded || err.Error() != `session "s": its worker gpu0-acme ended after the call's deadline`):
				t.Fatalf("after the deadline: %v", err)
			case !errors.As(err, &ce) || ce.Err == nil || strings.Contains(err.Error(), s.path):
				t.Fatalf("the connection's error: %#v", err)
			case took > d/2+2*time.Second && !after, after && took > d+localcall.Grace:
				t.Fatalf("answered after %v", took)
			}
		})
	}
}

// TestWorkerNotReading: a call whose input the worker does not read
// (a worker stuck before it read the whole call) is deadline_exceeded
// at the deadline plus Grace, not ErrNotSent: its deadline is spent.
func TestWorkerNotReading(t *testing.T) {
	path := sockPath(t)
	ln, err := localcall.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if conn, err := ln.Accept(); err == nil {
			accepted <- conn
		}
	}()
	defer func() {
		select {
		case conn := <-accepted:
			conn.Close()
		default:
		}
	}()
	c := newClient(path)
	defer c.Close()
	t0 := time.Now() // before the deadline is set
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = c.Call(ctx, "s", "", nil, make([]byte, 32<<20))
	if took := time.Since(t0); class(err) != errdefs.ClassDeadlineExceeded || took < 50*time.Millisecond+localcall.Grace || took > 50*time.Millisecond+localcall.Grace+2*time.Second {
		t.Fatalf("%v after %v", err, took)
	}
}

// TestCancelClosesConnection: a call whose ctx is cancelled is answered
// client_closed at once; its connection is closed (the worker's call
// sees its ctx cancelled) and not reused.
func TestCancelClosesConnection(t *testing.T) {
	started, seen := make(chan struct{}, 1), make(chan error, 1)
	s := serveAt(t, sockPath(t), func(ctx context.Context, c localcall.Call) ([]byte, error) {
		if c.Session == "wait" {
			started <- struct{}{}
			select {
			case <-ctx.Done():
				seen <- ctx.Err()
			case <-time.After(10 * time.Second):
				seen <- errors.New("the call's ctx was not cancelled within 10s")
			}
			return nil, ctx.Err()
		}
		return c.Input, nil
	})
	c := newClient(s.path)
	defer c.Close()
	bg, cancelBG := context.WithTimeout(context.Background(), time.Minute)
	defer cancelBG()
	if _, err := c.Call(bg, "echo", "", nil, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	go func() { <-started; cancel() }()
	t0 := time.Now()
	_, err := c.Call(ctx, "wait", "", nil, nil)
	if took := time.Since(t0); class(err) != errdefs.ClassClientClosed || took > 10*time.Second {
		t.Fatalf("cancelled: %v after %v", err, took)
	}
	if err := <-seen; !errors.Is(err, context.Canceled) {
		t.Fatalf("the worker's call: %v", err)
	}
	if _, err := c.Call(bg, "echo", "", nil, nil); err != nil {
		t.Fatal(err)
	}
	if n := s.accepts.Load(); n != 2 {
		t.Fatalf("%d connections accepted, want 2 (the cancelled call's not reused)", n)
	}
	// Cancelled before the call: not sent.
	if _, err := c.Call(ctx, "echo", "", nil, nil); class(err) != errdefs.ClassClientClosed {
		t.Fatalf("cancelled before: %v", err)
	}
}

// TestIdleConnectionRedialled: a pooled connection that the worker
// closed while it was idle (the worker restarted) is dialled again (a
// new connection, not the next idle one, as dead), not an error; with
// no worker at all the call is ErrNotSent.
func TestIdleConnectionRedialled(t *testing.T) {
	started, release := make(chan struct{}, 2), make(chan struct{})
	echo := func(ctx context.Context, c localcall.Call) ([]byte, error) {
		if c.Session == "pair" {
			started <- struct{}{}
			<-release
		}
		return c.Input, nil
	}
	path := sockPath(t)
	a := serveAt(t, path, echo)
	c := newClient(path)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Two calls at once: two idle connections afterwards.
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := c.Call(ctx, "pair", "", nil, []byte("x"))
			errs <- err
		}()
	}
	<-started
	<-started
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	a.stop()
	b := serveAt(t, path, echo)
	if out, err := c.Call(ctx, "s", "", nil, []byte("y")); err != nil || string(out) != "y" {
		t.Fatalf("after the worker restarted: %q %v", out, err)
	}
	if a.accepts.Load() != 2 || b.accepts.Load() != 1 {
		t.Fatalf("accepted %d and %d connections, want 2 and 1", a.accepts.Load(), b.accepts.Load())
	}
	b.stop()
	if _, err := c.Call(ctx, "s", "", nil, []byte("z")); !errors.Is(err, localcall.ErrNotSent) {
		t.Fatalf("after the worker stopped: %v", err)
	}
}

// TestMalformedFrames: a call frame that breaks the wire format ends
// its connection without an answer; an answer that does is internal.
func TestMalformedFrames(t *testing.T) {
	path := serve(t, func(ctx context.Context, c localcall.Call) ([]byte, error) { return c.Input, nil })
	for _, frame := range [][]byte{
		{2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 's'},    // version 2
		{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},         // no session
		{1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 's'}, // deadline < 0
	} {
		conn, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(time.Minute))
		if _, err := conn.Write(frame); err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		if n, err := conn.Read(b[:]); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("frame %v: read %d bytes, %v; want the connection ended", frame, n, err)
		}
		conn.Close()
	}
	// A worker that answers garbage.
	fake := sockPath(t)
	ln, err := localcall.Listen(fake)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		var b [64]byte
		_, _ = conn.Read(b[:])
		_, _ = conn.Write([]byte{1, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}) // reserved byte set
		_, _ = conn.Read(b[:])                                                          // until the client closes
	}()
	c := newClient(fake)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = c.Call(ctx, "s", "", nil, nil)
	var ce *localcall.ConnError
	if class(err) != errdefs.ClassInternal || err.Error() != `session "s": the answer of the worker breaks the local transport's format` || !errors.As(err, &ce) || !strings.Contains(ce.Err.Error(), "reserved byte") {
		t.Fatalf("garbage answer: %v", err)
	}
}

// TestConcurrentCalls: calls from many goroutines each get their own
// answer, with fewer idle connections kept than callers.
func TestConcurrentCalls(t *testing.T) {
	path := serve(t, func(ctx context.Context, c localcall.Call) ([]byte, error) {
		return append([]byte(c.RequestID+":"), c.Input...), nil
	})
	c := localcall.NewClient(path, localcall.NewClientConfig().WithMaxIdle(2))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				id, in := fmt.Sprint(g), fmt.Sprint(i)
				out, err := c.Call(ctx, "s", id, nil, []byte(in))
				if err != nil || string(out) != id+":"+in {
					errs <- fmt.Errorf("caller %d call %d: %q %v", g, i, out, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// latencies reports the p50 and p99 of lat.
func latencies(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkLocalCall: one call's round trip through the local transport
// to a call that returns at once; the added cost of the transport over
// an in-process call. b.ReportMetric gives p50 and p99.
func BenchmarkLocalCall(b *testing.B) {
	path := serve(b, func(ctx context.Context, c localcall.Call) ([]byte, error) { return c.Input, nil })
	c := newClient(path)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	in := make([]byte, 64)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := c.Call(ctx, "s", "r", nil, in); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	latencies(b, lat)
}

// BenchmarkLocalCallParallel: BenchmarkLocalCall from 8 goroutines at
// once; ns/op is the time per call of all of them together, p50 and p99
// each call's round trip.
func BenchmarkLocalCallParallel(b *testing.B) {
	path := serve(b, func(ctx context.Context, c localcall.Call) ([]byte, error) { return c.Input, nil })
	c := newClient(path)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	const callers = 8
	lats := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	b.ResetTimer()
	for g := range callers {
		n := b.N / callers
		if g < b.N%callers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := make([]byte, 64)
			lat := make([]time.Duration, 0, n)
			for range n {
				t0 := time.Now()
				if _, err := c.Call(ctx, "s", "r", nil, in); err != nil {
					b.Error(err)
					return
				}
				lat = append(lat, time.Since(t0))
			}
			lats[g] = lat
		}()
	}
	wg.Wait()
	b.StopTimer()
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	latencies(b, all)
}

// BenchmarkInProcessCall: the same call made in process, the baseline of
// BenchmarkLocalCall.
func BenchmarkInProcessCall(b *testing.B) {
	var call localcall.CallFunc = func(ctx context.Context, c localcall.Call) ([]byte, error) { return c.Input, nil }
	ctx := context.Background()
	in := make([]byte, 64)
	for range b.N {
		if _, err := call(ctx, localcall.Call{Session: "s", RequestID: "r", Input: in}); err != nil {
			b.Fatal(err)
		}
	}
}
