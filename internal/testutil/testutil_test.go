package testutil

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// recorder is a testing.TB that records Fatalf and Skipf instead of
// ending the test, and stops the calling goroutine as the real ones do.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f with a recorder on a goroutine of its own (Fatalf and
// Skipf end it) and returns the recorder once f has returned or ended.
func run(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return within 10s")
	}
	return r
}

func TestPoll(t *testing.T) {
	var n atomic.Int32
	if !Poll(5*time.Second, func() bool { return n.Add(1) == 5 }) {
		t.Fatal("Poll gave up on a condition that became true")
	}
	start := time.Now()
	if Poll(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll reported a false condition true")
	}
	if d := time.Since(start); d < 20*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Poll of 20ms returned after %v", d)
	}
	// True only on the call after the deadline: still seen.
	var late atomic.Bool
	if !Poll(time.Millisecond, func() bool {
		if late.Load() {
			return true
		}
		time.Sleep(2 * time.Millisecond) // past the deadline before the next call
		late.Store(true)
		return false
	}) {
		t.Fatal("Poll missed a condition that became true as its deadline passed")
	}
}

func TestEventuallyFailsWithItsMessage(t *testing.T) {
	r := run(t, func(tb testing.TB) {
		Eventually(tb, 10*time.Millisecond, func() bool { return false }, "the %s never came", "answer")
	})
	if r.fatal != "after 10ms: the answer never came" {
		t.Fatalf("Fatalf %q", r.fatal)
	}
	r = run(t, func(tb testing.TB) { Eventually(tb, time.Second, func() bool { return true }, "unused") })
	if r.fatal != "" {
		t.Fatalf("Eventually failed on a true condition: %q", r.fatal)
	}
}

func TestContextEndsAtItsTimeout(t *testing.T) {
	ctx := Context(t, 10*time.Millisecond)
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the context outlived its 10ms by 5s")
	}
}

func TestGPUGate(t *testing.T) {
	unsupported := fmt.Errorf("no libcuda.so.1: %w", errdefs.ErrUnsupported)
	for _, c := range []struct {
		name        string
		err         error
		require     string
		fatal, skip string
	}{
		{"opened", nil, "", "", ""},
		{"opened, required", nil, "1", "", ""},
		{"no GPU", unsupported, "", "", "no usable GPU (set STAGEHOST_REQUIRE_GPU=1 to fail instead): no libcuda.so.1: unsupported"},
		{"no GPU, required", unsupported, "1", "no usable GPU although STAGEHOST_REQUIRE_GPU=1: no libcuda.so.1: unsupported", ""},
		{"driver error", errors.New("cuInit: CUDA_ERROR_UNKNOWN"), "", "opening the GPU backend: cuInit: CUDA_ERROR_UNKNOWN", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(RequireGPUEnv, c.require)
			r := run(t, func(tb testing.TB) { GPU(tb, c.err) })
			if r.fatal != c.fatal || r.skip != c.skip {
				t.Fatalf("fatal %q, skip %q; want %q, %q", r.fatal, r.skip, c.fatal, c.skip)
			}
		})
	}
}

func TestServing(t *testing.T) {
	out := strings.NewReader("loading\nserving 2 sessions on http://127.0.0.1:4567 (grace 30s)\nstopped: signal\n")
	r := run(t, func(tb testing.TB) {
		base, lines := Serving(tb, out, 5*time.Second, nil)
		if base != "http://127.0.0.1:4567" || !lines.Scan() || lines.Text() != "stopped: signal" {
			tb.Fatalf("base %q, next line %q", base, lines.Text())
		}
	})
	if r.fatal != "" {
		t.Fatal(r.fatal)
	}

	// The output ends without the line.
	r = run(t, func(tb testing.TB) {
		Serving(tb, strings.NewReader("bad manifest\n"), 5*time.Second, func() string { return "exit 65" })
	})
	if !strings.Contains(r.fatal, "without a serving line") || !strings.Contains(r.fatal, "exit 65") {
		t.Fatalf("Fatalf %q", r.fatal)
	}

	// Nothing comes: the timeout; failure ends the writer.
	pr, pw := io.Pipe()
	r = run(t, func(tb testing.TB) {
		Serving(tb, pr, 20*time.Millisecond, func() string { pw.Close(); return "killed" })
	})
	if !strings.Contains(r.fatal, "no serving line within 20ms") || !strings.Contains(r.fatal, "killed") {
		t.Fatalf("Fatalf %q", r.fatal)
	}
}

func TestGoGuestsSkipsOnlyUnderRace(t *testing.T) {
	t.Setenv(GoGuestsRaceEnv, "")
	r := run(t, func(tb testing.TB) { GoGuests(tb) })
	if Race != (r.skip != "") || r.fatal != "" {
		t.Fatalf("race %v: skip %q, fatal %q", Race, r.skip, r.fatal)
	}
	t.Setenv(GoGuestsRaceEnv, "1")
	if r := run(t, func(tb testing.TB) { GoGuests(tb) }); r.skip != "" {
		t.Fatalf("skipped with %s=1: %q", GoGuestsRaceEnv, r.skip)
	}
}
