// Package extism_test compares stagehost's host path with a raw wazero
// call and with Extism's Go SDK, side by side in one run, on the same
// empty export. It lives in its own module so that the main module does
// not depend on Extism.
package extism_test

import (
	"context"
	"os"
	"testing"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/stages"
)

const emptyModule = "../../stages/testdata/bench/empty.wasm"

func load(b *testing.B) []byte {
	bin, err := os.ReadFile(emptyModule)
	if err != nil {
		b.Fatal(err)
	}
	return bin
}

// BenchmarkEmptyStage/stagehost: the full host path (admission, compute
// lease, deadline, built-in fence over one stream, idle check, trace).
// BenchmarkEmptyStage/raw: wazero CallWithStack on a cached api.Function.
// BenchmarkEmptyStage/extism: Extism's Plugin.Call of the same export.
func BenchmarkEmptyStage(b *testing.B) {
	ctx := context.Background()
	bin := load(b)

	b.Run("stagehost", func(b *testing.B) {
		eng, err := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
		if err != nil {
			b.Fatal(err)
		}
		defer eng.Close(ctx)
		rt, _ := host.NewRuntime(host.NewConfig())
		p := sim.New()
		defer p.Close()
		gpu, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
		m, err := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("empty"))
		if err != nil {
			b.Fatal(err)
		}
		s, err := eng.NewSession(ctx, rt, m, stages.NewSessionConfig("bench", gpu).WithStreams("s0"))
		if err != nil {
			b.Fatal(err)
		}
		var out []byte
		b.ReportAllocs()
		for b.Loop() {
			if out, err = s.Run(ctx, nil, out[:0]); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("raw", func(b *testing.B) {
		r := wazero.NewRuntime(ctx)
		defer r.Close(ctx)
		mod, err := r.Instantiate(ctx, bin)
		if err != nil {
			b.Fatal(err)
		}
		fn := mod.ExportedFunction("stagehost_run")
		stack := make([]uint64, 1)
		b.ReportAllocs()
		for b.Loop() {
			if err := fn.CallWithStack(ctx, stack); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("extism", func(b *testing.B) {
		manifest := extism.Manifest{Wasm: []extism.Wasm{extism.WasmData{Data: bin}}}
		plugin, err := extism.NewPlugin(ctx, manifest, extism.PluginConfig{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer plugin.Close(ctx)
		b.ReportAllocs()
		for b.Loop() {
			if rc, _, err := plugin.Call("stagehost_run", nil); err != nil || rc != 0 {
				b.Fatal(rc, err)
			}
		}
	})
}
