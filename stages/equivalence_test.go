package stages

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// outcome is what a module did in a session: the load or creation error
// class, and per call the output, the error class and whether the
// session was then quarantined.
type outcome struct {
	load  error
	calls []callOutcome
}

type callOutcome struct {
	out         []byte
	class       error
	clientCode  int32
	quarantined bool
}

// runModule loads bin on eng, makes a session on a fresh sim device and
// calls it three times (so a trapped instance is replaced and called
// again).
func runModule(t *testing.T, eng *Engine, name string, bin, input []byte) outcome {
	t.Helper()
	ctx := context.Background()
	var o outcome
	rt, err := host.NewRuntime(host.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := sim.New()
	defer p.Close()
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU)
	if err != nil {
		t.Fatal(err)
	}
	m, err := eng.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithName(name).WithWASI(GrantGoRuntime))
	if err != nil {
		o.load = errdefs.ClassOf(err)
		return o
	}
	cfg := NewSessionConfig(name, gpu).WithStreams("s0").
		WithPrograms("noop", "fill", "matmul", "bias", "relu", "argmax").
		WithDeadline(10 * time.Second).WithFenceTimeout(10 * time.Second)
	s, err := eng.NewSession(ctx, rt, m, cfg)
	if err != nil {
		o.load = errdefs.ClassOf(err)
		return o
	}
	defer s.Close(ctx)
	for range 3 {
		out, err := s.Run(ctx, input, nil)
		c := callOutcome{out: out, class: errdefs.ClassOf(err), quarantined: s.Quarantined() != nil}
		var ce *ClientError
		if errors.As(err, &ce) {
			c.clientCode = ce.Code
		}
		o.calls = append(o.calls, c)
	}
	return o
}

// TestInstrumentedAndPlainModulesBehaveAlike runs every example, corpus,
// ABI and benchmark module of the repository that finishes by itself on
// the host as it runs them (instrumented, from snapshots) and on an
// engine that neither instruments nor snapshots (as raw wazero would run
// them), and requires the same
// outcome: load and creation errors, every call's output, error class and
// client code, and quarantine. Modules that only end by interruption are
// left out (without instrumentation they would never return), and so is
// lying_fence, whose outcome depends on the device's timing.
func TestInstrumentedAndPlainModulesBehaveAlike(t *testing.T) {
	ctx := context.Background()
	plainCfg := NewEngineConfig().WithCacheDir("").WithSnapshots(false)
	plainCfg.uninterruptible = true
	plain, err := NewEngine(ctx, plainCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)
	instrumented := engineForTest(t)

	var files []string
	for _, pattern := range []string{
		"testdata/hostile/*.wasm", "testdata/abi/*.wasm", "testdata/bench/*.wasm", "testdata/fuzz/*.wasm",
		"testdata/snapshot/*.wasm", "../examples/wasm/*/*.wasm", "../examples/wasm/*/*/*.wasm",
	} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 40 {
		t.Fatalf("found only %d modules", len(files))
	}
	mlpInput := model.EncodeInput(model.TestInputs(1)[0])
	ran := 0
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".wasm")
		if strings.HasPrefix(name, "loop_") {
			continue // ends only by interruption
		}
		if name == "lying_fence" {
			// Its outcome depends on whether the device finished the work
			// before the idle check, not on the module's code;
			// TestFencesThatCannotBeProvenQuarantine holds the work to
			// make it certain.
			continue
		}
		t.Run(name, func(t *testing.T) {
			bin, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var input []byte
			if name == "mlp" {
				input = mlpInput
			}
			want := runModule(t, plain, name, bin, input)
			got := runModule(t, instrumented, name, bin, input)
			if name == "named_alloc" { // outputs a handle, which carries its session's tag (ABI.md §2)
				for _, o := range []outcome{want, got} {
					for _, c := range o.calls {
						if len(c.out) == 8 {
							clear(c.out[4:7])
						}
					}
				}
			}
			if name == "snap_clock" { // outputs the host's clocks and entropy, which differ from read to read
				for _, o := range []outcome{want, got} {
					for _, c := range o.calls {
						clear(c.out)
					}
				}
			}
			if got.load != want.load {
				t.Fatalf("load or creation: instrumented %v, plain %v", got.load, want.load)
			}
			for i := range want.calls {
				g, w := got.calls[i], want.calls[i]
				if !bytes.Equal(g.out, w.out) || g.class != w.class || g.clientCode != w.clientCode || g.quarantined != w.quarantined {
					t.Errorf("call %d: instrumented %+v, plain %+v", i, g, w)
				}
			}
		})
		ran++
	}
	t.Logf("%d modules compared", ran)
}
