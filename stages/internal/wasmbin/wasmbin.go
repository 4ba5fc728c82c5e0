// Package wasmbin reads and rewrites the WebAssembly binaries the host
// runs, before the engine (wazero) compiles them. Nothing here runs guest
// code.
//
// Reading. [Parse] reads every section of a binary at least as strictly
// as wazero's own decoder does (types, imports, functions, tables,
// memories, globals, exports, start, elements, data count, code, data,
// and the "name" custom section), and bounds every count and length by
// the bytes left before it allocates anything, so it takes time and
// memory linear in the size of the binary whatever the binary holds.
// [Module.ValidateCode] then decodes every function body, for exactly
// the instruction set the host admits (WebAssembly 2.0 with fixed-width
// SIMD, one memory), naming the opcode, the function and the byte offset
// of anything else; operand types are left to the engine.
//
// Rewriting. Each rewrite returns a new binary and leaves the input
// alone:
//
//   - [Module.Rewrite] caps the memory maximum and merges nearby active
//     data segments, so that instantiation copies a few large segments
//     instead of tens of thousands of small ones.
//   - [Instrument] adds the interruption countdown: an import from a
//     reserved module that the guest calls about every so many
//     instructions, charged at every function entry and loop iteration,
//     so that the host can stop a guest at its deadline without the
//     engine polling a context. It renumbers every function reference
//     past the added import and gives the output a name section that
//     names the guest's functions as the engine would name them in the
//     input, so that stack traces and trap messages are the input's;
//     [Module.StartDesc] and [RenameStart] do the same for the one
//     message that prints an index (a failed start function).
//   - [Module.CompactTable] drops the leading table entries no element
//     fills, which every instance would otherwise allocate.
//   - [Module.Freeze], with [Module.ActiveData] and
//     [Module.SnapshotBlocker], derives the module a snapshot of an
//     initialised instance is taken from: mutable globals and the start
//     function exported, the start section and data segments removed.
//
// Errors wrap [ErrMalformed] (or [ErrMemoryLimit] for a memory over the
// cap) and name the section, function or byte offset at fault.
package wasmbin

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Section ids.
const (
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secFunction  = 3
	secTable     = 4
	secMemory    = 5
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secElement   = 9
	secCode      = 10
	secData      = 11
	secDataCount = 12
)

// Limits Parse enforces.
const (
	// localsLimit bounds the locals of one function, parameters included.
	// The engine accepts up to 2^32-1 declared locals and 2^27 values on
	// its stack; this is stricter.
	localsLimit = 50_000
	// pagesLimit is the most 64 KiB pages a 32-bit memory can have.
	pagesLimit = 65536
	// indexLimit bounds the function, global and table index spaces and a
	// table's minimum size, as the engine does.
	indexLimit = 1 << 27
)

// Value types.
const (
	typeI32       ValueType = 0x7f
	typeI64       ValueType = 0x7e
	typeF32       ValueType = 0x7d
	typeF64       ValueType = 0x7c
	typeV128      ValueType = 0x7b
	typeFuncref   ValueType = 0x70
	typeExternref ValueType = 0x6f
)

// ValueType is a Wasm value type byte (0x7f i32, 0x7e i64, 0x7d f32,
// 0x7c f64, ...).
type ValueType = byte

func isValueType(t byte) bool {
	switch t {
	case typeI32, typeI64, typeF32, typeF64, typeV128, typeFuncref, typeExternref:
		return true
	}
	return false
}

func isRefType(t byte) bool { return t == typeFuncref || t == typeExternref }

func typeName(t ValueType) string {
	switch t {
	case typeI32:
		return "i32"
	case typeI64:
		return "i64"
	case typeF32:
		return "f32"
	case typeF64:
		return "f64"
	case typeV128:
		return "v128"
	case typeFuncref:
		return "funcref"
	case typeExternref:
		return "externref"
	}
	return fmt.Sprintf("type 0x%02x", t)
}

// FuncType is a function signature.
type FuncType struct {
	Params, Results []ValueType
}

// External kinds of imports and exports.
const (
	KindFunc   byte = 0
	KindTable  byte = 1
	KindMemory byte = 2
	KindGlobal byte = 3
	KindTag    byte = 4
)

// KindName names an external kind.
func KindName(k byte) string {
	switch k {
	case KindFunc:
		return "function"
	case KindTable:
		return "table"
	case KindMemory:
		return "memory"
	case KindGlobal:
		return "global"
	case KindTag:
		return "tag"
	}
	return fmt.Sprintf("kind %d", k)
}

// Import is one import.
type Import struct {
	Module, Name string
	Kind         byte
	Type         FuncType // for functions
}

// Export is one export.
type Export struct {
	Name  string
	Kind  byte
	Index uint32
	Type  FuncType // for functions
}

// Limits are memory limits in 64 KiB pages, or table limits in elements.
type Limits struct {
	Min    uint32
	Max    uint32
	HasMax bool
	Shared bool
}

// FuncBody is one entry of the code section.
type FuncBody struct {
	TypeIndex   uint32 // the function's type, an index into Types
	NumLocals   uint32 // declared locals, parameters excluded
	LocalsStart int    // absolute offset in the binary of the local declarations vector
	Start, End  int    // absolute offsets of the instructions; bin[End-1] is the body's final end (0x0b)
}

// GlobalType is the type of a global.
type GlobalType struct {
	Type    ValueType
	Mutable bool
}

// TableType is the type of a table.
type TableType struct {
	Elem   ValueType
	Limits Limits
}

// Custom is one custom section: its name and its payload after the
// name, a slice of the binary.
type Custom struct {
	Name    string
	Payload []byte
	At      int // the payload's offset in the binary
}

type section struct {
	id          byte
	start, end  int // payload bounds in the binary
	headerStart int // where the id byte is
}

// Module is a parsed binary.
type Module struct {
	bin      []byte
	sections []section
	Types    []FuncType
	Imports  []Import
	Exports  []Export
	Memories []Limits // defined (not imported) memories

	Code         []FuncBody   // defined functions, in order
	Globals      []GlobalType // imported globals first, then defined ones
	Tables       []TableType  // imported tables first, then defined ones
	NumMemories  uint32       // imported + defined
	HasStart     bool         // whether the module has a start section
	StartFunc    uint32       // the start function's index, when HasStart
	NumElems     uint32       // element segments
	NumData      uint32       // data segments
	HasDataCount bool         // whether the module has a data count section
	Customs      []Custom     // the custom sections, in order ("name" included)

	funcs      []uint32 // type index per defined function
	nImpFunc   int
	impFuncs   []uint32 // type index per imported function
	nImpGlobal int
	dataCount  uint32 // the data count section's value, when HasDataCount
	hasNames   bool   // whether a "name" custom section was read
}

// NumFuncs returns the number of functions, imported and defined.
func (m *Module) NumFuncs() uint32 { return uint32(m.nImpFunc + len(m.funcs)) }

// FuncTypeIndex returns the type index of function index (imported
// functions first, then defined ones), and false when index is out of
// range.
func (m *Module) FuncTypeIndex(index uint32) (uint32, bool) {
	if uint64(index) < uint64(len(m.impFuncs)) {
		return m.impFuncs[index], true
	}
	i := uint64(index) - uint64(len(m.impFuncs))
	if i < uint64(len(m.funcs)) {
		return m.funcs[i], true
	}
	return 0, false
}

// Bytes returns the binary Parse read. The caller must not modify it.
func (m *Module) Bytes() []byte { return m.bin }

// ErrMalformed is returned for binaries that cannot be parsed.
var ErrMalformed = errors.New("malformed wasm binary")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// within puts a malformed-binary error in context: within(err, "import
// %d", 3) reads "malformed wasm binary: import 3: <what err said>".
func within(err error, format string, args ...any) error {
	msg := strings.TrimPrefix(err.Error(), ErrMalformed.Error()+": ")
	return fmt.Errorf("%w: %s: %s", ErrMalformed, fmt.Sprintf(format, args...), msg)
}

// sectionRank orders the non-custom sections as the binary format
// requires; 0 is an unknown id.
func sectionRank(id byte) int {
	switch {
	case id >= secType && id <= secElement:
		return int(id)
	case id == secDataCount:
		return 10
	case id == secCode:
		return 11
	case id == secData:
		return 12
	}
	return 0
}

func sectionName(id byte) string {
	names := [...]string{"custom", "type", "import", "function", "table", "memory", "global", "export", "start", "element", "code", "data", "data count"}
	if int(id) < len(names) {
		return names[id]
	}
	return fmt.Sprintf("unknown (id %d)", id)
}

// Parse reads and checks the module structure. It never panics; it takes
// time and memory linear in len(bin). The returned Module refers to bin,
// which the caller must not modify afterwards.
func Parse(bin []byte) (*Module, error) {
	if len(bin) < 8 || !bytes.Equal(bin[:4], []byte("\x00asm")) {
		return nil, malformed("no \\0asm magic")
	}
	if v := binary.LittleEndian.Uint32(bin[4:8]); v != 1 {
		return nil, malformed("binary version %d (want 1)", v)
	}
	m := &Module{bin: bin}
	r := reader{b: bin, i: 8}
	var last byte // the last non-custom section's id
	for r.i < len(bin) {
		hs := r.i
		id := r.byte()
		size := r.u32()
		if r.err != nil {
			return nil, within(r.err, "section header at byte %d", hs)
		}
		if uint64(size) > uint64(len(bin)-r.i) {
			return nil, malformed("%s section at byte %d: size %d overruns the binary (%d bytes left)", sectionName(id), hs, size, len(bin)-r.i)
		}
		if id != secCustom {
			rank := sectionRank(id)
			switch {
			case rank == 0:
				return nil, malformed("unknown section id %d at byte %d", id, hs)
			case last != 0 && rank == sectionRank(last):
				return nil, malformed("duplicate %s section at byte %d", sectionName(id), hs)
			case last != 0 && rank < sectionRank(last):
				return nil, malformed("%s section at byte %d is out of order (after the %s section)", sectionName(id), hs, sectionName(last))
			}
			last = id
		}
		s := section{id: id, start: r.i, end: r.i + int(size), headerStart: hs}
		m.sections = append(m.sections, s)
		sr := reader{b: bin[:s.end], i: s.start}
		m.parseSection(id, &sr)
		if sr.err == nil && sr.i != s.end {
			sr.err = malformed("%d trailing bytes at byte %d", s.end-sr.i, sr.i)
		}
		if sr.err != nil {
			return nil, within(sr.err, "%s section at byte %d", sectionName(id), hs)
		}
		r.i = s.end
	}
	if len(m.Code) != len(m.funcs) {
		return nil, malformed("the function section declares %d functions, the code section has %d bodies", len(m.funcs), len(m.Code))
	}
	if m.HasDataCount && m.NumData != m.dataCount {
		return nil, malformed("the data count section says %d data segments, the data section has %d", m.dataCount, m.NumData)
	}
	for i := range m.Exports {
		e := &m.Exports[i]
		if e.Kind != KindFunc {
			continue
		}
		if t, ok := m.funcType(e.Index); ok {
			e.Type = t
		}
	}
	return m, nil
}

func (m *Module) parseSection(id byte, r *reader) {
	switch id {
	case secCustom:
		m.parseCustom(r)
	case secType:
		m.parseTypes(r)
	case secImport:
		m.parseImports(r)
	case secFunction:
		m.parseFunctions(r)
	case secTable:
		m.parseTables(r)
	case secMemory:
		m.parseMemories(r)
	case secGlobal:
		m.parseGlobals(r)
	case secExport:
		m.parseExports(r)
	case secStart:
		m.parseStart(r)
	case secElement:
		m.parseElements(r)
	case secDataCount:
		m.dataCount, m.HasDataCount = r.u32(), true
	case secCode:
		m.parseCode(r)
	case secData:
		m.parseData(r)
	}
}

// funcType returns the signature of function index, in constant time.
func (m *Module) funcType(index uint32) (FuncType, bool) {
	ti, ok := m.FuncTypeIndex(index)
	if !ok || uint64(ti) >= uint64(len(m.Types)) {
		return FuncType{}, false
	}
	return m.Types[ti], true
}

// parseCustom checks a custom section's name and, for the "name"
// section, its subsections; the rest of the payload is opaque.
func (m *Module) parseCustom(r *reader) {
	n := r.name()
	if r.err != nil {
		return
	}
	m.Customs = append(m.Customs, Custom{Name: n, Payload: r.b[r.i:len(r.b):len(r.b)], At: r.i})
	if n == "name" {
		if m.hasNames {
			r.failAt(r.i, "second \"name\" section")
			return
		}
		m.hasNames = true
		m.parseNames(r)
		return
	}
	r.i = len(r.b)
}

// parseNames checks the module (0), function (1) and local (2) name
// subsections of the "name" section and skips any other.
func (m *Module) parseNames(r *reader) {
	for r.err == nil && r.i < len(r.b) {
		at := r.i
		id := r.byte()
		size := r.u32()
		if r.err != nil {
			return
		}
		if uint64(size) > uint64(len(r.b)-r.i) {
			r.failAt(at, "name subsection %d: size %d overruns the section", id, size)
			return
		}
		end := r.i + int(size)
		sr := reader{b: r.b[:end], i: r.i}
		switch id {
		case 0:
			sr.name()
		case 1:
			sr.nameMap()
		case 2:
			n := sr.vecLen("function")
			for range n {
				sr.u32()
				sr.nameMap()
				if sr.err != nil {
					break
				}
			}
		default:
			sr.i = end
		}
		if sr.err == nil && sr.i != end {
			sr.failAt(sr.i, "name subsection %d: %d trailing bytes", id, end-sr.i)
		}
		if sr.err != nil {
			r.err = sr.err
			return
		}
		r.i = end
	}
}

func (m *Module) parseTypes(r *reader) {
	n := r.vecLen("type")
	m.Types = make([]FuncType, 0, n)
	for i := range n {
		at := r.i
		if form := r.byte(); form != 0x60 && r.err == nil {
			r.failAt(at, "form 0x%02x, want 0x60 (func)", form)
		}
		var t FuncType
		t.Params = r.valtypes()
		t.Results = r.valtypes()
		if r.err != nil {
			r.err = within(r.err, "type %d", i)
			return
		}
		m.Types = append(m.Types, t)
	}
}

func (m *Module) parseImports(r *reader) {
	n := r.vecLen("import")
	m.Imports = make([]Import, 0, n)
	for i := range n {
		im := Import{Module: r.name(), Name: r.name()}
		at := r.i
		im.Kind = r.byte()
		if r.err == nil && im.Module == "" {
			r.failAt(at, "empty module name")
		}
		switch im.Kind {
		case KindFunc:
			ti := r.u32()
			if r.err == nil && uint64(ti) >= uint64(len(m.Types)) {
				r.failAt(at+1, "type index %d out of range (%d types)", ti, len(m.Types))
			}
			if r.err == nil {
				im.Type = m.Types[ti]
				m.impFuncs = append(m.impFuncs, ti)
				m.nImpFunc++
			}
		case KindTable:
			m.Tables = append(m.Tables, r.tableType())
		case KindMemory:
			r.memLimits()
			m.NumMemories++
			if r.err == nil && m.NumMemories > 1 {
				r.failAt(at, "more than one memory")
			}
		case KindGlobal:
			m.Globals = append(m.Globals, r.globalType())
			m.nImpGlobal++
		default:
			if r.err == nil {
				r.failAt(at, "unsupported import kind %d (%s)", im.Kind, KindName(im.Kind))
			}
		}
		if r.err != nil {
			r.err = within(r.err, "import %d (%q.%q)", i, im.Module, im.Name)
			return
		}
		m.Imports = append(m.Imports, im)
	}
}

func (m *Module) parseFunctions(r *reader) {
	n := r.vecLen("function")
	m.funcs = make([]uint32, 0, n)
	for i := range n {
		at := r.i
		ti := r.u32()
		if r.err == nil && uint64(ti) >= uint64(len(m.Types)) {
			r.failAt(at, "type index %d out of range (%d types)", ti, len(m.Types))
		}
		if r.err != nil {
			r.err = within(r.err, "function %d", m.nImpFunc+i)
			return
		}
		m.funcs = append(m.funcs, ti)
	}
	if m.nImpFunc+len(m.funcs) > indexLimit {
		r.failAt(r.i, "%d functions, more than %d", m.nImpFunc+len(m.funcs), indexLimit)
	}
}

func (m *Module) parseTables(r *reader) {
	n := r.vecLen("table")
	for range n {
		t := r.tableType()
		if r.err != nil {
			r.err = within(r.err, "table %d", len(m.Tables))
			return
		}
		m.Tables = append(m.Tables, t)
	}
	if len(m.Tables) > indexLimit {
		r.failAt(r.i, "%d tables, more than %d", len(m.Tables), indexLimit)
	}
}

func (m *Module) parseMemories(r *reader) {
	n := r.vecLen("memory")
	for i := range n {
		at := r.i
		l := r.memLimits()
		if r.err == nil && m.NumMemories > 0 {
			r.failAt(at, "more than one memory")
		}
		if r.err != nil {
			r.err = within(r.err, "memory %d", i)
			return
		}
		m.Memories = append(m.Memories, l)
		m.NumMemories++
	}
}

func (m *Module) parseGlobals(r *reader) {
	n := r.vecLen("global")
	for range n {
		g := r.globalType()
		m.constExpr(r, g.Type)
		if r.err != nil {
			r.err = within(r.err, "global %d", len(m.Globals))
			return
		}
		m.Globals = append(m.Globals, g)
	}
	if len(m.Globals) > indexLimit {
		r.failAt(r.i, "%d globals, more than %d", len(m.Globals), indexLimit)
	}
}

// constExpr reads a constant expression of one instruction and its end,
// and checks that it has type want.
func (m *Module) constExpr(r *reader, want ValueType) {
	at := r.i
	op := r.byte()
	var got ValueType
	switch op {
	case 0x41: // i32.const
		r.s32()
		got = typeI32
	case 0x42: // i64.const
		r.s64()
		got = typeI64
	case 0x43: // f32.const
		r.skip(4, "f32 constant")
		got = typeF32
	case 0x44: // f64.const
		r.skip(8, "f64 constant")
		got = typeF64
	case 0xfd: // v128.const
		if sub := r.byte(); sub != 12 && r.err == nil {
			r.failAt(at, "instruction 0xfd %d is not constant", sub)
		}
		r.skip(16, "v128 constant")
		got = typeV128
	case 0x23: // global.get
		idx := r.u32()
		switch {
		case r.err != nil:
		case uint64(idx) >= uint64(m.nImpGlobal):
			r.failAt(at, "global.get %d: only the %d imported globals may be read", idx, m.nImpGlobal)
		case m.Globals[idx].Mutable:
			r.failAt(at, "global.get %d: the global is mutable", idx)
		default:
			got = m.Globals[idx].Type
		}
	case 0xd0: // ref.null
		got = r.byte()
		if r.err == nil && !isRefType(got) {
			r.failAt(at, "ref.null of %s", typeName(got))
		}
	case 0xd2: // ref.func
		idx := r.u32()
		if r.err == nil && idx >= m.NumFuncs() {
			r.failAt(at, "ref.func %d: function index out of range (%d functions)", idx, m.NumFuncs())
		}
		got = typeFuncref
	default:
		if r.err == nil {
			r.failAt(at, "instruction 0x%02x is not constant", op)
		}
	}
	endAt := r.i
	if end := r.byte(); end != 0x0b && r.err == nil {
		r.failAt(endAt, "constant expression does not end after one instruction (0x%02x)", end)
	}
	if r.err == nil && got != want {
		r.failAt(at, "constant expression of type %s, want %s", typeName(got), typeName(want))
	}
}

func (m *Module) parseExports(r *reader) {
	n := r.vecLen("export")
	m.Exports = make([]Export, 0, n)
	seen := make(map[string]struct{}, n)
	for i := range n {
		e := Export{Name: r.name()}
		at := r.i
		e.Kind = r.byte()
		e.Index = r.u32()
		if r.err == nil {
			if _, dup := seen[e.Name]; dup {
				r.failAt(at, "duplicate export name")
			}
		}
		var count uint64
		switch e.Kind {
		case KindFunc:
			count = uint64(m.NumFuncs())
		case KindTable:
			count = uint64(len(m.Tables))
		case KindMemory:
			count = uint64(m.NumMemories)
		case KindGlobal:
			count = uint64(len(m.Globals))
		default:
			if r.err == nil {
				r.failAt(at, "unsupported export kind %d (%s)", e.Kind, KindName(e.Kind))
			}
		}
		if r.err == nil && uint64(e.Index) >= count {
			r.failAt(at+1, "%s index %d out of range (%d)", KindName(e.Kind), e.Index, count)
		}
		if r.err != nil {
			r.err = within(r.err, "export %d (%q)", i, e.Name)
			return
		}
		seen[e.Name] = struct{}{}
		m.Exports = append(m.Exports, e)
	}
}

func (m *Module) parseStart(r *reader) {
	at := r.i
	idx := r.u32()
	if r.err != nil {
		return
	}
	t, ok := m.funcType(idx)
	if !ok {
		r.failAt(at, "start function %d out of range (%d functions)", idx, m.NumFuncs())
		return
	}
	if len(t.Params) != 0 || len(t.Results) != 0 {
		r.failAt(at, "start function %d has %d parameters and %d results, want none", idx, len(t.Params), len(t.Results))
		return
	}
	m.HasStart, m.StartFunc = true, idx
}

// parseElements reads the element segments in all eight forms: bit 0 of
// the flags marks passive or declarative segments, bit 1 an explicit
// table index (active) or declarative (otherwise), bit 2 constant
// expressions instead of function indices.
func (m *Module) parseElements(r *reader) {
	n := r.vecLen("element segment")
	for i := range n {
		m.element(r)
		if r.err != nil {
			r.err = within(r.err, "element segment %d", i)
			return
		}
	}
	m.NumElems = uint32(n)
}

func (m *Module) element(r *reader) {
	at := r.i
	flags := r.u32()
	if r.err != nil {
		return
	}
	if flags > 7 {
		r.failAt(at, "flags %d (want 0 to 7)", flags)
		return
	}
	active := flags&1 == 0
	exprs := flags&4 != 0
	var table uint32
	if active {
		if flags&2 != 0 {
			table = r.u32()
		}
		if r.err == nil && uint64(table) >= uint64(len(m.Tables)) {
			r.failAt(at, "table %d out of range (%d tables)", table, len(m.Tables))
			return
		}
		m.constExpr(r, typeI32)
	}
	elem := typeFuncref
	if flags&3 != 0 {
		kat := r.i
		k := r.byte()
		switch {
		case r.err != nil:
		case exprs && !isRefType(k):
			r.failAt(kat, "element type %s", typeName(k))
		case exprs:
			elem = k
		case k != 0:
			r.failAt(kat, "element kind %d (want 0)", k)
		}
	}
	if r.err != nil {
		return
	}
	if active && m.Tables[table].Elem != elem {
		r.failAt(at, "%s elements for a table of %s", typeName(elem), typeName(m.Tables[table].Elem))
		return
	}
	cnt := r.vecLen("element")
	for range cnt {
		if exprs {
			m.constExpr(r, elem)
		} else {
			fat := r.i
			if f := r.u32(); r.err == nil && f >= m.NumFuncs() {
				r.failAt(fat, "function index %d out of range (%d functions)", f, m.NumFuncs())
			}
		}
		if r.err != nil {
			return
		}
	}
}

func (m *Module) parseCode(r *reader) {
	at := r.i
	n := r.vecLen("function body")
	if r.err != nil {
		return
	}
	if n != len(m.funcs) {
		r.failAt(at, "%d function bodies, the function section declares %d functions", n, len(m.funcs))
		return
	}
	m.Code = make([]FuncBody, 0, n)
	for i := range n {
		b := m.body(r, m.funcs[i])
		if r.err != nil {
			r.err = within(r.err, "function body %d (function %d)", i, m.nImpFunc+i)
			m.Code = nil
			return
		}
		m.Code = append(m.Code, b)
	}
}

func (m *Module) body(r *reader, typeIndex uint32) FuncBody {
	at := r.i
	size := r.u32()
	if r.err != nil {
		return FuncBody{}
	}
	if uint64(size) > uint64(len(r.b)-r.i) {
		r.failAt(at, "size %d overruns the section (%d bytes left)", size, len(r.b)-r.i)
		return FuncBody{}
	}
	end := r.i + int(size)
	br := reader{b: r.b[:end], i: r.i}
	fb := FuncBody{TypeIndex: typeIndex, LocalsStart: br.i}
	params := uint64(len(m.Types[typeIndex].Params))
	total := params
	decls := br.vecLen("local declaration")
	for range decls {
		cat := br.i
		c := br.u32()
		tat := br.i
		t := br.byte()
		if br.err != nil {
			break
		}
		if !isValueType(t) {
			br.failAt(tat, "local of %s", typeName(t))
			break
		}
		total += uint64(c)
		if total > localsLimit {
			br.failAt(cat, "more than %d locals (parameters included)", localsLimit)
			break
		}
	}
	if br.err == nil && total > localsLimit {
		br.failAt(fb.LocalsStart, "more than %d locals (parameters included)", localsLimit)
	}
	if br.err == nil && (br.i >= end || r.b[end-1] != 0x0b) {
		br.failAt(end, "the body does not end with end (0x0b)")
	}
	if br.err != nil {
		r.err = br.err
		return FuncBody{}
	}
	fb.NumLocals = uint32(total - params)
	fb.Start, fb.End = br.i, end
	r.i = end
	return fb
}

func (m *Module) parseData(r *reader) {
	at := r.i
	n := r.vecLen("data segment")
	if r.err != nil {
		return
	}
	if m.HasDataCount && uint64(n) != uint64(m.dataCount) {
		r.failAt(at, "%d data segments, the data count section says %d", n, m.dataCount)
		return
	}
	for i := range n {
		m.dataSegment(r)
		if r.err != nil {
			r.err = within(r.err, "data segment %d", i)
			return
		}
	}
	m.NumData = uint32(n)
}

func (m *Module) dataSegment(r *reader) {
	at := r.i
	flag := r.u32()
	switch {
	case r.err != nil:
		return
	case flag > 2:
		r.failAt(at, "flags %d (want 0, 1 or 2)", flag)
		return
	case flag == 2:
		if mem := r.u32(); mem != 0 && r.err == nil {
			r.failAt(at, "memory index %d (want 0)", mem)
			return
		}
	}
	if flag != 1 {
		if r.err == nil && m.NumMemories == 0 {
			r.failAt(at, "active data segment without a memory")
			return
		}
		m.constExpr(r, typeI32)
	}
	lat := r.i
	l := r.u32()
	if r.err == nil && uint64(l) > uint64(len(r.b)-r.i) {
		r.failAt(lat, "%d bytes of data overrun the section (%d bytes left)", l, len(r.b)-r.i)
	}
	if r.err == nil {
		r.i += int(l)
	}
}

// Export finds an export by name.
func (m *Module) Export(name string) (Export, bool) {
	for _, e := range m.Exports {
		if e.Name == name {
			return e, true
		}
	}
	return Export{}, false
}

// RewriteOptions say what Rewrite changes.
type RewriteOptions struct {
	// MaxPages caps every defined memory's maximum at this many pages
	// (0: leave the limits alone).
	MaxPages uint32
	// MergeGap merges consecutive active data segments separated by at
	// most this many bytes (0: do not merge).
	MergeGap int
	// MaxTableElements caps every defined table's maximum at this many
	// elements (0: leave the limits alone), so that table.grow cannot
	// make an instance hold unbounded host memory; a table whose minimum
	// is above it is refused ([ErrTableLimit]).
	MaxTableElements uint32
}

// RewriteStats report what Rewrite did.
type RewriteStats struct {
	SegmentsBefore, SegmentsAfter int
}

// ErrMemoryLimit is returned when a memory's minimum exceeds the cap.
var ErrMemoryLimit = errors.New("memory exceeds the limit")

// ErrTableLimit is returned when a table's minimum exceeds the cap.
var ErrTableLimit = errors.New("table exceeds the limit")

// Rewrite returns a new binary with the memory maximum capped and the data
// segments merged. Custom sections are kept as they are. A merge that
// would grow the data section to more than twice its size, or by more than
// 64 KiB, is not done: the segments are left as they were. Neither is a
// merge in a module with a data count section: only such a module can
// name data segments by index (memory.init, data.drop), and merging
// renumbers them.
func (m *Module) Rewrite(opt RewriteOptions) ([]byte, RewriteStats, error) {
	var st RewriteStats
	if m.HasDataCount {
		opt.MergeGap = 0
	}
	out := append([]byte(nil), m.bin[:8]...)
	for _, s := range m.sections {
		payload := m.bin[s.start:s.end]
		switch {
		case s.id == secMemory && opt.MaxPages > 0:
			p, err := capMemories(m.Memories, opt.MaxPages)
			if err != nil {
				return nil, st, err
			}
			payload = p
		case s.id == secTable && opt.MaxTableElements > 0:
			p, err := capTables(payload, opt.MaxTableElements)
			if err != nil {
				return nil, st, err
			}
			payload = p
		case s.id == secData && opt.MergeGap > 0:
			p, before, after, err := mergeData(payload, opt.MergeGap)
			if err != nil {
				return nil, st, err
			}
			payload, st.SegmentsBefore, st.SegmentsAfter = p, before, after
		}
		out = append(out, s.id)
		out = appendU32(out, uint32(len(payload)))
		out = append(out, payload...)
	}
	return out, st, nil
}

func capMemories(mems []Limits, maxPages uint32) ([]byte, error) {
	p := appendU32(nil, uint32(len(mems)))
	for i, l := range mems {
		if l.Min > maxPages {
			return nil, fmt.Errorf("%w: memory %d needs at least %d pages (%d KiB), the limit is %d pages", ErrMemoryLimit, i, l.Min, uint64(l.Min)*64, maxPages)
		}
		if l.Shared {
			return nil, fmt.Errorf("%w: memory %d is shared, which is not supported", ErrMalformed, i)
		}
		max := maxPages
		if l.HasMax && l.Max < max {
			max = l.Max
		}
		p = append(p, 0x01)
		p = appendU32(p, l.Min)
		p = appendU32(p, max)
	}
	return p, nil
}

// capTables rewrites a table section so that no table's maximum is
// above maxElems.
func capTables(payload []byte, maxElems uint32) ([]byte, error) {
	r := reader{b: payload}
	n := r.vecLen("table")
	p := appendU32(nil, uint32(n))
	for i := range n {
		t := r.tableType()
		if r.err != nil {
			return nil, r.err
		}
		if t.Limits.Min > maxElems {
			return nil, fmt.Errorf("%w: table %d needs at least %d elements, the limit is %d", ErrTableLimit, i, t.Limits.Min, maxElems)
		}
		max := maxElems
		if t.Limits.HasMax && t.Limits.Max < max {
			max = t.Limits.Max
		}
		p = append(p, t.Elem, 0x01)
		p = appendU32(p, t.Limits.Min)
		p = appendU32(p, max)
	}
	if r.err == nil && r.i != len(payload) {
		return nil, malformed("table section has trailing bytes")
	}
	return p, r.err
}

type segment struct {
	offset uint32
	data   []byte
}

// mergeGrowthSlack is how much a merge may grow a data section beyond
// twice its size when that is more.
const mergeGrowthSlack = 64 << 10

// mergeData merges active memory-0 segments with constant offsets. If any
// segment is passive, uses another memory, a non-constant offset, or the
// segments are not in ascending non-overlapping order, the section is left
// unchanged (indices of passive segments must not move; overlapping
// segments depend on their order). So is it when the merged section would
// be larger than max(2 × len(payload), len(payload) + 64 KiB): the zero
// fill of the gaps must not let a small binary grow into a large one.
func mergeData(payload []byte, gap int) ([]byte, int, int, error) {
	r := reader{b: payload}
	n := r.vecLen("data segment")
	if r.err != nil {
		return nil, 0, 0, r.err
	}
	var segs []segment
	mergeable := true
	for range n {
		flag := r.u32()
		if flag != 0 {
			mergeable = false
			break
		}
		if r.byte() != 0x41 { // i32.const
			mergeable = false
			break
		}
		off := r.s32()
		if r.byte() != 0x0b || off < 0 {
			mergeable = false
			break
		}
		l := r.u32()
		if r.err != nil || uint64(l) > uint64(len(payload)-r.i) {
			return nil, 0, 0, malformed("data segment overruns its section")
		}
		segs = append(segs, segment{offset: uint32(off), data: payload[r.i : r.i+int(l)]})
		r.i += int(l)
	}
	if r.err != nil {
		return nil, 0, 0, r.err
	}
	if !mergeable {
		return payload, n, n, nil
	}
	// Disjoint segments may be applied in any order, so sort them; if any
	// two overlap, the result depends on their order: leave them alone.
	slices.SortStableFunc(segs, func(a, b segment) int { return cmp.Compare(a.offset, b.offset) })
	for i := 1; i < len(segs); i++ {
		prevEnd := uint64(segs[i-1].offset) + uint64(len(segs[i-1].data))
		if uint64(segs[i].offset) < prevEnd {
			return payload, n, n, nil
		}
	}
	// Plan the merged segments as runs of segs (first index, memory
	// span) and size the result before building it.
	type run struct {
		first    int
		from, to uint64 // memory offsets
	}
	var runs []run
	for i, s := range segs {
		end := uint64(s.offset) + uint64(len(s.data))
		if k := len(runs); k > 0 && uint64(s.offset)-runs[k-1].to <= uint64(gap) {
			runs[k-1].to = end
			continue
		}
		runs = append(runs, run{first: i, from: uint64(s.offset), to: end})
	}
	limit := max(2*uint64(len(payload)), uint64(len(payload))+mergeGrowthSlack)
	size := uint64(len(appendU32(nil, uint32(len(runs)))))
	for _, rn := range runs {
		l := rn.to - rn.from
		size += 2 + uint64(len(appendS32(nil, int32(rn.from)))) + 1 + uint64(len(appendU32(nil, uint32(l)))) + l
		if size > limit {
			return payload, n, n, nil
		}
	}
	out := make([]byte, 0, size)
	out = appendU32(out, uint32(len(runs)))
	for k, rn := range runs {
		last := len(segs)
		if k+1 < len(runs) {
			last = runs[k+1].first
		}
		out = append(out, 0x00, 0x41)
		out = appendS32(out, int32(rn.from))
		out = append(out, 0x0b)
		out = appendU32(out, uint32(rn.to-rn.from))
		pos := rn.from
		for _, s := range segs[rn.first:last] {
			out = append(out, make([]byte, uint64(s.offset)-pos)...)
			out = append(out, s.data...)
			pos = uint64(s.offset) + uint64(len(s.data))
		}
	}
	return out, n, len(runs), nil
}

type reader struct {
	b   []byte
	i   int
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = malformed("truncated %s at byte %d", what, r.i)
	}
}

// failAt records a malformed-binary error about the byte at offset at,
// unless an error is already recorded.
func (r *reader) failAt(at int, format string, args ...any) {
	if r.err == nil {
		r.err = malformed("%s at byte %d", fmt.Sprintf(format, args...), at)
	}
}

func (r *reader) byte() byte {
	if r.err != nil || r.i >= len(r.b) {
		r.fail("byte")
		return 0
	}
	c := r.b[r.i]
	r.i++
	return c
}

func (r *reader) u32() uint32 {
	var v uint64
	for shift := 0; shift < 35; shift += 7 {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			if v > 0xffffffff {
				r.err = malformed("u32 overflow at byte %d", r.i)
				return 0
			}
			return uint32(v)
		}
	}
	r.err = malformed("u32 too long at byte %d", r.i)
	return 0
}

// s32 reads a signed LEB128 of at most 5 bytes whose unused bits in the
// last byte extend the sign.
func (r *reader) s32() int32 {
	return int32(r.sleb(32, "s32"))
}

// s64 reads a signed LEB128 of at most 10 bytes whose unused bits in the
// last byte extend the sign.
func (r *reader) s64() int64 {
	return r.sleb(64, "s64")
}

func (r *reader) sleb(bits uint, what string) int64 {
	var v int64
	var shift uint
	for {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= int64(c&0x7f) << shift
		shift += 7
		if c < 0x80 {
			if shift >= bits {
				// The last byte holds bits-(shift-7) value bits; the
				// rest must repeat the sign bit.
				used := bits - (shift - 7)
				sign := c >> (used - 1) & 1
				rest := c &^ (1<<used - 1) & 0x7f
				if want := (0x7f &^ (byte(1)<<used - 1)) * sign; rest != want {
					r.err = malformed("%s overflow at byte %d", what, r.i)
					return 0
				}
			}
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v
		}
		if shift >= bits {
			r.err = malformed("%s too long at byte %d", what, r.i)
			return 0
		}
	}
}

// skip steps over n bytes.
func (r *reader) skip(n int, what string) {
	if r.err != nil || n > len(r.b)-r.i {
		r.fail(what)
		return
	}
	r.i += n
}

// vecLen reads a vector length. Every entry takes at least one byte, so a
// length larger than the bytes left is malformed; checking it first
// bounds every allocation by the size of the binary.
func (r *reader) vecLen(what string) int {
	at := r.i
	n := r.u32()
	if r.err != nil {
		return 0
	}
	if left := len(r.b) - r.i; uint64(n) > uint64(left) {
		r.failAt(at, "%s count %d larger than the %d bytes left", what, n, left)
		return 0
	}
	return int(n)
}

func (r *reader) name() string {
	at := r.i
	n := r.u32()
	if r.err != nil || uint64(n) > uint64(len(r.b)-r.i) {
		r.fail("name")
		return ""
	}
	b := r.b[r.i : r.i+int(n)]
	if !utf8.Valid(b) {
		r.failAt(at, "name is not valid UTF-8")
		return ""
	}
	r.i += int(n)
	return string(b)
}

// nameMap reads a vector of (index, name) pairs.
func (r *reader) nameMap() {
	n := r.vecLen("name")
	for range n {
		r.u32()
		r.name()
		if r.err != nil {
			return
		}
	}
}

func (r *reader) valtypes() []ValueType {
	n := r.vecLen("value type")
	if r.err != nil {
		return nil
	}
	v := r.b[r.i : r.i+n]
	for k, t := range v {
		if !isValueType(t) {
			r.failAt(r.i+k, "bad value type 0x%02x", t)
			return nil
		}
	}
	r.i += n
	return append([]ValueType(nil), v...)
}

// limits reads limits with flags 0 to 3 (bit 0: a maximum follows, bit
// 1: shared) and checks that the minimum is not above the maximum.
func (r *reader) limits() Limits {
	at := r.i
	flag := r.byte()
	var l Limits
	if r.err != nil {
		return l
	}
	if flag > 0x03 {
		r.failAt(at, "unsupported limits flag 0x%x (64-bit memories are not supported)", flag)
		return l
	}
	l.Shared = flag&0x02 != 0
	l.Min = r.u32()
	if flag&0x01 != 0 {
		l.Max, l.HasMax = r.u32(), true
	}
	if r.err == nil && l.HasMax && l.Min > l.Max {
		r.failAt(at, "limits minimum %d above maximum %d", l.Min, l.Max)
	}
	return l
}

// memLimits reads a memory type: at most 65536 pages, and a maximum when
// shared.
func (r *reader) memLimits() Limits {
	at := r.i
	l := r.limits()
	switch {
	case r.err != nil:
	case l.Min > pagesLimit:
		r.failAt(at, "memory minimum %d pages, more than %d", l.Min, pagesLimit)
	case l.HasMax && l.Max > pagesLimit:
		r.failAt(at, "memory maximum %d pages, more than %d", l.Max, pagesLimit)
	case l.Shared && !l.HasMax:
		r.failAt(at, "shared memory without a maximum")
	}
	return l
}

// tableType reads a table type: funcref or externref elements, unshared
// limits with a minimum of at most 2^27.
func (r *reader) tableType() TableType {
	at := r.i
	t := TableType{Elem: r.byte()}
	if r.err == nil && !isRefType(t.Elem) {
		r.failAt(at, "table of %s", typeName(t.Elem))
		return t
	}
	t.Limits = r.limits()
	switch {
	case r.err != nil:
	case t.Limits.Shared:
		r.failAt(at, "shared table")
	case t.Limits.Min > indexLimit:
		r.failAt(at, "table minimum %d, more than %d", t.Limits.Min, indexLimit)
	}
	return t
}

// globalType reads a value type and a mutability byte (0 or 1).
func (r *reader) globalType() GlobalType {
	at := r.i
	g := GlobalType{Type: r.byte()}
	if r.err == nil && !isValueType(g.Type) {
		r.failAt(at, "global of %s", typeName(g.Type))
		return g
	}
	switch mut := r.byte(); {
	case r.err != nil:
	case mut > 1:
		r.failAt(at+1, "global mutability %d (want 0 or 1)", mut)
	default:
		g.Mutable = mut == 1
	}
	return g
}

func appendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

func appendS32(b []byte, v int32) []byte {
	x := int64(v)
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if (x == 0 && c&0x40 == 0) || (x == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// ReplaceCustom returns m's binary without its custom sections named
// name, and with one of that name holding payload appended at its end
// (where a custom section may always be). The binary m read is not
// modified.
func ReplaceCustom(m *Module, name string, payload []byte) []byte {
	out := make([]byte, 0, len(m.bin)+len(name)+len(payload)+12)
	out = append(out, m.bin[:8]...)
	for _, s := range m.sections {
		if s.id == secCustom {
			r := reader{b: m.bin[:s.end], i: s.start}
			if r.name() == name && r.err == nil {
				continue
			}
		}
		out = append(out, m.bin[s.headerStart:s.end]...)
	}
	body := appendName(nil, name)
	body = append(body, payload...)
	out = append(out, secCustom)
	out = appendU32(out, uint32(len(body)))
	return append(out, body...)
}
