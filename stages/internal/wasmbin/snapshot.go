package wasmbin

import (
	"strconv"
)

// SnapshotBlocker returns why the module's state after initialisation
// cannot be captured as its linear memory and mutable globals alone, or ""
// when it can. A snapshot cannot be taken when initialisation could leave
// state elsewhere or when the captured module would need something the
// snapshot drops:
//
//   - memory.init or data.drop (the snapshot drops the data segments);
//   - table.set, table.grow, table.fill, table.copy, table.init or
//     elem.drop (tables are not captured);
//   - a mutable global of a reference or vector type (its value cannot
//     be read back as a number);
//   - more or less than one memory.
//
// It decodes every function body once.
func (m *Module) SnapshotBlocker() string {
	if m.NumMemories != 1 {
		return "it does not have exactly one memory"
	}
	for i, g := range m.Globals {
		if g.Mutable && g.Type != typeI32 && g.Type != typeI64 && g.Type != typeF32 && g.Type != typeF64 {
			return "global " + strconv.Itoa(i) + " is a mutable " + typeName(g.Type)
		}
	}
	if len(m.Code) != len(m.funcs) {
		return "its code section does not match its function section"
	}
	d := newCodeDecoder(m)
	why := ""
	for i := range m.Code {
		err := d.decodeBody(i, func(in *instr) {
			if why != "" {
				return
			}
			name := ""
			switch {
			case in.op == opTableSet:
				name = "table.set"
			case in.op == opMiscPrefix:
				switch in.sub {
				case 8:
					name = "memory.init"
				case 9:
					name = "data.drop"
				case 12:
					name = "table.init"
				case 13:
					name = "elem.drop"
				case 14:
					name = "table.copy"
				case 15:
					name = "table.grow"
				case 17:
					name = "table.fill"
				}
			}
			if name != "" {
				why = "function " + strconv.Itoa(m.nImpFunc+i) + " uses " + name
			}
		})
		if err != nil {
			return err.Error()
		}
		if why != "" {
			return why
		}
	}
	return ""
}

// GlobalExportName is the name under which [Module.Freeze] exports the
// global of index i.
func GlobalExportName(prefix string, i int) string { return prefix + strconv.Itoa(i) }

// FreezeOptions say how [Module.Freeze] rewrites a module.
type FreezeOptions struct {
	// ExportPrefix names the exports added for every mutable defined
	// global: ExportPrefix followed by the global's index in decimal.
	ExportPrefix string
	// StartExport, when the module has a start function, exports it
	// under this name, so that the host can call it itself once it has
	// written the data segments (see [Module.ActiveData]).
	StartExport string
	// Strip removes what the host then does itself: the start section,
	// the data segments and the data count section.
	Strip bool
}

// DataSegment is an active data segment: bytes written at Offset of
// memory 0 when the module is instantiated.
type DataSegment struct {
	Offset uint32
	Bytes  []byte
}

// ActiveData returns the module's active data segments in order, the
// bytes an instantiation writes into memory 0 before the start function.
// Passive segments are left out: only memory.init can use them. It fails
// when an active segment's offset is not an i32.const.
func (m *Module) ActiveData() ([]DataSegment, error) {
	var out []DataSegment
	for _, s := range m.sections {
		if s.id != secData {
			continue
		}
		r := reader{b: m.bin[:s.end], i: s.start}
		n := r.vecLen("data segment")
		for i := 0; i < n && r.err == nil; i++ {
			flag := r.u32()
			if flag == 2 {
				r.u32() // memory index, checked by Parse to be 0
			}
			active := flag != 1
			var off int32
			if active {
				if r.byte() != 0x41 { // i32.const
					return nil, malformed("data segment %d: its offset is not an i32.const", i)
				}
				off = r.s32()
				if r.byte() != 0x0b {
					return nil, malformed("data segment %d: its offset is not an i32.const", i)
				}
			}
			l := r.u32()
			if r.err != nil || uint64(l) > uint64(s.end-r.i) {
				return nil, malformed("data segment %d overruns its section", i)
			}
			if active {
				out = append(out, DataSegment{Offset: uint32(off), Bytes: m.bin[r.i : r.i+int(l)]})
			}
			r.i += int(l)
		}
		if r.err != nil {
			return nil, r.err
		}
	}
	return out, nil
}

// Freeze returns the binary with every mutable defined global exported
// (so that the host can read and set it), the start function exported
// under opt.StartExport and, with Strip, without its start section and
// data segments, which the host applies itself or replaces with captured
// memory. Every index in the module stays what it was. It returns the
// indices of the exported globals. It fails when an export name it would
// add is already taken.
func (m *Module) Freeze(opt FreezeOptions) ([]byte, []int, error) {
	var mutable []int
	for i := m.nImpGlobal; i < len(m.Globals); i++ {
		if m.Globals[i].Mutable {
			mutable = append(mutable, i)
		}
	}
	if opt.ExportPrefix == "" && len(mutable) > 0 {
		return nil, nil, malformed("freeze: no export prefix")
	}
	type added struct {
		name  string
		kind  byte
		index uint32
	}
	var adds []added
	for _, i := range mutable {
		adds = append(adds, added{GlobalExportName(opt.ExportPrefix, i), KindGlobal, uint32(i)})
	}
	if m.HasStart && opt.StartExport != "" {
		adds = append(adds, added{opt.StartExport, KindFunc, m.StartFunc})
	}
	for _, a := range adds {
		if _, taken := m.Export(a.name); taken {
			return nil, nil, malformed("freeze: the module already exports %q", a.name)
		}
	}
	appendExports := func(p []byte) []byte {
		for _, a := range adds {
			p = appendName(p, a.name)
			p = append(p, a.kind)
			p = appendU32(p, a.index)
		}
		return p
	}
	bin := m.bin
	out := append(make([]byte, 0, len(bin)+16*len(mutable)), bin[:8]...)
	emit := func(id byte, payload []byte) {
		out = append(out, id)
		out = appendU32(out, uint32(len(payload)))
		out = append(out, payload...)
	}
	exported := len(adds) == 0
	for _, s := range m.sections {
		payload := bin[s.start:s.end]
		if s.id != secCustom && !exported && sectionRank(s.id) > sectionRank(secExport) {
			emit(secExport, appendExports(appendU32(nil, uint32(len(adds)))))
			exported = true
		}
		switch s.id {
		case secExport:
			p := appendU32(nil, uint32(len(m.Exports)+len(adds)))
			r := reader{b: bin[:s.end], i: s.start}
			r.u32()
			if r.err != nil {
				return nil, nil, r.err
			}
			payload = appendExports(append(p, bin[r.i:s.end]...))
			exported = true
		case secStart, secData, secDataCount:
			if opt.Strip {
				continue
			}
		}
		emit(s.id, payload)
	}
	if !exported {
		emit(secExport, appendExports(appendU32(nil, uint32(len(adds)))))
	}
	return out, mutable, nil
}
