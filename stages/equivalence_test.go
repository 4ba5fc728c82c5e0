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
	"github.com/stagehost/stagehost/internal/testutil"
)

// outcome is what a module did in a session: the load or creation error
// class and text, and per call the output, the error class and text and
// whether the session was then quarantined.
type outcome struct {
	load    error
	loadMsg string
	calls   []callOutcome
}

type callOutcome struct {
	out         []byte
	class       error
	msg         string
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
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	m, err := eng.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithName(name).WithWASI(GrantGoRuntime))
	if err != nil {
		o.load = errdefs.ClassOf(err)
		return o
	}
	// Every module compared ends by itself: the deadline only has to be
	// longer than the slowest of them (deep_recursion, memory_bomb) takes
	// on a busy machine, under the race detector too, where they took
	// 13 to 48 s on 2 loaded vCPUs.
	deadline := 10 * time.Second
	if testutil.Race {
		deadline = 2 * time.Minute
	}
	cfg := NewSessionConfig(name, gpu).WithStreams("s0").
		WithPrograms("noop", "fill", "matmul", "bias", "relu", "argmax").
		WithDeadline(deadline).WithFenceTimeout(deadline)
	s, err := eng.NewSession(ctx, rt, m, cfg)
	if err != nil {
		o.load, o.loadMsg = errdefs.ClassOf(err), err.Error()
		return o
	}
	defer s.Close(ctx)
	for range 3 {
		out, err := s.Run(ctx, input, nil)
		c := callOutcome{out: out, class: errdefs.ClassOf(err), quarantined: s.Quarantined() != nil}
		if err != nil {
			c.msg = err.Error()
		}
		var ce *ClientError
		if errors.As(err, &ce) {
			c.clientCode = ce.Code
		}
		o.calls = append(o.calls, c)
	}
	return o
}

// corpus lists every example, corpus, ABI and benchmark module of the
// repository (at least 40, or the test fails) in two parts: the Go guests
// (a go.mod beside the module: examples/wasm's minimal, mlp and fence,
// about 2 MB each) and the rest.
func corpus(t *testing.T, patterns ...string) (goGuests, others []string) {
	t.Helper()
	var files []string
	for _, pattern := range patterns {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 40 {
		t.Fatalf("found only %d modules", len(files))
	}
	for _, path := range files {
		if _, err := os.Stat(filepath.Join(filepath.Dir(path), "go.mod")); err == nil {
			goGuests = append(goGuests, path)
		} else {
			others = append(others, path)
		}
	}
	if len(goGuests) < 3 {
		t.Fatalf("found only %d Go guests: %v", len(goGuests), goGuests)
	}
	return goGuests, others
}

var equivalenceCorpus = []string{
	"testdata/hostile/*.wasm", "testdata/abi/*.wasm", "testdata/bench/*.wasm", "testdata/fuzz/*.wasm",
	"testdata/snapshot/*.wasm", "../examples/wasm/*/*.wasm", "../examples/wasm/*/*/*.wasm",
}

// TestInstrumentedAndPlainModulesBehaveAlike runs every example, corpus,
// ABI and benchmark module of the repository that finishes by itself, but
// the Go guests (TestInstrumentedAndPlainGoGuestsBehaveAlike), on the host
// as it runs them (instrumented, from snapshots) and on an
// engine that neither instruments nor snapshots (as raw wazero would run
// them), and requires the same outcome: load and creation errors (class
// and text), every call's output, error class and text (trap messages
// and stack traces included) and client code, and quarantine. Modules
// that only end by interruption are left out (without instrumentation
// they would never return), and so is lying_fence, whose outcome
// depends on the device's timing.
func TestInstrumentedAndPlainModulesBehaveAlike(t *testing.T) {
	_, others := corpus(t, equivalenceCorpus...)
	compareInstrumentedAndPlain(t, others)
}

// TestInstrumentedAndPlainGoGuestsBehaveAlike is
// TestInstrumentedAndPlainModulesBehaveAlike for the Go guests.
func TestInstrumentedAndPlainGoGuestsBehaveAlike(t *testing.T) {
	testutil.GoGuests(t)
	goGuests, _ := corpus(t, equivalenceCorpus...)
	compareInstrumentedAndPlain(t, goGuests)
}

func compareInstrumentedAndPlain(t *testing.T, files []string) {
	ctx := context.Background()
	plainCfg := NewEngineConfig().WithCacheDir("").WithSnapshots(false)
	plainCfg.uninterruptible = true
	plain, err := NewEngine(ctx, plainCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)
	instrumented := engineForTest(t)

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
			if got.load != want.load || got.loadMsg != want.loadMsg {
				t.Fatalf("load or creation: instrumented %v %q, plain %v %q", got.load, got.loadMsg, want.load, want.loadMsg)
			}
			for i := range want.calls {
				g, w := got.calls[i], want.calls[i]
				if !bytes.Equal(g.out, w.out) || g.class != w.class || g.msg != w.msg || g.clientCode != w.clientCode || g.quarantined != w.quarantined {
					t.Errorf("call %d: instrumented %+v, plain %+v", i, g, w)
				}
			}
		})
		ran++
	}
	t.Logf("%d modules compared", ran)
}
