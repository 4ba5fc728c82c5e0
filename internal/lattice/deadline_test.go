package lattice_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/testutil"
)

// pause holds a host's session handler: the host is "stopped" from the
// first call it is handed until release.
type pause struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func pauseHost(h *lattice.Host) *pause {
	p := &pause{entered: make(chan struct{}, 1), release: make(chan struct{})}
	lattice.SetHold(h, func() {
		select {
		case p.entered <- struct{}{}:
		default:
		}
		<-p.release
	})
	return p
}

func (p *pause) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-p.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the paused host was handed no call within 10s")
	}
}

func (p *pause) resume() { p.once.Do(func() { close(p.release) }) }

// TestPausedHostDoesNotRunWhatRanElsewhere: a host stopped with a call in
// its queue does not acknowledge it; the front sends the call again until
// another host takes it, claims its id and runs it. When the stopped host
// resumes, every copy it was handed is past its acknowledgement window, so
// it must claim the id first; the claim fails and it runs none of them.
func TestPausedHostDoesNotRunWhatRanElsewhere(t *testing.T) {
	url := startServer(t)
	const lat = "dl1"
	a := join(t, url, lat, "a", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	p := pauseHost(a.h)
	defer p.resume()
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl, AckTimeout: 100 * time.Millisecond})

	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := f.Call(ctx, "steady", nil)
		done <- result{out, err}
	}()
	p.waitEntered(t) // a has the call, and is stopped
	b := join(t, url, lat, "b", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the call was not answered within 20s")
	}
	if r.err != nil || string(r.out) != "ok" {
		t.Fatalf("call: %q, %v (stats %+v)", r.out, r.err, f.Stats())
	}
	if calls(b) != 1 || b.h.Stats().Claims != 1 {
		t.Fatalf("b ran %d calls and claimed %d, want 1 and 1", calls(b), b.h.Stats().Claims)
	}
	p.resume()
	// Every copy sent reached a or b; wait until a has decided on each.
	sent := 1 + f.Stats().Resent
	if !testutil.Poll(10*time.Second, func() bool {
		as, bs := a.h.Stats(), b.h.Stats()
		return as.Received+bs.Received == sent && as.ClaimedElsewhere+as.Expired+calls(a) == as.Received
	}) {
		t.Fatalf("copies: %d sent, a %+v (ran %d), b %+v", sent, a.h.Stats(), calls(a), b.h.Stats())
	}
	if n := calls(a); n != 0 {
		t.Fatalf("the resumed host ran %d copies of a call another host had run (stats %+v)", n, a.h.Stats())
	}
	if a.h.Stats().ClaimedElsewhere == 0 {
		t.Fatalf("a refused no copy for its claim: %+v", a.h.Stats())
	}
}

// TestPausedHostDoesNotStartAnExpiredCall: a call that waited in a
// stopped host's queue past its deadline is not started when the host
// resumes (the deadline is absolute, not counted from when the host
// reads the call), and nothing is answered for it.
func TestPausedHostDoesNotStartAnExpiredCall(t *testing.T) {
	url := startServer(t)
	const lat = "dl2"
	a := join(t, url, lat, "a", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	p := pauseHost(a.h)
	defer p.resume()
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl, AckTimeout: time.Minute, Grace: 50 * time.Millisecond})

	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := f.Call(ctx, "steady", nil)
		errc <- err
	}()
	p.waitEntered(t)
	var err error
	select {
	case err = <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("the call was not answered within 10s")
	}
	if lattice.Class(err) != errdefs.ClassUnavailable {
		t.Fatalf("call to a stopped host: %v, want unavailable (no host took it)", err)
	}
	p.resume()
	if !testutil.Poll(10*time.Second, func() bool { return a.h.Stats().Received == 1 && (a.h.Stats().Expired == 1 || calls(a) > 0) }) ||
		a.h.Stats().Expired != 1 {
		t.Fatalf("a resumed: %+v, ran %d", a.h.Stats(), calls(a))
	}
	if n := calls(a); n != 0 {
		t.Fatalf("the resumed host ran %d calls past their deadline", n)
	}
}

// TestDisconnectedHostAnswersWithinDeadline: a front whose host is
// disconnected from NATS, with no free local instance, waits for one
// within the call's deadline instead of sending the call into the dead
// connection until the deadline.
func TestDisconnectedHostAnswersWithinDeadline(t *testing.T) {
	srv, err := lattice.EmbeddedServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	d := openDeployment(t, manifestOpts{latency: 300 * time.Millisecond})
	ctx := testutil.Context(t, 10*time.Second)
	h, err := lattice.NewHost(ctx, nc, d.Deployment, hostDefaults(lattice.HostConfig{Lattice: "dl3", ID: "a", TTL: ttl, Logger: quietLogger()}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		nc.Close() // as Member.Leave does on a disconnected host
		_ = h.Close(cctx)
	}()
	f, err := lattice.NewFront(ctx, nc, lattice.FrontConfig{Lattice: "dl3", TTL: ttl, Local: h, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { nc.Close(); f.Close() }() // as Member.Close does, disconnected

	// The one instance is busy (300 ms), and the connection is down.
	busy := make(chan error, 1)
	go func() { _, err := h.Call(context.Background(), "steady", nil); busy <- err }()
	testutil.Eventually(t, 5*time.Second, func() bool { return h.Record().Sessions[0].InFlight == 1 }, "the first call did not start")
	srv.Shutdown()
	srv.WaitForShutdown()
	testutil.Eventually(t, 5*time.Second, func() bool { return nc.Status() != nats.CONNECTED }, "still connected")

	start := time.Now()
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out, err := f.Call(cctx, "steady", nil)
	took := time.Since(start)
	if err != nil || string(out) != "ok" {
		t.Fatalf("call on a disconnected host: %q, %v after %v", out, err, took)
	}
	if took >= 2*time.Second {
		t.Fatalf("answered after %v, past its deadline of 2s", took)
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	// With no instance free within its deadline: deadline_exceeded, at
	// the deadline.
	go func() { _, err := h.Call(context.Background(), "steady", nil); busy <- err }()
	testutil.Eventually(t, 5*time.Second, func() bool { return h.Record().Sessions[0].InFlight == 1 }, "the third call did not start")
	start = time.Now()
	cctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	_, err = f.Call(cctx2, "steady", nil)
	took = time.Since(start)
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) && lattice.Class(err) != errdefs.ClassDeadlineExceeded {
		t.Fatalf("call with no instance free within its deadline: %v after %v", err, took)
	}
	if took > time.Second {
		t.Fatalf("answered after %v, deadline 100ms", took)
	}
	<-busy
}

// TestNoCallStartsPastItsDeadline: a call whose deadline has passed by
// the time it has an instance is not started on it (the instance goes
// back unused): deadline_exceeded, and the session counts no call.
func TestNoCallStartsPastItsDeadline(t *testing.T) {
	url := startServer(t)
	a := join(t, url, "dl4", "a", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	_, err := a.h.Call(ctx, "steady", nil)
	if lattice.Class(err) != errdefs.ClassDeadlineExceeded {
		t.Fatalf("call past its deadline: %v", err)
	}
	if n := calls(a); n != 0 || a.h.Stats().Expired != 1 {
		t.Fatalf("the session ran %d calls past their deadline (stats %+v)", n, a.h.Stats())
	}
	// The instance went back: the next call runs.
	if out, err := a.h.Call(context.Background(), "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("next call: %q, %v", out, err)
	}
}
