package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/internal/testutil"
)

// requireGPU opens the real CUDA platform. Without a usable GPU it skips
// the test, unless STAGEHOST_REQUIRE_GPU=1, which turns the skip into a
// failure (for runs on GPU machines). STAGEHOST_CUDA_PTX=file loads that
// module instead of the embedded one.
func requireGPU(t testing.TB) *Platform {
	t.Helper()
	cfg := NewConfig()
	if path := os.Getenv("STAGEHOST_CUDA_PTX"); path != "" {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("STAGEHOST_CUDA_PTX: %v", err)
		}
		cfg = cfg.withPTX(src)
	}
	p, err := Open(cfg)
	testutil.GPU(t, err)
	t.Cleanup(func() {
		settle(p)
		if err := p.Close(); err != nil {
			t.Errorf("platform Close: %v", err)
		}
	})
	return p
}

// settle waits (at most 5 s) until every device of p has released all
// its streams and allocations. A Free while another stream of the device
// still has queued work completes on a goroutine once that work retired
// (TestGPUConcurrentStreams frees from 4 goroutines at once), so closing
// right after a test could otherwise find an allocation still open.
func settle(p *Platform) {
	testutil.Poll(5*time.Second, func() bool {
		n := p.host.live.Load()
		for _, d := range p.devices {
			n += d.live.Load()
		}
		return n == 0
	})
}

func TestGPUOpen(t *testing.T) {
	p := requireGPU(t)
	t.Logf("driver version %d", p.DriverVersion())
	for _, d := range p.Devices() {
		if d == p.Host() {
			continue
		}
		cd := d.(*Device)
		t.Logf("%s: %s (%s)", d.Name(), cd.Model(), d.Engine())
		if d.Engine() != hw.EngineGPU || d.Err() != nil {
			t.Errorf("%s: engine %v err %v", d.Name(), d.Engine(), d.Err())
		}
	}
	if h := p.Devices()[len(p.Devices())-1]; h != p.Host() || h.Name() != "host0" || h.Engine() != hw.EngineCPU {
		t.Errorf("last device %v, want the host device host0 (cpu)", h.Name())
	}
}

// TestGPUHostExchange runs the resident exchange kernel against a host
// program on host0, through startup and payload memory mapped for both.
func TestGPUHostExchange(t *testing.T) { scenarioHostExchange(t, requireGPU(t)) }

// TestGPUSubmitBatch: a batch is validated whole, retires as one
// completion, and is replayed from a cached CUDA graph once repeated.
func TestGPUSubmitBatch(t *testing.T) {
	p := requireGPU(t)
	r := newRig(t, p)
	st := r.s.(*Stream)
	x := r.upload([]float32{1, 2, 3, 4})
	y := r.upload([]float32{10, 20, 30, 40})
	batch := []hw.Command{
		{Program: r.prog("fill"), Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.Float32(2)}},
		{Program: r.prog("saxpy"), Args: []hw.Arg{hw.Float32(3), hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1)}},
	}
	for range 5 {
		c, err := st.SubmitBatch(batch)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Wait(r.ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, v := range r.download(y) {
		if want := float32(10*(i+1)) + 30; v != want {
			t.Fatalf("y[%d] = %v, want %v", i, v, want)
		}
	}
	d, g, c := st.batchDirect.Load(), st.batchReplays.Load(), st.batchCapture.Load()
	t.Logf("5 batches: %d launched kernel by kernel, %d replayed from %d captured graph(s)", d, g, c)
	if d != 1 || g != 4 || c != 1 {
		t.Fatalf("want 1 direct, 4 replays, 1 capture")
	}
}

func TestGPUKernels(t *testing.T) { scenarioKernels(t, requireGPU(t)) }

func TestGPUMLP(t *testing.T) { scenarioMLP(t, requireGPU(t)) }

func TestGPUMLPForward(t *testing.T) { scenarioMLPForward(t, requireGPU(t)) }

func TestGPUGraph(t *testing.T) { scenarioGraph(t, requireGPU(t)) }

func TestGPUSharedSpin(t *testing.T) {
	t.Logf("host Store32Release → spin kernel retired: %v", scenarioSharedSpin(t, requireGPU(t)))
}

// TestGPUSharedFlagLatency measures the round trip through a host-mapped
// pinned word: the spin kernel is already polling; the host stores the
// target and waits for the kernel's completion.
func TestGPUSharedFlagLatency(t *testing.T) {
	p := requireGPU(t)
	r := newRig(t, p)
	sh, err := p.AllocShared(64, p.Devices()[:1], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Free()
	view, _ := sh.View(r.dev)
	spin := r.prog("spin")
	var lat []time.Duration
	for i := uint32(1); i <= 200; i++ {
		c, err := r.s.Submit(&hw.Command{Program: spin, Args: []hw.Arg{hw.BufferArg(view, 0, 4), hw.Uint(0), hw.Uint(uint64(i))}})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Microsecond) // let the kernel start polling
		start := time.Now()
		sh.Store32Release(0, i)
		if err := c.Wait(r.ctx); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("store→retired round trip over %d runs: min %v, median %v, p90 %v, max %v",
		len(lat), lat[0], lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1])
}

// TestGPUConcurrentStreams drives 4 streams from 4 goroutines at once
// (each stream has its own driver thread) and moves 64 MiB each way.
func TestGPUConcurrentStreams(t *testing.T) {
	p := requireGPU(t)
	dev := p.Devices()[0]
	saxpy, _ := dev.Prepare("saxpy")
	fill, _ := dev.Prepare("fill")
	ctx := testCtx(t)
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			errs <- func() error {
				s, err := dev.NewStream()
				if err != nil {
					return err
				}
				defer s.Close(context.Background())
				const n = 1 << 24 // 16 Mi floats = 64 MiB
				x, err := dev.Alloc(4*n, 0, nil)
				if err != nil {
					return err
				}
				defer x.Free()
				y, err := dev.Alloc(4*n, 0, nil)
				if err != nil {
					return err
				}
				defer y.Free()
				host := f32bytes(make([]float32, n))
				for i := range n {
					binary.LittleEndian.PutUint32(host[4*i:], math.Float32bits(float32(i%1000)))
				}
				s.Write(y, 0, host)
				s.Submit(&hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.Float32(float32(g + 1))}})
				for range 100 {
					for {
						_, err := s.Submit(&hw.Command{Program: saxpy, Args: []hw.Arg{hw.Float32(1), hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1)}})
						if !errors.Is(err, errdefs.ErrBusy) {
							if err != nil {
								return err
							}
							break
						}
						runtime.Gosched()
					}
				}
				back := make([]byte, 4*n)
				c, err := s.Read(y, 0, back)
				if err != nil {
					return err
				}
				if err := c.Wait(ctx); err != nil {
					return err
				}
				for i := 0; i < n; i += 4099 {
					got := math.Float32frombits(binary.LittleEndian.Uint32(back[4*i:]))
					if want := float32(i%1000) + 100*float32(g+1); got != want {
						return fmt.Errorf("stream %d: y[%d] = %v, want %v", g, i, got, want)
					}
				}
				return s.Sync(ctx)
			}()
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestGPUZZDeviceLost runs last among the GPU tests (source order): the
// fault poisons the process's primary context until every reference to
// it is released.
func TestGPUZZDeviceLost(t *testing.T) {
	p := requireGPU(t)
	d := scenarioLost(t, p)
	t.Logf("illegal address surfaced as ErrDeviceLost after %v", d)
	if err := p.Close(); err != nil {
		t.Errorf("Close after loss: %v", err)
	}
	// With the last reference released, the primary context is destroyed;
	// a new Open gets a fresh, healthy one.
	t.Logf("cuDevicePrimaryCtxReset_v2 at Close: %s", resultString(p.drv, p.devices[0].resetResult))
	q, err := Open(NewConfig())
	if err != nil {
		t.Logf("reopen after loss: %v", err)
		return
	}
	defer q.Close()
	r := newRig(t, q)
	b := r.alloc(64, 0)
	if err := r.submit("fill", 0, hw.BufferArg(b, 0, -1), hw.Float32(1)).Wait(r.ctx); err != nil {
		t.Logf("work after reopen: %v (the device stays lost for this process)", err)
	} else {
		t.Logf("reopen after loss: fresh context works")
	}
	r.s.Close(context.Background())
}

// Benchmarks (GPU only; compare with bench/cuda/launch.c).

// BenchmarkLaunchNoop: b.N asynchronous noop launches, one Sync at the end.
func BenchmarkLaunchNoop(b *testing.B) {
	p := requireGPU(b)
	r := newRig(b, p)
	cmd := &hw.Command{Program: r.prog("noop")}
	for range 1000 {
		r.s.Submit(cmd)
	}
	r.sync()
	b.ReportAllocs()
	b.ResetTimer()
	busy := 0
	for i := 0; i < b.N; {
		_, err := r.s.Submit(cmd)
		switch {
		case err == nil:
			i++
		case errors.Is(err, errdefs.ErrBusy): // queue full: the driver thread is behind
			busy++
			runtime.Gosched()
		default:
			b.Fatal(err)
		}
	}
	r.sync()
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/launch")
	b.ReportMetric(float64(busy)/float64(b.N), "busy/launch")
}

// benchBatch: b.N asynchronous SubmitBatch calls of 64 noops each, one
// Sync at the end; ns/kernel is per kernel.
func benchBatch(b *testing.B, cfgs ...Config) {
	p := requireGPU(b)
	if len(cfgs) > 0 {
		// A platform of its own, so the configuration applies.
		p.Close()
		var err error
		if p, err = Open(cfgs[0]); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
	}
	r := newRig(b, p)
	st := r.s.(*Stream)
	cmds := make([]hw.Command, 64)
	for i := range cmds {
		cmds[i] = hw.Command{Program: r.prog("noop")}
	}
	for range 20 {
		st.SubmitBatch(cmds)
	}
	r.sync()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; {
		_, err := st.SubmitBatch(cmds)
		switch {
		case err == nil:
			i++
		case errors.Is(err, errdefs.ErrBusy):
			runtime.Gosched()
		default:
			b.Fatal(err)
		}
	}
	r.sync()
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(cmds)), "ns/kernel")
}

// BenchmarkBatchNoop64: SubmitBatch of 64 noops; repeated, so replayed
// from the stream's cached graph.
func BenchmarkBatchNoop64(b *testing.B) { benchBatch(b) }

// BenchmarkBatchNoop64Direct: the same with the graph cache off: one
// hand-off, then 64 cuLaunchKernel calls on the driver thread.
func BenchmarkBatchNoop64Direct(b *testing.B) { benchBatch(b, NewConfig().WithBatchGraphs(0)) }

// BenchmarkLaunchSync: launch, then wait for its completion, each time.
func BenchmarkLaunchSync(b *testing.B) {
	p := requireGPU(b)
	r := newRig(b, p)
	cmd := &hw.Command{Program: r.prog("noop")}
	for range 100 {
		c, _ := r.s.Submit(cmd)
		c.Wait(r.ctx)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		c, err := r.s.Submit(cmd)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Wait(r.ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGraphNoop: one replay of a graph of 64 noop kernels per
// iteration, asynchronous, one Sync at the end; ns/kernel is per kernel.
func BenchmarkGraphNoop(b *testing.B) {
	p := requireGPU(b)
	r := newRig(b, p)
	cmds := make([]hw.Command, 64)
	for i := range cmds {
		cmds[i] = hw.Command{Program: r.prog("noop")}
	}
	st := r.s.(*Stream)
	g, err := st.RecordGraph(cmds)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	for range 20 {
		st.SubmitGraph(g)
	}
	r.sync()
	b.ResetTimer()
	for i := 0; i < b.N; {
		_, err := st.SubmitGraph(g)
		switch {
		case err == nil:
			i++
		case errors.Is(err, errdefs.ErrBusy):
			runtime.Gosched()
		default:
			b.Fatal(err)
		}
	}
	r.sync()
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(cmds)), "ns/kernel")
}
