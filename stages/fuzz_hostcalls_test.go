package stages

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// The replay guest, testdata/fuzz/hostcalls.wat, calls stagehost_v1
// imports with arguments read from its input, record by record, and
// appends each call's status to its output. FuzzHostCalls feeds it
// arbitrary records.

// replayFunctions are the guest's imports in selector order.
var replayFunctions = []string{
	abi.FnInputSize, abi.FnInputRead, abi.FnOutputWrite, abi.FnEntryName, abi.FnErrorSet,
	abi.FnLog, abi.FnStreamGet, abi.FnBufferGet, abi.FnProgramGet, abi.FnBufferAlloc,
	abi.FnBufferAllocNamed, abi.FnBufferFree, abi.FnBufferSize, abi.FnStreamWrite, abi.FnStreamRead,
	abi.FnStreamSubmit, abi.FnStreamSubmitBatch, abi.FnStreamSync, abi.FnStreamIdle,
	abi.FnLastError, abi.FnWeightsGet, abi.FnTensorGet,
}

const (
	replayRecordSize  = 44    // u32 selector, then 5 u64 arguments
	replayMemorySize  = 65536 // the guest's one page, which never grows
	replayOutputLimit = 4096
	// replayOwnTag, in the tag field of an i64 argument of a record,
	// stands for the session's own tag: the harness puts the real tag in
	// before the guest sees the record, so that inputs can name the
	// session's handles although every session gets a new tag.
	replayOwnTag = abi.MaxTag
)

// Guest memory addresses of the names the replay guest holds.
const (
	replayNameS0      = 256 // "s0"
	replayNameS1      = 264 // "s1"
	replayNameB0      = 272 // "b0"
	replayNameNoop    = 280 // "noop"
	replayNameFill    = 288 // "fill"
	replayNameWeights = 296 // "weights"
	replayNameTensor  = 304 // "weights/w"
)

// Serials of the replay session's declared handles, in declaration order:
// streams, buffers, programs, weights. Allocations start after them.
const (
	replayS0 = 1 + iota
	replayS1
	replayB0
	replayNoop
	replayFill
	replayWeights
	replayFirstAlloc
)

// replayWeightsData is the replay session's weights, "weights", with one
// tensor, "w" (all of it): every replay must leave them as they were.
var replayWeightsData = []byte("the weights every replay session shares, which none may change!!")

// own is a handle of the replay session (through replayOwnTag).
func own(kind abi.HandleKind, serial uint32) uint64 {
	return uint64(abi.MakeHandle(kind, replayOwnTag, serial))
}

// replayCall is one record of the replay guest's input.
type replayCall struct {
	fn   string
	args []uint64
}

func rec(fn string, args ...uint64) replayCall { return replayCall{fn, args} }

func encodeCalls(calls ...replayCall) []byte {
	var b []byte
	for _, c := range calls {
		sel := -1
		for i, fn := range replayFunctions {
			if fn == c.fn {
				sel = i
			}
		}
		if sel < 0 {
			panic("no host function " + c.fn)
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(sel))
		for k := range 5 {
			var v uint64
			if k < len(c.args) {
				v = c.args[k]
			}
			b = binary.LittleEndian.AppendUint64(b, v)
		}
	}
	return b
}

// replayEnv is what every replay shares: an engine that discards guest
// logs, the loaded guest, a runtime and a sim device.
type replayEnv struct {
	eng *Engine
	mod *Module
	rt  *host.Runtime
	dev *sim.Device
	w   *Weights
}

func newReplayEnv(t testing.TB) *replayEnv {
	t.Helper()
	ctx := context.Background()
	eng, err := NewEngine(ctx, NewEngineConfig().WithCacheDir("").WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close(ctx) })
	bin, err := os.ReadFile(filepath.Join("testdata", "fuzz", "hostcalls.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := eng.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithName("hostcalls"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := host.NewRuntime(host.NewConfig().WithCapacity(8))
	if err != nil {
		t.Fatal(err)
	}
	p := sim.New()
	t.Cleanup(func() { _ = p.Close() })
	dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	n := uint64(len(replayWeightsData))
	w, err := UploadWeights(ctx, dev, NewWeightsConfig("weights", int64(n)).
		WithTensors(map[string]WeightsTensor{"w": {Offset: 0, Bytes: n, DType: 20, Dims: []uint64{n}}}), bytes.NewReader(replayWeightsData))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Release)
	return &replayEnv{eng: eng, mod: mod, rt: rt, dev: dev, w: w}
}

// checkWeights fails when the weights no longer hold replayWeightsData.
func (e *replayEnv) checkWeights(t testing.TB) {
	t.Helper()
	str, err := e.dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer str.Close(context.Background())
	got := make([]byte, len(replayWeightsData))
	c, err := str.Read(e.w.buf, 0, got)
	if err == nil {
		err = c.Wait(context.Background())
	}
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, replayWeightsData) {
		t.Fatalf("a replay changed the shared weights: %q", got)
	}
}

// replayResult is one replay: the session's tag, what Run returned, and
// the state of the session after the call.
type replayResult struct {
	out          []byte
	err          error
	quarantined  error
	replacements int
}

// replay runs data through the replay guest in a new session under the
// built-in fence, closes the session, and checks what must hold for any
// input: the session is not quarantined, Close releases everything, and
// the output stays within its limit.
func (e *replayEnv) replay(t testing.TB, data []byte) replayResult {
	t.Helper()
	ctx := context.Background()
	cfg := NewSessionConfig("replay", e.dev).WithStreams("s0", "s1").WithBuffer("b0", 4096).
		WithPrograms("noop", "fill").WithBudget(16 << 20).WithOutputLimit(replayOutputLimit).
		WithStagingLimit(1 << 20).WithWeights(e.w)
	s, err := e.eng.NewSession(ctx, e.rt, e.mod, cfg)
	if err != nil {
		t.Fatal(err)
	}
	input := patchOwnTag(data, s.native.state.table.tag)
	var r replayResult
	r.out, r.err = s.Run(ctx, input, nil)
	r.quarantined, r.replacements = s.Quarantined(), s.Replacements()
	if r.quarantined != nil {
		t.Fatalf("the session was quarantined under the built-in fence: %v (Run: %v)", r.quarantined, r.err)
	}
	if len(r.out) > replayOutputLimit {
		t.Fatalf("output of %d bytes, over its limit of %d", len(r.out), replayOutputLimit)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if used := s.Owner().Budget().Used(); used != 0 {
		t.Fatalf("%d bytes still charged after Close", used)
	}
	if refs := e.w.Refs(); refs != 1 {
		t.Fatalf("the weights hold %d references after Close, want 1 (the harness's)", refs)
	}
	e.checkWeights(t)
	return r
}

// patchOwnTag returns a copy of data in which every i64 argument of a
// record that carries replayOwnTag carries tag instead.
func patchOwnTag(data []byte, tag uint32) []byte {
	in := append([]byte(nil), data...)
	for off := 0; off+replayRecordSize <= len(in); off += replayRecordSize {
		fn := replayFunctions[binary.LittleEndian.Uint32(in[off:])%uint32(len(replayFunctions))]
		for k, p := range abi.Functions[fn].Params {
			if p != abi.Functions[abi.FnStreamSync].Params[0] { // not an i64
				continue
			}
			at := in[off+4+8*k:]
			if h := abi.Handle(binary.LittleEndian.Uint64(at)); h.Tag() == replayOwnTag {
				binary.LittleEndian.PutUint64(at, uint64(abi.MakeHandle(h.Kind(), tag, h.Serial())))
			}
		}
	}
	return in
}

// replayStatuses walks data's records and the output together and
// returns the status of each record that ran. The output holds, per
// record, the bytes an output_write record appended (when it succeeded)
// and then the record's status. Whether an output_write record succeeds
// follows from its arguments and the output so far: its range must lie
// in the guest's one page (else OUT_OF_BOUNDS) and fit the output limit
// (else OUTPUT_TOO_LARGE). It also checks that the guest stopped exactly
// where it had to (its status no longer fitting the output: client error
// 1), and that every status is one ABI v1 defines.
func replayStatuses(t testing.TB, data []byte, r replayResult) []abi.Status {
	t.Helper()
	var ce *ClientError
	clientErr := errors.As(r.err, &ce)
	interrupted := errors.Is(r.err, errdefs.ErrDeadlineExceeded)
	switch {
	case r.err == nil, interrupted:
	case clientErr:
		if ce.Code != 1 {
			t.Fatalf("the replay guest returned %d: input_size or input_read failed (%v)", ce.Code, r.err)
		}
	case errors.Is(r.err, errdefs.ErrFault):
		// Device work of the call failed; the guest itself never traps,
		// so a trap means that a host function failed inside the guest.
		if r.replacements != 0 {
			t.Fatalf("the replay guest trapped: %v", r.err)
		}
	default:
		t.Fatalf("Run = %v: not a documented outcome of a stage call", r.err)
	}
	if !interrupted && r.replacements != 0 {
		t.Fatalf("%d instances replaced, but the guest never traps (Run: %v)", r.replacements, r.err)
	}
	out := r.out
	pos := 0
	var got []abi.Status
	for off := 0; off+replayRecordSize <= len(data); off += replayRecordSize {
		rec := data[off:]
		fn := replayFunctions[binary.LittleEndian.Uint32(rec)%uint32(len(replayFunctions))]
		want := abi.Status(-1)
		if fn == abi.FnOutputWrite {
			ptr, n := uint64(uint32(binary.LittleEndian.Uint64(rec[4:]))), uint64(uint32(binary.LittleEndian.Uint64(rec[12:])))
			switch {
			case ptr+n > replayMemorySize:
				want = abi.StatusOutOfBounds
			case uint64(pos)+n > replayOutputLimit:
				want = abi.StatusOutputTooLarge
			default:
				want = abi.StatusOK
				pos += int(n)
			}
		}
		if pos+4 > replayOutputLimit {
			// The status no longer fits: the guest must have stopped.
			if !interrupted && (!clientErr || len(out) != pos) {
				t.Fatalf("record %d: its status cannot fit the output, so the guest must stop with client error 1 and %d bytes of output; got %d bytes, %v", off/replayRecordSize, pos, len(out), r.err)
			}
			return got
		}
		if pos+4 > len(out) {
			if !interrupted {
				t.Fatalf("record %d (%s): the output ends at byte %d, before its status (Run: %v)", off/replayRecordSize, fn, len(out), r.err)
			}
			return got
		}
		st := abi.Status(binary.LittleEndian.Uint32(out[pos:]))
		pos += 4
		if st < abi.StatusOK || st > abi.StatusOutputTooLarge {
			t.Fatalf("record %d (%s): status %d, which ABI v1 does not define", off/replayRecordSize, fn, uint32(st))
		}
		if want >= 0 && st != want {
			t.Fatalf("record %d (output_write): status %v, want %v", off/replayRecordSize, st, want)
		}
		got = append(got, st)
	}
	if clientErr {
		t.Fatalf("client error %v, although every status fitted the output", r.err)
	}
	if r.err == nil && slices.Contains(got, abi.StatusFault) {
		t.Fatalf("a host call reported FAULT (failed device work), but Run returned nil")
	}
	if !interrupted && pos != len(out) {
		t.Fatalf("%d bytes of output, want %d", len(out), pos)
	}
	return got
}

// FuzzHostCalls calls the host functions with arbitrary arguments through
// the replay guest. The host must never panic; Run returns nil, a client
// error (the output is full), Fault (device work failed) or
// DeadlineExceeded, and never nil once a host call reported FAULT; every
// status is one ABI v1 defines, and output_write's is exactly what its
// arguments call for; the session is never
// quarantined, Close releases all it holds, and the output stays within
// its limit.
func FuzzHostCalls(f *testing.F) {
	for _, seed := range replaySeeds {
		f.Add(encodeCalls(seed.calls...))
	}
	env := newReplayEnv(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		replayStatuses(t, data, env.replay(t, data))
	})
}

// replaySeeds are hand-made inputs with the statuses they must give; the
// fuzz corpus (testdata/fuzz/FuzzHostCalls) holds them too.
var replaySeeds = []struct {
	name    string
	calls   []replayCall
	wantErr error // nil, or the class Run must return
	want    []abi.Status
}{
	{"lookups", []replayCall{
		rec(abi.FnStreamGet, replayNameS0, 2, 1024),
		rec(abi.FnStreamGet, replayNameS1, 2, 1032),
		rec(abi.FnBufferGet, replayNameB0, 2, 1040),
		rec(abi.FnProgramGet, replayNameNoop, 4, 1048),
		rec(abi.FnProgramGet, replayNameFill, 4, 1056),
		rec(abi.FnStreamGet, replayNameWeights, 7, 1064),
		rec(abi.FnBufferGet, replayNameS0, 2, 1072),
		rec(abi.FnEntryName, 2048, 64, 2112),
		rec(abi.FnEntryName, 2048, 2, 2112),
		rec(abi.FnInputSize, 2116),
		rec(abi.FnInputRead, 0, 2200, 44, 2196),
		rec(abi.FnBufferSize, own(abi.KindBuffer, replayB0), 2120),
		rec(abi.FnStreamIdle, own(abi.KindStream, replayS1), 2124),
		rec(abi.FnLog, uint64(abi.LogInfo), replayNameWeights, 7),
		rec(abi.FnLog, 4, replayNameWeights, 7),
		rec(abi.FnErrorSet, replayNameWeights, 7),
	}, nil, []abi.Status{
		abi.StatusOK, abi.StatusOK, abi.StatusOK, abi.StatusOK, abi.StatusOK,
		abi.StatusNotFound, abi.StatusNotFound, abi.StatusOK, abi.StatusOutOfBounds,
		abi.StatusOK, abi.StatusOK, abi.StatusOK, abi.StatusOK, abi.StatusOK,
		abi.StatusInvalidArgument, abi.StatusOK,
	}},
	{"out_of_bounds", []replayCall{
		rec(abi.FnOutputWrite, 0xFFFFFFF0, 64),
		rec(abi.FnInputRead, 0, 65530, 100, 0),
		rec(abi.FnStreamGet, 70000, 2, 0),
		rec(abi.FnInputSize, 0xFFFFFFFF),
		rec(abi.FnErrorSet, 0, 0x7FFFFFFF),
		rec(abi.FnStreamGet, replayNameS0, 2, 65532),
		rec(abi.FnBufferSize, own(abi.KindBuffer, replayB0), 65534),
		rec(abi.FnStreamIdle, own(abi.KindStream, replayS0), 65536),
		rec(abi.FnEntryName, 65530, 64, 0),
		rec(abi.FnStreamSubmit, own(abi.KindStream, replayS0), own(abi.KindProgram, replayNoop), 65530, 1),
		rec(abi.FnStreamWrite, own(abi.KindStream, replayS0), own(abi.KindBuffer, replayB0), 0, 65500, 100),
		rec(abi.FnStreamRead, own(abi.KindStream, replayS0), own(abi.KindBuffer, replayB0), 0, 0xFFFFFFFF, 2),
	}, nil, []abi.Status{
		abi.StatusOutOfBounds, abi.StatusOutOfBounds, abi.StatusOutOfBounds, abi.StatusOutOfBounds,
		abi.StatusOutOfBounds, abi.StatusOutOfBounds, abi.StatusOutOfBounds, abi.StatusOutOfBounds,
		abi.StatusOutOfBounds, abi.StatusOutOfBounds, abi.StatusOutOfBounds, abi.StatusOutOfBounds,
	}},
	{"sizes_0x80000000", []replayCall{
		rec(abi.FnBufferAlloc, 0x80000000, 1024),
		rec(abi.FnBufferAllocNamed, replayNameWeights, 7, 0x80000000, 1024),
		rec(abi.FnOutputWrite, 0, 0x80000000),
		rec(abi.FnInputRead, 0x80000000, 0, 16, 1024),
		rec(abi.FnLog, uint64(abi.LogInfo), 0, 0x80000000),
		rec(abi.FnStreamWrite, own(abi.KindStream, replayS0), own(abi.KindBuffer, replayB0), 0x80000000, 0, 16),
		rec(abi.FnStreamRead, own(abi.KindStream, replayS0), own(abi.KindBuffer, replayB0), 0x80000000, 0, 16),
		rec(abi.FnBufferAllocNamed, replayNameWeights, 0x80000000, 64, 1024),
		rec(abi.FnBufferAlloc, 0, 1024),
	}, nil, []abi.Status{
		abi.StatusOutOfBudget, abi.StatusOutOfBudget, abi.StatusOutOfBounds, abi.StatusInvalidArgument,
		abi.StatusOutOfBounds, abi.StatusInvalidArgument, abi.StatusInvalidArgument, abi.StatusOutOfBounds,
		abi.StatusInvalidArgument,
	}},
	{"forged_handles", []replayCall{
		rec(abi.FnStreamSync, 0x0100000000000007),
		rec(abi.FnStreamSync, 0),
		rec(abi.FnStreamSync, own(abi.KindStream, 0x7FFFFFFF)),
		rec(abi.FnBufferSize, own(abi.KindStream, replayS0), 1024),
		rec(abi.FnBufferFree, own(abi.KindBuffer, replayB0)),
		rec(abi.FnBufferFree, own(abi.KindProgram, replayNoop)),
		rec(abi.FnStreamSubmit, own(abi.KindStream, replayS0), own(4, replayNoop), 0, 0),
		rec(abi.FnStreamIdle, uint64(abi.MakeHandle(abi.KindStream, 0x123456, replayS0)), 1024),
		rec(abi.FnBufferAlloc, 64, 1024),
		rec(abi.FnBufferFree, own(abi.KindBuffer, replayFirstAlloc)),
		rec(abi.FnBufferSize, own(abi.KindBuffer, replayFirstAlloc), 1024),
		rec(abi.FnBufferFree, own(abi.KindBuffer, replayFirstAlloc)),
	}, nil, []abi.Status{
		abi.StatusForeignHandle, abi.StatusBadHandle, abi.StatusBadHandle, abi.StatusBadHandle,
		abi.StatusInvalidArgument, abi.StatusBadHandle, abi.StatusBadHandle, abi.StatusForeignHandle,
		abi.StatusOK, abi.StatusOK, abi.StatusStaleHandle, abi.StatusStaleHandle,
	}},
	{"batch_and_transfers", []replayCall{
		// Batch records at 2048 and 2064: program_get writes the program
		// handles into them; their args_ptr and args_count stay 0.
		rec(abi.FnProgramGet, replayNameNoop, 4, 2048),
		rec(abi.FnProgramGet, replayNameNoop, 4, 2064),
		rec(abi.FnStreamSubmitBatch, own(abi.KindStream, replayS0), 2048, 2),
		rec(abi.FnStreamSubmitBatch, own(abi.KindStream, replayS0), 2048, 1025),
		rec(abi.FnStreamSubmitBatch, own(abi.KindStream, replayS0), 65530, 1),
		rec(abi.FnStreamSync, own(abi.KindStream, replayS0)),
		rec(abi.FnStreamIdle, own(abi.KindStream, replayS0), 1024),
		// Round trip through an allocated, named buffer.
		rec(abi.FnBufferAllocNamed, replayNameWeights, 7, 64, 1032),
		rec(abi.FnStreamWrite, own(abi.KindStream, replayS1), own(abi.KindBuffer, replayFirstAlloc), 8, replayNameNoop, 4),
		rec(abi.FnStreamRead, own(abi.KindStream, replayS1), own(abi.KindBuffer, replayFirstAlloc), 8, 3000, 4),
		rec(abi.FnOutputWrite, 3000, 4),
		rec(abi.FnBufferAllocNamed, replayNameWeights, 7, 64, 1032),
		rec(abi.FnBufferAllocNamed, replayNameWeights, 7, 65, 1032),
		// Argument records at 2304 for fill: b0 to its end, then the
		// scalar 0. The first one's kind, offset and length (1, 0,
		// 0xFFFFFFFF) are the arguments of record 13, copied from the
		// input; buffer_get writes b0's handle into its value field.
		rec(abi.FnInputSize, 1, 0xFFFFFFFF),
		rec(abi.FnInputRead, 13*replayRecordSize+4, 2304, 16, 2400),
		rec(abi.FnBufferGet, replayNameB0, 2, 2320),
		rec(abi.FnStreamSubmit, own(abi.KindStream, replayS0), own(abi.KindProgram, replayFill), 2304, 2),
		rec(abi.FnStreamSubmit, own(abi.KindStream, replayS0), own(abi.KindProgram, replayFill), 2304, 17),
		rec(abi.FnStreamSync, own(abi.KindStream, replayS0)),
	}, nil, []abi.Status{
		abi.StatusOK, abi.StatusOK, abi.StatusOK, abi.StatusInvalidArgument, abi.StatusOutOfBounds,
		abi.StatusOK, abi.StatusOK,
		abi.StatusOK, abi.StatusOK, abi.StatusOK, abi.StatusOK, abi.StatusOK, abi.StatusInvalidArgument,
		abi.StatusOK, abi.StatusOK, abi.StatusOK, abi.StatusOK, abi.StatusInvalidArgument, abi.StatusOK,
	}},
	{"device_fault", []replayCall{
		// fill with no arguments fails on the device, not at submission.
		rec(abi.FnStreamSubmit, own(abi.KindStream, replayS0), own(abi.KindProgram, replayFill), 0, 0),
		rec(abi.FnStreamSync, own(abi.KindStream, replayS0)),
		rec(abi.FnStreamSync, own(abi.KindStream, replayS0)),
		// And one left for the built-in fence to find.
		rec(abi.FnStreamSubmit, own(abi.KindStream, replayS1), own(abi.KindProgram, replayFill), 0, 0),
	}, errdefs.ErrFault, []abi.Status{
		abi.StatusOK, abi.StatusFault, abi.StatusOK, abi.StatusOK,
	}},
	{"weights", []replayCall{
		rec(abi.FnWeightsGet, replayNameWeights, 7, 1024),
		rec(abi.FnWeightsGet, replayNameS0, 2, 1024),
		rec(abi.FnTensorGet, replayNameTensor, 9, 1100),
		rec(abi.FnTensorGet, replayNameTensor, 9, 65500),
		rec(abi.FnBufferSize, own(abi.KindBuffer, replayWeights), 1200),
		rec(abi.FnStreamRead, own(abi.KindStream, replayS0), own(abi.KindBuffer, replayWeights), 0, 2000, 8),
		rec(abi.FnStreamWrite, own(abi.KindStream, replayS0), own(abi.KindBuffer, replayWeights), 0, replayNameNoop, 4),
		rec(abi.FnBufferFree, own(abi.KindBuffer, replayWeights)),
		rec(abi.FnBufferGet, replayNameWeights, 7, 1024),
	}, nil, []abi.Status{
		abi.StatusOK, abi.StatusNotFound, abi.StatusOK, abi.StatusOutOfBounds, abi.StatusOK, abi.StatusOK,
		abi.StatusInvalidArgument, abi.StatusInvalidArgument, abi.StatusNotFound,
	}},
	{"last_error", []replayCall{
		rec(abi.FnLastError, 2048, 1024, 2112), // none yet: OK, length 0
		rec(abi.FnProgramGet, replayNameWeights, 7, 1048),
		rec(abi.FnLastError, 2048, 4, 2112),   // too small: the length only
		rec(abi.FnLastError, 65530, 64, 2112), // destination outside memory
		rec(abi.FnLastError, 2048, 64, 65534), // length pointer outside memory
		rec(abi.FnLastError, 2048, 1024, 2112),
		rec(abi.FnOutputWrite, 2048, 17), // `program "weights"`
	}, nil, []abi.Status{
		abi.StatusOK, abi.StatusNotFound, abi.StatusOutOfBounds, abi.StatusOutOfBounds,
		abi.StatusOutOfBounds, abi.StatusOK, abi.StatusOK,
	}},
}

// TestFuzzHostCallsSeeds replays the hand-made inputs and checks each
// status, so the replay guest and the harness are known to do what they
// say.
func TestFuzzHostCallsSeeds(t *testing.T) {
	env := newReplayEnv(t)
	for _, seed := range replaySeeds {
		t.Run(seed.name, func(t *testing.T) {
			data := encodeCalls(seed.calls...)
			r := env.replay(t, data)
			if (seed.wantErr == nil) != (r.err == nil) || (seed.wantErr != nil && !errors.Is(r.err, seed.wantErr)) {
				t.Fatalf("Run = %v, want %v", r.err, seed.wantErr)
			}
			got := replayStatuses(t, data, r)
			if fmt.Sprint(got) != fmt.Sprint(seed.want) {
				t.Fatalf("statuses\n got %v\nwant %v", got, seed.want)
			}
		})
	}
	// last_error gave the NOT_FOUND's message, naming the program.
	r := env.replay(t, encodeCalls(replaySeeds[len(replaySeeds)-1].calls...))
	if want := `program "weights"`; !strings.Contains(string(r.out), want) {
		t.Fatalf("output %q does not hold the last error's first bytes, %q", r.out, want)
	}
	// The round trip wrote "noop" into the buffer and read it back.
	r = env.replay(t, encodeCalls(replaySeeds[4].calls...))
	if want := "noop"; len(r.out) < 11*4+4 || string(r.out[10*4:10*4+4]) != want {
		t.Fatalf("output %q does not hold the bytes read back, %q, after the tenth status", r.out, want)
	}
}
