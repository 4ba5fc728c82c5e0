package lattice

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestRunnersConcurrent: requests handed to runners run at once, however
// many are running already (a busy runner never holds up a new one).
func TestRunnersConcurrent(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	r := newRunners(stop)
	const n = 16
	var started, release sync.WaitGroup
	started.Add(n)
	release.Add(1)
	go func() { // a run that blocked would fail the test, not hang it
		for range n {
			r.run(func() { started.Done(); release.Wait() })
		}
	}()
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatal("16 requests did not all run at once")
	}
	release.Done()
}

// TestRunnersReuse: a runner that finished its request takes the next
// one, on the same goroutine, instead of a new goroutine starting; once
// stop closes, waiting runners exit.
func TestRunnersReuse(t *testing.T) {
	stop := make(chan struct{})
	r := newRunners(stop)
	first := make(chan uint64)
	r.run(func() { first <- goid() })
	id := <-first
	// The runner waits for work once its request returned: a send to
	// its channel succeeds only then, and only if it waits.
	second := make(chan uint64, 1)
	deadline := time.Now().Add(10 * time.Second)
	for handed := false; !handed; {
		select {
		case r.work <- func() { second <- goid() }:
			handed = true
		default:
			if time.Now().After(deadline) {
				t.Fatal("no runner waited for work after its request")
			}
			runtime.Gosched()
		}
	}
	if got := <-second; got != id {
		t.Fatalf("the second request ran on goroutine %d, the first on %d", got, id)
	}
	close(stop)
	// With stop closed no runner takes work any more.
	deadline = time.Now().Add(10 * time.Second)
	for {
		select {
		case r.work <- func() {}:
			if time.Now().After(deadline) {
				t.Fatal("a runner still takes work after stop")
			}
			runtime.Gosched()
			continue
		default:
		}
		break
	}
}

// goid is the running goroutine's id, from its stack trace's first line.
func goid() uint64 {
	var b [64]byte
	s := b[:runtime.Stack(b[:], false)]
	var id uint64
	for _, c := range s[len("goroutine "):] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}
