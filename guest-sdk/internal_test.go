package stagehost

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stagehost/stagehost/guest-sdk/internal/host"
)

// fakeHost answers every call with OK and records what it got. Methods
// named in the fields override the defaults.
type fakeHost struct {
	host.Host // nil: unexpected calls panic

	submits   [][]byte
	batchCmds []byte
	batchArgs []byte
	entry     string
	writesLen bool // entry_name reports the needed length on OUT_OF_BOUNDS
	errMsg    []byte
	input     []byte
	chunk     int // input_read returns at most chunk bytes (0: all)
	shortRead bool

	// refuse makes every call below return INVALID_ARGUMENT, with
	// lastErr as its last error.
	refuse   bool
	lastErr  string
	launches [][]byte
	offsets  []uint32 // stream_write's and stream_read's
	sizes    []uint32 // buffer_alloc's and buffer_alloc_named's
}

func (f *fakeHost) status() int32 {
	if f.refuse {
		return int32(StatusInvalidArgument)
	}
	return 0
}

func (f *fakeHost) StreamSubmit(s, p uint64, args []byte, count uint32) int32 {
	f.submits = append(f.submits, bytes.Clone(args[:count*argRecordSize]))
	return f.status()
}

func (f *fakeHost) StreamSubmitBatch(s uint64, cmds, args []byte, count uint32) int32 {
	f.batchCmds, f.batchArgs = bytes.Clone(cmds[:count*batchRecordSize]), bytes.Clone(args)
	return f.status()
}

func (f *fakeHost) StreamLaunch(s, p uint64, grid, block [3]uint32, shared uint32, args []byte, count uint32) int32 {
	f.launches = append(f.launches, bytes.Clone(args[:count*argRecordSize]))
	return f.status()
}

func (f *fakeHost) StreamWrite(s, b uint64, off uint32, src []byte) int32 {
	f.offsets = append(f.offsets, off)
	return f.status()
}

func (f *fakeHost) StreamRead(s, b uint64, off uint32, dst []byte) int32 {
	f.offsets = append(f.offsets, off)
	return f.status()
}

func (f *fakeHost) BufferAlloc(size uint32) (uint64, int32) {
	f.sizes = append(f.sizes, size)
	return 0, f.status()
}

func (f *fakeHost) BufferAllocNamed(name []byte, size uint32) (uint64, int32) {
	f.sizes = append(f.sizes, size)
	return 0, f.status()
}

func (f *fakeHost) LastError(dst []byte) (uint32, int32) {
	if len(dst) < len(f.lastErr) {
		return uint32(len(f.lastErr)), int32(StatusOutOfBounds)
	}
	return uint32(copy(dst, f.lastErr)), 0
}

func (f *fakeHost) EntryName(dst []byte) (uint32, int32) {
	if len(dst) < len(f.entry) {
		if f.writesLen {
			return uint32(len(f.entry)), int32(StatusOutOfBounds)
		}
		return 0, int32(StatusOutOfBounds)
	}
	return uint32(copy(dst, f.entry)), 0
}

func (f *fakeHost) ErrorSet(msg []byte) int32 {
	f.errMsg = bytes.Clone(msg)
	return 0
}

func (f *fakeHost) InputSize() (uint32, int32) { return uint32(len(f.input)), 0 }

func (f *fakeHost) InputRead(off uint32, dst []byte) (uint32, int32) {
	if f.shortRead {
		return 0, 0
	}
	if f.chunk > 0 && len(dst) > f.chunk {
		dst = dst[:f.chunk]
	}
	return uint32(copy(dst, f.input[off:])), 0
}

func attach(t *testing.T, f *fakeHost) {
	detach := host.Attach(f)
	t.Cleanup(detach)
}

func TestArgRecords(t *testing.T) {
	f := &fakeHost{}
	attach(t, f)
	b := Buffer{0x0200000700000009}
	s := Stream{0x0100000700000001}
	p := Program{0x0300000700000002}
	if err := s.Submit(p, Buf(b, 8, 16), Whole(b), U32(0xDEADBEEF), U64(1<<40|3), F32(2.5)); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		kind, off, length, reserved uint32
		value                       uint64
	}{
		{1, 8, 16, 0, b.h},
		{1, 0, 0xFFFFFFFF, 0, b.h},
		{0, 0, 0, 0, 0xDEADBEEF},
		{0, 0, 0, 0, 1<<40 | 3},
		{0, 0, 0, 0, uint64(math.Float32bits(2.5))},
	}
	rec := f.submits[0]
	if len(rec) != len(want)*24 {
		t.Fatalf("%d record bytes", len(rec))
	}
	for i, w := range want {
		r := rec[i*24:]
		got := [4]uint32{
			binary.LittleEndian.Uint32(r[0:]), binary.LittleEndian.Uint32(r[4:]),
			binary.LittleEndian.Uint32(r[8:]), binary.LittleEndian.Uint32(r[12:]),
		}
		if got != [4]uint32{w.kind, w.off, w.length, w.reserved} || binary.LittleEndian.Uint64(r[16:]) != w.value {
			t.Errorf("record %d: % x", i, r[:24])
		}
	}
}

func TestBatchRecords(t *testing.T) {
	f := &fakeHost{}
	attach(t, f)
	s := Stream{1}
	p1, p2 := Program{0x0300000100000005}, Program{0x0300000100000006}
	b := Buffer{0x0200000100000007}
	err := s.SubmitBatch(
		Cmd(p1, Whole(b), F32(1)),
		Cmd(p2),
		Cmd(p1, U32(7)),
	)
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		prog       uint64
		ptr, count uint32
	}
	want := []rec{{p1.h, 0, 2}, {p2.h, 48, 0}, {p1.h, 48, 1}}
	for i, w := range want {
		r := f.batchCmds[i*16:]
		got := rec{binary.LittleEndian.Uint64(r), binary.LittleEndian.Uint32(r[8:]), binary.LittleEndian.Uint32(r[12:])}
		if got != w {
			t.Errorf("batch record %d = %+v, want %+v", i, got, w)
		}
	}
	if v := binary.LittleEndian.Uint64(f.batchArgs[48+16:]); v != 7 {
		t.Errorf("third command's scalar = %d", v)
	}
	if err := s.SubmitBatch(); err != nil {
		t.Errorf("empty batch: %v", err)
	}
}

// TestValuesThatDoNotFitGoToTheHost: a size, offset or length that does
// not fit its 32-bit parameter is not refused by the SDK but sent as a
// value the host refuses (an offset of 2^32-1, a record's range
// [2^32-1, +2^32-2), a size of 0), so the error carries the host's last
// error (the emulator's TestValuesThatDoNotFitGetTheHostsLastError has
// the texts).
func TestValuesThatDoNotFitGoToTheHost(t *testing.T) {
	const reason = "the host's reason"
	f := &fakeHost{refuse: true, lastErr: reason}
	attach(t, f)
	s, p, b := Stream{1}, Program{2}, Buffer{3}
	one := Dim3{1, 1, 1}
	_, allocNeg := AllocBuffer(-1)
	_, allocHuge := AllocBuffer(math.MaxUint32 + 1)
	_, allocNamed := AllocNamedBuffer("kv", -1)
	for name, err := range map[string]error{
		"negative offset": s.Submit(p, Buf(b, -1, 4)),
		"huge length":     s.Submit(p, Buf(b, 0, math.MaxUint32+1)),
		"launch":          s.Launch(p, one, one, 0, U32(0), Buf(b, 8, -4)),
		"batch bad arg":   s.SubmitBatch(Cmd(p), Cmd(p, Buf(b, -4, 4))),
		"write offset":    s.Write(b, -1, nil),
		"read offset":     s.Read(b, math.MaxUint32+1, nil),
		"write from":      (&Call{}).WriteFrom(s, b, 0, -1),
		"alloc negative":  allocNeg,
		"alloc huge":      allocHuge,
		"named alloc":     allocNamed,
	} {
		var e *Error
		if !errors.As(err, &e) || e.Status != StatusInvalidArgument || e.Op == "" || e.Reason != reason {
			t.Errorf("%s: %#v, want INVALID_ARGUMENT with the host's reason", name, err)
		}
	}
	outside := func(what string, r []byte) {
		t.Helper()
		if off, n := binary.LittleEndian.Uint32(r[4:]), binary.LittleEndian.Uint32(r[8:]); off != math.MaxUint32 || n != math.MaxUint32-1 {
			t.Errorf("%s: record range [%d,+%d), want [%d,+%d)", what, off, n, uint32(math.MaxUint32), uint32(math.MaxUint32-1))
		}
	}
	if len(f.submits) != 2 || len(f.launches) != 1 || f.batchArgs == nil {
		t.Fatalf("%d submits, %d launches, batch %v", len(f.submits), len(f.launches), f.batchArgs != nil)
	}
	outside("negative offset", f.submits[0])
	outside("huge length", f.submits[1])
	outside("launch", f.launches[0][argRecordSize:])
	outside("batch", f.batchArgs)
	if want := []uint32{math.MaxUint32, math.MaxUint32, math.MaxUint32}; !slices.Equal(f.offsets, want) {
		t.Errorf("transfer offsets %v, want %v", f.offsets, want)
	}
	if want := []uint32{0, 0, 0}; !slices.Equal(f.sizes, want) {
		t.Errorf("alloc sizes %v, want %v", f.sizes, want)
	}
}

func TestNoHostAttached(t *testing.T) {
	if _, err := LookupStream("s0"); !errors.Is(err, ErrUnsupported) {
		t.Errorf("LookupStream without a host: %v", err)
	}
	if err := (Stream{1}).Sync(); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Sync without a host: %v", err)
	}
}

func TestEntryNameGrows(t *testing.T) {
	long := strings.Repeat("e", 300)
	for _, writesLen := range []bool{false, true} {
		f := &fakeHost{entry: long, writesLen: writesLen}
		detach := host.Attach(f)
		got, err := entryName()
		detach()
		if err != nil || got != long {
			t.Errorf("writesLen=%v: %q, %v", writesLen, got, err)
		}
	}
}

func TestErrorMessageCut(t *testing.T) {
	f := &fakeHost{}
	attach(t, f)
	msg := strings.Repeat("a", MaxErrorMessage-1) + "é" + "tail"
	setError(msg)
	if len(f.errMsg) != MaxErrorMessage-1 || !utf8.Valid(f.errMsg) {
		t.Errorf("cut to %d bytes, valid=%v", len(f.errMsg), utf8.Valid(f.errMsg))
	}
	setError("short")
	if string(f.errMsg) != "short" {
		t.Errorf("%q", f.errMsg)
	}
}

func TestInputInChunks(t *testing.T) {
	f := &fakeHost{input: []byte("0123456789abcdef"), chunk: 3}
	attach(t, f)
	c := &Call{}
	if got := c.Input(); string(got) != "0123456789abcdef" {
		t.Fatalf("%q", got)
	}
	f.input = []byte("changed")
	if got := c.Input(); string(got) != "0123456789abcdef" {
		t.Errorf("input not cached: %q", got)
	}
	f.shortRead = true
	if _, err := (&Call{}).ReadInput(); !errors.Is(err, ErrFault) {
		t.Errorf("short read: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("Input did not panic on a host failure")
		}
	}()
	(&Call{}).Input()
}

var registerRuns int

func TestRegisterPanics(t *testing.T) {
	fn := func(*Call) error { return nil }
	registerRuns++ // a fresh name for every -count run
	entry := "dup-test-" + strconv.Itoa(registerRuns)
	Register(entry, fn)
	for name, f := range map[string]func(){
		"empty": func() { Register("", fn) },
		"nil":   func() { Register("x", nil) },
		"dup":   func() { Register(entry, fn) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}
