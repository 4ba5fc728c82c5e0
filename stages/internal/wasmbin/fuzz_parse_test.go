package wasmbin

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// FuzzParse checks that Parse never panics, that what it accepts
// Rewrite turns into a binary it accepts again (or refuses with
// ErrMemoryLimit or ErrMalformed), and that where the engine accepts the
// same bytes, both read the same imports, exports and memory limits.
func FuzzParse(f *testing.F) {
	for _, file := range repoWasmFiles(f) {
		bin, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(bin)
	}
	f.Add(pfull())
	f.Add(hugeImportCount())
	f.Add(hugeDataCount())
	f.Add(sparseSegments(64, 4096))
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	f.Cleanup(func() { _ = rt.Close(ctx) })
	f.Fuzz(func(t *testing.T, bin []byte) {
		m, err := Parse(bin)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error without ErrMalformed: %v", err)
			}
			return
		}
		out, _, err := m.Rewrite(RewriteOptions{MaxPages: 1024, MergeGap: 4096})
		switch {
		case errors.Is(err, ErrMemoryLimit), errors.Is(err, ErrMalformed):
		case err != nil:
			t.Fatalf("rewrite: %v", err)
		default:
			if _, err := Parse(out); err != nil {
				t.Fatalf("the rewritten binary does not parse: %v", err)
			}
		}
		cm, err := rt.CompileModule(ctx, bin)
		if err != nil {
			return
		}
		defer cm.Close(ctx)
		agree(t, m, cm)
	})
}

// agree checks that Parse and the engine read the same imports, exports
// and memory limits.
func agree(t *testing.T, m *Module, cm wazero.CompiledModule) {
	t.Helper()
	type ext struct {
		module, name string
		kind         byte
	}
	var ours, theirs []ext
	for _, im := range m.Imports {
		ours = append(ours, ext{im.Module, im.Name, im.Kind})
	}
	for _, fn := range cm.ImportedFunctions() {
		mod, name, _ := fn.Import()
		theirs = append(theirs, ext{mod, name, KindFunc})
	}
	for _, mem := range cm.ImportedMemories() {
		mod, name, _ := mem.Import()
		theirs = append(theirs, ext{mod, name, KindMemory})
	}
	if len(ours) != len(theirs) {
		// Tables and globals are not listed by the engine.
		n := 0
		for _, e := range ours {
			if e.kind == KindFunc || e.kind == KindMemory {
				n++
			}
		}
		if n != len(theirs) {
			t.Fatalf("imports: ours %v, the engine's %v", ours, theirs)
		}
	}
	for _, e := range theirs {
		if !slices.Contains(ours, e) {
			t.Fatalf("the engine imports %v, Parse does not", e)
		}
	}
	exports := map[string]byte{}
	for name, fn := range cm.ExportedFunctions() {
		_ = fn
		exports[name] = KindFunc
	}
	for name := range cm.ExportedMemories() {
		exports[name] = KindMemory
	}
	seen := 0
	for _, e := range m.Exports {
		if e.Kind != KindFunc && e.Kind != KindMemory {
			continue
		}
		seen++
		if k, ok := exports[e.Name]; !ok || k != e.Kind {
			t.Fatalf("export %q: ours %s, the engine's %v (%v)", e.Name, KindName(e.Kind), k, ok)
		}
		if e.Kind == KindFunc {
			fn := cm.ExportedFunctions()[e.Name]
			if !slices.Equal(e.Type.Params, valueBytes(fn.ParamTypes())) || !slices.Equal(e.Type.Results, valueBytes(fn.ResultTypes())) {
				t.Fatalf("export %q: type %v, the engine's %v -> %v", e.Name, e.Type, fn.ParamTypes(), fn.ResultTypes())
			}
		}
	}
	if seen != len(exports) {
		t.Fatalf("%d function and memory exports, the engine has %d", seen, len(exports))
	}
	var defined []api.MemoryDefinition
	for _, mem := range cm.ExportedMemories() {
		if _, _, imported := mem.Import(); !imported {
			defined = append(defined, mem)
		}
	}
	for _, mem := range defined {
		if len(m.Memories) != 1 {
			t.Fatalf("the engine exports a defined memory, Parse read %d", len(m.Memories))
		}
		l := m.Memories[0]
		max, hasMax := mem.Max()
		if mem.Min() != l.Min || hasMax != l.HasMax || (hasMax && max != l.Max) {
			t.Fatalf("memory limits: ours %+v, the engine's %d %d %v", l, mem.Min(), max, hasMax)
		}
	}
}

func valueBytes(ts []api.ValueType) []byte {
	if len(ts) == 0 {
		return nil
	}
	return append([]byte(nil), ts...)
}
