package stages

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// weightsData is the data section the tests upload: 8 bytes of "w", 8
// f32 values of "b".
var weightsData = append([]byte("01234567"), make([]byte, 32)...)

var weightsTensors = map[string]WeightsTensor{
	"w":     {Offset: 0, Bytes: 8, DType: 20, Dims: []uint64{8}},
	"dir/b": {Offset: 8, Bytes: 32, DType: 0, Dims: []uint64{2, 4}},
}

func uploadTestWeights(t *testing.T, f *wasmFixture, budget *hw.Budget) *Weights {
	t.Helper()
	cfg := NewWeightsConfig("digits", int64(len(weightsData))).WithTensors(weightsTensors).
		WithBudget(budget).WithSHA256(SHA256(weightsData)).WithChunk(16)
	w, err := UploadWeights(context.Background(), f.gpu, cfg, bytes.NewReader(weightsData))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

type weightsRun struct {
	t   *testing.T
	s   *Session
	out []byte
}

func (r *weightsRun) call(op byte, name string) *weightsRun {
	r.t.Helper()
	out, err := r.s.Run(context.Background(), append([]byte{op}, name...), nil)
	if err != nil {
		r.t.Fatalf("op %d %q: %v", op, name, err)
	}
	r.out = out
	if op >= 2 { // weights_get's status comes first
		r.status(abi.StatusOK)
	}
	return r
}

func (r *weightsRun) word() uint32 {
	r.t.Helper()
	if len(r.out) < 4 {
		r.t.Fatalf("output ends early")
	}
	v := binary.LittleEndian.Uint32(r.out)
	r.out = r.out[4:]
	return v
}

func (r *weightsRun) status(want abi.Status) {
	r.t.Helper()
	if got := abi.Status(r.word()); got != want {
		r.t.Fatalf("status %v, want %v", got, want)
	}
}

func (r *weightsRun) lastError() string {
	r.t.Helper()
	r.status(abi.StatusOK)
	n := r.word()
	msg := string(r.out[:n])
	r.out = r.out[n:]
	return msg
}

// TestWeightsLookups: weights_get and tensor_get find what the session
// lists, and only that, with the record of ABI.md §3.
func TestWeightsLookups(t *testing.T) {
	f := newWasmFixture(t)
	w := uploadTestWeights(t, f, nil)
	defer w.Release()
	s := f.session(t, abiModule(t, f, "weights"), NewSessionConfig("w", f.gpu).WithStreams("s0").WithPrograms("copy").WithWeights(w))
	defer s.Close(context.Background())
	r := &weightsRun{t: t, s: s}

	r.call(0, "digits").status(abi.StatusOK)
	if h := abi.Handle(binary.LittleEndian.Uint64(r.out)); h.Kind() != abi.KindBuffer {
		t.Fatalf("handle %#x is not a buffer's", uint64(h))
	}
	r.call(0, "other").status(abi.StatusNotFound)
	r.call(6, "digits").status(abi.StatusOK)
	if got := r.word(); got != uint32(len(weightsData)) {
		t.Fatalf("buffer_size = %d", got)
	}
	r.call(7, "digits").status(abi.StatusOK)
	if string(r.out) != "01234567" {
		t.Fatalf("stream_read = %q", r.out)
	}
	r.call(5, "digits").status(abi.StatusOK) // copy's src is "in"
	r.status(abi.StatusOK)
	r.status(abi.StatusOK)
	if string(r.out) != "01234567" {
		t.Fatalf("copied %q", r.out)
	}

	r.call(1, "digits/dir/b").status(abi.StatusOK)
	rec := r.out
	if len(rec) != abi.TensorRecordSize {
		t.Fatalf("record of %d bytes", len(rec))
	}
	le := binary.LittleEndian
	if h := abi.Handle(le.Uint64(rec)); h.Kind() != abi.KindBuffer || le.Uint64(rec[8:]) != 8 || le.Uint64(rec[16:]) != 32 ||
		le.Uint32(rec[24:]) != 0 || le.Uint32(rec[28:]) != 2 || le.Uint64(rec[32:]) != 2 || le.Uint64(rec[40:]) != 4 || le.Uint64(rec[48:]) != 0 {
		t.Fatalf("record %x", rec)
	}
	for _, name := range []string{"digits/none", "other/w", "digits", "w"} {
		r.call(1, name).status(abi.StatusNotFound)
	}
}

// TestWeightsReadOnly: every write to weights is refused with
// INVALID_ARGUMENT before anything is enqueued, and the last error names
// the argument; the device copy is unchanged.
func TestWeightsReadOnly(t *testing.T) {
	f := newWasmFixture(t)
	w := uploadTestWeights(t, f, nil)
	defer w.Release()
	s := f.session(t, abiModule(t, f, "weights"), NewSessionConfig("w", f.gpu).WithStreams("s0").WithPrograms("copy").WithWeights(w))
	defer s.Close(context.Background())
	r := &weightsRun{t: t, s: s}

	str := s.Owner().Streams()[0].(*sim.Stream)
	submitted := str.Submitted()
	uploads, _ := f.gpu.Uploads()
	nothingEnqueued := func(what string) {
		t.Helper()
		if n := str.Submitted(); n != submitted {
			t.Fatalf("a refused %s enqueued %d commands", what, n-submitted)
		}
		if now, _ := f.gpu.Uploads(); now != uploads {
			t.Fatalf("a refused %s enqueued %d uploads", what, now-uploads)
		}
	}
	r.call(2, "digits").status(abi.StatusInvalidArgument)
	if msg := r.lastError(); !strings.Contains(msg, "stream_write: buffer is the read-only weights \"digits\"") {
		t.Fatalf("stream_write's last error: %q", msg)
	}
	nothingEnqueued("stream_write")
	r.call(4, "digits").status(abi.StatusInvalidArgument)
	if msg := r.lastError(); !strings.Contains(msg, "copy: argument 0 is the read-only weights \"digits\"") || !strings.Contains(msg, "written (direction out)") {
		t.Fatalf("stream_submit's last error: %q", msg)
	}
	nothingEnqueued("stream_submit")
	r.call(8, "digits").status(abi.StatusInvalidArgument)
	if msg := r.lastError(); !strings.Contains(msg, "copy: argument 0 is the read-only weights \"digits\"") {
		t.Fatalf("stream_submit_batch's last error: %q", msg)
	}
	nothingEnqueued("stream_submit_batch (its first command included)")
	r.call(3, "digits").status(abi.StatusInvalidArgument)
	if msg := r.lastError(); !strings.Contains(msg, "buffer_free: buffer is the read-only weights \"digits\"") {
		t.Fatalf("buffer_free's last error: %q", msg)
	}
	nothingEnqueued("buffer_free")
	r.call(7, "digits").status(abi.StatusOK)
	if string(r.out) != "01234567" {
		t.Fatalf("the weights changed: %q", r.out)
	}
}

// TestWeightsSharedAndCounted: sessions share one device copy, charged
// once; it is freed when the last holder closes, and a quarantined
// holder keeps it.
func TestWeightsSharedAndCounted(t *testing.T) {
	f := newWasmFixture(t)
	budget := hw.NewBudget("device gpu0", 0)
	w := uploadTestWeights(t, f, budget)
	m := abiModule(t, f, "weights")
	var ss []*Session
	for range 4 {
		ss = append(ss, f.session(t, m, NewSessionConfig("w", f.gpu).WithStreams("s0").WithPrograms("copy").WithWeights(w)))
	}
	if budget.Used() != int64(len(weightsData)) || w.Refs() != 5 {
		t.Fatalf("4 sessions: budget %d bytes, %d references", budget.Used(), w.Refs())
	}
	w.Release()
	for _, s := range ss[:3] {
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if budget.Used() != int64(len(weightsData)) || w.Refs() != 1 {
		t.Fatalf("one session left: budget %d bytes, %d references", budget.Used(), w.Refs())
	}
	if err := ss[3].Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if budget.Used() != 0 || w.Refs() != 0 {
		t.Fatalf("all closed: budget %d bytes, %d references", budget.Used(), w.Refs())
	}
	if err := w.Retain(); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("Retain of freed weights: %v", err)
	}
}

// TestWeightsSHA256Mismatch: bytes that do not hash to the declared sum
// are refused, and nothing stays charged.
func TestWeightsSHA256Mismatch(t *testing.T) {
	f := newWasmFixture(t)
	budget := hw.NewBudget("device gpu0", 0)
	cfg := NewWeightsConfig("digits", int64(len(weightsData))).WithBudget(budget).WithChunk(16).
		WithSHA256(strings.Repeat("0", 64))
	_, err := UploadWeights(context.Background(), f.gpu, cfg, bytes.NewReader(weightsData))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), SHA256(weightsData)) {
		t.Fatalf("err = %v, want InvalidArgument naming the actual sum", err)
	}
	if budget.Used() != 0 {
		t.Fatalf("%d bytes left charged", budget.Used())
	}
	_, err = UploadWeights(context.Background(), f.gpu, cfg.WithSHA256(""), bytes.NewReader(weightsData[:20]))
	if err == nil || budget.Used() != 0 {
		t.Fatalf("a short file: err %v, %d bytes charged", err, budget.Used())
	}
}

// TestWeightsResetPerCallUploadsNothing: a session that resets every
// call and uses weights uploads nothing per call, nor when its instance
// is replaced after a trap.
func TestWeightsResetPerCallUploadsNothing(t *testing.T) {
	f := newWasmFixture(t)
	w := uploadTestWeights(t, f, nil)
	defer w.Release()
	s := f.session(t, abiModule(t, f, "weights"), NewSessionConfig("w", f.gpu).WithStreams("s0").WithPrograms("copy").
		WithWeights(w).WithResetPerCall(true))
	defer s.Close(context.Background())
	r := &weightsRun{t: t, s: s}
	before, bytesBefore := f.gpu.Uploads()
	for range 10 {
		r.call(7, "digits").status(abi.StatusOK)
	}
	// A trap replaces the instance; the new one finds the same weights.
	if _, err := s.Run(context.Background(), append([]byte{9}, "digits"...), nil); !errors.Is(err, errdefs.ErrFault) {
		t.Fatalf("the trapping call: %v", err)
	}
	r.call(7, "digits").status(abi.StatusOK)
	if s.Replacements() != 1 || string(r.out) != "01234567" {
		t.Fatalf("%d replacements, read %q", s.Replacements(), r.out)
	}
	if n, b := f.gpu.Uploads(); n != before || b != bytesBefore {
		t.Fatalf("11 calls and a replaced instance uploaded %d times, %d bytes", n-before, b-bytesBefore)
	}
}

// TestWeightsKeptByAQuarantinedSession: a session whose fence could not
// be proven keeps its reference, so the weights a command of it may
// still read stay allocated and charged.
func TestWeightsKeptByAQuarantinedSession(t *testing.T) {
	f := newWasmFixture(t)
	budget := hw.NewBudget("device gpu0", 0)
	w := uploadTestWeights(t, f, budget)
	s := f.session(t, abiModule(t, f, "weights"), NewSessionConfig("w", f.gpu).WithStreams("s0").WithPrograms("copy").
		WithWeights(w).WithDeadline(50*time.Millisecond).WithFenceTimeout(50*time.Millisecond))
	release := s.Owner().Streams()[0].(*sim.Stream).Inject(sim.Fault{Kind: sim.Hang})
	defer release()
	if _, err := s.Run(context.Background(), append([]byte{7}, "digits"...), nil); err == nil {
		t.Fatal("a call whose read hangs succeeded")
	}
	if s.Quarantined() == nil {
		t.Fatal("not quarantined")
	}
	_ = s.Close(context.Background())
	w.Release()
	if w.Refs() != 1 || budget.Used() != int64(len(weightsData)) {
		t.Fatalf("quarantined holder: %d references, %d bytes charged", w.Refs(), budget.Used())
	}
}

// TestWeightsTensorsChecked: a tensor tensor_get could not describe is
// refused before anything is allocated.
func TestWeightsTensorsChecked(t *testing.T) {
	f := newWasmFixture(t)
	budget := hw.NewBudget("device gpu0", 0)
	for name, tn := range map[string]WeightsTensor{
		"rank 9":       {Offset: 0, Bytes: 1, Dims: make([]uint64, 9)},
		"past the end": {Offset: 30, Bytes: 11},
		"overflowing":  {Offset: 8, Bytes: ^uint64(0)},
	} {
		cfg := NewWeightsConfig("w", int64(len(weightsData))).WithBudget(budget).WithTensors(map[string]WeightsTensor{"t": tn})
		if _, err := UploadWeights(context.Background(), f.gpu, cfg, bytes.NewReader(weightsData)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if budget.Used() != 0 {
		t.Fatalf("%d bytes charged", budget.Used())
	}
}

// TestWeightsConfigRefused: weights given twice, or on another device,
// are refused, and the session holds no reference.
func TestWeightsConfigRefused(t *testing.T) {
	f := newWasmFixture(t)
	w := uploadTestWeights(t, f, nil)
	defer w.Release()
	other, err := f.p.AddDevice("gpu1", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	m := abiModule(t, f, "weights")
	for _, cfg := range []SessionConfig{
		NewSessionConfig("twice", f.gpu).WithStreams("s0").WithWeights(w, w),
		NewSessionConfig("elsewhere", other).WithStreams("s0").WithWeights(w),
	} {
		if _, err := f.eng.NewSession(context.Background(), f.rt, m, cfg); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%v", err)
		}
	}
	if w.Refs() != 1 {
		t.Fatalf("%d references after refused sessions, want 1", w.Refs())
	}
}
