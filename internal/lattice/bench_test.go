package lattice_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// reportLatency reports the p50 and p99 of ds.
func reportLatency(b *testing.B, ds []time.Duration) {
	slices.Sort(ds)
	if len(ds) == 0 {
		return
	}
	b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(ds[len(ds)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkCallOverhead: one call at a time to the good stage on a sim
// device with no latency (local_client_error: to a stage that fails
// every call), run locally (Host.Call) and through the lattice
// (Front.Call to one host over in-process NATS: request, ack, answer);
// lattice_traced is the lattice call with tracing on, every call sampled
// (the front's lattice.call, the host's lattice.serve, session.acquire
// and session.run: four spans a call), batched to an exporter that
// drops them, so the cost is recording and batching, not exporting.
func BenchmarkCallOverhead(b *testing.B) {
	url := startServer(b)
	m := join(b, url, "bo", "h1", manifestOpts{extra: moduleSession(b, "client_error", "ce")}, lattice.HostConfig{TTL: 3 * time.Second})
	f := newFront(b, url, "bo", lattice.FrontConfig{TTL: 3 * time.Second})
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	join(b, url, "bt", "h1", manifestOpts{}, lattice.HostConfig{TTL: 3 * time.Second, TracerProvider: tp})
	ft := newFront(b, url, "bt", lattice.FrontConfig{TTL: 3 * time.Second, TracerProvider: tp})
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		call func() ([]byte, error)
	}{
		{"local", func() ([]byte, error) { return m.h.Call(ctx, "steady", nil) }},
		// A stage that fails every call (client_error): the failing
		// call's own cost on the host.
		{"local_client_error", func() ([]byte, error) {
			if _, err := m.h.Call(ctx, "ce", nil); lattice.Class(err) != errdefs.ClassClientError {
				return nil, fmt.Errorf("want a client_error, got %v", err)
			}
			return nil, nil
		}},
		{"lattice", func() ([]byte, error) { return f.Call(ctx, "steady", nil) }},
		{"lattice_traced", func() ([]byte, error) { return ft.Call(ctx, "steady", nil) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ds := make([]time.Duration, 0, b.N)
			claims := m.h.Stats().Claims
			for b.Loop() {
				start := time.Now()
				if _, err := bc.call(); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(start))
			}
			reportLatency(b, ds)
			if bc.name == "lattice" {
				// Calls whose id the host claimed in the calls bucket
				// (its acknowledgement was still unsent when the call
				// would start).
				b.ReportMetric(float64(m.h.Stats().Claims-claims)/float64(len(ds)), "claims/op")
			}
		})
	}
}

// BenchmarkThroughput: calls through a front from 8 callers per host,
// spread over 1, 2 and 3 hosts, each with one instance of a session on a
// sim device with 200µs latency.
func BenchmarkThroughput(b *testing.B) {
	for _, n := range []int{1, 2, 3} {
		b.Run("hosts="+strconv.Itoa(n), func(b *testing.B) {
			url := startServer(b)
			lat := "bt" + strconv.Itoa(n)
			var hosts []*member
			for i := range n {
				hosts = append(hosts, join(b, url, lat, "h"+strconv.Itoa(i), manifestOpts{latency: 200 * time.Microsecond}, lattice.HostConfig{TTL: 3 * time.Second}))
			}
			f := newFront(b, url, lat, lattice.FrontConfig{TTL: 3 * time.Second})
			ctx := context.Background()
			callers := 8 * n
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			next := make(chan struct{}, callers)
			go func() {
				for range b.N {
					next <- struct{}{}
				}
				close(next)
			}()
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range next {
						if _, err := f.Call(ctx, "steady", nil); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			claims := uint64(0)
			for _, m := range hosts {
				claims += m.h.Stats().Claims
			}
			b.ReportMetric(float64(claims)/float64(b.N), "claims/op")
		})
	}
}

// discardSpans is a span exporter that drops what it is given.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// BenchmarkLargePayload: one call at a time to the echo stage through
// the lattice (embedded server, max_payload 8 MiB), its input and output
// each n bytes: 1 MiB travels in the messages, 9 MiB through the payload
// store (an object each way, written to the store's files). local is
// Host.Call of the same input, for the stage's own cost.
func BenchmarkLargePayload(b *testing.B) {
	srv, err := lattice.StartEmbedded(lattice.EmbeddedConfig{StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := srv.ClientURL()
	m := join(b, url, "bl", "h1", manifestOpts{extra: moduleSession(b, "echo", "echo")}, lattice.HostConfig{TTL: 3 * time.Second})
	f := newFront(b, url, "bl", lattice.FrontConfig{TTL: 3 * time.Second})
	ctx := context.Background()
	for _, n := range []int{1 << 20, 9 << 20} {
		in := make([]byte, n)
		for _, route := range []string{"local", "lattice"} {
			b.Run(route+"/"+strconv.Itoa(n>>20)+"MiB", func(b *testing.B) {
				b.SetBytes(int64(2 * n)) // in and out
				for b.Loop() {
					var out []byte
					var err error
					if route == "local" {
						out, err = m.h.Call(ctx, "echo", in)
					} else {
						out, err = f.Call(ctx, "echo", in)
					}
					if err != nil || len(out) != n {
						b.Fatalf("%d bytes back, %v", len(out), err)
					}
				}
			})
		}
	}
}
