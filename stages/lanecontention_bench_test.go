package stages

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// BenchmarkLaneContention: 16 sessions of good_stage on one sim GPU whose
// commands take 100 ms, each with a deadline of 500 ms, called all at once
// (one round per iteration). Each call holds the compute lane for about
// 100 ms, so the last one is served about 1.6 s after the first: with a
// deadline that covers the wait for the lane, calls that would wait past
// theirs are answered DeadlineExceeded at it. Reported: the slowest
// answer (max-ms), how many calls succeeded (ok/round) and how many were
// answered DeadlineExceeded (deadline/round).
func BenchmarkLaneContention(b *testing.B) {
	ctx := context.Background()
	f := newWasmFixture(b)
	gpu, err := f.p.AddDevice("slow", hw.EngineGPU, sim.NewDeviceConfig().WithLatency(100*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	const n = 16
	m := f.mustLoad(b, "good_stage")
	var sessions []*Session
	for range n {
		s := f.session(b, m, NewSessionConfig("contended", gpu).WithStreams("s0").WithPrograms("noop").
			WithDeadline(500*time.Millisecond).WithFenceTimeout(10*time.Second))
		defer s.Close(ctx)
		sessions = append(sessions, s)
	}
	var worst time.Duration
	ok, late := 0, 0
	for b.Loop() {
		w, o, l := contendedRound(b, sessions)
		worst, ok, late = max(worst, w), ok+o, late+l
	}
	b.ReportMetric(float64(worst)/1e6, "max-ms")
	b.ReportMetric(float64(ok)/float64(b.N), "ok/round")
	b.ReportMetric(float64(late)/float64(b.N), "deadline/round")
}

// contendedRound calls every session at once and returns the slowest
// answer and the counts of successes and DeadlineExceeded answers.
func contendedRound(b *testing.B, sessions []*Session) (worst time.Duration, ok, late int) {
	var wg sync.WaitGroup
	took := make([]time.Duration, len(sessions))
	errs := make([]error, len(sessions))
	for i, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, errs[i] = s.Run(context.Background(), nil, nil)
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		worst = max(worst, took[i])
		switch {
		case err == nil:
			ok++
		case errors.Is(err, errdefs.ErrDeadlineExceeded):
			late++
		default:
			b.Fatal(err)
		}
	}
	return worst, ok, late
}
