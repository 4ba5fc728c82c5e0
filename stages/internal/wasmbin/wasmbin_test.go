package wasmbin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
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

// module has one import, one exported function of type () -> pi32, one
// memory, and the given data segments.
func module(mem []byte, segs ...[]byte) []byte {
	b := newBuilder()
	b.section(secType, vec(functype([]byte{0x7f, 0x7f}, []byte{0x7f}), functype(nil, []byte{0x7f})))
	b.section(secImport, vec(append(append(name("env"), name("f")...), 0x00, 0x00)))
	b.section(3, vec([]byte{0x01}))
	b.section(secMemory, vec(mem))
	b.section(secExport, vec(append(name("run"), 0x00, 0x01), append(name("memory"), 0x02, 0x00)))
	b.section(10, vec([]byte{0x04, 0x00, 0x41, 0x07, 0x0b})) // run: pi32.const 7
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
		activeSeg(20, []byte("yz")),
	)
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	out, st, err := m.Rewrite(RewriteOptions{MergeGap: 64})
	if err != nil {
		t.Fatal(err)
	}
	if st.SegmentsBefore != 6 || st.SegmentsAfter != 3 {
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

// psec is one section of a test module.
type psec struct {
	id      byte
	payload []byte
}

// build assembles a binary from sections, in the order given.
func pbuild(secs ...psec) []byte {
	b := newBuilder()
	for _, s := range secs {
		b.section(s.id, s.payload)
	}
	return b.out
}

func pcat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func pu32(v uint32) []byte { return appendU32(nil, v) }

// body is a function body with the given local declarations and
// instructions.
func pbody(locals []byte, code ...byte) []byte {
	p := pcat(locals, code)
	return pcat(pu32(uint32(len(p))), p)
}

var (
	pi32 = []byte{0x7f}
	// phuge is 0xFFFFFFFF as LEB128.
	phuge = []byte{0xff, 0xff, 0xff, 0xff, 0x0f}
	// types: 0 () -> (), 1 (pi32) -> pi32.
	ptypeSec = psec{secType, vec(functype(nil, nil), functype(pi32, pi32))}
	// an imported function of type 1 and an imported immutable pi32
	// global.
	pimportSec = psec{secImport, vec(
		pcat(name("env"), name("f"), []byte{KindFunc, 0x01}),
		pcat(name("env"), name("g"), []byte{KindGlobal, 0x7f, 0x00}),
	)}
	pfuncSec  = psec{secFunction, vec([]byte{0x00})}
	ptableSec = psec{secTable, vec([]byte{0x70, 0x00, 0x02})}
	pmemSec   = psec{secMemory, vec([]byte{0x01, 0x01, 0x02})}
	pcodeSec  = psec{secCode, vec(pbody(vec(), 0x0b))}
)

// full is a module with every kind of section.
func pfull() []byte {
	return pbuild(
		ptypeSec, pimportSec, pfuncSec, ptableSec, pmemSec,
		psec{secGlobal, vec([]byte{0x7f, 0x01, 0x23, 0x00, 0x0b})},
		psec{secExport, vec(pcat(name("run"), []byte{KindFunc, 0x01}), pcat(name("memory"), []byte{KindMemory, 0x00}))},
		psec{secStart, pu32(1)},
		psec{secElement, vec([]byte{0x00, 0x41, 0x00, 0x0b, 0x02, 0x00, 0x01})},
		psec{secDataCount, pu32(2)},
		psec{secCode, vec(pbody(vec([]byte{0x02, 0x7e}, []byte{0x01, 0x7f}), 0x01, 0x0b))},
		psec{secData, vec(activeSeg(4, []byte("hi")), pcat([]byte{0x01}, name("passive")))},
		psec{secCustom, pcat(name("name"), []byte{0x00}, pu32(3), name("hi"))},
	)
}

func TestParseRecordsTheModuleStructure(t *testing.T) {
	bin := pfull()
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	if &m.Bytes()[0] != &bin[0] {
		t.Error("Bytes is not the parsed binary")
	}
	if m.NumFuncs() != 2 {
		t.Errorf("NumFuncs %d", m.NumFuncs())
	}
	for i, want := range []struct {
		ti uint32
		ok bool
	}{{1, true}, {0, true}, {0, false}} {
		if ti, ok := m.FuncTypeIndex(uint32(i)); ti != want.ti || ok != want.ok {
			t.Errorf("FuncTypeIndex(%d) = %d, %v", i, ti, ok)
		}
	}
	if len(m.Code) != 1 {
		t.Fatalf("code %+v", m.Code)
	}
	c := m.Code[0]
	if c.TypeIndex != 0 || c.NumLocals != 3 || bin[c.LocalsStart] != 0x02 || c.End-c.Start != 2 || bin[c.Start] != 0x01 || bin[c.End-1] != 0x0b {
		t.Errorf("body %+v", c)
	}
	if !slices.Equal(m.Globals, []GlobalType{{Type: 0x7f}, {Type: 0x7f, Mutable: true}}) {
		t.Errorf("globals %+v", m.Globals)
	}
	if !slices.Equal(m.Tables, []TableType{{Elem: 0x70, Limits: Limits{Min: 2}}}) {
		t.Errorf("tables %+v", m.Tables)
	}
	if m.NumMemories != 1 || len(m.Memories) != 1 || !m.HasStart || m.StartFunc != 1 || m.NumElems != 1 || m.NumData != 2 || !m.HasDataCount {
		t.Errorf("module %+v", m)
	}
	if run, ok := m.Export("run"); !ok || len(run.Type.Params) != 0 || len(run.Type.Results) != 0 {
		t.Errorf("run %+v", run)
	}
}

func TestParseAcceptsEveryElementAndDataForm(t *testing.T) {
	ref := func(op byte, imm ...byte) []byte { return pcat([]byte{op}, imm, []byte{0x0b}) }
	off := ref(0x41, 0x00)
	for form, seg := range map[string][]byte{
		"0 active funcs":        pcat([]byte{0x00}, off, vec([]byte{0x00})),
		"1 passive funcs":       pcat([]byte{0x01, 0x00}, vec([]byte{0x01})),
		"2 table funcs":         pcat([]byte{0x02, 0x00}, off, []byte{0x00}, vec([]byte{0x00})),
		"3 declarative funcs":   pcat([]byte{0x03, 0x00}, vec([]byte{0x00})),
		"4 active exprs":        pcat([]byte{0x04}, off, vec(ref(0xd2, 0x01), ref(0xd0, 0x70))),
		"5 passive externrefs":  pcat([]byte{0x05, 0x6f}, vec(ref(0xd0, 0x6f))),
		"6 table exprs":         pcat([]byte{0x06, 0x01}, off, []byte{0x6f}, vec(ref(0xd0, 0x6f))),
		"7 declarative exprs":   pcat([]byte{0x07, 0x70}, vec(ref(0xd2, 0x00))),
		"offset global.get":     pcat([]byte{0x00}, ref(0x23, 0x00), vec()),
		"data forms":            nil,
		"constant globals":      nil,
		"shared memory records": nil,
	} {
		secs := []psec{ptypeSec, pimportSec, pfuncSec,
			{secTable, vec([]byte{0x70, 0x00, 0x01}, []byte{0x6f, 0x00, 0x01})},
			pmemSec}
		switch form {
		case "data forms":
			secs = append(secs, psec{secDataCount, pu32(3)}, pcodeSec, psec{secData, vec(
				activeSeg(0, []byte("a")),
				pcat([]byte{0x01}, name("b")),
				pcat([]byte{0x02, 0x00}, off, name("c")),
			)})
		case "constant globals":
			secs = append(secs, psec{secGlobal, vec(
				pcat([]byte{0x7e, 0x00}, ref(0x42, 0x80, 0x7f)),
				pcat([]byte{0x7d, 0x00}, ref(0x43, 0, 0, 0, 0)),
				pcat([]byte{0x7c, 0x01}, ref(0x44, 0, 0, 0, 0, 0, 0, 0, 0)),
				pcat([]byte{0x7b, 0x00}, ref(0xfd, append([]byte{12}, make([]byte, 16)...)...)),
				pcat([]byte{0x70, 0x00}, ref(0xd2, 0x01)),
				pcat([]byte{0x6f, 0x01}, ref(0xd0, 0x6f)),
			)}, pcodeSec)
		case "shared memory records":
			secs[4] = psec{secMemory, vec([]byte{0x03, 0x01, 0x02})}
			secs = append(secs, pcodeSec)
		default:
			secs = append(secs, psec{secElement, vec(seg)}, pcodeSec)
		}
		m, err := Parse(pbuild(secs...))
		if err != nil {
			t.Errorf("%s: %v", form, err)
			continue
		}
		if form == "shared memory records" && !m.Memories[0].Shared {
			t.Errorf("%s: %+v", form, m.Memories)
		}
	}
}

func TestParseRefusesMalformedSections(t *testing.T) {
	expr := func(op byte, imm ...byte) []byte { return pcat([]byte{op}, imm, []byte{0x0b}) }
	mem, code := pmemSec, pcodeSec
	withFunc := func(secs ...psec) []byte {
		return pbuild(append([]psec{ptypeSec, pimportSec, pfuncSec}, secs...)...)
	}
	elems := func(seg []byte) []byte {
		return withFunc(ptableSec, psec{secElement, vec(seg)}, code)
	}
	global := func(g []byte) []byte { return withFunc(psec{secGlobal, vec(g)}, code) }
	data := func(segs ...[]byte) []byte { return withFunc(mem, code, psec{secData, vec(segs...)}) }
	for _, tc := range []struct {
		name string
		bin  []byte
		want string
	}{
		// Section framing.
		{"out of order", pbuild(mem, ptypeSec), "type section at byte 14 is out of order (after the memory section)"},
		{"data count after code", withFunc(code, psec{secDataCount, pu32(0)}), "data count section at byte 49 is out of order (after the code section)"},
		{"duplicated", pbuild(ptypeSec, ptypeSec), "duplicate type section at byte 19"},
		{"unknown id", pbuild(psec{13, nil}), "unknown section id 13 at byte 8"},
		{"trailing bytes", pbuild(psec{secType, append(vec(), 0x00)}), "type section at byte 8: 1 trailing bytes at byte 11"},
		{"section overruns", []byte("\x00asm\x01\x00\x00\x00\x01\x05\x00"), "type section at byte 8: size 5 overruns the binary (1 bytes left)"},
		{"custom name UTF-8", pbuild(psec{secCustom, pcat(name("\xff"), []byte{1})}), "custom section at byte 8: name is not valid UTF-8 at byte 10"},
		{"second name section", pbuild(psec{secCustom, name("name")}, psec{secCustom, name("name")}), "second \"name\" section"},
		{"name subsection overrun", pbuild(psec{secCustom, pcat(name("name"), []byte{0x01, 0x09, 0x00})}), "name subsection 1: size 9 overruns the section"},
		// Counts larger than the section, for every vector.
		{"type count", pbuild(psec{secType, phuge}), "type count 4294967295 larger than the 0 bytes left at byte 10"},
		{"import count", pbuild(psec{secImport, phuge}), "import count 4294967295 larger than the 0 bytes left"},
		{"function count", pbuild(psec{secFunction, phuge}), "function count 4294967295 larger than the 0 bytes left"},
		{"table count", pbuild(psec{secTable, phuge}), "table count 4294967295 larger than"},
		{"memory count", pbuild(psec{secMemory, phuge}), "memory count 4294967295 larger than"},
		{"global count", pbuild(psec{secGlobal, phuge}), "global count 4294967295 larger than"},
		{"export count", pbuild(psec{secExport, phuge}), "export count 4294967295 larger than"},
		{"element count", pbuild(psec{secElement, phuge}), "element segment count 4294967295 larger than"},
		{"code count", pbuild(psec{secCode, phuge}), "function body count 4294967295 larger than"},
		{"data count", pbuild(psec{secData, phuge}), "data segment count 4294967295 larger than"},
		{"param count", pbuild(psec{secType, vec(pcat([]byte{0x60}, phuge))}), "type 0: value type count 4294967295 larger than"},
		{"locals count", withFunc(psec{secCode, vec(pbody(phuge))}), "local declaration count 4294967295 larger than"},
		{"element index count", elems(pcat([]byte{0x00}, expr(0x41, 0), phuge)), "element count 4294967295 larger than"},
		// Types.
		{"bad form", pbuild(psec{secType, vec([]byte{0x5f, 0, 0})}), "type 0: form 0x5f, want 0x60 (func) at byte 11"},
		{"bad value type", pbuild(psec{secType, vec(functype([]byte{0x7f, 0x40}, nil))}), "type 0: bad value type 0x40 at byte 14"},
		// Imports.
		{"import UTF-8", pbuild(ptypeSec, psec{secImport, vec(pcat(name("env"), name("\xc3"), []byte{0, 0}))}), "name is not valid UTF-8"},
		{"import type index", pbuild(ptypeSec, psec{secImport, vec(pcat(name("env"), name("f"), []byte{0, 2}))}), `import 0 ("env"."f"): type index 2 out of range (2 types)`},
		{"import empty module", pbuild(ptypeSec, psec{secImport, vec(pcat(name(""), name("f"), []byte{0, 0}))}), "empty module name"},
		{"import kind", pbuild(psec{secImport, vec(pcat(name("env"), name("t"), []byte{4, 0, 0}))}), "unsupported import kind 4 (tag)"},
		{"import global mutability", pbuild(psec{secImport, vec(pcat(name("env"), name("g"), []byte{3, 0x7f, 2}))}), "global mutability 2 (want 0 or 1)"},
		{"import global type", pbuild(psec{secImport, vec(pcat(name("env"), name("g"), []byte{3, 0x40, 0}))}), "global of type 0x40"},
		{"import table type", pbuild(psec{secImport, vec(pcat(name("env"), name("t"), []byte{1, 0x7f, 0, 0}))}), "table of i32"},
		{"import memory min > max", pbuild(psec{secImport, vec(pcat(name("env"), name("m"), []byte{2, 1, 3, 2}))}), "limits minimum 3 above maximum 2"},
		{"two memories", pbuild(psec{secImport, vec(pcat(name("env"), name("m"), []byte{2, 0, 1}))}, pmemSec), "memory section at byte 20: memory 0: more than one memory at byte 23"},
		// Functions, tables, memories.
		{"function type index", pbuild(ptypeSec, psec{secFunction, vec([]byte{2})}), "function 0: type index 2 out of range (2 types)"},
		{"table min > max", pbuild(psec{secTable, vec([]byte{0x70, 1, 3, 2})}), "table 0: limits minimum 3 above maximum 2"},
		{"table too large", pbuild(psec{secTable, vec(pcat([]byte{0x70, 0}, pu32(1<<27+1)))}), "table minimum 134217729, more than 134217728"},
		{"shared table", pbuild(psec{secTable, vec([]byte{0x70, 3, 1, 1})}), "shared table"},
		{"memory min > max", pbuild(psec{secMemory, vec([]byte{1, 3, 2})}), "memory 0: limits minimum 3 above maximum 2 at byte 11"},
		{"memory pages", pbuild(psec{secMemory, vec(pcat([]byte{0}, pu32(65537)))}), "memory minimum 65537 pages, more than 65536"},
		{"memory max pages", pbuild(psec{secMemory, vec(pcat([]byte{1, 0}, pu32(65537)))}), "memory maximum 65537 pages, more than 65536"},
		{"memory flags", pbuild(psec{secMemory, vec([]byte{4, 0})}), "unsupported limits flag 0x4"},
		{"shared without maximum", pbuild(psec{secMemory, vec([]byte{2, 0})}), "shared memory without a maximum"},
		// Globals and constant expressions.
		{"global type mismatch", global(pcat([]byte{0x7f, 0}, expr(0x42, 0))), "global 1: constant expression of type i64, want i32"},
		{"global.get defined", global(pcat([]byte{0x7f, 0}, expr(0x23, 1))), "global.get 1: only the 1 imported globals may be read"},
		{"two instructions", global([]byte{0x7f, 0, 0x41, 0, 0x41, 0, 0x0b}), "constant expression does not end after one instruction (0x41)"},
		{"not constant", global([]byte{0x7f, 0, 0x6a, 0x0b}), "instruction 0x6a is not constant"},
		{"ref.func range", global(pcat([]byte{0x70, 0}, expr(0xd2, 2))), "ref.func 2: function index out of range (2 functions)"},
		{"ref.null type", global(pcat([]byte{0x70, 0}, expr(0xd0, 0x7f))), "ref.null of i32"},
		{"v128 opcode", global(pcat([]byte{0x7b, 0}, expr(0xfd, 13))), "instruction 0xfd 13 is not constant"},
		{"s32 overflow", global([]byte{0x7f, 0, 0x41, 0xff, 0xff, 0xff, 0xff, 0x4f, 0x0b}), "s32 overflow"},
		{"s64 too long", global(pcat([]byte{0x7e, 0, 0x42}, bytes.Repeat([]byte{0x80}, 10), []byte{0, 0x0b})), "s64 too long"},
		// Exports.
		{"export duplicate", withFunc(psec{secExport, vec(pcat(name("a"), []byte{0, 0}), pcat(name("a"), []byte{0, 1}))}, code), `export 1 ("a"): duplicate export name`},
		{"export function index", withFunc(psec{secExport, vec(pcat(name("a"), []byte{0, 2}))}, code), `export 0 ("a"): function index 2 out of range (2)`},
		{"export memory index", withFunc(psec{secExport, vec(pcat(name("m"), []byte{2, 0}))}, code), "memory index 0 out of range (0)"},
		{"export global index", withFunc(psec{secExport, vec(pcat(name("g"), []byte{3, 1}))}, code), "global index 1 out of range (1)"},
		{"export table index", withFunc(psec{secExport, vec(pcat(name("t"), []byte{1, 0}))}, code), "table index 0 out of range (0)"},
		{"export kind", withFunc(psec{secExport, vec(pcat(name("x"), []byte{5, 0}))}, code), "unsupported export kind 5"},
		{"export UTF-8", withFunc(psec{secExport, vec(pcat(name("\xed\xa0\x80"), []byte{0, 0}))}, code), "name is not valid UTF-8"},
		// Start.
		{"start range", withFunc(psec{secStart, pu32(2)}, code), "start function 2 out of range (2 functions)"},
		{"start type", withFunc(psec{secStart, pu32(0)}, code), "start function 0 has 1 parameters and 1 results, want none"},
		// Elements.
		{"element flags", elems([]byte{0x08}), "element segment 0: flags 8 (want 0 to 7)"},
		{"element no table", withFunc(psec{secElement, vec(pcat([]byte{0}, expr(0x41, 0), vec()))}, code), "table 0 out of range (0 tables)"},
		{"element table index", elems(pcat([]byte{2, 1}, expr(0x41, 0), []byte{0}, vec())), "table 1 out of range (1 tables)"},
		{"element function index", elems(pcat([]byte{0}, expr(0x41, 0), vec([]byte{2}))), "function index 2 out of range (2 functions)"},
		{"element kind", elems([]byte{1, 1, 0}), "element kind 1 (want 0)"},
		{"element ref type", elems([]byte{5, 0x7f, 0}), "element type i32"},
		{"element type mismatch", elems(pcat([]byte{6, 0}, expr(0x41, 0), []byte{0x6f}, vec())), "externref elements for a table of funcref"},
		{"element expr type", elems(pcat([]byte{5, 0x6f}, vec(expr(0xd2, 0)))), "constant expression of type funcref, want externref"},
		{"element offset type", elems(pcat([]byte{0}, expr(0x42, 0), vec())), "constant expression of type i64, want i32"},
		// Code.
		{"code count mismatch", withFunc(psec{secCode, vec()}), "0 function bodies, the function section declares 1 functions"},
		{"code missing", withFunc(), "the function section declares 1 functions, the code section has 0 bodies"},
		{"body overrun", withFunc(psec{secCode, vec([]byte{0x09, 0x00, 0x0b})}), "function body 0 (function 1): size 9 overruns the section (2 bytes left)"},
		{"too many locals", withFunc(psec{secCode, vec(pbody(vec(pcat(pu32(50_001), pi32)), 0x0b))}), "more than 50000 locals (parameters included)"},
		{"too many locals with params", pbuild(ptypeSec, pimportSec, psec{secFunction, vec([]byte{1})}, psec{secCode, vec(pbody(vec(pcat(pu32(50_000), pi32)), 0x0b))}), "more than 50000 locals"},
		{"locals sum overflow", withFunc(psec{secCode, vec(pbody(vec(pcat(pu32(0xffffffff), pi32), pcat(pu32(0xffffffff), pi32)), 0x0b))}), "more than 50000 locals"},
		{"local type", withFunc(psec{secCode, vec(pbody(vec([]byte{1, 0x40}), 0x0b))}), "local of type 0x40"},
		{"body without end", withFunc(psec{secCode, vec(pbody(vec(), 0x01))}), "the body does not end with end (0x0b)"},
		{"empty body", withFunc(psec{secCode, vec(pbody(vec()))}), "the body does not end with end (0x0b)"},
		// Data.
		{"data count mismatch", withFunc(mem, psec{secDataCount, pu32(2)}, code, psec{secData, vec(activeSeg(0, nil))}), "1 data segments, the data count section says 2"},
		{"data count without data", withFunc(mem, psec{secDataCount, pu32(1)}, code), "the data count section says 1 data segments, the data section has 0"},
		{"data memory index", data(pcat([]byte{2, 1}, expr(0x41, 0), vec())), "data segment 0: memory index 1 (want 0)"},
		{"data flags", data([]byte{3}), "flags 3 (want 0, 1 or 2)"},
		{"data without memory", withFunc(code, psec{secData, vec(activeSeg(0, nil))}), "active data segment without a memory"},
		{"data overrun", data(pcat([]byte{1}, pu32(9), []byte("x"))), "9 bytes of data overrun the section (1 bytes left)"},
		{"data offset type", data(pcat([]byte{0}, expr(0x44, 0, 0, 0, 0, 0, 0, 0, 0), vec())), "constant expression of type f64, want i32"},
	} {
		_, err := Parse(tc.bin)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}

// allocated returns the bytes f allocates on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// hugeImportCount is 15 bytes: the header and an import section whose
// count is 0xFFFFFFFF.
func hugeImportCount() []byte { return pbuild(psec{secImport, phuge}) }

// hugeDataCount is a small module whose data section claims 0xFFFFFFFF
// segments.
func hugeDataCount() []byte {
	return pbuild(ptypeSec, pfuncSec, pmemSec, pcodeSec, psec{secData, pcat(phuge, activeSeg(0, []byte("x")))})
}

func TestHugeCountsAreRefusedBeforeAllocating(t *testing.T) {
	for name, bin := range map[string][]byte{
		"imports": hugeImportCount(),
		"data":    hugeDataCount(),
	} {
		var err error
		if n := allocated(func() { _, err = Parse(bin) }); n > 64<<10 {
			t.Errorf("%s: Parse allocated %d bytes for %d", name, n, len(bin))
		}
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "count 4294967295 larger than") {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The merge reads the same count itself.
	payload := pcat(phuge, activeSeg(0, []byte("x")))
	var err error
	if n := allocated(func() { _, _, _, err = mergeData(payload, 4096) }); n > 64<<10 || !errors.Is(err, ErrMalformed) {
		t.Errorf("mergeData allocated %d bytes: %v", n, err)
	}
}

// manyImportsExports has n imported functions, each exported.
func manyImportsExports(n int) []byte {
	imps, exps := make([][]byte, n), make([][]byte, n)
	for i := range n {
		fn := fmt.Sprintf("f%d", i)
		imps[i] = pcat(name("env"), name(fn), []byte{KindFunc, byte(i % 2)})
		exps[i] = pcat(name(fn), []byte{KindFunc}, pu32(uint32(i)))
	}
	return pbuild(ptypeSec, psec{secImport, vec(imps...)}, psec{secExport, vec(exps...)})
}

func TestParseManyImportsExports(t *testing.T) {
	const n = 120_000
	m, err := Parse(manyImportsExports(n))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Exports) != n || m.NumFuncs() != n {
		t.Fatalf("%d exports, %d functions", len(m.Exports), m.NumFuncs())
	}
	for _, i := range []int{0, 1, n - 2, n - 1} {
		e := m.Exports[i]
		if want := i % 2; len(e.Type.Params) != want || len(e.Type.Results) != want {
			t.Errorf("export %d: %+v", i, e)
		}
	}
}

func BenchmarkParseManyImportsExports(b *testing.B) {
	bin := manyImportsExports(120_000)
	b.SetBytes(int64(len(bin)))
	for b.Loop() {
		if _, err := Parse(bin); err != nil {
			b.Fatal(err)
		}
	}
}

// sparseSegments has n empty data segments step bytes apart.
func sparseSegments(n, step int) []byte {
	segs := make([][]byte, n)
	for i := range segs {
		segs[i] = activeSeg(int32(i*step), nil)
	}
	return pbuild(ptypeSec, pfuncSec, psec{secMemory, vec([]byte{0x00, 0x80, 0x08})}, pcodeSec, psec{secData, vec(segs...)})
}

func TestMergeDoesNotInflateSparseSegments(t *testing.T) {
	bin := sparseSegments(32_768, 4096)
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	out, st, err := m.Rewrite(RewriteOptions{MaxPages: 2048, MergeGap: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if st.SegmentsBefore != 32_768 || st.SegmentsAfter != st.SegmentsBefore {
		t.Errorf("stats %+v", st)
	}
	if len(out) > len(bin)+16 {
		t.Errorf("%d bytes became %d", len(bin), len(out))
	}
	if _, err := Parse(out); err != nil {
		t.Fatal(err)
	}
	// Within the bound, the same segments are merged: 16 segments 4 KiB
	// apart grow the section by 60 KiB.
	m, _ = Parse(sparseSegments(16, 4096))
	if _, st, _ := m.Rewrite(RewriteOptions{MergeGap: 4096}); st.SegmentsAfter != 1 {
		t.Errorf("small merge: %+v", st)
	}
}

// repoRoot is the directory above the test holding go.work or .git.
func repoRoot(t testing.TB) string {
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		for _, marker := range []string{".git", "go.work"} {
			if _, err := os.Stat(filepath.Join(dir, marker)); err == nil {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("no repository root above the package")
		}
		dir = parent
	}
}

// repoWasmFiles lists the .wasm files of the repository, outside hidden
// directories.
func repoWasmFiles(t testing.TB) []string {
	var files []string
	err := filepath.WalkDir(repoRoot(t), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "." {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".wasm") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestParseAcceptsTheRepositoryModules(t *testing.T) {
	files := repoWasmFiles(t)
	if len(files) == 0 {
		t.Fatal("no .wasm files found")
	}
	for _, f := range files {
		bin, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Parse(bin)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if _, _, err := m.Rewrite(RewriteOptions{MergeGap: 4096}); err != nil {
			t.Errorf("%s: rewrite: %v", f, err)
		}
	}
}

// TestMergeLeavesIndexedSegmentsAlone: a module with a data count section
// may name its data segments by index (memory.init, data.drop), so its
// segments are never merged (merging renumbers them).
func TestMergeLeavesIndexedSegmentsAlone(t *testing.T) {
	// (module (memory 1) (data (i32.const 0) "a") (data (i32.const 1) "b")
	//   (func data.drop 1)), with a data count section of 2.
	bin := []byte("\x00asm\x01\x00\x00\x00" +
		"\x01\x04\x01\x60\x00\x00" + // type () -> ()
		"\x03\x02\x01\x00" + // one function
		"\x05\x03\x01\x00\x01" + // memory min 1
		"\x0c\x01\x02" + // data count 2
		"\x0a\x07\x01\x05\x00\xfc\x09\x01\x0b" + // data.drop 1
		"\x0b\x0d\x02\x00\x41\x00\x0b\x01a\x00\x41\x01\x0b\x01b") // two active segments
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ValidateCode(); err != nil {
		t.Fatal(err)
	}
	out, st, err := m.Rewrite(RewriteOptions{MergeGap: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if st.SegmentsAfter != st.SegmentsBefore || !bytes.Equal(out, bin) {
		t.Fatalf("segments merged (%d -> %d) in a module with a data count section", st.SegmentsBefore, st.SegmentsAfter)
	}
}
