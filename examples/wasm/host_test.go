// Package wasm_test runs every example module through the real host on
// the sim backend and checks its output.
package wasm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"sync"
	"testing"

	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/stages"
)

var (
	engOnce sync.Once
	eng     *stages.Engine
	engErr  error
	// cacheDir is the compilation cache of this test binary: each Go
	// guest compiles once, whichever test loads it first (TestMain).
	cacheDir string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "stagehost-cache-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cacheDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func engine(t testing.TB) *stages.Engine {
	t.Helper()
	engOnce.Do(func() {
		eng, engErr = stages.NewEngine(context.Background(), stages.NewEngineConfig().WithCacheDir(cacheDir))
	})
	if engErr != nil {
		t.Fatal(engErr)
	}
	return eng
}

type fixture struct {
	rt  *host.Runtime
	gpu hw.Device
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	rt, err := host.NewRuntime(host.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := sim.New()
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &fixture{rt: rt, gpu: gpu}
}

func load(t testing.TB, path, name string, cfg stages.LoadConfig) *stages.Module {
	t.Helper()
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine(t).Load(context.Background(), bin, stages.SHA256(bin), cfg.WithName(name))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func goGuest() stages.LoadConfig { return stages.NewLoadConfig().WithWASI(stages.GrantGoRuntime) }

func TestMinimalGoGuest(t *testing.T) {
	testutil.GoGuests(t)
	f := newFixture(t)
	m := load(t, "minimal/minimal.wasm", "minimal", goGuest())
	s, err := engine(t).NewSession(context.Background(), f.rt, m, stages.NewSessionConfig("minimal", f.gpu))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	out, err := s.Run(context.Background(), []byte("abc"), nil)
	if err != nil || string(out) != "ok:cba" {
		t.Fatalf("%q, %v", out, err)
	}
}

// mlpConfig is the MLP stage's session: stream s0 and the six-launch
// path's programs, plus mlp_forward when fused (the stage then runs the
// network as that one launch).
func mlpConfig(name string, dev hw.Device, fused bool) stages.SessionConfig {
	progs := []string{"matmul", "bias", "relu", "argmax"}
	if fused {
		progs = append(progs, "mlp_forward")
	}
	return stages.NewSessionConfig(name, dev).WithStreams("s0").WithPrograms(progs...)
}

// mlpInputs are the inputs the MLP tests classify: TestInputs (exact
// products) and RoundingInputs (rounded products), n of each.
func mlpInputs(n int) [][model.Inputs]float32 {
	return append(model.TestInputs(n), model.RoundingInputs(n)...)
}

func TestMLPGoGuestMatchesTheGoReference(t *testing.T) {
	testutil.GoGuests(t)
	f := newFixture(t)
	stage := load(t, "mlp/stage/mlp.wasm", "mlp", goGuest())
	fence := load(t, "fence/fence.wasm", "fence", goGuest().WithKind(stages.FenceModule))
	for _, c := range []struct{ fence, fused bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		withFence := c.fence
		cfg := mlpConfig("mlp", f.gpu, c.fused)
		if withFence {
			cfg = cfg.WithFenceModule(fence)
		}
		s, err := engine(t).NewSession(context.Background(), f.rt, stage, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i, x := range mlpInputs(16) {
			in := model.EncodeInput(x)
			got, err := s.Run(context.Background(), in, nil)
			if err != nil {
				t.Fatalf("input %d: %v", i, err)
			}
			want, err := model.Predict(in)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				gc, gs, _ := model.DecodeOutput(got)
				wc, ws, _ := model.DecodeOutput(want)
				t.Fatalf("input %d (fence module %v, mlp_forward %v): class %d scores %v, want %d %v", i, withFence, c.fused, gc, gs, wc, ws)
			}
		}
		if s.Quarantined() != nil {
			t.Fatal(s.Quarantined())
		}
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCStage(t *testing.T) {
	f := newFixture(t)
	m := load(t, "cstage/cstage.wasm", "cstage", stages.NewLoadConfig())
	s, err := engine(t).NewSession(context.Background(), f.rt, m,
		stages.NewSessionConfig("cstage", f.gpu).WithStreams("s0").WithPrograms("fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	out, err := s.Run(context.Background(), nil, nil)
	if err != nil || len(out) != 4 {
		t.Fatalf("%x, %v", out, err)
	}
	if v := math.Float32frombits(binary.LittleEndian.Uint32(out)); v != 40 {
		t.Fatalf("sum %v, want 40", v)
	}
}

// BenchmarkSessionInstantiateGo creates and closes a session of the
// minimal Go guest: instantiate, _initialize, streams. Target ≤ 3 ms.
func BenchmarkSessionInstantiateGo(b *testing.B) {
	f := newFixture(b)
	m := load(b, "minimal/minimal.wasm", "minimal", goGuest())
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s, err := engine(b).NewSession(ctx, f.rt, m, stages.NewSessionConfig("bench", f.gpu).WithStreams("s0"))
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMLPStage is one classification through the MLP Go guest on
// the sim backend: six-launch batch, and mlp_forward.
func BenchmarkMLPStage(b *testing.B) {
	for _, fused := range []bool{false, true} {
		name := "six-kernels"
		if fused {
			name = "fused"
		}
		b.Run(name, func(b *testing.B) {
			f := newFixture(b)
			stage := load(b, "mlp/stage/mlp.wasm", "mlp", goGuest())
			s, err := engine(b).NewSession(context.Background(), f.rt, stage, mlpConfig("mlp", f.gpu, fused))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			in := model.EncodeInput(model.TestInputs(1)[0])
			var out []byte
			b.ReportAllocs()
			for b.Loop() {
				if out, err = s.Run(context.Background(), in, out[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
