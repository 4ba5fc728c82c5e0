package stages

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// trapText loads the hostile module name on eng, makes a session and
// calls it once, and returns the text of the first error: the session's
// creation's or the call's.
func trapText(t *testing.T, eng *Engine, name string) string {
	t.Helper()
	ctx := context.Background()
	bin, err := os.ReadFile("testdata/hostile/" + name + ".wasm")
	if err != nil {
		t.Fatal(err)
	}
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
	m, err := eng.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithName(name))
	if err != nil {
		t.Fatal(err)
	}
	s, err := eng.NewSession(ctx, rt, m, NewSessionConfig(name, gpu).WithDeadline(10*time.Second).WithInitTimeout(10*time.Second))
	if err != nil {
		return err.Error()
	}
	defer s.Close(ctx)
	if _, err := s.Run(ctx, nil, nil); err != nil {
		return err.Error()
	}
	t.Fatalf("%s: no error", name)
	return ""
}

// TestTrapsNameTheGuestsOwnFunctions loads modules without a name section
// whose start function or stage traps in nested calls, on the host
// (instrumented) and on an engine that neither instruments nor snapshots
// (as raw wazero runs them), and requires the same error text: the
// failed start function and the stack trace name the functions by the
// guest's own indices, not by the instrumented module's (one higher).
func TestTrapsNameTheGuestsOwnFunctions(t *testing.T) {
	ctx := context.Background()
	plainCfg := NewEngineConfig().WithCacheDir("").WithSnapshots(false)
	plainCfg.uninterruptible = true
	plain, err := NewEngine(ctx, plainCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"trap_start", []string{"start function[0] failed: wasm error: unreachable", "\t.$1()\n\t.$0()"}},
		{"trap_nested", []string{"wasm error: unreachable", "\t.$3()\n\t.$2()\n\t.$1() i32"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := trapText(t, plain, tc.name)
			got := trapText(t, engineForTest(t), tc.name)
			if got != want {
				t.Errorf("instrumented:\n%s\nplain:\n%s", got, want)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q does not contain %q", got, w)
				}
			}
		})
	}
}
