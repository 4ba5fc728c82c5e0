package sim_test

import (
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// TestLatencyIsPrecise: a command on a device with a configured latency
// takes that latency, not the timer granularity (before latencies were
// spun out, every latency below 1 ms cost about 1.1 ms). It checks two
// things, each as the median of 200 commands (20 for the 3 ms latency,
// which sleeps for the bulk of its wait; the median, because the machines
// that run these tests are small and shared):
//
//   - a round trip, submitting one command and waiting for it, takes the
//     latency ± 20 %;
//   - commands submitted back to back run one latency apart (± 20 %), as
//     the worker itself sees it.
//
// Under the race detector nothing is skipped, but the upper bounds allow
// for the detector's own cost, measured alongside on a device without
// latency (one round trip there after each measured one, so that both see
// the same load; then the same back-to-back run): a round trip costs
// 10–35 µs under the detector on a 2-vCPU machine, which alone is more
// than 20 % of 20 µs, and each command back to back 0.3–6 µs.
func TestLatencyIsPrecise(t *testing.T) {
	var base *rig
	if raceEnabled {
		base = newRig(t)
	}
	for _, lat := range []time.Duration{20 * time.Microsecond, 50 * time.Microsecond, 200 * time.Microsecond, 3 * time.Millisecond} {
		t.Run(lat.String(), func(t *testing.T) {
			r := newRig(t, sim.NewDeviceConfig().WithLatency(lat))
			n := 200
			if lat >= time.Millisecond {
				n = 20 // sleeps for the bulk, then spins: the same bounds, fewer samples
			}
			took := make([]time.Duration, 0, n)
			var baseTook []time.Duration
			for range n {
				took = append(took, roundTrip(t, r))
				if base != nil {
					baseTook = append(baseTook, roundTrip(t, base))
				}
			}
			rt, pipelined := median(took), backToBack(t, r, n)
			t.Logf("latency %v: round trip %v, back to back %v per command (medians)", lat, rt, pipelined)
			var slack struct{ rt, pipelined time.Duration }
			if base != nil {
				slack.rt, slack.pipelined = median(baseTook), backToBack(t, base, n)
				t.Logf("race detector, without latency: round trip %v, back to back %v per command", slack.rt, slack.pipelined)
			}
			lo, hi := lat*8/10, lat*12/10
			if rt < lo || rt > hi+slack.rt {
				t.Errorf("median round trip %v, want %v ± 20%% [%v, %v]", rt, lat, lo, hi+slack.rt)
			}
			if pipelined < lo || pipelined > hi+slack.pipelined {
				t.Errorf("median time per command back to back %v, want %v ± 20%% [%v, %v]", pipelined, lat, lo, hi+slack.pipelined)
			}
		})
	}
}

// roundTrip submits a noop on r's stream and waits for it.
func roundTrip(t *testing.T, r *rig) time.Duration {
	t.Helper()
	cmd := hw.Command{Program: r.prog(r.dev, "noop")}
	start := time.Now()
	c, err := r.st.Submit(&cmd)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// backToBack submits n commands on r's stream at once and returns the
// median interval between their executions. The worker stamps each
// command as it runs it, after its latency, so the intervals are the
// per-command times, free of how fast a waiter wakes.
func backToBack(t *testing.T, r *rig, n int) time.Duration {
	t.Helper()
	tag := tags.Add(1)
	times := make([]time.Time, n)
	stamps.Store(tag, times)
	defer stamps.Delete(tag)
	stamp := r.prog(r.dev, "test.stamp")
	var last hw.Completion
	for i := range n {
		c, err := r.st.Submit(&hw.Command{Program: stamp, Args: []hw.Arg{hw.Uint(tag), hw.Uint(uint64(i))}})
		if err != nil {
			t.Fatal(err)
		}
		last = c
	}
	if err := last.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	took := make([]time.Duration, 0, n-1)
	for i := 1; i < n; i++ {
		took = append(took, times[i].Sub(times[i-1]))
	}
	return median(took)
}

// stamps[tag] is the []time.Time that "test.stamp" (scalar args tag and
// i) writes the time it runs to, at index i.
var stamps sync.Map

func init() {
	sim.Register("test.stamp", func(l *sim.Launch) error {
		ts, _ := stamps.Load(l.Uint(0))
		ts.([]time.Time)[l.Uint(1)] = time.Now()
		return nil
	})
}

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// TestLatencyAfterHang: a hang is not latency. Commands queued during a
// hang still take their latency each once it is released (their latency
// starts at their submission, or when the worker is free, whichever is
// later; a hang does not count as free time).
func TestLatencyAfterHang(t *testing.T) {
	const lat = 200 * time.Microsecond
	r := newRig(t, sim.NewDeviceConfig().WithLatency(lat))
	noop := r.prog(r.dev, "noop")
	release := r.st.Inject(sim.Fault{Kind: sim.Hang})
	var last hw.Completion
	for range 5 {
		last = r.submit(r.st, noop)
	}
	// Long enough for the commands' latency to have passed, had it started
	// at submission: an observable wait, not a synchronisation.
	deadline := time.Now().Add(2 * 5 * lat)
	for time.Now().Before(deadline) {
		runtime.Gosched()
	}
	start := time.Now()
	release()
	if err := last.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 5*lat {
		t.Fatalf("5 commands of %v each retired %v after the hang ended", lat, took)
	}
}
