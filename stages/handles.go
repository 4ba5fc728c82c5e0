package stages

import (
	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/hw"
)

// handleEntry is one resource a session's guest can name.
type handleEntry struct {
	kind     abi.HandleKind
	declared bool // declared by the operator; a guest cannot free it
	freed    bool
	name     string // for buffers from buffer_alloc_named
	stream   hw.Stream
	buffer   hw.Buffer
	program  hw.Program
}

// handleTable is a session's handle table (ABI.md §2). Serial numbers
// index entries directly and are never reused, so a freed entry stays as
// a tombstone that answers STALE_HANDLE.
type handleTable struct {
	tag     uint32
	entries []handleEntry // entries[serial-1]
	byName  [4]map[string]abi.Handle
	named   map[string]abi.Handle // live buffers from buffer_alloc_named
	live    int                   // allocated, unfreed buffers
}

func newHandleTable(tag uint32) *handleTable {
	t := &handleTable{tag: tag, named: map[string]abi.Handle{}}
	for i := range t.byName {
		t.byName[i] = map[string]abi.Handle{}
	}
	return t
}

// maxHandles bounds the table; handle serials are 32-bit.
const maxHandles = 1<<32 - 2

func (t *handleTable) add(e handleEntry, name string) (abi.Handle, error) {
	if len(t.entries) >= maxHandles {
		return 0, hw.Errorf(hw.ErrOutOfBudget, "the session has used every handle serial number")
	}
	t.entries = append(t.entries, e)
	h := abi.MakeHandle(e.kind, t.tag, uint32(len(t.entries)))
	if name != "" {
		t.byName[e.kind][name] = h
	}
	return h, nil
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
	if h.Kind() != kind || serial == 0 || int(serial) > len(t.entries) {
		return nil, abi.ErrBadHandle
	}
	e := &t.entries[serial-1]
	if e.kind != kind {
		return nil, abi.ErrBadHandle
	}
	if e.freed {
		return nil, abi.ErrStaleHandle
	}
	return e, nil
}

func (t *handleTable) lookup(kind abi.HandleKind, name []byte) (abi.Handle, bool) {
	h, ok := t.byName[kind][string(name)]
	return h, ok
}
