package wasmbin

import (
	"fmt"
)

// Opcodes the decoder and the instrumenter refer to by name.
const (
	opBlock        = 0x02
	opLoop         = 0x03
	opIf           = 0x04
	opElse         = 0x05
	opEnd          = 0x0b
	opReturn       = 0x0f
	opBr           = 0x0c
	opBrIf         = 0x0d
	opBrTable      = 0x0e
	opCall         = 0x10
	opCallIndirect = 0x11
	opSelectT      = 0x1c
	opLocalGet     = 0x20
	opLocalSet     = 0x21
	opLocalTee     = 0x22
	opGlobalGet    = 0x23
	opGlobalSet    = 0x24
	opTableGet     = 0x25
	opTableSet     = 0x26
	opI32Load      = 0x28
	opI64Store32   = 0x3e
	opMemorySize   = 0x3f
	opMemoryGrow   = 0x40
	opI32Const     = 0x41
	opI64Const     = 0x42
	opF32Const     = 0x43
	opF64Const     = 0x44
	opI32LtS       = 0x48
	opI32Add       = 0x6a
	opI32Sub       = 0x6b
	opI32ShrU      = 0x76
	opI64Extend32S = 0xc4
	opRefNull      = 0xd0
	opRefIsNull    = 0xd1
	opRefFunc      = 0xd2
	opMiscPrefix   = 0xfc
	opSIMDPrefix   = 0xfd
)

// Value types accepted in block types, typed select and ref.null.
const (
	valI32       ValueType = 0x7f
	valI64       ValueType = 0x7e
	valF32       ValueType = 0x7d
	valF64       ValueType = 0x7c
	valV128      ValueType = 0x7b
	valFuncref   ValueType = 0x70
	valExternref ValueType = 0x6f
)

// memAlign is the natural alignment (log2 of the access size) of the
// loads and stores 0x28 (i32.load) to 0x3e (i64.store32).
var memAlign = [opI64Store32 - opI32Load + 1]uint8{
	2, 3, 2, 3, // i32.load i64.load f32.load f64.load
	0, 0, 1, 1, // i32.load8_s/u i32.load16_s/u
	0, 0, 1, 1, 2, 2, // i64.load8_s/u i64.load16_s/u i64.load32_s/u
	2, 3, 2, 3, // i32.store i64.store f32.store f64.store
	0, 1, // i32.store8 i32.store16
	0, 1, 2, // i64.store8 i64.store16 i64.store32
}

// simdDefined has a bit set for every SIMD sub-opcode (after 0xFD) that
// wazero v1.12.0 implements: the fixed-width SIMD proposal, 236 opcodes
// in 0 to 255. Relaxed SIMD is not among them.
var simdDefined = [4]uint64{0xffffffffffffffff, 0xffffffffffffffff, 0xf7e27f9bfbffffff, 0xffffbffbffe27f9b}

// SIMD sub-opcodes with immediates.
const (
	simdV128Load     = 0
	simdV128Store    = 11
	simdV128Const    = 12
	simdI8x16Shuffle = 13
	simdExtractFirst = 21 // i8x16.extract_lane_s
	simdReplaceLast  = 34 // f64x2.replace_lane
	simdLoad8Lane    = 84
	simdStore64Lane  = 91
	simdLoad32Zero   = 92
	simdLoad64Zero   = 93
)

// simdMemAlign is the natural alignment (log2) of the SIMD loads and
// stores 0 to 11.
var simdMemAlign = [12]uint8{
	4,    // v128.load
	3, 3, // v128.load8x8_s/u
	3, 3, // v128.load16x4_s/u
	3, 3, // v128.load32x2_s/u
	0, 1, 2, 3, // v128.load8/16/32/64_splat
	4, // v128.store
}

// simdLaneLog is log2 of the lane count of the extract/replace lane
// instructions 21 to 34.
var simdLaneLog = [14]uint8{
	4, 4, 4, // i8x16.extract_lane_s/u, i8x16.replace_lane
	3, 3, 3, // i16x8.extract_lane_s/u, i16x8.replace_lane
	2, 2, // i32x4.extract_lane, i32x4.replace_lane
	1, 1, // i64x2.extract_lane, i64x2.replace_lane
	2, 2, // f32x4.extract_lane, f32x4.replace_lane
	1, 1, // f64x2.extract_lane, f64x2.replace_lane
}

// unsupported names opcodes of proposals the host does not enable.
var unsupported = map[byte]string{
	0x06: "try (exception handling)",
	0x07: "catch (exception handling)",
	0x08: "throw (exception handling)",
	0x09: "rethrow (exception handling)",
	0x0a: "throw_ref (exception handling)",
	0x12: "return_call (tail calls)",
	0x13: "return_call_indirect (tail calls)",
	0x14: "call_ref (typed function references)",
	0x15: "return_call_ref (tail calls)",
	0x18: "delegate (exception handling)",
	0x19: "catch_all (exception handling)",
	0x1f: "try_table (exception handling)",
	0xd3: "ref.eq (garbage collection)",
	0xd4: "ref.as_non_null (typed function references)",
	0xd5: "br_on_null (typed function references)",
	0xd6: "br_on_non_null (typed function references)",
	0xfb: "garbage collection prefix",
	0xfe: "threads prefix",
}

// instr is one decoded instruction, as the visitor of decodeBody sees it.
type instr struct {
	op    byte   // the opcode, or the prefix byte 0xFC or 0xFD
	sub   uint32 // the sub-opcode after a prefix
	start int    // absolute offset of the opcode byte
	end   int    // absolute offset just past the last immediate
	// index is the immediate of call and ref.func (a function index),
	// encoded in bin[start+1:end].
	index uint32
	// closes is, for end, the construct it closes: opBlock, opLoop, opIf
	// (also for an if with an else), or 0 for the function body.
	closes byte
	// exits is, for br, br_if and br_table, whether a target is the
	// function body's own label: the branch may leave the function.
	exits bool
}

// codeDecoder decodes function bodies. It is reused across bodies so that
// decoding allocates nothing per instruction.
type codeDecoder struct {
	m    *Module
	r    reader
	ctl  []byte // open constructs: opBlock, opLoop, opIf, opElse
	in   instr
	fn   uint32 // function index of the body being decoded
	nmem uint32
}

func newCodeDecoder(m *Module) *codeDecoder {
	return &codeDecoder{m: m, ctl: make([]byte, 0, 16), nmem: m.NumMemories}
}

// ValidateCode decodes every function body and checks what can be checked
// without typing the operand stack: every opcode belongs to the enabled
// feature set (WebAssembly 2.0: the MVP, mutable globals, sign extension,
// non-trapping float-to-int, multi-value, bulk memory, reference types and
// fixed-width SIMD); every type, function, table, memory, global, local,
// data, element and label index is in range; blocks, loops, ifs and elses
// nest and the body ends with its final end; memory alignments do not
// exceed the natural alignment; global.set names a mutable global.
//
// Operand-stack types are not checked: the engine does that when it
// compiles the module, which the host does before instantiating it.
func (m *Module) ValidateCode() error {
	if len(m.Code) != len(m.funcs) {
		return malformed("%d function bodies for %d declared functions", len(m.Code), len(m.funcs))
	}
	d := newCodeDecoder(m)
	for i := range m.Code {
		if err := d.decodeBody(i, nil); err != nil {
			return err
		}
	}
	return nil
}

// fail records an error for the instruction at the current position.
func (d *codeDecoder) fail(format string, args ...any) error {
	op := fmt.Sprintf("0x%02x", d.in.op)
	if d.in.op == opMiscPrefix || d.in.op == opSIMDPrefix {
		op = fmt.Sprintf("0x%02x %d", d.in.op, d.in.sub)
	}
	return malformed("function %d, byte %d, opcode %s: %s", d.fn, d.in.start, op, fmt.Sprintf(format, args...))
}

// readErr turns a reader error (truncated or overlong immediate) into an
// error naming the instruction.
func (d *codeDecoder) readErr() error {
	if d.r.err == nil {
		return nil
	}
	return d.fail("bad immediate: %v", d.r.err)
}

// decodeBody decodes the i-th body of m.Code, calling visit (when not nil)
// for every instruction in order, the final end included. The instr passed
// to visit is reused; visit must not keep it. Decoding is linear in the
// body size and allocates nothing per instruction.
func (d *codeDecoder) decodeBody(i int, visit func(*instr)) error {
	m := d.m
	fb := m.Code[i]
	d.fn = uint32(m.nImpFunc + i)
	d.in = instr{start: fb.Start}
	if fb.Start > fb.End || fb.End > len(m.bin) || fb.Start < 0 {
		return d.fail("body bounds %d..%d out of the binary", fb.Start, fb.End)
	}
	if int(fb.TypeIndex) >= len(m.Types) {
		return d.fail("type index %d out of range", fb.TypeIndex)
	}
	nlocals := uint64(len(m.Types[fb.TypeIndex].Params)) + uint64(fb.NumLocals)
	d.r = reader{b: m.bin[:fb.End], i: fb.Start}
	d.ctl = d.ctl[:0]
	r := &d.r
	for {
		if r.i >= fb.End {
			d.in = instr{start: r.i}
			return d.fail("body ends without its final end")
		}
		in := &d.in
		*in = instr{start: r.i, op: r.b[r.i]}
		r.i++
		switch op := in.op; {
		case op == 0x00 || op == 0x01 || op == 0x0f || op == 0x1a || op == 0x1b ||
			op >= 0x45 && op <= opI64Extend32S || op == opRefIsNull:
			// unreachable nop return drop select, numeric, ref.is_null
		case op == opBlock || op == opLoop || op == opIf:
			if err := d.blockType(); err != nil {
				return err
			}
			d.ctl = append(d.ctl, op)
		case op == opElse:
			if n := len(d.ctl); n == 0 || d.ctl[n-1] != opIf {
				return d.fail("else outside an if, or a second else")
			}
			d.ctl[len(d.ctl)-1] = opElse
		case op == opEnd:
			n := len(d.ctl)
			if n == 0 {
				if r.i != fb.End {
					return d.fail("final end at byte %d before the end of the body at byte %d", in.start, fb.End)
				}
				in.end = r.i
				if visit != nil {
					visit(in)
				}
				return nil
			}
			in.closes = d.ctl[n-1]
			if in.closes == opElse {
				in.closes = opIf
			}
			d.ctl = d.ctl[:n-1]
		case op == opBr || op == opBrIf:
			x := r.u32()
			if err := d.label(x); err != nil {
				return err
			}
			in.exits = x == uint32(len(d.ctl))
		case op == opBrTable:
			n := r.u32()
			for k := uint64(0); k <= uint64(n) && r.err == nil; k++ {
				x := r.u32()
				if err := d.label(x); err != nil {
					return err
				}
				in.exits = in.exits || x == uint32(len(d.ctl))
			}
		case op == opCall:
			in.index = r.u32()
			if r.err == nil && in.index >= m.NumFuncs() {
				return d.fail("function index %d out of range (%d functions)", in.index, m.NumFuncs())
			}
		case op == opCallIndirect:
			ti, tab := r.u32(), r.u32()
			if r.err == nil && int(ti) >= len(m.Types) {
				return d.fail("type index %d out of range (%d types)", ti, len(m.Types))
			}
			if err := d.table(tab); err != nil {
				return err
			}
			if r.err == nil && m.Tables[tab].Elem != valFuncref {
				return d.fail("table %d is not a funcref table", tab)
			}
		case op == opSelectT:
			if n := r.byte(); r.err == nil && n != 1 {
				return d.fail("typed select with %d types (want 1)", n)
			}
			if t := r.byte(); r.err == nil && !isValType(t) {
				return d.fail("typed select with value type 0x%02x", t)
			}
		case op >= opLocalGet && op <= opLocalTee:
			if x := r.u32(); r.err == nil && uint64(x) >= nlocals {
				return d.fail("local index %d out of range (%d locals and parameters)", x, nlocals)
			}
		case op == opGlobalGet || op == opGlobalSet:
			x := r.u32()
			if r.err == nil && int(x) >= len(m.Globals) {
				return d.fail("global index %d out of range (%d globals)", x, len(m.Globals))
			}
			if r.err == nil && op == opGlobalSet && !m.Globals[x].Mutable {
				return d.fail("global.set on immutable global %d", x)
			}
		case op == opTableGet || op == opTableSet:
			if err := d.table(r.u32()); err != nil {
				return err
			}
		case op >= opI32Load && op <= opI64Store32:
			if err := d.memarg(memAlign[op-opI32Load]); err != nil {
				return err
			}
		case op == opMemorySize || op == opMemoryGrow:
			if err := d.memIndex(); err != nil {
				return err
			}
		case op == opI32Const:
			r.s32()
		case op == opI64Const:
			r.s64()
		case op == opF32Const:
			r.skip(4, "f32 constant")
		case op == opF64Const:
			r.skip(8, "f64 constant")
		case op == opRefNull:
			if t := r.byte(); r.err == nil && t != valFuncref && t != valExternref {
				return d.fail("ref.null with type 0x%02x", t)
			}
		case op == opRefFunc:
			in.index = r.u32()
			if r.err == nil && in.index >= m.NumFuncs() {
				return d.fail("function index %d out of range (%d functions)", in.index, m.NumFuncs())
			}
		case op == opMiscPrefix:
			in.sub = r.u32()
			if err := d.readErr(); err != nil {
				return err
			}
			if err := d.misc(); err != nil {
				return err
			}
		case op == opSIMDPrefix:
			if err := d.simd(); err != nil {
				return err
			}
		default:
			if what, ok := unsupported[op]; ok {
				return d.fail("unsupported instruction: %s", what)
			}
			return d.fail("unknown opcode")
		}
		if err := d.readErr(); err != nil {
			return err
		}
		in.end = r.i
		if visit != nil {
			visit(in)
		}
	}
}

func isValType(t byte) bool {
	switch t {
	case valI32, valI64, valF32, valF64, valV128, valFuncref, valExternref:
		return true
	}
	return false
}

// s33 reads a signed 33-bit LEB128 (block types).
func (r *reader) s33() int64 { return r.sleb(33, "s33") }

// blockType reads the block type of block, loop and if: empty (0x40), one
// value type, or an index into the type section (multi-value).
func (d *codeDecoder) blockType() error {
	bt := d.r.s33()
	if d.r.err != nil {
		return d.readErr()
	}
	switch {
	case bt == -64: // 0x40
	case bt < 0:
		if t := byte(bt & 0x7f); bt < -64 || !isValType(t) {
			return d.fail("block type %d is not a value type", bt)
		}
	case bt >= int64(len(d.m.Types)):
		return d.fail("block type index %d out of range (%d types)", bt, len(d.m.Types))
	}
	return nil
}

// label checks a branch depth against the open constructs (the function
// body counts as one).
func (d *codeDecoder) label(l uint32) error {
	if d.r.err == nil && uint64(l) > uint64(len(d.ctl)) {
		return d.fail("label %d out of range (depth %d)", l, len(d.ctl)+1)
	}
	return nil
}

func (d *codeDecoder) table(t uint32) error {
	if d.r.err == nil && int(t) >= len(d.m.Tables) {
		return d.fail("table index %d out of range (%d tables)", t, len(d.m.Tables))
	}
	return nil
}

func (d *codeDecoder) elem(e uint32) error {
	if d.r.err == nil && e >= d.m.NumElems {
		return d.fail("element segment %d out of range (%d segments)", e, d.m.NumElems)
	}
	return nil
}

func (d *codeDecoder) data(x uint32) error {
	if d.r.err != nil {
		return nil
	}
	if !d.m.HasDataCount {
		return d.fail("data segment index without a data count section")
	}
	if x >= d.m.NumData {
		return d.fail("data segment %d out of range (%d segments)", x, d.m.NumData)
	}
	return nil
}

// memIndex reads the memory index byte of memory.size, memory.grow and the
// bulk memory instructions: it must be a single zero byte, and a memory
// must exist.
func (d *codeDecoder) memIndex() error {
	b := d.r.byte()
	if d.r.err != nil {
		return nil
	}
	if b != 0 {
		return d.fail("memory index byte 0x%02x (only memory 0 is supported)", b)
	}
	return d.needMemory()
}

func (d *codeDecoder) needMemory() error {
	if d.nmem == 0 {
		return d.fail("memory instruction in a module without a memory")
	}
	return nil
}

// memarg reads an alignment and an offset and checks the alignment
// against the access's natural alignment (log2 of its size).
func (d *codeDecoder) memarg(natural uint8) error {
	align, _ := d.r.u32(), d.r.u32()
	if d.r.err != nil {
		return nil
	}
	if align >= 32 {
		// Bit 6 selects a memory index in the multi-memory proposal.
		return d.fail("alignment exponent %d (multi-memory is not supported)", align)
	}
	if align > uint32(natural) {
		return d.fail("alignment 2^%d exceeds the natural alignment 2^%d", align, natural)
	}
	return d.needMemory()
}

// misc decodes the 0xFC instructions: non-trapping float-to-int, bulk
// memory and the table instructions of reference types.
func (d *codeDecoder) misc() error {
	r := &d.r
	switch sub := d.in.sub; sub {
	case 0, 1, 2, 3, 4, 5, 6, 7: // iNN.trunc_sat_fMM_s/u
	case 8: // memory.init
		if err := d.data(r.u32()); err != nil {
			return err
		}
		return d.memIndex()
	case 9: // data.drop
		return d.data(r.u32())
	case 10: // memory.copy
		if err := d.memIndex(); err != nil {
			return err
		}
		return d.memIndex()
	case 11: // memory.fill
		return d.memIndex()
	case 12: // table.init
		if err := d.elem(r.u32()); err != nil {
			return err
		}
		return d.table(r.u32())
	case 13: // elem.drop
		return d.elem(r.u32())
	case 14: // table.copy
		if err := d.table(r.u32()); err != nil {
			return err
		}
		return d.table(r.u32())
	case 15, 16, 17: // table.grow, table.size, table.fill
		return d.table(r.u32())
	default:
		return d.fail("unknown 0xfc sub-opcode %d", sub)
	}
	return nil
}

// simd decodes a 0xFD instruction. The sub-opcode is a u32 LEB128 in the
// specification, but the engine reads it as one byte: opcodes from 128 to
// 255 are accepted only in their canonical two-byte form (the second byte,
// 0x01, is then read by the engine as a nop), so that both agree on where
// every instruction begins.
func (d *codeDecoder) simd() error {
	r := &d.r
	b := r.byte()
	if r.err != nil {
		return d.readErr()
	}
	d.in.sub = uint32(b)
	if b >= 0x80 {
		c := r.byte()
		if r.err != nil {
			return d.readErr()
		}
		d.in.sub = uint32(b&0x7f) | uint32(c)<<7
		if c != 0x01 {
			return d.fail("SIMD sub-opcode not in its canonical encoding")
		}
	}
	sub := d.in.sub
	if simdDefined[sub/64]&(1<<(sub%64)) == 0 {
		return d.fail("unknown SIMD sub-opcode %d", sub)
	}
	switch {
	case sub <= simdV128Store:
		return d.memarg(simdMemAlign[sub])
	case sub == simdV128Const:
		r.skip(16, "v128 constant")
	case sub == simdI8x16Shuffle:
		for k := 0; k < 16; k++ {
			if l := r.byte(); r.err == nil && l >= 32 {
				return d.fail("shuffle lane %d is %d (want < 32)", k, l)
			}
		}
	case sub >= simdExtractFirst && sub <= simdReplaceLast:
		return d.lane(simdLaneLog[sub-simdExtractFirst])
	case sub >= simdLoad8Lane && sub <= simdStore64Lane:
		// load8/16/32/64_lane 84-87, store8/16/32/64_lane 88-91
		size := uint8((sub - simdLoad8Lane) % 4)
		if err := d.memarg(size); err != nil {
			return err
		}
		return d.lane(4 - size)
	case sub == simdLoad32Zero:
		return d.memarg(2)
	case sub == simdLoad64Zero:
		return d.memarg(3)
	}
	return nil
}

// lane reads a lane index and checks it against the lane count 2^log.
func (d *codeDecoder) lane(log uint8) error {
	l := d.r.byte()
	if d.r.err == nil && l >= 1<<log {
		return d.fail("lane %d out of range (%d lanes)", l, 1<<log)
	}
	return nil
}
