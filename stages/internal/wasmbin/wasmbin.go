// Package wasmbin reads the parts of a WebAssembly binary that the host
// checks before instantiating (types, imports, exports, memories) and
// rewrites two of them: the memory maximum, to enforce a per-module limit,
// and the data segments, merged so that instantiation copies a few large
// segments instead of tens of thousands of small ones.
//
// It reads only the module structure; function bodies are left to the
// engine, which validates them when compiling.
package wasmbin

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Section ids used here.
const (
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secMemory    = 5
	secExport    = 7
	secData      = 11
	secDataCount = 12
)

// ValueType is a Wasm value type byte (0x7f i32, 0x7e i64, 0x7d f32,
// 0x7c f64, ...).
type ValueType = byte

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
	Type  FuncType // for functions, when resolvable
}

// Limits are memory limits in 64 KiB pages.
type Limits struct {
	Min    uint32
	Max    uint32
	HasMax bool
	Shared bool
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
	funcs    []uint32 // type index per defined function
	nImpFunc int
}

// ErrMalformed is returned for binaries that cannot be parsed.
var ErrMalformed = errors.New("malformed wasm binary")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// Parse reads the module structure.
func Parse(bin []byte) (*Module, error) {
	if len(bin) < 8 || !bytes.Equal(bin[:4], []byte("\x00asm")) {
		return nil, malformed("no \\0asm magic")
	}
	if v := binary.LittleEndian.Uint32(bin[4:8]); v != 1 {
		return nil, malformed("binary version %d (want 1)", v)
	}
	m := &Module{bin: bin}
	r := reader{b: bin, i: 8}
	for r.i < len(bin) {
		hs := r.i
		id := r.byte()
		size := r.u32()
		if r.err != nil {
			return nil, r.err
		}
		if r.i+int(size) > len(bin) || int(size) < 0 {
			return nil, malformed("section %d overruns the binary", id)
		}
		s := section{id: id, start: r.i, end: r.i + int(size), headerStart: hs}
		m.sections = append(m.sections, s)
		sr := reader{b: bin[:s.end], i: s.start}
		var err error
		switch id {
		case secType:
			err = m.parseTypes(&sr)
		case secImport:
			err = m.parseImports(&sr)
		case 3: // function
			n := sr.u32()
			for range n {
				m.funcs = append(m.funcs, sr.u32())
			}
			err = sr.err
		case secMemory:
			n := sr.u32()
			for range n {
				m.Memories = append(m.Memories, sr.limits())
			}
			err = sr.err
		case secExport:
			err = m.parseExports(&sr)
		}
		if err != nil {
			return nil, err
		}
		r.i = s.end
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

func (m *Module) funcType(index uint32) (FuncType, bool) {
	if int(index) < m.nImpFunc {
		n := 0
		for _, im := range m.Imports {
			if im.Kind == KindFunc {
				if n == int(index) {
					return im.Type, true
				}
				n++
			}
		}
		return FuncType{}, false
	}
	i := int(index) - m.nImpFunc
	if i >= len(m.funcs) || int(m.funcs[i]) >= len(m.Types) {
		return FuncType{}, false
	}
	return m.Types[m.funcs[i]], true
}

func (m *Module) parseTypes(r *reader) error {
	n := r.u32()
	for range n {
		if form := r.byte(); form != 0x60 {
			if r.err == nil {
				return malformed("type section: unsupported type form 0x%x", form)
			}
			break
		}
		var t FuncType
		t.Params = r.valtypes()
		t.Results = r.valtypes()
		m.Types = append(m.Types, t)
	}
	return r.err
}

func (m *Module) parseImports(r *reader) error {
	n := r.u32()
	for range n {
		im := Import{Module: r.name(), Name: r.name(), Kind: r.byte()}
		switch im.Kind {
		case KindFunc:
			ti := r.u32()
			if r.err == nil && int(ti) >= len(m.Types) {
				return malformed("import %s.%s: type index %d out of range", im.Module, im.Name, ti)
			}
			if r.err == nil {
				im.Type = m.Types[ti]
			}
			m.nImpFunc++
		case KindTable:
			r.byte() // reftype
			r.limits()
		case KindMemory:
			r.limits()
		case KindGlobal:
			r.byte()
			r.byte()
		case KindTag:
			r.byte()
			r.u32()
		default:
			if r.err == nil {
				return malformed("import %s.%s: unknown kind %d", im.Module, im.Name, im.Kind)
			}
		}
		m.Imports = append(m.Imports, im)
	}
	return r.err
}

func (m *Module) parseExports(r *reader) error {
	n := r.u32()
	for range n {
		e := Export{Name: r.name(), Kind: r.byte(), Index: r.u32()}
		m.Exports = append(m.Exports, e)
	}
	return r.err
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
}

// RewriteStats report what Rewrite did.
type RewriteStats struct {
	SegmentsBefore, SegmentsAfter int
}

// ErrMemoryLimit is returned when a memory's minimum exceeds the cap.
var ErrMemoryLimit = errors.New("memory exceeds the limit")

// Rewrite returns a new binary with the memory maximum capped and the data
// segments merged. Custom sections are kept as they are.
func (m *Module) Rewrite(opt RewriteOptions) ([]byte, RewriteStats, error) {
	var st RewriteStats
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
		case s.id == secData && opt.MergeGap > 0:
			p, before, after, err := mergeData(payload, opt.MergeGap)
			if err != nil {
				return nil, st, err
			}
			payload, st.SegmentsBefore, st.SegmentsAfter = p, before, after
		case s.id == secDataCount && opt.MergeGap > 0 && st.SegmentsAfter > 0:
			payload = appendU32(nil, uint32(st.SegmentsAfter))
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
			return nil, fmt.Errorf("%w: memory %d needs at least %d pages (%d KiB), the limit is %d pages", ErrMemoryLimit, i, l.Min, l.Min*64, maxPages)
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

type segment struct {
	offset uint32
	data   []byte
}

// mergeData merges active memory-0 segments with constant offsets. If any
// segment is passive, uses another memory, a non-constant offset, or the
// segments are not in ascending non-overlapping order, the section is left
// unchanged (indices of passive segments must not move; overlapping
// segments depend on their order).
func mergeData(payload []byte, gap int) ([]byte, int, int, error) {
	r := reader{b: payload}
	n := int(r.u32())
	segs := make([]segment, 0, n)
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
		l := int(r.u32())
		if r.err != nil || r.i+l > len(payload) {
			return nil, 0, 0, malformed("data segment overruns its section")
		}
		segs = append(segs, segment{offset: uint32(off), data: payload[r.i : r.i+l]})
		r.i += l
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
	var merged []segment
	for _, s := range segs {
		if k := len(merged); k > 0 {
			last := &merged[k-1]
			end := uint64(last.offset) + uint64(len(last.data))
			if uint64(s.offset)-end <= uint64(gap) {
				last.data = append(last.data, make([]byte, uint64(s.offset)-end)...)
				last.data = append(last.data, s.data...)
				continue
			}
		}
		merged = append(merged, segment{offset: s.offset, data: append([]byte(nil), s.data...)})
	}
	out := appendU32(nil, uint32(len(merged)))
	for _, s := range merged {
		out = append(out, 0x00, 0x41)
		out = appendS32(out, int32(s.offset))
		out = append(out, 0x0b)
		out = appendU32(out, uint32(len(s.data)))
		out = append(out, s.data...)
	}
	return out, n, len(merged), nil
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

func (r *reader) s32() int32 {
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
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return int32(v)
		}
		if shift >= 35 {
			r.err = malformed("s32 too long at byte %d", r.i)
			return 0
		}
	}
}

func (r *reader) name() string {
	n := int(r.u32())
	if r.err != nil || r.i+n > len(r.b) || n < 0 {
		r.fail("name")
		return ""
	}
	s := string(r.b[r.i : r.i+n])
	r.i += n
	return s
}

func (r *reader) valtypes() []ValueType {
	n := int(r.u32())
	if r.err != nil || r.i+n > len(r.b) {
		r.fail("value types")
		return nil
	}
	v := append([]ValueType(nil), r.b[r.i:r.i+n]...)
	r.i += n
	return v
}

func (r *reader) limits() Limits {
	flag := r.byte()
	var l Limits
	if flag > 0x03 {
		if r.err == nil {
			r.err = malformed("unsupported limits flag 0x%x (64-bit memories are not supported)", flag)
		}
		return l
	}
	l.Shared = flag&0x02 != 0
	l.Min = r.u32()
	if flag&0x01 != 0 {
		l.Max, l.HasMax = r.u32(), true
	}
	return l
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
