package sim_test

import (
	"context"
	"testing"
	"time"

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
	r := newRig(b, sim.NewDeviceConfig().WithQueueDepth(batch))
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

// BenchmarkNewStream measures creating (and closing) one stream with the
// default queue depth: its bytes per op are what a session's stream costs.
func BenchmarkNewStream(b *testing.B) {
	r := newRig(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s, err := r.dev.NewStream()
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLatency measures one round trip of a noop on a device with a
// configured latency; ns/op should be close to the latency.
func BenchmarkLatency(b *testing.B) {
	for _, lat := range []time.Duration{20 * time.Microsecond, 50 * time.Microsecond, 200 * time.Microsecond} {
		b.Run(lat.String(), func(b *testing.B) {
			r := newRig(b, sim.NewDeviceConfig().WithLatency(lat))
			cmd := &hw.Command{Program: r.prog(r.dev, "noop")}
			ctx := context.Background()
			for b.Loop() {
				c, err := r.st.Submit(cmd)
				if err != nil {
					b.Fatal(err)
				}
				if err := c.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOpSubmitToCompletion: one round trip of a small op launch
// (exp on 64 float32 values): its submit-time check and its run by the
// op library's reference implementation.
func BenchmarkOpSubmitToCompletion(b *testing.B) {
	r := newRig(b)
	x := r.alloc(r.dev, 256)
	cmd := &hw.Command{Program: r.prog(r.dev, "exp"), Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(x, 0, -1)}}
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
