//go:build linux

package lattice_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/testutil"
)

const childURLEnv = "STAGEHOST_LATTICE_TEST_CHILD_URL"

// TestLatticeChildHost is the child process of TestSIGSTOPedHost: a host
// of lattice "stop" with id "child", until it is killed.
func TestLatticeChildHost(t *testing.T) {
	url := os.Getenv(childURLEnv)
	if url == "" {
		t.Skip("the child process of TestSIGSTOPedHost")
	}
	join(t, url, "stop", "child", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	select {} // until killed
}

// TestSIGSTOPedHost stops a host process (SIGSTOP) after the NATS
// server has handed it a call, so the call sits unread in its socket;
// the front sends it again until a host of this process claims and runs
// it. Continued (SIGCONT), the stopped host reads every copy it was
// handed, claims none (another host holds the id) and runs none.
func TestSIGSTOPedHost(t *testing.T) {
	srv, err := lattice.EmbeddedServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() }) // after the members' cleanups
	url := srv.ClientURL()
	const lat = "stop"

	cmd := exec.Command(os.Args[0], "-test.run", "^TestLatticeChildHost$", "-test.timeout", "60s")
	cmd.Env = append(os.Environ(), childURLEnv+"="+url)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl, AckTimeout: 200 * time.Millisecond})
	ctx := testutil.Context(t, 20*time.Second)
	if err := f.WaitFor(ctx, func() bool { return len(f.Serving("steady")) == 1 }); err != nil {
		t.Fatalf("the child host did not join: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// kill(2) returns before every thread of the child has stopped.
	if !testutil.Poll(5*time.Second, func() bool { return stopped(cmd.Process.Pid) }) {
		t.Fatal("the child did not stop")
	}
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		out, err := f.Call(cctx, "steady", nil)
		done <- result{out, err}
	}()
	// The server has handed the stopped child the call.
	if !testutil.Poll(10*time.Second, func() bool { return delivered(t, srv, lattice.SessionSubject(lat, "steady")) > 0 }) {
		t.Fatal("the server handed the stopped host no call")
	}
	b := join(t, url, lat, "b", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the call was not answered within 15s")
	}
	if r.err != nil || string(r.out) != "ok" || calls(b) != 1 {
		t.Fatalf("call: %q, %v; b ran %d (stats %+v)", r.out, r.err, calls(b), f.Stats())
	}
	toChild := delivered(t, srv, lattice.SessionSubject(lat, "steady")) - int64(b.h.Stats().Received)
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The child's heartbeat shows its decisions on every copy.
	var rec lattice.HostRecord
	if !testutil.Poll(10*time.Second, func() bool {
		for _, h := range f.Hosts() {
			if h.ID == "child" {
				rec = h
			}
		}
		c := rec.Calls
		return int64(c.Received) == toChild && c.Expired+c.ClaimedElsewhere == c.Received
	}) {
		t.Fatalf("the child was handed %d copies; its heartbeat: %+v, sessions %+v", toChild, rec.Calls, rec.Sessions)
	}
	if n := rec.Sessions[0].Outcomes; len(n) != 0 {
		t.Fatalf("the continued host ran copies of a call another host had run: %v", n)
	}
	t.Logf("copies handed to the stopped host: %d, refused: %+v", toChild, rec.Calls)
}

// delivered counts the messages the server handed to subscriptions of
// subject, over every connection.
func delivered(t *testing.T, srv *server.Server, subject string) int64 {
	t.Helper()
	cz, err := srv.Connz(&server.ConnzOptions{SubscriptionsDetail: true})
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range cz.Conns {
		for _, s := range c.SubsDetail {
			if s.Subject == subject {
				n += s.Msgs
			}
		}
	}
	return n
}

// stopped says whether every thread of process pid is stopped (state T
// in /proc/<pid>/task/*/stat).
func stopped(pid int) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	threads, err := os.ReadDir(dir)
	if err != nil || len(threads) == 0 {
		return false
	}
	for _, th := range threads {
		b, err := os.ReadFile(dir + "/" + th.Name() + "/stat")
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces; the state follows
		// the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return true
}
