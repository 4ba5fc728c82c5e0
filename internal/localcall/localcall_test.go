package localcall_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/localcall"
	"github.com/stagehost/stagehost/stages"
)

// serve starts a server of call on a socket in a temporary directory and
// returns its path.
func serve(t testing.TB, call localcall.CallFunc) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "w.sock")
	ln, err := localcall.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: localcall.Handler(call, 1<<20)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return path
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
		case !ok || !dl.Equal(deadline) || c.RequestID != "r1" || c.Traceparent != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01":
			return nil, errors.New("deadline, request id or trace context not carried")
		}
		return append([]byte(session+":"), input...), nil
	})
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	c := localcall.NewClient(path)
	defer c.Close()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	tc := map[string][]string{"traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
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
	if !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("lost: %v", err)
	}
	_, err = c.Call(ctx, "big", "r1", tc, make([]byte, 1<<20+1))
	if !errors.Is(err, errdefs.ErrOutOfBudget) {
		t.Fatalf("big: %v", err)
	}
	gone := localcall.NewClient(filepath.Join(t.TempDir(), "none.sock"))
	if _, err := gone.Call(ctx, "echo", "", nil, nil); !errors.Is(err, localcall.ErrNotSent) {
		t.Fatalf("no listener: %v", err)
	}
	// A call whose work outlives its deadline is answered
	// deadline_exceeded by the client at the deadline plus Grace.
	hctx, hcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer hcancel()
	t0 := time.Now()
	_, err = c.Call(hctx, "hang", "", nil, nil)
	if took := time.Since(t0); !errors.Is(err, errdefs.ErrDeadlineExceeded) || took < 100*time.Millisecond+localcall.Grace || took > 100*time.Millisecond+localcall.Grace+2*time.Second {
		t.Fatalf("hang: %v after %v", err, took)
	}
}

// BenchmarkLocalCall: one call's round trip through the local transport
// to a call that returns at once; the added cost of the transport over
// an in-process call. b.ReportMetric gives p50 and p99.
func BenchmarkLocalCall(b *testing.B) {
	path := serve(b, func(ctx context.Context, c localcall.Call) ([]byte, error) { return c.Input, nil })
	c := localcall.NewClient(path)
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
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
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
