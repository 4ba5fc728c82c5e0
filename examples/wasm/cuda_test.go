package wasm_test

// The MLP example stage, unchanged, on a real NVIDIA GPU (cuda0), compared
// with the sim backend and the Go reference; and examples/cuda.toml. The
// GPU tests skip without a usable GPU, unless STAGEHOST_REQUIRE_GPU=1.

import (
	"context"
	"errors"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/sessions/deploy"
	"github.com/stagehost/stagehost/sessions/manifest"
	"github.com/stagehost/stagehost/stages"
)

func requireCUDA(t testing.TB) *cuda.Platform {
	t.Helper()
	p, err := cuda.Open()
	if err != nil {
		if errors.Is(err, hw.ErrUnsupported) && os.Getenv("STAGEHOST_REQUIRE_GPU") != "1" {
			t.Skipf("no usable CUDA GPU (set STAGEHOST_REQUIRE_GPU=1 to fail instead): %v", err)
		}
		t.Fatalf("cuda.Open: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// scoreBound is how far the device's scores may lie from the reference's
// for input x, output by output: the standard forward error bound of a
// float32 dot product, |fl(Σ a_k b_k) − Σ a_k b_k| ≤ γ_n Σ |a_k b_k| with
// γ_n = n·u/(1−n·u), u = 2⁻²⁴, holds for any summation order and with or
// without fused multiply-adds. The GPU's matmul fuses (fmaf) where the
// reference rounds each product, so the two may differ by twice the bound
// (each is within it of the exact value). Layer 1 (K=8 products plus the
// bias) gives each hidden value an error δ_k; ReLU does not increase it;
// layer 2 (K=16 plus the bias) adds its own bound and carries Σ|W2|·δ.
func scoreBound(x [model.Inputs]float32) [model.Classes]float64 {
	const u = 1.0 / (1 << 24)
	gamma := func(n float64) float64 { return n * u / (1 - n*u) }
	p := model.Params()
	var h, dh [model.Hidden]float64
	for j := range model.Hidden {
		var exact, mag float64
		for k := range model.Inputs {
			v := float64(x[k]) * float64(p[model.OffW1+k*model.Hidden+j])
			exact += v
			mag += math.Abs(v)
		}
		exact += float64(p[model.OffB1+j])
		mag += math.Abs(float64(p[model.OffB1+j]))
		dh[j] = 2 * gamma(model.Inputs+1) * mag
		h[j] = math.Max(exact, 0)
	}
	var out [model.Classes]float64
	for j := range model.Classes {
		var mag, carried float64
		for k := range model.Hidden {
			w := math.Abs(float64(p[model.OffW2+k*model.Classes+j]))
			mag += (math.Abs(h[k]) + dh[k]) * w
			carried += dh[k] * w
		}
		mag += math.Abs(float64(p[model.OffB2+j]))
		out[j] = 2*gamma(model.Hidden+1)*mag + carried
	}
	return out
}

// TestMLPStageOnCUDA runs examples/wasm/mlp/stage/mlp.wasm, unchanged, in
// a stages.Session on cuda0 for 64 inputs and compares every output with
// the sim backend's and with model.Predict: the class must be identical,
// the scores within scoreBound. It reports how many outputs are also
// bit-identical.
func TestMLPStageOnCUDA(t *testing.T) {
	p := requireCUDA(t)
	gpu, err := p.Device("cuda0")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	stage := load(t, "mlp/stage/mlp.wasm", "mlp", goGuest())
	ctx := context.Background()
	open := func(dev hw.Device) *stages.Session {
		s, err := engine(t).NewSession(ctx, f.rt, stage, mlpConfig("mlp-"+dev.Name(), dev))
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
	onGPU, onSim := open(gpu), open(f.gpu)
	exact, simExact := 0, 0
	worst := 0.0 // largest |diff| / bound
	inputs := model.TestInputs(64)
	for i, x := range inputs {
		in := model.EncodeInput(x)
		want, _ := model.Predict(in)
		got, err := onGPU.Run(ctx, in, nil)
		if err != nil {
			t.Fatalf("input %d on cuda0: %v", i, err)
		}
		sim, err := onSim.Run(ctx, in, nil)
		if err != nil {
			t.Fatalf("input %d on sim: %v", i, err)
		}
		gc, gs, err := model.DecodeOutput(got)
		if err != nil {
			t.Fatal(err)
		}
		wc, ws, _ := model.DecodeOutput(want)
		sc, _, _ := model.DecodeOutput(sim)
		if gc != wc || gc != sc {
			t.Fatalf("input %d: class %d on cuda0, %d on sim, %d in the reference", i, gc, sc, wc)
		}
		bound := scoreBound(x)
		for j := range gs {
			d := math.Abs(float64(gs[j]) - float64(ws[j]))
			if d > bound[j] {
				t.Fatalf("input %d score %d: cuda0 %v, reference %v: |diff| %.3g above the bound %.3g", i, j, gs[j], ws[j], d, bound[j])
			}
			worst = math.Max(worst, d/bound[j])
		}
		if string(got) == string(want) {
			exact++
		}
		if string(sim) == string(want) {
			simExact++
		}
	}
	t.Logf("%d inputs: classes identical on cuda0, sim and the reference; bit-identical outputs: cuda0 %d/%d, sim %d/%d; largest score difference %.3f of its bound",
		len(inputs), exact, len(inputs), simExact, len(inputs), worst)
	if q := onGPU.Quarantined(); q != nil {
		t.Fatal(q)
	}
}

// BenchmarkMLPStageBackends: one classification through the whole host path
// (stage call, upload, the six-kernel batch, download, sync, the built-in
// fence and the idle check), on sim and on cuda0, with p50 and p99 per
// call. STAGEHOST_MLP_WASM_BEFORE names another build of the stage (the
// one before issue 9's restructuring) to run side by side, as before/sim
// and before/cuda.
func BenchmarkMLPStageBackends(b *testing.B) {
	stage := load(b, "mlp/stage/mlp.wasm", "mlp", goGuest())
	var before *stages.Module
	if path := os.Getenv("STAGEHOST_MLP_WASM_BEFORE"); path != "" {
		before = load(b, path, "mlp-before", goGuest())
	}
	ctx := context.Background()
	in := model.EncodeInput(model.TestInputs(1)[0])
	run := func(b *testing.B, stage *stages.Module, dev hw.Device) {
		f := newFixture(b)
		s, err := engine(b).NewSession(ctx, f.rt, stage, mlpConfig("bench-"+dev.Name(), dev))
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
	b.Run("sim", func(b *testing.B) { run(b, stage, newFixture(b).gpu) })
	b.Run("cuda", func(b *testing.B) { run(b, stage, cuda0(b)) })
	if before != nil {
		b.Run("before/sim", func(b *testing.B) { run(b, before, newFixture(b).gpu) })
		b.Run("before/cuda", func(b *testing.B) { run(b, before, cuda0(b)) })
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
	d, err := deploy.Open(ctx, m, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(ctx)
	s := d.Session("classify")
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
