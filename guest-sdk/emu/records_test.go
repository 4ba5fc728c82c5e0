package emu

import (
	"encoding/binary"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

// These tests call the ABI surface directly, with records the SDK never
// produces.

func record(kind, off, length, reserved uint32, value uint64) []byte {
	r := make([]byte, 24)
	binary.LittleEndian.PutUint32(r[0:], kind)
	binary.LittleEndian.PutUint32(r[4:], off)
	binary.LittleEndian.PutUint32(r[8:], length)
	binary.LittleEndian.PutUint32(r[12:], reserved)
	binary.LittleEndian.PutUint64(r[16:], value)
	return r
}

func batchRecord(prog uint64, ptr, count uint32) []byte {
	r := make([]byte, 16)
	binary.LittleEndian.PutUint64(r[0:], prog)
	binary.LittleEndian.PutUint32(r[8:], ptr)
	binary.LittleEndian.PutUint32(r[12:], count)
	return r
}

func cat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

func st(s stagehost.Status) int32 { return int32(s) }

func TestRawStatuses(t *testing.T) {
	e := New(NewConfig()).Stream("s0").Buffer("b", 16).Programs("fill")
	h := (*abiHost)(e)
	s, _ := h.StreamGet([]byte("s0"))
	b, _ := h.BufferGet([]byte("b"))
	p, _ := h.ProgramGet([]byte("fill"))
	ok := record(1, 0, toEnd, 0, b)
	val := record(0, 0, 0, 0, 0x40200000)
	serialOnly := func(h uint64) uint64 { return h &^ (0xFF << 56) }
	foreignTag := b ^ 1<<40

	submit := []struct {
		name   string
		stream uint64
		prog   uint64
		args   []byte
		count  uint32
		want   stagehost.Status
	}{
		{"valid", s, p, cat(ok, val), 2, stagehost.StatusOK},
		{"stream handle of kind buffer", b, p, cat(ok, val), 2, stagehost.StatusBadHandle},
		{"program handle of kind stream", s, s, cat(ok, val), 2, stagehost.StatusBadHandle},
		{"kind bits cleared", s, serialOnly(p), cat(ok, val), 2, stagehost.StatusBadHandle},
		{"serial never issued", s, p + 100, cat(ok, val), 2, stagehost.StatusBadHandle},
		{"foreign tag", s, p ^ 1<<33, cat(ok, val), 2, stagehost.StatusForeignHandle},
		{"foreign buffer arg", s, p, cat(record(1, 0, 4, 0, foreignTag), val), 2, stagehost.StatusForeignHandle},
		{"arg kind 2", s, p, cat(record(2, 0, 4, 0, b), val), 2, stagehost.StatusInvalidArgument},
		{"reserved set", s, p, cat(record(1, 0, 4, 1, b), val), 2, stagehost.StatusInvalidArgument},
		{"buffer arg with program handle", s, p, cat(record(1, 0, 4, 0, p), val), 2, stagehost.StatusBadHandle},
		{"range past end", s, p, cat(record(1, 12, 8, 0, b), val), 2, stagehost.StatusInvalidArgument},
		{"offset past end with ToEnd", s, p, cat(record(1, 17, toEnd, 0, b), val), 2, stagehost.StatusInvalidArgument},
		{"offset+length wraps u32", s, p, cat(record(1, 8, 0xFFFFFFF8, 0, b), val), 2, stagehost.StatusInvalidArgument},
		{"17 args", s, p, make([]byte, 17*24), 17, stagehost.StatusInvalidArgument},
		{"records shorter than count", s, p, ok, 2, stagehost.StatusOutOfBounds},
	}
	for _, c := range submit {
		if got := h.StreamSubmit(c.stream, c.prog, c.args, c.count); got != st(c.want) {
			t.Errorf("submit %s: %v, want %v", c.name, stagehost.Status(got), c.want)
		}
	}
	if got := h.StreamSync(s); got != 0 {
		t.Fatalf("sync: %v", stagehost.Status(got))
	}

	args := cat(ok, val)
	batch := []struct {
		name  string
		cmds  []byte
		count uint32
		want  stagehost.Status
	}{
		{"valid", cat(batchRecord(p, 0, 2), batchRecord(p, 0, 2)), 2, stagehost.StatusOK},
		{"args_ptr outside", cat(batchRecord(p, 0, 2), batchRecord(p, 24, 2)), 2, stagehost.StatusOutOfBounds},
		{"cmds shorter than count", batchRecord(p, 0, 2), 2, stagehost.StatusOutOfBounds},
		{"too many commands", make([]byte, 1025*16), 1025, stagehost.StatusInvalidArgument},
		{"too many args", batchRecord(p, 0, 17), 1, stagehost.StatusInvalidArgument},
		{"bad program in second", cat(batchRecord(p, 0, 2), batchRecord(b, 0, 2)), 2, stagehost.StatusBadHandle},
	}
	for _, c := range batch {
		if got := h.StreamSubmitBatch(s, c.cmds, args, c.count); got != st(c.want) {
			t.Errorf("batch %s: %v, want %v", c.name, stagehost.Status(got), c.want)
		}
	}
	if n := e.Pending("s0"); n != 2 {
		t.Errorf("%d pending: a rejected batch enqueued commands", n)
	}
	if got := h.StreamSync(s); got != 0 {
		t.Fatalf("sync: %v", stagehost.Status(got))
	}
	if _, got := h.StreamIdle(b); got != st(stagehost.StatusBadHandle) {
		t.Errorf("idle on a buffer: %v", stagehost.Status(got))
	}
	if _, got := h.BufferSize(0); got != st(stagehost.StatusBadHandle) {
		t.Errorf("size of 0: %v", stagehost.Status(got))
	}
}

func TestRawCallState(t *testing.T) {
	e := New(NewConfig())
	h := (*abiHost)(e)
	e.entry, e.input = "entry", []byte("abc")
	if n, got := h.EntryName(make([]byte, 2)); n != 5 || got != st(stagehost.StatusOutOfBounds) {
		t.Errorf("entry_name too small: %d %v", n, got)
	}
	if _, got := h.InputRead(4, make([]byte, 1)); got != st(stagehost.StatusInvalidArgument) {
		t.Errorf("input_read past end: %v", got)
	}
	if n, got := h.InputRead(3, make([]byte, 1)); n != 0 || got != 0 {
		t.Errorf("input_read at end: %d %v", n, got)
	}
	if n, got := h.InputRead(1, make([]byte, 8)); n != 2 || got != 0 {
		t.Errorf("input_read: %d %v", n, got)
	}
	if _, got := h.BufferAlloc(0); got != st(stagehost.StatusInvalidArgument) {
		t.Errorf("alloc 0: %v", got)
	}
}
