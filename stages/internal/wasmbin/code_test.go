package wasmbin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
)

// cmSpec describes a module built around one function body: types
// 0 (params) -> (results) and 1 () -> (); an import of type 1 (unless
// noImport); one funcref table with an element segment naming the
// function; one memory (unless noMemory); globals 0 (mutable i32) and 1
// (immutable i32); a data count section (unless noDataCount) and one
// passive data segment.
type cmSpec struct {
	params, results []byte
	body            []byte // locals and instructions, final end included
	noImport        bool
	importModule    string
	noMemory        bool
	noDataCount     bool
}

func cmSection(b []byte, id byte, payload []byte) []byte {
	b = append(b, id)
	b = appendU32(b, uint32(len(payload)))
	return append(b, payload...)
}

func cmVec(items ...[]byte) []byte {
	p := appendU32(nil, uint32(len(items)))
	for _, it := range items {
		p = append(p, it...)
	}
	return p
}

func cmFuncType(params, results []byte) []byte {
	p := append(appendU32([]byte{0x60}, uint32(len(params))), params...)
	return append(appendU32(p, uint32(len(results))), results...)
}

func cmBuild(s cmSpec) []byte {
	b := []byte("\x00asm\x01\x00\x00\x00")
	b = cmSection(b, secType, cmVec(cmFuncType(s.params, s.results), cmFuncType(nil, nil)))
	self := byte(0)
	if !s.noImport {
		mod := s.importModule
		if mod == "" {
			mod = "env"
		}
		b = cmSection(b, secImport, cmVec(append(append(appendName(nil, mod), appendName(nil, "f")...), KindFunc, 1)))
		self = 1
	}
	b = cmSection(b, secFunction, cmVec([]byte{0}))
	b = cmSection(b, secTable, cmVec([]byte{valFuncref, 0x00, 0x01}))
	if !s.noMemory {
		b = cmSection(b, secMemory, cmVec([]byte{0x00, 0x01}))
	}
	b = cmSection(b, secGlobal, cmVec(
		[]byte{valI32, 1, opI32Const, 0, opEnd},
		[]byte{valI32, 0, opI32Const, 0, opEnd}))
	b = cmSection(b, secElement, cmVec([]byte{0x00, opI32Const, 0, opEnd, 1, self}))
	if !s.noDataCount {
		b = cmSection(b, secDataCount, []byte{1})
	}
	b = cmSection(b, secCode, cmVec(append(appendU32(nil, uint32(len(s.body))), s.body...)))
	return cmSection(b, secData, cmVec([]byte{0x01, 0x01, 'x'}))
}

// cmBody prefixes instructions with one declared i32 local and appends
// the final end.
func cmBody(code ...byte) []byte {
	return append(append([]byte{0x01, 0x01, valI32}, code...), opEnd)
}

func TestValidateCodeAcceptsGoodBodies(t *testing.T) {
	for i, body := range [][]byte{
		cmBody(),
		cmBody(opLocalGet, 1, opGlobalSet, 0, opGlobalGet, 1, 0x1a),
		cmBody(opBlock, 0x40, opLoop, 0x7f, opI32Const, 1, opBr, 1, opEnd, 0x1a, opEnd),
		cmBody(opI32Const, 0, opIf, 0x00, opElse, opEnd),                          // block type: type 0
		cmBody(opI32Const, 0, opI32Load, 2, 0, 0x1a),                              // natural alignment
		cmBody(opMiscPrefix, 9, 0),                                                // data.drop 0
		cmBody(opMiscPrefix, 8, 0, 0, 0x1a),                                       // memory.init 0 (operands aside)
		cmBody(opSIMDPrefix, 0x15, 15, 0x1a),                                      // i8x16.extract_lane_s 15
		cmBody(opSIMDPrefix, 0xba, 0x01, 0x1a),                                    // i32x4.dot_i16x8_s
		cmBody(opSIMDPrefix, 0x54, 0, 0, 15, 0x1a),                                // v128.load8_lane align 0 lane 15
		cmBody(opI32Const, 0, opBrTable, 2, 0, 0, 0),                              // br_table
		cmBody(opSelectT, 1, valI64, opRefNull, valExternref, opRefFunc, 0, 0x1a), // typed select, refs
	} {
		m, err := Parse(cmBuild(cmSpec{params: []byte{valI32}, body: body, noImport: true}))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.ValidateCode(); err != nil {
			t.Errorf("body %d: %v", i, err)
		}
	}
}

func TestValidateCodeRefusesBadBodies(t *testing.T) {
	for _, c := range []struct {
		name string
		spec cmSpec
		want string
	}{
		{"unknown opcode", cmSpec{body: cmBody(0x27)}, "opcode 0x27: unknown opcode"},
		{"threads", cmSpec{body: cmBody(0xfe, 0x00)}, "threads"},
		{"tail call", cmSpec{body: cmBody(0x12, 0x00)}, "return_call (tail calls)"},
		{"tail call indirect", cmSpec{body: cmBody(opI32Const, 0, 0x13, 0x01, 0x00)}, "return_call_indirect"},
		{"exceptions", cmSpec{body: cmBody(0x06, 0x40, opEnd)}, "exception handling"},
		{"gc", cmSpec{body: cmBody(0xfb, 0x00)}, "garbage collection"},
		{"bad label", cmSpec{body: cmBody(opBlock, 0x40, opBr, 2, opEnd)}, "label 2 out of range (depth 2)"},
		{"bad br_table label", cmSpec{body: cmBody(opI32Const, 0, opBrTable, 1, 0, 1)}, "label 1 out of range"},
		{"local out of range", cmSpec{params: []byte{valI32}, body: cmBody(opLocalGet, 2, 0x1a)}, "local index 2 out of range (2 locals and parameters)"},
		{"extra end", cmSpec{body: cmBody(opEnd)}, "final end at byte"},
		{"missing end", cmSpec{body: []byte{0x00, opBlock, 0x40, opEnd}}, "body ends without its final end"},
		{"else outside if", cmSpec{body: cmBody(opBlock, 0x40, opElse, opEnd)}, "else outside an if"},
		{"second else", cmSpec{body: cmBody(opI32Const, 0, opIf, 0x40, opElse, opElse, opEnd)}, "else outside an if, or a second else"},
		{"memory index 1", cmSpec{body: cmBody(opMemorySize, 1, 0x1a)}, "memory index byte 0x01"},
		{"memory.copy memory 1", cmSpec{body: cmBody(opMiscPrefix, 10, 0, 1)}, "memory index byte 0x01"},
		{"no memory", cmSpec{noMemory: true, body: cmBody(opI32Const, 0, opI32Load, 2, 0, 0x1a)}, "without a memory"},
		{"data.drop without datacount", cmSpec{noDataCount: true, body: cmBody(opMiscPrefix, 9, 0)}, "without a data count section"},
		{"memory.init without datacount", cmSpec{noDataCount: true, body: cmBody(opMiscPrefix, 8, 0, 0)}, "without a data count section"},
		{"data index", cmSpec{body: cmBody(opMiscPrefix, 9, 1)}, "data segment 1 out of range"},
		{"elem index", cmSpec{body: cmBody(opMiscPrefix, 13, 1)}, "element segment 1 out of range"},
		{"table index", cmSpec{body: cmBody(opMiscPrefix, 16, 1, 0x1a)}, "table index 1 out of range"},
		{"call_indirect table", cmSpec{body: cmBody(opI32Const, 0, opCallIndirect, 1, 1)}, "table index 1 out of range"},
		{"call_indirect type", cmSpec{body: cmBody(opI32Const, 0, opCallIndirect, 2, 0)}, "type index 2 out of range"},
		{"call index", cmSpec{body: cmBody(opCall, 2)}, "function index 2 out of range (2 functions)"},
		{"ref.func index", cmSpec{body: cmBody(opRefFunc, 5, 0x1a)}, "function index 5 out of range"},
		{"global index", cmSpec{body: cmBody(opGlobalGet, 2, 0x1a)}, "global index 2 out of range"},
		{"global.set immutable", cmSpec{body: cmBody(opI32Const, 0, opGlobalSet, 1)}, "global.set on immutable global 1"},
		{"alignment", cmSpec{body: cmBody(opI32Const, 0, opI32Load, 3, 0, 0x1a)}, "alignment 2^3 exceeds the natural alignment 2^2"},
		{"alignment load8", cmSpec{body: cmBody(opI32Const, 0, 0x2d, 1, 0, 0x1a)}, "alignment 2^1 exceeds the natural alignment 2^0"},
		{"multi-memory memarg", cmSpec{body: cmBody(opI32Const, 0, opI32Load, 0x42, 1, 0, 0x1a)}, "multi-memory"},
		{"simd alignment", cmSpec{body: cmBody(opI32Const, 0, opSIMDPrefix, 0, 5, 0, 0x1a)}, "alignment 2^5 exceeds the natural alignment 2^4"},
		{"simd lane", cmSpec{body: cmBody(opSIMDPrefix, 0x15, 16, 0x1a)}, "lane 16 out of range (16 lanes)"},
		{"simd lane f64x2", cmSpec{body: cmBody(opSIMDPrefix, 0x22, 2, 0x1a)}, "lane 2 out of range (2 lanes)"},
		{"simd load lane", cmSpec{body: cmBody(opSIMDPrefix, 0x57, 3, 0, 2, 0x1a)}, "lane 2 out of range (2 lanes)"},
		{"simd shuffle lane", cmSpec{body: cmBody(opSIMDPrefix, 13, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 32)}, "shuffle lane 15 is 32"},
		{"simd unknown", cmSpec{body: cmBody(opSIMDPrefix, 0x9a, 0x01)}, "unknown SIMD sub-opcode 154"},
		{"simd relaxed", cmSpec{body: cmBody(opSIMDPrefix, 0x80, 0x02)}, "canonical encoding"},
		{"simd overlong", cmSpec{body: cmBody(opSIMDPrefix, 0x8c, 0x00)}, "canonical encoding"},
		{"misc unknown", cmSpec{body: cmBody(opMiscPrefix, 18)}, "unknown 0xfc sub-opcode 18"},
		{"typed select arity", cmSpec{body: cmBody(opSelectT, 2, valI32, valI32)}, "typed select with 2 types"},
		{"ref.null type", cmSpec{body: cmBody(opRefNull, valI32, 0x1a)}, "ref.null with type 0x7f"},
		{"block type", cmSpec{body: cmBody(opBlock, 0x05, opEnd)}, "block type index 5 out of range"},
		{"block value type", cmSpec{body: cmBody(opBlock, 0x60, opEnd)}, "is not a value type"},
		{"truncated immediate", cmSpec{body: []byte{0x00, opF64Const, 0, 0, opEnd}}, "bad immediate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := Parse(cmBuild(c.spec))
			if err != nil {
				t.Fatal(err)
			}
			err = m.ValidateCode()
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
			if !strings.Contains(err.Error(), "function 1, byte ") {
				t.Fatalf("%v does not name the function and the byte", err)
			}
		})
	}
}

func TestValidateCodeNamesTheOffset(t *testing.T) {
	bin := cmBuild(cmSpec{body: cmBody(opNop, 0x27), noImport: true})
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Code) != 1 {
		t.Fatalf("%d bodies", len(m.Code))
	}
	at := m.Code[0].Start + 1
	want := fmt.Sprintf("function 0, byte %d, opcode 0x27", at)
	if err := m.ValidateCode(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want %q", err, want)
	}
	if bin[at] != 0x27 {
		t.Fatalf("byte %d is 0x%02x", at, bin[at])
	}
}

const opNop = 0x01

// TestPrefixedOpcodesMatchTheEngine checks, for every 0xFC and 0xFD
// sub-opcode, that the decoder knows it exactly when the engine does.
func TestPrefixedOpcodesMatchTheEngine(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	check := func(desc string, code []byte, engineUnknown string) {
		bin := cmBuild(cmSpec{body: cmBody(code...)})
		m, err := Parse(bin)
		if err != nil {
			t.Fatal(err)
		}
		verr := m.ValidateCode()
		weKnow := verr == nil || !strings.Contains(verr.Error(), "unknown")
		_, cerr := rt.CompileModule(ctx, bin)
		engineKnows := cerr == nil || !strings.Contains(cerr.Error(), engineUnknown)
		if weKnow != engineKnows {
			t.Errorf("%s: decoder: %v; engine: %v", desc, verr, cerr)
		}
	}
	for sub := 0; sub < 256; sub++ {
		code := []byte{opSIMDPrefix, byte(sub)}
		if sub >= 0x80 {
			code = append(code, 0x01)
		}
		// Zero immediates of the longest kind (16 bytes) are harmless:
		// extra zeros decode as unreachable.
		code = append(code, make([]byte, 16)...)
		check(fmt.Sprintf("0xfd %d", sub), code, "unknown SIMD instruction")
	}
	for sub := 0; sub < 32; sub++ {
		check(fmt.Sprintf("0xfc %d", sub), []byte{opMiscPrefix, byte(sub), 0, 0}, "unknown misc opcode")
	}
}

func BenchmarkDecodeBody(b *testing.B) {
	bin := largestRepoModule(b)
	m, err := Parse(bin)
	if err != nil {
		b.Fatal(err)
	}
	d := newCodeDecoder(m)
	n := 0
	visit := func(*instr) { n++ }
	b.SetBytes(int64(len(bin)))
	b.ReportAllocs()
	for b.Loop() {
		for i := range m.Code {
			if err := d.decodeBody(i, visit); err != nil {
				b.Fatal(err)
			}
		}
	}
}
