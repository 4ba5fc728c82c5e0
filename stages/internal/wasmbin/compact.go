package wasmbin

// compactMinShift is the smallest run of leading table entries that
// [Module.CompactTable] removes: below it the rewrite saves too little.
const compactMinShift = 64

// CompactTable removes the entries before the first element of a
// module's only table, which no element segment fills and which every
// instance would otherwise allocate and keep (a Go guest's table starts
// its 1,362 functions at entry 4096). Every element segment's offset and
// the table's limits move down by that shift, every call_indirect
// subtracts it from its index first, and every table.size adds it back,
// so the module computes what it did: an indirect call through an entry
// that was empty still traps (its index now falls outside the table).
//
// It applies only to a module with exactly one table, of funcref, not
// exported, whose active element segments all have i32.const offsets,
// and whose code reads or writes the table only through call_indirect
// and table.size (table.get, table.set, table.grow, table.fill,
// table.copy and table.init would see the shift). Otherwise, or when
// the shift would be under 64 entries, it returns nil and 0.
//
// It decodes every function body once and rewrites only the table,
// element and code sections.
func (m *Module) CompactTable() ([]byte, uint32, error) {
	if len(m.Tables) != 1 || m.Tables[0].Elem != typeFuncref {
		return nil, 0, nil
	}
	for _, e := range m.Exports {
		if e.Kind == KindTable {
			return nil, 0, nil
		}
	}
	shift, ok := m.leadingGap()
	if !ok || shift < compactMinShift {
		return nil, 0, nil
	}
	// Plan the code first: a body that touches the table otherwise
	// leaves the module as it is.
	d := newCodeDecoder(m)
	blocked := false
	for i := range m.Code {
		err := d.decodeBody(i, func(in *instr) {
			switch {
			case in.op == opTableGet || in.op == opTableSet:
				blocked = true
			case in.op == opMiscPrefix && in.sub >= 12 && in.sub <= 17 && in.sub != 16:
				blocked = true // table.init, elem.drop, table.copy, table.grow, table.fill
			}
		})
		if err != nil {
			return nil, 0, err
		}
		if blocked {
			return nil, 0, nil
		}
	}
	out := append(make([]byte, 0, len(m.bin)+len(m.bin)/16), m.bin[:8]...)
	emit := func(id byte, payload []byte) {
		out = append(out, id)
		out = appendU32(out, uint32(len(payload)))
		out = append(out, payload...)
	}
	for _, s := range m.sections {
		payload := m.bin[s.start:s.end]
		var err error
		switch s.id {
		case secTable:
			payload = m.shiftTable(shift)
		case secElement:
			payload, err = m.shiftElements(s, shift)
		case secCode:
			payload, err = m.shiftCode(d, shift)
		}
		if err != nil {
			return nil, 0, err
		}
		emit(s.id, payload)
	}
	return out, shift, nil
}

// leadingGap returns the lowest offset of an active element segment of
// table 0, or false when one is not an i32.const or there is none.
func (m *Module) leadingGap() (uint32, bool) {
	lowest, found := uint32(0), false
	ok := m.eachElement(func(active bool, off int32, _, _ int) bool {
		if !active {
			return true
		}
		if off < 0 {
			return false
		}
		if !found || uint32(off) < lowest {
			lowest, found = uint32(off), true
		}
		return true
	})
	return lowest, ok && found
}

// eachElement calls fn for every element segment with whether it is
// active, its offset and, for an active one, where its i32.const offset
// expression starts and ends in the binary. It returns false if an
// active segment's offset is not an i32.const or fn returned false.
func (m *Module) eachElement(fn func(active bool, off int32, exprStart, exprEnd int) bool) bool {
	for _, s := range m.sections {
		if s.id != secElement {
			continue
		}
		r := reader{b: m.bin[:s.end], i: s.start}
		n := r.vecLen("element segment")
		for range n {
			flags := r.u32()
			active := flags&1 == 0
			var off int32
			start, end := 0, 0
			if active {
				if flags&2 != 0 {
					r.u32() // table index: 0, the only table
				}
				start = r.i
				if r.byte() != opI32Const {
					return false
				}
				off = r.s32()
				if r.byte() != opEnd {
					return false
				}
				end = r.i
			}
			if flags&3 != 0 {
				r.byte() // element kind or type
			}
			cnt := r.vecLen("element")
			for range cnt {
				if flags&4 != 0 {
					m.constExpr(&r, typeFuncref)
				} else {
					r.u32()
				}
			}
			if r.err != nil || !fn(active, off, start, end) {
				return false
			}
		}
		if r.err != nil {
			return false
		}
	}
	return true
}

func (m *Module) shiftTable(shift uint32) []byte {
	t := m.Tables[0]
	p := appendU32(nil, 1)
	p = append(p, t.Elem)
	if t.Limits.HasMax {
		p = append(p, 0x01)
		p = appendU32(p, t.Limits.Min-shift)
		return appendU32(p, t.Limits.Max-shift)
	}
	p = append(p, 0x00)
	return appendU32(p, t.Limits.Min-shift)
}

func (m *Module) shiftElements(s section, shift uint32) ([]byte, error) {
	p := make([]byte, 0, s.end-s.start)
	prev := s.start
	ok := m.eachElement(func(active bool, off int32, start, end int) bool {
		if !active || start < s.start || end > s.end {
			return true
		}
		p = append(p, m.bin[prev:start]...)
		p = append(p, opI32Const)
		p = appendS32(p, off-int32(shift))
		p = append(p, opEnd)
		prev = end
		return true
	})
	if !ok {
		return nil, malformed("compact table: an element segment changed while being read")
	}
	return append(p, m.bin[prev:s.end]...), nil
}

// shiftCode re-encodes the code section with the index of every
// call_indirect lowered by shift and every table.size raised by it.
func (m *Module) shiftCode(d *codeDecoder, shift uint32) ([]byte, error) {
	fix := append(append([]byte{opI32Const}, appendS32(nil, int32(shift))...), opI32Sub)
	unfix := append(append([]byte{opI32Const}, appendS32(nil, int32(shift))...), opI32Add)
	p := appendU32(nil, uint32(len(m.Code)))
	var body []byte
	for i, fb := range m.Code {
		body = append(body[:0], m.bin[fb.LocalsStart:fb.Start]...)
		prev := fb.Start
		err := d.decodeBody(i, func(in *instr) {
			switch {
			case in.op == opCallIndirect:
				body = append(body, m.bin[prev:in.start]...)
				body = append(body, fix...)
				prev = in.start
			case in.op == opMiscPrefix && in.sub == 16: // table.size
				body = append(body, m.bin[prev:in.end]...)
				body = append(body, unfix...)
				prev = in.end
			}
		})
		if err != nil {
			return nil, err
		}
		body = append(body, m.bin[prev:fb.End]...)
		p = appendU32(p, uint32(len(body)))
		p = append(p, body...)
	}
	return p, nil
}
