package wasm_test

// The MLP example stage, unchanged, on a real NVIDIA GPU (cuda0), compared
// with the sim backend and the Go reference, bit for bit; and
// examples/cuda.toml. The
// GPU tests skip without a usable GPU, unless STAGEHOST_REQUIRE_GPU=1.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

func requireCUDA(t testing.TB) *cuda.Platform {
	t.Helper()
	p, err := cuda.Open(cuda.NewConfig())
	testutil.GPU(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// TestMLPStageOnCUDA runs examples/wasm/mlp/stage/mlp.wasm, unchanged, in
// stages.Sessions on cuda0 and on sim, each both ways (the six-launch
// batch, and mlp_forward when the session lists it), for 64 TestInputs
// (exact products) and 64 RoundingInputs (rounded products, which tell a
// fused multiply-add or another summation order apart), and requires
// every output to be bit-identical to model.Predict's.
func TestMLPStageOnCUDA(t *testing.T) {
	p := requireCUDA(t)
	gpu, err := p.Device("cuda0")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	stage := load(t, "mlp/stage/mlp.wasm", "mlp", goGuest())
	ctx := context.Background()
	open := func(dev hw.Device, fused bool) *stages.Session {
		s, err := engine(t).NewSession(ctx, f.rt, stage, mlpConfig(fmt.Sprintf("mlp-%s-%v", dev.Name(), fused), dev, fused))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.Close(ctx); err != nil {
				t.Errorf("close %s: %v", dev.Name(), err)
			}
		})
		return s
	}
	sessions := []struct {
		name string
		s    *stages.Session
	}{
		{"cuda0 six-kernel", open(gpu, false)}, {"cuda0 mlp_forward", open(gpu, true)},
		{"sim six-kernel", open(f.gpu, false)}, {"sim mlp_forward", open(f.gpu, true)},
	}
	inputs := mlpInputs(64)
	exact := make([]int, len(sessions))
	for i, x := range inputs {
		in := model.EncodeInput(x)
		want, _ := model.Predict(in)
		wc, ws, _ := model.DecodeOutput(want)
		for si, s := range sessions {
			got, err := s.s.Run(ctx, in, nil)
			if err != nil {
				t.Fatalf("input %d on %s: %v", i, s.name, err)
			}
			if string(got) == string(want) {
				exact[si]++
				continue
			}
			gc, gs, _ := model.DecodeOutput(got)
			t.Errorf("input %d on %s: class %d scores %v, reference %d %v", i, s.name, gc, gs, wc, ws)
		}
	}
	var report []string
	for si, s := range sessions {
		report = append(report, fmt.Sprintf("%s %d/%d", s.name, exact[si], len(inputs)))
		if q := s.s.Quarantined(); q != nil {
			t.Fatal(q)
		}
	}
	t.Logf("%d inputs (64 exact, 64 rounding): outputs bit-identical to the reference: %s", len(inputs), strings.Join(report, ", "))
}

// BenchmarkMLPStageBackends: one classification through the whole host path
// (stage call, upload, the network, download, sync, the fence and the idle
// check), on sim and on cuda0, with p50 and p99 per call: "sim" and "cuda"
// run the six-launch batch, ".../fused" the one mlp_forward launch (the
// same mlp.wasm; the session lists mlp_forward or not), and
// ".../fence-module" and ".../fused+fence-module" fence with
// examples/wasm/fence (as host.toml does: a second Go guest called after
// each stage call) instead of the host's built-in drain. ".../minimal" is the floor of a Go guest's call on the
// same host path: examples/wasm/minimal (no device work) in a session with
// stream s0 and the built-in fence. STAGEHOST_MLP_WASM_BEFORE names another
// build of the stage to run side by side, as before/sim and before/cuda.
func BenchmarkMLPStageBackends(b *testing.B) {
	stage := load(b, "mlp/stage/mlp.wasm", "mlp", goGuest())
	fence := load(b, "fence/fence.wasm", "fence", goGuest().WithKind(stages.FenceModule))
	minimal := load(b, "minimal/minimal.wasm", "minimal", goGuest())
	var before *stages.Module
	if path := os.Getenv("STAGEHOST_MLP_WASM_BEFORE"); path != "" {
		before = load(b, path, "mlp-before", goGuest())
	}
	ctx := context.Background()
	in := model.EncodeInput(model.TestInputs(1)[0])
	run := func(b *testing.B, stage *stages.Module, dev hw.Device, fused, fenced bool) {
		f := newFixture(b)
		cfg := mlpConfig("bench-"+dev.Name(), dev, fused)
		if fenced {
			cfg = cfg.WithFenceModule(fence)
		}
		if stage == minimal {
			cfg = stages.NewSessionConfig("bench-"+dev.Name(), dev).WithStreams("s0")
		}
		s, err := engine(b).NewSession(ctx, f.rt, stage, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close(ctx)
		var out []byte
		for range 10 {
			if out, err = s.Run(ctx, in, out[:0]); err != nil {
				b.Fatal(err)
			}
		}
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			t0 := time.Now()
			if out, err = s.Run(ctx, in, out[:0]); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		b.StopTimer()
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/classification")
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds()), "p99-ns")
	}
	cuda0 := func(b *testing.B) hw.Device {
		gpu, err := requireCUDA(b).Device("cuda0")
		if err != nil {
			b.Fatal(err)
		}
		return gpu
	}
	sim := func(b *testing.B) hw.Device { return newFixture(b).gpu }
	for _, dev := range []struct {
		name string
		open func(*testing.B) hw.Device
	}{{"sim", sim}, {"cuda", cuda0}} {
		b.Run(dev.name, func(b *testing.B) { run(b, stage, dev.open(b), false, false) })
		b.Run(dev.name+"/fused", func(b *testing.B) { run(b, stage, dev.open(b), true, false) })
		b.Run(dev.name+"/fence-module", func(b *testing.B) { run(b, stage, dev.open(b), false, true) })
		b.Run(dev.name+"/fused+fence-module", func(b *testing.B) { run(b, stage, dev.open(b), true, true) })
		b.Run(dev.name+"/minimal", func(b *testing.B) { run(b, minimal, dev.open(b), false, false) })
	}
	if before != nil {
		b.Run("before/sim", func(b *testing.B) { run(b, before, sim(b), false, false) })
		b.Run("before/cuda", func(b *testing.B) { run(b, before, cuda0(b), false, false) })
	}
}

// TestCUDAManifestDecodes checks examples/cuda.toml everywhere: a cuda
// device with engine "cpu" names the host device.
func TestCUDAManifestDecodes(t *testing.T) {
	m, err := manifest.Load("../cuda.toml")
	if err != nil {
		t.Fatal(err)
	}
	gpu, host := m.Device("gpu0"), m.Device("host")
	if gpu == nil || host == nil || gpu.Backend != manifest.BackendCUDA || host.Backend != manifest.BackendCUDA ||
		gpu.Engine != hw.EngineGPU || host.Engine != hw.EngineCPU {
		t.Fatalf("devices: %+v %+v", gpu, host)
	}
	if len(m.Sessions) != 1 || len(m.Residents) != 1 || m.Residents[0].NPU != "host" {
		t.Fatalf("sessions %d residents %+v", len(m.Sessions), m.Residents)
	}
}

// TestCUDAManifestRuns deploys examples/cuda.toml on the GPU: the MLP
// session classifies its sample input and the resident exchange between
// cuda0 and host0 is verified.
func TestCUDAManifestRuns(t *testing.T) {
	requireCUDA(t)
	m, err := manifest.Load("../cuda.toml")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := deploy.Open(ctx, m, deploy.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(ctx)
	s := d.Pool("classify")
	in, err := s.DefaultInput()
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.Run(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := model.Predict(in)
	gc, _, _ := model.DecodeOutput(out)
	wc, _, _ := model.DecodeOutput(want)
	if gc != wc {
		t.Fatalf("class %d, reference %d", gc, wc)
	}
	for i := range 3 {
		run, err := d.Resident("pingpong").Run(ctx)
		if err != nil {
			t.Fatalf("resident run %d: %v", i+1, err)
		}
		t.Logf("resident run %d: %s, %d rounds in %v", run.ID, run.State, run.Rounds, run.Duration)
	}
}
