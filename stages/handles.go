package stages

import (
	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// handleEntry is one resource a session's guest can name.
type handleEntry struct {
	kind     abi.HandleKind
	declared bool // declared by the operator; a guest cannot free it
	// weights: a read-only buffer over shared weights (buffer is their
	// device copy); nothing may write or free it.
	weights *Weights
	// dirs are a program's argument directions ("in", "out", "inout"),
	// from its kernel's description; nil when it has none.
	dirs []string
	// vendor is a vendor kernel's declaration (launched only with
	// stream_launch); nil for a built-in program.
	vendor  *hw.KernelInfo
	freed   bool
	name    string // for buffers from buffer_alloc_named
	stream  hw.Stream
	buffer  hw.Buffer
	program hw.Program
}

// handleTable is a session's handle table (ABI.md §2). Serial numbers are
// never reused. The operator's declared resources take the first serials
// and live in a slice, so looking up a stream or a program (every submit)
// is an index. Guest allocations take the serials after them and live in
// a map only while they are live: every serial issued is either live or
// freed, so a serial below the next one that is not live is stale, and a
// session that allocates and frees a buffer per call keeps no memory for
// the handles it freed.
type handleTable struct {
	tag       uint32
	declared  []handleEntry // serials 1..len(declared)
	allocated map[uint32]*handleEntry
	next      uint32 // the next serial to issue
	byName    [4]map[string]abi.Handle
	named     map[string]abi.Handle // live buffers from buffer_alloc_named
	weights   map[string]abi.Handle // the weights the session lists, by name
}

func newHandleTable(tag uint32) *handleTable {
	t := &handleTable{tag: tag, next: 1, allocated: map[uint32]*handleEntry{}, named: map[string]abi.Handle{}, weights: map[string]abi.Handle{}}
	for i := range t.byName {
		t.byName[i] = map[string]abi.Handle{}
	}
	return t
}

// maxSerial is the last serial a session may issue (serials are 32-bit).
const maxSerial = 1<<32 - 2

// declare adds an operator-declared resource. All declarations come
// before any guest allocation.
func (t *handleTable) declare(e handleEntry, name string) abi.Handle {
	if len(t.allocated) > 0 || int(t.next) != len(t.declared)+1 {
		panic("stages: declaration after a guest allocation")
	}
	e.declared = true
	t.declared = append(t.declared, e)
	h := abi.MakeHandle(e.kind, t.tag, t.next)
	t.next++
	if e.weights != nil {
		t.weights[name] = h // a namespace of its own, apart from declared buffers
	} else {
		t.byName[e.kind][name] = h
	}
	return h
}

// allocate adds a guest-allocated buffer.
func (t *handleTable) allocate(e *handleEntry) (abi.Handle, error) {
	if t.next > maxSerial {
		return 0, errdefs.Errorf(errdefs.ErrOutOfBudget, "the session has used every handle serial number")
	}
	h := abi.MakeHandle(abi.KindBuffer, t.tag, t.next)
	t.allocated[t.next] = e
	t.next++
	return h, nil
}

// live is the number of guest allocations not freed.
func (t *handleTable) live() int { return len(t.allocated) }

// free forgets a guest allocation: its handle is stale from now on.
func (t *handleTable) free(h abi.Handle) {
	if e := t.allocated[h.Serial()]; e != nil {
		e.freed = true
		if e.name != "" {
			delete(t.named, e.name)
		}
		delete(t.allocated, h.Serial())
	}
}

// get resolves a guest handle of the wanted kind. It never allocates: the
// errors are the abi sentinels.
func (t *handleTable) get(raw uint64, kind abi.HandleKind) (*handleEntry, error) {
	h := abi.Handle(raw)
	if h == 0 {
		return nil, abi.ErrBadHandle
	}
	if h.Tag() != t.tag {
		return nil, abi.ErrForeignHandle
	}
	serial := h.Serial()
	if h.Kind() != kind || serial == 0 || serial >= t.next {
		return nil, abi.ErrBadHandle
	}
	if int(serial) <= len(t.declared) {
		e := &t.declared[serial-1]
		if e.kind != kind {
			return nil, abi.ErrBadHandle
		}
		return e, nil
	}
	// A guest allocation: only buffers are allocated.
	if kind != abi.KindBuffer {
		return nil, abi.ErrBadHandle
	}
	e := t.allocated[serial]
	if e == nil {
		return nil, abi.ErrStaleHandle
	}
	return e, nil
}

func (t *handleTable) lookup(kind abi.HandleKind, name []byte) (abi.Handle, bool) {
	h, ok := t.byName[kind][string(name)]
	return h, ok
}
