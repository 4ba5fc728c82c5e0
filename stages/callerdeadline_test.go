package stages

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// TestCallerDeadlineDuringSyncIsDeadlineExceeded: a caller's deadline
// that ends the call while the stage waits in stream_sync makes the call
// DeadlineExceeded, whatever the stage returns after the status
// (good_stage returns its own client error code 103 when stream_sync
// fails): ABI.md §3, stream_sync.
func TestCallerDeadlineDuringSyncIsDeadlineExceeded(t *testing.T) {
	f := newWasmFixture(t)
	gpu, err := f.p.AddDevice("slow", hw.EngineGPU, sim.NewDeviceConfig().WithLatency(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s := f.session(t, f.mustLoad(t, "good_stage"), NewSessionConfig("slow", gpu).WithStreams("s0").WithPrograms("noop").WithDeadline(time.Minute))
	counts := map[string]int{}
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		_, err := s.Run(ctx, nil, nil)
		cancel()
		var ce *ClientError
		switch {
		case errors.As(err, &ce):
			counts["client error"]++
		case errors.Is(err, errdefs.ErrDeadlineExceeded):
			counts["deadline"]++
		default:
			counts[err.Error()]++
		}
	}
	if counts["deadline"] != 20 {
		t.Fatalf("outcomes %v, want 20 DeadlineExceeded", counts)
	}
}
