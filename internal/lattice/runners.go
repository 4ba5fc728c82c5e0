package lattice

import "time"

// runnerIdle is how long a runner goroutine waits for another request
// before it exits.
const runnerIdle = 30 * time.Second

// runners run a host's lattice requests, each on a goroutine of its own,
// as `go` would, but hand a request to a goroutine that finished its last
// one and waits, when there is one, instead of starting a new goroutine.
// A new goroutine starts with a small stack, and a call into a stage grows
// it (a copy of the stack each time) before the call is done: about 5 µs
// of a 37 µs lattice call on the 2-vCPU machine (BENCHMARKS.md). A
// goroutine kept from an earlier call has its stack grown already. How
// many wait is bounded by the peak of concurrent requests; each exits
// after runnerIdle without one, or when stop closes.
type runners struct {
	work chan func()
	stop <-chan struct{}
}

func newRunners(stop <-chan struct{}) *runners {
	return &runners{work: make(chan func()), stop: stop}
}

// run runs f on a waiting runner, else on a new one.
func (r *runners) run(f func()) {
	select {
	case r.work <- f:
	default:
		go r.loop(f)
	}
}

func (r *runners) loop(f func()) {
	t := time.NewTimer(runnerIdle)
	defer t.Stop()
	for {
		f()
		f = nil // nothing of the last request stays reachable while waiting
		t.Reset(runnerIdle)
		select {
		case f = <-r.work:
		case <-t.C:
			return
		case <-r.stop:
			return
		}
	}
}
