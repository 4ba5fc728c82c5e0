package sessions_test

import (
	"context"
	"fmt"
	. "github.com/stagehost/stagehost/sessions"
	. "github.com/stagehost/stagehost/sessions/exchange"
	"runtime"
	"testing"
	"time"
)

// BenchmarkResidentStartup measures the startup protocol alone: the time
// from publishing RUN (Start) until both resident participants have
// observed it, seen by spinning with acquire loads on the "observed" word
// each participant writes right after it sees RUN. That interval is the
// reported ns/op. Each iteration first builds a fresh session with both
// participants submitted (normally already polling WAIT; if a stream
// worker has not reached its kernel yet, that launch is part of the
// interval, as it would be in production), and afterwards joins and
// closes it; iter-ns/op is the whole iteration, and B/op and allocs/op
// cover the whole iteration too (publishing itself allocates nothing:
// TestR1PublishAllocatesNothing).
//
// The interval is timed with time.Now instead of b.StopTimer/StartTimer:
// those read memory statistics with a stop-the-world pause on every call,
// which deschedules the spinning participants and inflated the measured
// interval about 50 times.
func BenchmarkResidentStartup(b *testing.B) {
	r := newRig(b, 0, noOwner)
	must(b, r.startup.Close())
	must(b, r.payload.Free())
	ctx := context.Background()
	var observe time.Duration
	var polls int
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		startup, err := NewResidentStartup(r.p, r.gpu, r.npu, r.budget)
		must(b, err)
		gp, np, payload, err := NewSimExchange(r.p, startup, r.gs, r.ns, 0, nil)
		must(b, err)
		s, err := NewResidentSession(startup, gp, np, NewResidentConfig())
		must(b, err)
		must(b, s.SubmitGPU())
		must(b, s.SubmitNPU())

		t0 := time.Now()
		must(b, s.Start())
		for payload.Load32Acquire(GPUObservedOffset) == 0 || payload.Load32Acquire(NPUObservedOffset) == 0 {
			polls++
			runtime.Gosched()
		}
		observe += time.Since(t0)

		if done, err := s.Wait(ctx); !done || err != nil {
			b.Fatalf("Wait = %v, %v", done, err)
		}
		must(b, s.Close())
		must(b, payload.Free())
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "iter-ns/op")
	b.ReportMetric(float64(observe.Nanoseconds())/float64(b.N), "ns/op")
	b.ReportMetric(float64(polls)/float64(b.N), "host-polls/op")
}

// BenchmarkResidentExchange measures a whole resident session on the sim
// backend: startup line, participants and payload, submit both, publish
// RUN, N rounds of device-side credit ping-pong, join, close.
func BenchmarkResidentExchange(b *testing.B) {
	for _, rounds := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("rounds=%d", rounds), func(b *testing.B) {
			r := newRig(b, rounds, noOwner)
			must(b, r.startup.Close())
			must(b, r.payload.Free())
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				startup, err := NewResidentStartup(r.p, r.gpu, r.npu, r.budget)
				must(b, err)
				gp, np, payload, err := NewSimExchange(r.p, startup, r.gs, r.ns, rounds, nil)
				must(b, err)
				s, err := NewResidentSession(startup, gp, np, NewResidentConfig())
				must(b, err)
				must(b, s.SubmitGPU())
				must(b, s.SubmitNPU())
				must(b, s.Start())
				if done, err := s.Wait(ctx); !done || err != nil {
					b.Fatalf("Wait = %v, %v", done, err)
				}
				must(b, s.Close())
				must(b, payload.Free())
			}
		})
	}
}
