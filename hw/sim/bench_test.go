package sim_test

import (
	"context"
	"testing"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// BenchmarkSubmitToCompletion measures one round trip: submit a noop and
// wait for it (latency 0).
func BenchmarkSubmitToCompletion(b *testing.B) {
	r := newRig(b)
	cmd := &hw.Command{Program: r.prog(r.dev, "noop")}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		c, err := r.st.Submit(cmd)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSubmitAsync measures pipelined submission: batches of noops
// submitted back to back, then one Sync per batch. Reported per command.
func BenchmarkSubmitAsync(b *testing.B) {
	const batch = 512
	r := newRig(b, sim.WithQueueDepth(batch))
	cmd := &hw.Command{Program: r.prog(r.dev, "noop")}
	ctx := context.Background()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if _, err := r.st.Submit(cmd); err != nil {
			b.Fatal(err)
		}
		if n++; n == batch {
			n = 0
			if err := r.st.Sync(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := r.st.Sync(ctx); err != nil {
		b.Fatal(err)
	}
}
