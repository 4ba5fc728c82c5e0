package wasmbin

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/tetratelabs/wazero"
)

// builder assembles small binaries for tests.
type builder struct{ out []byte }

func newBuilder() *builder { return &builder{out: []byte("\x00asm\x01\x00\x00\x00")} }

func (b *builder) section(id byte, payload []byte) *builder {
	b.out = append(b.out, id)
	b.out = appendU32(b.out, uint32(len(payload)))
	b.out = append(b.out, payload...)
	return b
}

func vec(items ...[]byte) []byte {
	p := appendU32(nil, uint32(len(items)))
	for _, it := range items {
		p = append(p, it...)
	}
	return p
}

func name(s string) []byte { return append(appendU32(nil, uint32(len(s))), s...) }

func functype(params, results []byte) []byte {
	p := []byte{0x60}
	p = append(appendU32(p, uint32(len(params))), params...)
	return append(appendU32(p, uint32(len(results))), results...)
}

func activeSeg(off int32, data []byte) []byte {
	p := []byte{0x00, 0x41}
	p = appendS32(p, off)
	p = append(p, 0x0b)
	return append(appendU32(p, uint32(len(data))), data...)
}

// module has one import, one exported function of type () -> i32, one
// memory, and the given data segments.
func module(mem []byte, segs ...[]byte) []byte {
	b := newBuilder()
	b.section(secType, vec(functype([]byte{0x7f, 0x7f}, []byte{0x7f}), functype(nil, []byte{0x7f})))
	b.section(secImport, vec(append(append(name("env"), name("f")...), 0x00, 0x00)))
	b.section(3, vec([]byte{0x01}))
	b.section(secMemory, vec(mem))
	b.section(secExport, vec(append(name("run"), 0x00, 0x01), append(name("memory"), 0x02, 0x00)))
	b.section(10, vec([]byte{0x04, 0x00, 0x41, 0x07, 0x0b})) // run: i32.const 7
	if len(segs) > 0 {
		b.section(secData, vec(segs...))
	}
	b.section(secCustom, append(name("note"), "kept"...))
	return b.out
}

func TestParseReadsImportsExportsAndMemories(t *testing.T) {
	m, err := Parse(module([]byte{0x01, 0x02, 0x05}))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Imports) != 1 || m.Imports[0].Module != "env" || m.Imports[0].Name != "f" ||
		!bytes.Equal(m.Imports[0].Type.Params, []byte{0x7f, 0x7f}) || !bytes.Equal(m.Imports[0].Type.Results, []byte{0x7f}) {
		t.Fatalf("imports %+v", m.Imports)
	}
	run, ok := m.Export("run")
	if !ok || run.Kind != KindFunc || run.Index != 1 || len(run.Type.Params) != 0 || !bytes.Equal(run.Type.Results, []byte{0x7f}) {
		t.Fatalf("export run %+v", run)
	}
	if mem, ok := m.Export("memory"); !ok || mem.Kind != KindMemory {
		t.Fatal("memory export")
	}
	if len(m.Memories) != 1 || m.Memories[0] != (Limits{Min: 2, Max: 5, HasMax: true}) {
		t.Fatalf("memories %+v", m.Memories)
	}
}

func TestParseRejectsMalformedBinaries(t *testing.T) {
	good := module([]byte{0x00, 0x01})
	for name, bin := range map[string][]byte{
		"empty":     nil,
		"magic":     []byte("\x00asx\x01\x00\x00\x00"),
		"version":   []byte("\x00asm\x02\x00\x00\x00"),
		"truncated": good[:len(good)-3],
		"overrun":   append(append([]byte(nil), good[:8]...), 0x01, 0xff, 0x01),
	} {
		if _, err := Parse(bin); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func instantiateMemory(t *testing.T, bin []byte) []byte {
	t.Helper()
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	if _, err := r.NewHostModuleBuilder("env").NewFunctionBuilder().
		WithFunc(func(int32, int32) int32 { return 0 }).Export("f").Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	mod, err := r.Instantiate(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := mod.Memory().Read(0, mod.Memory().Size())
	return append([]byte(nil), b...)
}

func TestMergedSegmentsInitialiseTheSameMemory(t *testing.T) {
	// Out of order, with small and large gaps, as Go's linker emits them.
	bin := module([]byte{0x00, 0x01},
		activeSeg(3000, []byte("late")),
		activeSeg(10, []byte("abc")),
		activeSeg(15, []byte("de")),
		activeSeg(40000, []byte("far")),
		activeSeg(13, []byte("x")),
	)
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	out, st, err := m.Rewrite(RewriteOptions{MergeGap: 64})
	if err != nil {
		t.Fatal(err)
	}
	if st.SegmentsBefore != 5 || st.SegmentsAfter != 3 {
		t.Fatalf("stats %+v", st)
	}
	if !bytes.Equal(instantiateMemory(t, bin), instantiateMemory(t, out)) {
		t.Fatal("merged module initialises different memory")
	}
	if !bytes.Contains(out, []byte("kept")) {
		t.Fatal("custom section lost")
	}
}

func TestOverlappingOrPassiveSegmentsAreLeftAlone(t *testing.T) {
	passive := append([]byte{0x01}, append(appendU32(nil, 2), "zz"...)...)
	for name, segs := range map[string][][]byte{
		"overlap": {activeSeg(10, []byte("abcd")), activeSeg(12, []byte("XY"))},
		"passive": {activeSeg(10, []byte("ab")), passive},
	} {
		m, err := Parse(module([]byte{0x00, 0x01}, segs...))
		if err != nil {
			t.Fatal(err)
		}
		_, st, err := m.Rewrite(RewriteOptions{MergeGap: 64})
		if err != nil || st.SegmentsAfter != st.SegmentsBefore {
			t.Errorf("%s: %+v %v", name, st, err)
		}
	}
}

func TestRewriteCapsTheMemoryMaximum(t *testing.T) {
	for _, tc := range []struct {
		mem     []byte
		wantMax uint32
	}{
		{[]byte{0x00, 0x01}, 4},             // no maximum: capped
		{[]byte{0x01, 0x01, 0x80, 0x04}, 4}, // 512 pages: capped
		{[]byte{0x01, 0x01, 0x02}, 2},       // below the cap: kept
	} {
		m, err := Parse(module(tc.mem))
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := m.Rewrite(RewriteOptions{MaxPages: 4})
		if err != nil {
			t.Fatal(err)
		}
		m2, err := Parse(out)
		if err != nil {
			t.Fatal(err)
		}
		if l := m2.Memories[0]; !l.HasMax || l.Max != tc.wantMax || l.Min != 1 {
			t.Errorf("%x: limits %+v", tc.mem, l)
		}
	}
	m, _ := Parse(module([]byte{0x00, 0x09}))
	if _, _, err := m.Rewrite(RewriteOptions{MaxPages: 4}); !errors.Is(err, ErrMemoryLimit) {
		t.Fatalf("min above the cap: %v", err)
	}
}
