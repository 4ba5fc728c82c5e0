package wasmbin

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// InterruptOptions name the host function the countdown calls when it runs out.
type InterruptOptions struct {
	Module, Name string // the import added to the module; its type is () -> i32
	Fuel         int32  // the countdown's starting value (must be > 0)
}

// InstrumentStats count the checks Instrument injected.
type InstrumentStats struct {
	Loops, Functions int // checks injected
	// Bulk counts the charges of instructions whose work grows with an
	// operand or the memory (bulk memory and table instructions,
	// memory.grow).
	Bulk int
}

// maxWeight bounds the fuel one check charges.
const maxWeight = 10000

// Instrument returns a copy of the module in which guest code counts down
// a fuel global and calls a host function when it runs out, so that the
// host can interrupt loops without the engine polling a context.
//
// It adds a function import opt.Module.opt.Name of type () -> i32 after
// the existing imports (so every defined function's index grows by one,
// and every reference to one is rewritten: calls, ref.func, element
// segments, global initialisers, exports, the start function and the name
// section), and a mutable i32 global holding the countdown, initialised to
// opt.Fuel, after the existing globals (no global index moves).
//
// A function without loops charges its weight to the global at its
// entry and, if the countdown went below zero, calls the import:
//
//	global.get G; i32.const W; i32.sub; local.tee L; global.set G
//	local.get L; i32.const 0; i32.lt_s; if; call IMPORT; global.set G; end
//
// and touches the countdown nowhere else, so its calls keep nothing alive
// for the countdown's sake (its frame under the compiler is the plain
// function's, but for what the entry's call of the import keeps alive:
// RATIONALE.md, "Recursion depth under the compiler").
//
// A function with loops keeps the countdown in a local of its own, L,
// so that a loop's check touches no memory: at entry it loads the
// global into L (global.get G; local.set L); before every call of a
// defined function, every call_indirect, every return and every branch
// that may leave the function, and at its final end, it stores L back
// (local.get L; global.set G), and after every call it loads it again.
// At the function entry (after the load) it injects the check
//
//	local.get L; i32.const W; i32.sub; local.tee L; i32.const 0; i32.lt_s
//	if; call IMPORT; local.tee L; global.set G; end
//
// and each loop opcode gets the same decrement and comparison, with the
// call of the import on a negative result; the import's result, plus W,
// is the new countdown (see appendLoopOpen and appendLoopClose; a loop
// with parameters keeps the check above inside it).
//
// W, the weight, is the number of instructions the check pays for:
// for a loop, those directly inside it (not inside nested loops), for the
// entry, those of the function outside any loop; W is at least 1 and at
// most 10,000. So the host is called about every opt.Fuel instructions
// executed, and the value it returns is the new countdown. The injected
// code leaves the operand stack as it found it, so it is valid inside
// loops with parameters.
//
// Function names: the output always has a name section whose function
// names subsection names every function the guest defines, so that the
// engine's stack traces and trap messages name the guest's own
// functions, as the engine names them in the input: by the name the
// input gives (renumbered; read as the engine reads it, in one pass
// expecting ascending indices), or else "$" followed by the function's
// index in the input, which is how wazero prints an unnamed function.
// Imported functions keep their index, so they keep a name only when the
// input gives them one. Wazero's message for a failed start function
// prints the function's index, not its name: see [Module.StartDesc] and
// [RenameStart].
//
// Every body is decoded as ValidateCode does, with the same errors. The
// module must not import from opt.Module,
// which is reserved. DWARF sections (.debug_*) are dropped, since the code
// offsets they hold move (so stack traces lose their source lines); in
// the name section, module names are kept, local names renumbered, the
// function names replaced as above and other subsections dropped.
func Instrument(m *Module, opt InterruptOptions) ([]byte, InstrumentStats, error) {
	var st InstrumentStats
	if opt.Fuel <= 0 {
		return nil, st, malformed("instrument: fuel %d (want > 0)", opt.Fuel)
	}
	if opt.Module == "" {
		return nil, st, malformed("instrument: no import module name")
	}
	for _, im := range m.Imports {
		if im.Module == opt.Module {
			return nil, st, malformed("import %s.%s uses the reserved module name %q", im.Module, im.Name, opt.Module)
		}
	}
	// The code pass below decodes every body with ValidateCode's decoder,
	// so it refuses what ValidateCode would; only the count is left.
	if len(m.Code) != len(m.funcs) {
		return nil, st, malformed("%d function bodies for %d declared functions", len(m.Code), len(m.funcs))
	}
	ins := &instrumenter{
		m:      m,
		nImp:   uint32(m.nImpFunc),
		global: uint32(len(m.Globals)),
		dec:    newCodeDecoder(m),
	}
	ins.typ = uint32(len(m.Types))
	for i, t := range m.Types {
		if len(t.Params) == 0 && len(t.Results) == 1 && t.Results[0] == valI32 {
			ins.typ = uint32(i)
			break
		}
	}
	newType := ins.typ == uint32(len(m.Types))

	bin := m.bin
	out := append(make([]byte, 0, len(bin)+len(bin)/8+64), bin[:8]...)
	// Sections to add when the module has none of the kind.
	type pending struct {
		id   byte
		done bool
	}
	pend := []pending{{id: secType}, {id: secImport}, {id: secGlobal}}
	emit := func(id byte, payload []byte) {
		out = append(out, id)
		out = appendU32(out, uint32(len(payload)))
		out = append(out, payload...)
	}
	flush := func(rank int) {
		for i := range pend {
			p := &pend[i]
			if p.done || sectionRank(p.id) >= rank {
				continue
			}
			p.done = true
			switch p.id {
			case secType:
				emit(secType, ins.appendType(appendU32(nil, 1)))
			case secImport:
				emit(secImport, ins.appendImport(appendU32(nil, 1), opt))
			case secGlobal:
				emit(secGlobal, ins.appendGlobal(appendU32(nil, 1), opt.Fuel))
			}
		}
	}
	markDone := func(id byte) {
		for i := range pend {
			if pend[i].id == id {
				pend[i].done = true
			}
		}
	}
	for _, s := range m.sections {
		payload := bin[s.start:s.end]
		if s.id == secCustom {
			p, keep := ins.custom(s)
			if keep {
				emit(secCustom, p)
			}
			continue
		}
		rank := sectionRank(s.id)
		if rank == 0 {
			return nil, st, malformed("unknown section id %d", s.id)
		}
		flush(rank)
		r := reader{b: bin[:s.end], i: s.start}
		var p []byte
		var err error
		switch s.id {
		case secType:
			markDone(secType)
			n := r.u32()
			if !newType {
				p = payload
				break
			}
			p = ins.appendType(append(appendU32(nil, n+1), bin[r.i:s.end]...))
		case secImport:
			markDone(secImport)
			n := r.u32()
			p = ins.appendImport(append(appendU32(nil, n+1), bin[r.i:s.end]...), opt)
		case secGlobal:
			markDone(secGlobal)
			p, err = ins.globals(&r, opt.Fuel)
		case secExport:
			p, err = ins.exports(&r)
		case secStart:
			p = appendU32(nil, ins.shift(r.u32()))
			err = r.err
		case secElement:
			p, err = ins.elements(&r)
		case secCode:
			p, err = ins.code(&st)
		default:
			p = payload
		}
		if err == nil {
			err = r.err
		}
		if err != nil {
			return nil, st, err
		}
		emit(s.id, p)
	}
	flush(1 << 30)
	if !m.hasNames {
		emit(secCustom, append(appendName(nil, "name"), ins.appendFuncNames(nil, nil)...))
	}
	return out, st, nil
}

// instrumenter holds what Instrument needs while rewriting one module.
type instrumenter struct {
	m      *Module
	nImp   uint32 // function imports before instrumenting: the new import's index
	global uint32 // the countdown global's index
	typ    uint32 // the index of the type () -> i32
	dec    *codeDecoder

	local uint32 // the body's countdown local
	// bulk: the body has an instruction whose work grows with an operand
	// (see bulkShift), so it gets a second local, local+1, for it.
	bulk bool

	// Per body: instructions outside loops, per-loop weights (by loop
	// ordinal), the open loops, the open constructs (with the wrapper
	// blocks added around each), the places to patch and their new
	// bytes.
	entry   int
	weights []int
	open    []int
	ctl     []int // per open block, loop or if: the constructs added around it
	closed  int   // the ordinal of the loop an end just closed
	events  []event
	payload []byte // new bytes of evLabels events
	body    []byte
}

// wrappers is the number of constructs a rewritten loop gets around it:
// the blocks $done and $slow and the loop $retry (see loopOpen).
const wrappers = 3

// event is a place in a body where the output differs from the input.
type event struct {
	at, end int    // bytes of the input replaced (at == end: insertion)
	kind    byte   // evCheck, evIndex, evStore or evLoad
	loop    int    // loop ordinal, for a check
	index   uint32 // the new function index, for evIndex
	p, q    int    // the new bytes, payload[p:q], for evLabels and evLoopOpen
}

const (
	evCheck     = iota // a loop's check
	evIndex            // a renumbered function index
	evStore            // store the local countdown to the global
	evLoad             // load the global countdown into the local
	evLabels           // a branch's labels, renumbered
	evLoopOpen         // a loop opened inside its wrappers, with its check
	evLoopClose        // the wrappers closed after a loop, with the slow path
	evBulk             // a bulk instruction's charge, by its length operand
	evGrow             // memory.grow's charge
)

// The charges of instructions whose work is not one instruction's.
//
// A bulk memory instruction (memory.fill, memory.copy, memory.init) does
// work in proportion to its length operand, n bytes: it is charged n>>4
// (16 bytes per instruction: a fill or copy moves about 10 to 30 bytes
// in the time of one plain instruction), before it runs. A table
// instruction (table.fill, table.copy, table.init, table.grow) is
// charged n>>1 for its n elements. So a loop of 64 MiB fills, which the
// loop's static weight would charge a few instructions an iteration,
// reaches the host about once per fill, and a deadline stops it within
// one fill of passing.
//
// memory.grow's work depends on the memory's size, not its operand (the
// engine may copy the whole memory), so the host is called before every
// grow, whatever the countdown (appendGrow).
const (
	memoryBulkShift = 4
	tableBulkShift  = 1
)

// bulkShift returns, for a 0xFC instruction, the shift of its length
// operand that is its charge, and whether it is charged so.
func bulkShift(sub uint32) (int32, bool) {
	switch sub {
	case 8, 10, 11: // memory.init, memory.copy, memory.fill
		return memoryBulkShift, true
	case 12, 14, 15, 17: // table.init, table.copy, table.grow, table.fill
		return tableBulkShift, true
	}
	return 0, false
}

// shift maps a function index of the input to the output's.
func (ins *instrumenter) shift(x uint32) uint32 {
	if x >= ins.nImp {
		return x + 1
	}
	return x
}

func (ins *instrumenter) appendStore(b []byte) []byte {
	b = append(b, opLocalGet)
	b = appendU32(b, ins.local)
	b = append(b, opGlobalSet)
	return appendU32(b, ins.global)
}

func (ins *instrumenter) appendLoad(b []byte) []byte {
	b = append(b, opGlobalGet)
	b = appendU32(b, ins.global)
	b = append(b, opLocalSet)
	return appendU32(b, ins.local)
}

// appendDecrement charges weight to the countdown local and leaves
// whether it ran out on the stack:
//
//	local.get C; i32.const W; i32.sub; local.tee C; i32.const 0; i32.lt_s
func (ins *instrumenter) appendDecrement(b []byte, weight int) []byte {
	weight = min(max(weight, 1), maxWeight)
	b = append(b, opLocalGet)
	b = appendU32(b, ins.local)
	b = append(b, opI32Const)
	b = appendS32(b, int32(weight))
	b = append(b, opI32Sub, opLocalTee)
	b = appendU32(b, ins.local)
	return append(b, opI32Const, 0, opI32LtS)
}

// appendEntry is the check at the entry of a function without loops: it
// charges the function's weight to the global and calls the import when
// the countdown runs out:
//
//	global.get G; i32.const W; i32.sub; local.tee L; global.set G
//	local.get L; i32.const 0; i32.lt_s; if; call IMPORT; global.set G; end
//
// The countdown stays in the global: the local only carries the value
// from the store to the comparison.
func (ins *instrumenter) appendEntry(b []byte, weight int) []byte {
	weight = min(max(weight, 1), maxWeight)
	b = append(b, opGlobalGet)
	b = appendU32(b, ins.global)
	b = append(b, opI32Const)
	b = appendS32(b, int32(weight))
	b = append(b, opI32Sub, opLocalTee)
	b = appendU32(b, ins.local)
	b = ins.appendStore(b)
	b = append(b, opI32Const, 0, opI32LtS, opIf, 0x40, opCall)
	b = appendU32(b, ins.nImp)
	b = append(b, opGlobalSet)
	b = appendU32(b, ins.global)
	return append(b, opEnd)
}

// appendCheck is the check at the entry of a function with loops, and
// inside a loop with parameters:
//
//	local.get L; i32.const W; i32.sub; local.tee L; i32.const 0; i32.lt_s
//	if; call IMPORT; local.tee L; global.set G; end
func (ins *instrumenter) appendCheck(b []byte, weight int) []byte {
	b = ins.appendDecrement(b, weight)
	b = append(b, opIf, 0x40, opCall)
	b = appendU32(b, ins.nImp)
	b = append(b, opLocalTee)
	b = appendU32(b, ins.local)
	b = append(b, opGlobalSet)
	b = appendU32(b, ins.global)
	return append(b, opEnd)
}

// appendBulk charges a bulk instruction, whose length operand n (an i32)
// is on top of the stack, n>>shift, and calls the import when the
// countdown runs out; n is left on the stack as it was. In a function
// with loops, where the countdown is the local L:
//
//	local.tee T; local.get L; local.get T; i32.const S; i32.shr_u; i32.sub
//	local.tee L; i32.const 0; i32.lt_s
//	if; call IMPORT; local.tee L; global.set G; end
//
// and in one without, where it is the global G (L only carries it):
//
//	local.tee T; global.get G; local.get T; i32.const S; i32.shr_u; i32.sub
//	local.tee L; global.set G; local.get L; i32.const 0; i32.lt_s
//	if; call IMPORT; global.set G; end
//
// The shift is unsigned and at least 1, so the charge is at most 2^31-1
// and the countdown, never below zero before it, cannot wrap.
func (ins *instrumenter) appendBulk(b []byte, shift int32, loops bool) []byte {
	b = append(b, opLocalTee)
	b = appendU32(b, ins.local+1)
	b = ins.appendCountdown(b, loops)
	b = append(b, opLocalGet)
	b = appendU32(b, ins.local+1)
	b = append(b, opI32Const)
	b = appendS32(b, shift)
	b = append(b, opI32ShrU)
	return ins.appendCharged(b, loops)
}

// appendGrow calls the import before memory.grow, whatever the
// countdown (see bulkShift), and takes its result as the new countdown:
//
//	call IMPORT; local.tee L; global.set G    (a function with loops)
//	call IMPORT; global.set G                 (one without)
func (ins *instrumenter) appendGrow(b []byte, loops bool) []byte {
	b = append(b, opCall)
	b = appendU32(b, ins.nImp)
	if loops {
		b = append(b, opLocalTee)
		b = appendU32(b, ins.local)
	}
	b = append(b, opGlobalSet)
	return appendU32(b, ins.global)
}

// appendCountdown pushes the countdown: the local L in a function with
// loops, the global G in one without.
func (ins *instrumenter) appendCountdown(b []byte, loops bool) []byte {
	if loops {
		b = append(b, opLocalGet)
		return appendU32(b, ins.local)
	}
	b = append(b, opGlobalGet)
	return appendU32(b, ins.global)
}

// appendCharged subtracts the charge on top of the stack from the
// countdown below it, stores the result, and calls the import when it is
// below zero (the rest of appendBulk's sequences).
func (ins *instrumenter) appendCharged(b []byte, loops bool) []byte {
	b = append(b, opI32Sub, opLocalTee)
	b = appendU32(b, ins.local)
	if !loops {
		b = ins.appendStore(b)
	}
	b = append(b, opI32Const, 0, opI32LtS, opIf, 0x40, opCall)
	b = appendU32(b, ins.nImp)
	if loops {
		b = append(b, opLocalTee)
		b = appendU32(b, ins.local)
	}
	b = append(b, opGlobalSet)
	b = appendU32(b, ins.global)
	return append(b, opEnd)
}

// appendLoopOpen opens a loop without parameters, of block type bt, so
// that its check's slow path lies outside it:
//
//	block $done bt; loop $retry bt; block $slow; loop $L bt
//	  local.get C; i32.const W; i32.sub; local.tee C; i32.const 0; i32.lt_s
//	  br_if $slow
//	  ... the loop's body ...
//
// A call inside the loop itself, even one never taken, makes the engine
// keep the loop's values out of registers; a branch out of it does not.
func (ins *instrumenter) appendLoopOpen(b, bt []byte, weight int) []byte {
	b = append(b, opBlock)
	b = append(b, bt...)
	b = append(b, opLoop)
	b = append(b, bt...)
	b = append(b, opBlock, 0x40, opLoop)
	b = append(b, bt...)
	b = ins.appendDecrement(b, weight)
	return append(b, opBrIf, 1)
}

// appendLoopClose follows the end of a loop opened by appendLoopOpen:
//
//	br $done                     ;; the loop ended: leave with its results
//	end                          ;; $slow: the countdown ran out
//	call IMPORT; i32.const W; i32.add; local.tee C; global.set G
//	br $retry                    ;; and into the loop again
//	end end
//
// The slow path adds the loop's weight to the new countdown, because the
// check at the loop's head, which runs again, subtracts it again.
func (ins *instrumenter) appendLoopClose(b []byte, weight int) []byte {
	weight = min(max(weight, 1), maxWeight)
	b = append(b, opBr, 2, opEnd, opCall)
	b = appendU32(b, ins.nImp)
	b = append(b, opI32Const)
	b = appendS32(b, int32(weight))
	b = append(b, opI32Add, opLocalTee)
	b = appendU32(b, ins.local)
	b = append(b, opGlobalSet)
	b = appendU32(b, ins.global)
	return append(b, opBr, 0, opEnd, opEnd)
}

// loopHasParams reports whether the block type of the loop opcode at
// in.start takes parameters (only a type index can).
func (ins *instrumenter) loopHasParams(in *instr) bool {
	r := reader{b: ins.m.bin[:in.end], i: in.start + 1}
	bt := r.s33()
	return bt >= 0 && int(bt) < len(ins.m.Types) && len(ins.m.Types[bt].Params) > 0
}

// relabel renumbers a branch's labels past the constructs added around
// rewritten loops, and records the new immediate if it changed.
func (ins *instrumenter) relabel(in *instr) {
	r := reader{b: ins.m.bin[:in.end], i: in.start + 1}
	n := uint32(1)
	if in.op == opBrTable {
		n = r.u32() + 1
	}
	p := len(ins.payload)
	if in.op == opBrTable {
		ins.payload = appendU32(ins.payload, n-1)
	}
	changed := false
	for range n {
		x := r.u32()
		nx := x
		// The target is construct len(ctl)-1-x (the body when x ==
		// len(ctl)); the branch crosses the wrappers of every construct
		// from the innermost down to the one just inside the target.
		for k := len(ins.ctl) - 1; k >= 0 && k > len(ins.ctl)-1-int(x); k-- {
			nx += uint32(ins.ctl[k])
		}
		changed = changed || nx != x
		ins.payload = appendU32(ins.payload, nx)
	}
	if !changed {
		ins.payload = ins.payload[:p]
		return
	}
	ins.events = append(ins.events, event{at: in.start + 1, end: in.end, kind: evLabels, p: p, q: len(ins.payload)})
}

// appendLocals copies a body's local declarations with one i32 local
// more, the countdown, and sets ins.local to its index; a body with bulk
// instructions gets a second, ins.local+1, for their length operand.
func (ins *instrumenter) appendLocals(b []byte, fb FuncBody) ([]byte, error) {
	r := reader{b: ins.m.bin[:fb.Start], i: fb.LocalsStart}
	n := r.u32()
	if r.err != nil {
		return nil, r.err
	}
	ins.local = uint32(len(ins.m.Types[fb.TypeIndex].Params)) + fb.NumLocals
	b = appendU32(b, n+1)
	b = append(b, ins.m.bin[r.i:fb.Start]...)
	if ins.bulk {
		return append(b, 2, valI32), nil // the countdown and a bulk length
	}
	return append(b, 1, valI32), nil
}

func (ins *instrumenter) appendType(b []byte) []byte {
	return append(b, 0x60, 0x00, 0x01, valI32)
}

func (ins *instrumenter) appendImport(b []byte, opt InterruptOptions) []byte {
	b = appendName(b, opt.Module)
	b = appendName(b, opt.Name)
	b = append(b, KindFunc)
	return appendU32(b, ins.typ)
}

func (ins *instrumenter) appendGlobal(b []byte, fuel int32) []byte {
	b = append(b, valI32, 0x01, opI32Const)
	b = appendS32(b, fuel)
	return append(b, opEnd)
}

func appendName(b []byte, s string) []byte {
	b = appendU32(b, uint32(len(s)))
	return append(b, s...)
}

// globals rewrites the global section: ref.func in initialisers, and the
// countdown appended.
func (ins *instrumenter) globals(r *reader, fuel int32) ([]byte, error) {
	n := r.u32()
	out := appendU32(nil, n+1)
	for k := uint32(0); k < n && r.err == nil; k++ {
		out = append(out, r.byte(), r.byte()) // type, mutability
		var err error
		if out, err = ins.constExpr(r, out); err != nil {
			return nil, err
		}
	}
	return ins.appendGlobal(out, fuel), r.err
}

// constExpr copies a constant expression, renumbering ref.func.
func (ins *instrumenter) constExpr(r *reader, out []byte) ([]byte, error) {
	for r.err == nil {
		at := r.i
		switch op := r.byte(); op {
		case opEnd:
			return append(out, opEnd), r.err
		case opI32Const:
			r.s32()
		case opI64Const:
			r.s64()
		case opF32Const:
			r.skip(4, "f32 constant")
		case opF64Const:
			r.skip(8, "f64 constant")
		case opGlobalGet:
			r.u32()
		case opRefNull:
			r.byte()
		case opRefFunc:
			x := r.u32()
			out = append(out, opRefFunc)
			out = appendU32(out, ins.shift(x))
			continue
		case opSIMDPrefix:
			if r.byte() != simdV128Const {
				return nil, malformed("constant expression at byte %d: unsupported SIMD instruction", at)
			}
			r.skip(16, "v128 constant")
		default:
			if r.err == nil {
				return nil, malformed("constant expression at byte %d: unsupported opcode 0x%02x", at, op)
			}
		}
		if r.err == nil {
			out = append(out, r.b[at:r.i]...)
		}
	}
	return nil, r.err
}

func (ins *instrumenter) exports(r *reader) ([]byte, error) {
	n := r.u32()
	out := appendU32(nil, n)
	for k := uint32(0); k < n && r.err == nil; k++ {
		out = appendName(out, r.name())
		kind := r.byte()
		x := r.u32()
		if kind == KindFunc {
			x = ins.shift(x)
		}
		out = appendU32(append(out, kind), x)
	}
	return out, r.err
}

// elements rewrites the function indices of the element section: the
// index vectors of flags 0 to 3 and ref.func in the expressions of flags 4
// to 7.
func (ins *instrumenter) elements(r *reader) ([]byte, error) {
	n := r.u32()
	out := appendU32(nil, n)
	var err error
	for k := uint32(0); k < n && r.err == nil; k++ {
		flag := r.u32()
		if flag > 7 {
			return nil, malformed("element segment %d: flags %d", k, flag)
		}
		out = appendU32(out, flag)
		if flag&1 == 0 { // active
			if flag&2 != 0 {
				out = appendU32(out, r.u32()) // table
			}
			if out, err = ins.constExpr(r, out); err != nil {
				return nil, err
			}
		}
		if flag&3 != 0 {
			out = append(out, r.byte()) // element kind or reference type
		}
		c := r.u32()
		out = appendU32(out, c)
		for j := uint32(0); j < c && r.err == nil; j++ {
			if flag&4 != 0 {
				if out, err = ins.constExpr(r, out); err != nil {
					return nil, err
				}
			} else {
				out = appendU32(out, ins.shift(r.u32()))
			}
		}
	}
	return out, r.err
}

// custom returns a custom section's new payload, or false to drop it.
func (ins *instrumenter) custom(s section) ([]byte, bool) {
	bin := ins.m.bin
	payload := bin[s.start:s.end]
	r := reader{b: bin[:s.end], i: s.start}
	name := r.name()
	switch {
	case r.err != nil:
		return payload, true
	case strings.HasPrefix(name, ".debug_"):
		return nil, false
	case name == "name":
		p, err := ins.names(&r)
		if err != nil {
			// Parse checked the section, so this is not expected; the
			// functions keep their indices as names at least.
			p = ins.appendFuncNames(nil, nil)
		}
		return append(appendName(nil, "name"), p...), true
	}
	return payload, true
}

// funcName is an entry of a function names subsection.
type funcName struct {
	index uint32
	name  string
}

// names rewrites the name section's subsections: module names are kept,
// local names renumbered, the function names replaced by
// appendFuncNames's, others dropped. Subsections of one kind keep their
// order (the engine reads the last one of a kind); the module names
// come first, then the function names, then the local names.
func (ins *instrumenter) names(r *reader) ([]byte, error) {
	var mods, locals []byte
	var funcs []funcName
	for r.err == nil && r.i < len(r.b) {
		id := r.byte()
		size := int(r.u32())
		if r.err != nil || size < 0 || r.i+size > len(r.b) {
			r.fail("name subsection")
			break
		}
		end := r.i + size
		sub := reader{b: r.b[:end], i: r.i}
		switch id {
		case 0:
			mods = append(mods, 0)
			mods = appendU32(mods, uint32(size))
			mods = append(mods, r.b[r.i:end]...)
		case 1: // function names
			n := sub.u32()
			funcs = funcs[:0]
			for k := uint32(0); k < n && sub.err == nil; k++ {
				funcs = append(funcs, funcName{sub.u32(), sub.name()})
			}
		case 2: // local names
			n := sub.u32()
			p := appendU32(nil, n)
			for k := uint32(0); k < n && sub.err == nil; k++ {
				p = appendU32(p, ins.shift(sub.u32()))
				c := sub.u32()
				p = appendU32(p, c)
				for j := uint32(0); j < c && sub.err == nil; j++ {
					p = appendU32(p, sub.u32())
					p = appendName(p, sub.name())
				}
			}
			locals = append(locals, 2)
			locals = appendU32(locals, uint32(len(p)))
			locals = append(locals, p...)
		}
		if sub.err != nil {
			return nil, sub.err
		}
		if (id == 1 || id == 2) && sub.i != end {
			return nil, malformed("name subsection %d has trailing bytes", id)
		}
		r.i = end
	}
	if r.err != nil {
		return nil, r.err
	}
	return append(ins.appendFuncNames(mods, funcs), locals...), nil
}

// appendFuncNames appends a function names subsection that names every
// defined function of the input, so that the engine's messages name the
// guest's own functions: the name the engine would have given the
// function in the input (see engineNames), or, where that is empty,
// "$" and its index in the input, which is how the engine prints an
// unnamed function. Imported functions keep a non-empty name; the others
// keep their index, and so the engine's default name, and stay unnamed,
// as does the added import.
func (ins *instrumenter) appendFuncNames(b []byte, in []funcName) []byte {
	var p []byte
	count := uint32(0)
	names := engineNames(in)
	for i := range ins.m.NumFuncs() {
		name := names(i)
		if name == "" && i < ins.nImp {
			continue
		}
		p = appendU32(p, ins.shift(i))
		if name == "" {
			p = appendU32(p, 1+uint32(len(strconv.AppendUint(nil, uint64(i), 10))))
			p = strconv.AppendUint(append(p, '$'), uint64(i), 10)
		} else {
			p = appendName(p, name)
		}
		count++
	}
	sub := appendU32(nil, count)
	sub = append(sub, p...)
	b = append(b, 1)
	b = appendU32(b, uint32(len(sub)))
	return append(b, sub...)
}

// engineNames returns a function that gives, for ascending function
// indices 0, 1, 2..., the name wazero (v1.12.0) gives each function from
// a function names subsection as it appears in the binary: wazero walks
// the entries once, in their order, expecting ascending indices, so an
// entry out of order may be missed; "" where it finds none.
func engineNames(in []funcName) func(uint32) string {
	k := 0
	return func(i uint32) string {
		for ; k < len(in); k++ {
			if e := in[k]; e.index > i {
				break
			} else if e.index == i {
				return e.name
			}
		}
		return ""
	}
}

// RenameStart returns err, an error wazero returned for a module whose
// start function failed ("start " + got + " failed: " + the function's
// error, as [Module.StartDesc] describes), with want in place of got,
// wrapping the same error. Any other error is returned as it is.
func RenameStart(err error, got, want string) error {
	if err == nil || got == want {
		return err
	}
	inner := errors.Unwrap(err)
	if inner == nil || err.Error() != "start "+got+" failed: "+inner.Error() {
		return err
	}
	return fmt.Errorf("start %s failed: %w", want, inner)
}

// StartDesc returns the words with which wazero (v1.12.0) names the
// module's start function in the error of a start function that failed,
// after "start " and before " failed: ": "function[K]", or, when
// functions are exported under the index wazero looks up (K plus the
// number of imported functions), "function[K] export[...]" with their
// quoted names in sorted order. It returns false when the module has no
// start section.
//
// The start function of an instrumented module has another index than
// the input's, so the engine's message names another function; a host
// that compares the two descriptions (of the input and of the output)
// can put the input's back.
func (m *Module) StartDesc() (string, bool) {
	if !m.HasStart {
		return "", false
	}
	look := uint64(m.StartFunc) + uint64(m.nImpFunc)
	var names []string
	for _, e := range m.Exports {
		if e.Kind == KindFunc && uint64(e.Index) == look {
			names = append(names, strconv.Quote(e.Name))
		}
	}
	if names == nil {
		return fmt.Sprintf("function[%d]", m.StartFunc), true
	}
	sort.Strings(names)
	return fmt.Sprintf("function[%d] export[%s]", m.StartFunc, strings.Join(names, ",")), true
}

// code rewrites the code section: every body gets its checks and its
// function indices renumbered.
func (ins *instrumenter) code(st *InstrumentStats) ([]byte, error) {
	m := ins.m
	out := appendU32(make([]byte, 0, len(m.bin)), uint32(len(m.Code)))
	visit := ins.visit
	for i, fb := range m.Code {
		ins.entry, ins.weights, ins.open, ins.events = 0, ins.weights[:0], ins.open[:0], ins.events[:0]
		ins.ctl, ins.payload, ins.bulk = ins.ctl[:0], ins.payload[:0], false
		if err := ins.dec.decodeBody(i, visit); err != nil {
			return nil, err
		}
		b, err := ins.appendLocals(ins.body[:0], fb)
		if err != nil {
			return nil, err
		}
		// A function with loops keeps the countdown in its local from
		// its entry on; one without charges the global at its entry and
		// touches the countdown nowhere else.
		loops := len(ins.weights) > 0
		if loops {
			b = ins.appendLoad(b)
			b = ins.appendCheck(b, ins.entry)
		} else {
			b = ins.appendEntry(b, ins.entry)
		}
		st.Functions++
		pos := fb.Start
		for _, e := range ins.events {
			if !loops && (e.kind == evStore || e.kind == evLoad) {
				continue
			}
			b = append(b, m.bin[pos:e.at]...)
			switch e.kind {
			case evCheck:
				b = ins.appendCheck(b, ins.weights[e.loop])
				st.Loops++
			case evIndex:
				b = appendU32(b, e.index)
			case evStore:
				b = ins.appendStore(b)
			case evLoad:
				b = ins.appendLoad(b)
			case evLabels:
				b = append(b, ins.payload[e.p:e.q]...)
			case evLoopOpen:
				b = ins.appendLoopOpen(b, ins.payload[e.p:e.q], ins.weights[e.loop])
				st.Loops++
			case evLoopClose:
				b = ins.appendLoopClose(b, ins.weights[e.loop])
			case evBulk:
				b = ins.appendBulk(b, int32(e.index), loops)
				st.Bulk++
			case evGrow:
				b = ins.appendGrow(b, loops)
				st.Bulk++
			}
			pos = e.end
		}
		b = append(b, m.bin[pos:fb.End]...)
		ins.body = b
		out = appendU32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out, nil
}

// insert records an insertion at the input offset at.
func (ins *instrumenter) insert(at int, kind byte) {
	ins.events = append(ins.events, event{at: at, end: at, kind: kind})
}

// visit records, for one instruction, its weight and whether the output
// differs there.
func (ins *instrumenter) visit(in *instr) {
	// Charge the instruction to the innermost open loop (a loop's end to
	// the loop itself, its opening to the enclosing one).
	if n := len(ins.open); n > 0 {
		ins.weights[ins.open[n-1]]++
	} else {
		ins.entry++
	}
	insert := ins.insert
	switch in.op {
	case opBlock, opIf:
		ins.ctl = append(ins.ctl, 0)
	case opLoop:
		ord := len(ins.weights)
		ins.weights = append(ins.weights, 0)
		ins.open = append(ins.open, ord)
		if ins.loopHasParams(in) {
			// The wrappers cannot hand a loop its parameters again: the
			// check and its call stay inside the loop.
			ins.ctl = append(ins.ctl, 0)
			ins.events = append(ins.events, event{at: in.end, end: in.end, kind: evCheck, loop: ord})
			break
		}
		ins.ctl = append(ins.ctl, wrappers)
		p := len(ins.payload)
		ins.payload = append(ins.payload, ins.m.bin[in.start+1:in.end]...)
		ins.events = append(ins.events, event{at: in.start, end: in.end, kind: evLoopOpen, loop: ord, p: p, q: len(ins.payload)})
	case opEnd:
		switch in.closes {
		case 0: // the function's final end
			insert(in.start, evStore)
		default:
			if in.closes == opLoop {
				ins.closed = ins.open[len(ins.open)-1]
				ins.open = ins.open[:len(ins.open)-1]
			}
			top := ins.ctl[len(ins.ctl)-1]
			ins.ctl = ins.ctl[:len(ins.ctl)-1]
			if top == wrappers {
				ins.events = append(ins.events, event{at: in.end, end: in.end, kind: evLoopClose, loop: ins.closed})
			}
		}
	case opReturn:
		insert(in.start, evStore)
	case opBr, opBrIf, opBrTable:
		if in.exits {
			insert(in.start, evStore)
		}
		ins.relabel(in)
	case opCall:
		if in.index < ins.nImp { // a host function: it spends no fuel
			break
		}
		insert(in.start, evStore)
		ins.events = append(ins.events, event{at: in.start + 1, end: in.end, kind: evIndex, index: in.index + 1})
		insert(in.end, evLoad)
	case opCallIndirect:
		insert(in.start, evStore)
		insert(in.end, evLoad)
	case opRefFunc:
		if in.index >= ins.nImp {
			ins.events = append(ins.events, event{at: in.start + 1, end: in.end, kind: evIndex, index: in.index + 1})
		}
	case opMemoryGrow:
		insert(in.start, evGrow)
	case opMiscPrefix:
		if shift, ok := bulkShift(in.sub); ok {
			ins.bulk = true
			ins.events = append(ins.events, event{at: in.start, end: in.start, kind: evBulk, index: uint32(shift)})
		}
	}
}
