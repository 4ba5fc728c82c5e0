// Package testutil holds what the tests of several packages share: a poll
// with a deadline ([Eventually], [Poll]), a per-test context with a
// deadline ([Context]), the GPU gate ([GPU]), the gate of the tests that
// compile the Go guests ([GoGuests]), and reading the serving line of a
// started `stagehost serve` ([Serving]).
//
// Every function here bounds its own wait, so a test that uses them fails
// with a message that names what it waited for instead of hanging until
// the package's test timeout.
package testutil

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stagehost/stagehost/errdefs"
)

// RequireGPUEnv is the environment variable that turns [GPU]'s skip into a
// failure: set it to 1 on machines that have a GPU, so that a broken
// driver set-up fails the run instead of passing it with every GPU test
// skipped.
const RequireGPUEnv = "STAGEHOST_REQUIRE_GPU"

// Poll calls cond until it returns true or timeout has passed, and
// reports whether it returned true. It waits between calls, starting at
// 50µs and doubling up to 10ms, so a condition that is met quickly is
// seen quickly and a slow one costs little CPU. cond is called at least
// once, and once more after the deadline has passed, so a condition that
// became true while Poll slept is not missed.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := 50 * time.Microsecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(wait) // polling a condition with a deadline, not synchronising on time
		if wait < 10*time.Millisecond {
			wait *= 2
		}
	}
}

// Eventually polls cond as [Poll] does and fails the test with
// "after TIMEOUT: MESSAGE" when cond has not returned true within timeout.
// The message is format and args as for fmt.Sprintf. It must be called
// from the test's goroutine (it calls t.Fatalf).
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("after %v: %s", timeout, fmt.Sprintf(format, args...))
	}
}

// Context returns a context that ends after timeout, or when the test
// ends, whichever is first. A test that passes it to a call that can
// block (Run, Wait, Sync, Close) gets the call's deadline error instead
// of hanging until the package's test timeout when the call regresses.
func Context(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// GPU is the gate of every test that needs a real GPU. openErr is the
// error of opening the GPU backend (cuda.Open). GPU returns when openErr
// is nil. When openErr is of class [errdefs.ErrUnsupported] (no driver
// library, no device) it skips the test, naming the reason, unless
// STAGEHOST_REQUIRE_GPU=1, where it fails the test instead. Any other
// error fails the test: the driver is there and did not work.
func GPU(t testing.TB, openErr error) {
	t.Helper()
	if openErr == nil {
		return
	}
	if !errors.Is(openErr, errdefs.ErrUnsupported) {
		t.Fatalf("opening the GPU backend: %v", openErr)
	}
	if os.Getenv(RequireGPUEnv) == "1" {
		t.Fatalf("no usable GPU although %s=1: %v", RequireGPUEnv, openErr)
	}
	t.Skipf("no usable GPU (set %s=1 to fail instead): %v", RequireGPUEnv, openErr)
}

// GoGuestsRaceEnv is the environment variable that makes [GoGuests] run
// its test under the race detector too.
const GoGuestsRaceEnv = "STAGEHOST_GO_GUESTS_RACE"

// GoGuests is the gate of every test that compiles the Go guests
// (examples/wasm: minimal, mlp, fence; about 2 MB each). Such a test
// must have GoGuest in its name. Under the race detector GoGuests skips
// it, unless STAGEHOST_GO_GUESTS_RACE=1: wazero's compiler, which is Go
// code, runs 10 to 20 times slower there, so one compilation takes tens
// of seconds, and these tests spend their time compiling, not in the
// host's concurrent code, which the other tests cover under -race. The
// README's test command runs them without -race in its second step
// (go test -run GoGuest). Without the race detector GoGuests does
// nothing.
func GoGuests(t testing.TB) {
	t.Helper()
	if Race && os.Getenv(GoGuestsRaceEnv) != "1" {
		t.Skipf("compiles the Go guests, which takes minutes under the race detector: the README's test command runs the GoGuest tests without -race (set %s=1 to run it here)", GoGuestsRaceEnv)
	}
}

// servingLine is the line `stagehost serve` prints on stdout once it
// listens: "serving … on http://ADDR" (or https).
var servingLine = regexp.MustCompile(`on (https?://(\S+))`)

// ServingLine reads stdout of a started `stagehost serve` up to its
// serving line and returns the base URL it names (such as
// "http://127.0.0.1:41234") and the scanner over the lines after it. The
// base URL is "" when stdout ended first or no serving line came within
// timeout; reading then goes on in the background until stdout ends
// (kill the process to end it).
func ServingLine(stdout io.Reader, timeout time.Duration) (string, *bufio.Scanner) {
	type found struct {
		base  string
		lines *bufio.Scanner
	}
	ch := make(chan found, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if m := servingLine.FindStringSubmatch(lines.Text()); m != nil {
				ch <- found{m[1], lines}
				return
			}
		}
		ch <- found{"", lines}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case f := <-ch:
		return f.base, f.lines
	case <-timer.C:
		return "", nil
	}
}

// Serving is [ServingLine] that fails the test when there is no serving
// line. failure, when not nil, is called first: it should end the
// process and return what it wrote on stderr, which the failure message
// shows (stderr may only be read once the process has exited).
func Serving(t testing.TB, stdout io.Reader, timeout time.Duration, failure func() string) (string, *bufio.Scanner) {
	t.Helper()
	base, lines := ServingLine(stdout, timeout)
	if base != "" {
		return base, lines
	}
	stderr := ""
	if failure != nil {
		stderr = failure()
	}
	if lines == nil {
		t.Fatalf("serve printed no serving line within %v; stderr:\n%s", timeout, stderr)
	} else {
		t.Fatalf("serve ended its output without a serving line; stderr:\n%s", stderr)
	}
	return "", nil
}

// NATS starts an in-memory NATS server on a free local port (no
// JetStream) and returns a connection to it; both end with the test.
func NATS(t testing.TB) *nats.Conn {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
