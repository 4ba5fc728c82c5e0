package wasmbin

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tetratelabs/wazero"
)

// maxFuzzSeed leaves the large Go guests out of the seeds: each run would
// compile megabytes, and the small modules exercise the same code.
const maxFuzzSeed = 64 << 10

// FuzzInstrument checks that whatever the decoder and the engine accept
// is still accepted by both once instrumented, and once derived for a
// snapshot (table compacted, globals and start exported, start and data
// stripped).
func FuzzInstrument(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/instrument/*.wasm")
	seeds = append(seeds, repoModules(f)...)
	for _, path := range seeds {
		if bin, err := os.ReadFile(path); err == nil && len(bin) <= maxFuzzSeed {
			f.Add(bin)
		}
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	f.Cleanup(func() { rt.Close(ctx) })
	f.Fuzz(func(t *testing.T, bin []byte) {
		m, err := Parse(bin)
		if err != nil {
			return // never hand the engine what Parse refused
		}
		if m.ValidateCode() != nil {
			return
		}
		c, err := rt.CompileModule(ctx, bin)
		if err != nil {
			return
		}
		c.Close(ctx)
		for _, im := range m.Imports {
			if im.Module == testOpts.Module {
				return
			}
		}
		out, _, err := Instrument(m, InterruptOptions{Module: testOpts.Module, Name: testOpts.Name, Fuel: 100})
		if err != nil {
			t.Fatalf("instrument: %v", err)
		}
		m2, err := Parse(out)
		if err != nil {
			t.Fatalf("parse instrumented: %v", err)
		}
		if err := m2.ValidateCode(); err != nil {
			t.Fatalf("validate instrumented: %v", err)
		}
		c, err = rt.CompileModule(ctx, out)
		if err != nil {
			t.Fatalf("compile instrumented: %v", err)
		}
		c.Close(ctx)
		// What a snapshot derives from the instrumented module must be
		// accepted too: the compacted table and the frozen module.
		if m2.SnapshotBlocker() != "" {
			return
		}
		if compacted, _, err := m2.CompactTable(); err != nil {
			t.Fatalf("compact table: %v", err)
		} else if compacted != nil {
			if m2, err = Parse(compacted); err != nil {
				t.Fatalf("parse compacted: %v", err)
			}
			if err := m2.ValidateCode(); err != nil {
				t.Fatalf("validate compacted: %v", err)
			}
		}
		if _, err := m2.ActiveData(); err != nil {
			return
		}
		frozen, _, err := m2.Freeze(FreezeOptions{ExportPrefix: "g.", StartExport: "start.", Strip: true})
		if err != nil {
			return // an export name is taken
		}
		if c, err = rt.CompileModule(ctx, frozen); err != nil {
			t.Fatalf("compile frozen: %v", err)
		}
		c.Close(ctx)
	})
}
