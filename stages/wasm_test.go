package stages

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

var (
	testEngineOnce sync.Once
	testEngine     *Engine
)

// engineForTest shares one engine (no file cache) across the tests.
func engineForTest(t testing.TB) *Engine {
	t.Helper()
	testEngineOnce.Do(func() {
		// The corpus's never-ending initialisations (loop_start,
		// loop_initialize) each hold Load for the snapshot timeout; a
		// second is plenty for the rest, even under the race detector.
		e, err := NewEngine(context.Background(), NewEngineConfig().WithCacheDir("").WithSnapshotTimeout(time.Second))
		if err != nil {
			panic(err)
		}
		testEngine = e
	})
	return testEngine
}

type wasmFixture struct {
	eng *Engine
	rt  *host.Runtime
	p   *sim.Platform
	gpu *sim.Device
}

func newWasmFixture(t testing.TB) *wasmFixture {
	t.Helper()
	rt, err := host.NewRuntime(host.NewConfig().WithCapacity(8))
	if err != nil {
		t.Fatal(err)
	}
	p := sim.New()
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &wasmFixture{eng: engineForTest(t), rt: rt, p: p, gpu: gpu}
}

func hostile(t testing.TB, name string) []byte {
	t.Helper()
	bin, err := os.ReadFile(filepath.Join("testdata", "hostile", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func (f *wasmFixture) load(t testing.TB, name string, cfg LoadConfig) (*Module, error) {
	t.Helper()
	bin := hostile(t, name)
	return f.eng.Load(context.Background(), bin, SHA256(bin), cfg.WithName(name))
}

func (f *wasmFixture) mustLoad(t testing.TB, name string) *Module {
	t.Helper()
	m, err := f.load(t, name, NewLoadConfig())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (f *wasmFixture) session(t testing.TB, m *Module, cfg SessionConfig) *Session {
	t.Helper()
	s, err := f.eng.NewSession(context.Background(), f.rt, m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (f *wasmFixture) defaultConfig(name string) SessionConfig {
	return NewSessionConfig(name, f.gpu).WithStreams("s0").WithPrograms("noop").
		WithDeadline(100 * time.Millisecond).WithFenceTimeout(100 * time.Millisecond)
}

// controlStillWorks runs the well-behaved module in a fresh session on the
// same runtime.
func (f *wasmFixture) controlStillWorks(t *testing.T) {
	t.Helper()
	s := f.session(t, f.mustLoad(t, "good_stage"), f.defaultConfig("control"))
	out, err := s.Run(context.Background(), nil, nil)
	if err != nil || string(out) != "ok" {
		t.Fatalf("control session: %q, %v", out, err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func statuses(out []byte) []abi.Status {
	var s []abi.Status
	for i := 0; i+4 <= len(out); i += 4 {
		s = append(s, abi.Status(binary.LittleEndian.Uint32(out[i:])))
	}
	return s
}

func TestLoadRejectsModulesBeforeInstantiating(t *testing.T) {
	f := newWasmFixture(t)
	for _, tc := range []struct {
		name  string
		cfg   LoadConfig
		class error
		words []string
	}{
		{"no_marker", NewLoadConfig(), errdefs.ErrInvalidArgument, []string{"missing ABI marker"}},
		{"wrong_version", NewLoadConfig(), errdefs.ErrUnsupported, []string{"v2", "v1"}},
		{"unknown_import", NewLoadConfig(), errdefs.ErrInvalidArgument, []string{"env.exfiltrate"}},
		{"bad_signature", NewLoadConfig(), errdefs.ErrInvalidArgument, []string{"stream_sync", "(i32)->(i32)", "(i64)->(i32)"}},
		{"wasi_fs", NewLoadConfig(), errdefs.ErrInvalidArgument, []string{"path_open", "not granted"}},
		{"wasi_fs", NewLoadConfig().WithWASI(GrantGoRuntime), errdefs.ErrInvalidArgument, []string{"path_open", "never be granted"}},
		{"memory_bomb_max", NewLoadConfig().WithMemoryLimit(16 << 20), errdefs.ErrInvalidArgument, []string{"memory maximum 65536 pages", "limit of 256 pages"}},
		{"loop_fence", NewLoadConfig().WithKind(FenceModule).WithWASI("path_open"), errdefs.ErrInvalidArgument, []string{`grant "path_open" cannot be given`}},
	} {
		_, err := f.load(t, tc.name, tc.cfg)
		if !errors.Is(err, tc.class) {
			t.Errorf("%s: got %v, want class %v", tc.name, err, tc.class)
			continue
		}
		for _, w := range append(tc.words, tc.name) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not mention %q", tc.name, err, w)
			}
		}
	}
	bin := hostile(t, "good_stage")
	if _, err := f.eng.Load(context.Background(), bin, strings.Repeat("0", 64), NewLoadConfig()); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "sha256 mismatch") {
		t.Errorf("sha mismatch: %v", err)
	}
	if _, err := f.eng.Load(context.Background(), []byte("\x00asm\x01\x00\x00\x00\x01"), SHA256([]byte("\x00asm\x01\x00\x00\x00\x01")), NewLoadConfig()); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("malformed: %v", err)
	}
}

func TestLoadIsCachedPerProcess(t *testing.T) {
	f := newWasmFixture(t)
	a, b := f.mustLoad(t, "good_stage"), f.mustLoad(t, "good_stage")
	if a != b {
		t.Fatal("the same module compiled twice")
	}
}

func TestGoodAndClientErrorStagesDoNotQuarantine(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	good := f.session(t, f.mustLoad(t, "good_stage"), f.defaultConfig("good"))
	for range 3 {
		out, err := good.Run(ctx, nil, nil)
		if err != nil || string(out) != "ok" {
			t.Fatalf("good: %q %v", out, err)
		}
	}
	bad := f.session(t, f.mustLoad(t, "client_error"), f.defaultConfig("client"))
	_, err := bad.Run(ctx, nil, nil)
	var ce *ClientError
	if !errors.As(err, &ce) || ce.Code != 3 || ce.Message != "bad input" {
		t.Fatalf("client error: %v", err)
	}
	if bad.Quarantined() != nil {
		t.Fatal("client error quarantined the session")
	}
	if _, err := bad.Run(ctx, nil, nil); !errors.As(err, &ce) {
		t.Fatalf("second call: %v", err)
	}
	if err := bad.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStageSideHostilityIsContainedWithoutQuarantine(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	for _, tc := range []struct {
		name  string
		class error
		words []string
	}{
		{"loop_stage", errdefs.ErrDeadlineExceeded, []string{"deadline"}},
		{"loop_fill_stage", errdefs.ErrDeadlineExceeded, []string{"deadline"}},
		{"trap_stage", errdefs.ErrFault, []string{"trapped", "unreachable"}},
		{"deep_recursion", errdefs.ErrFault, []string{"trapped", "stack overflow"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.defaultConfig(tc.name)
			if tc.name == "deep_recursion" {
				cfg = cfg.WithDeadline(10 * time.Second) // stack growth is slow under -race
			}
			s := f.session(t, f.mustLoad(t, tc.name), cfg)
			streams := s.Owner().Streams()
			for round := 1; round <= 2; round++ {
				start := time.Now()
				_, err := s.Run(ctx, nil, nil)
				if !errors.Is(err, tc.class) {
					t.Fatalf("round %d: got %v, want %v", round, err, tc.class)
				}
				// Interrupted at the 100 ms deadline, give or take a
				// check's delay: far from the minute the context allows
				// (a 16 MiB fill a check would have run for minutes).
				if d := time.Since(start); tc.class == errdefs.ErrDeadlineExceeded && d > 5*time.Second {
					t.Fatalf("round %d: interrupted after %v; the deadline is 100ms", round, d)
				}
				for _, w := range tc.words {
					if !strings.Contains(err.Error(), w) {
						t.Fatalf("%q does not mention %q", err, w)
					}
				}
				if s.Quarantined() != nil {
					t.Fatal("stage-side failure quarantined the session")
				}
				if s.Replacements() != round {
					t.Fatalf("replacements %d after round %d", s.Replacements(), round)
				}
			}
			if got := s.Owner().Streams(); len(got) != 1 || got[0] != streams[0] {
				t.Fatal("the session's resources did not survive the instance")
			}
			f.controlStillWorks(t)
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestMemoryBombStaysUnderTheLimit(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	m, err := f.load(t, "memory_bomb", NewLoadConfig().WithMemoryLimit(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	s := f.session(t, m, f.defaultConfig("bomb").WithDeadline(10*time.Second))
	out, err := s.Run(callCtx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pages := binary.LittleEndian.Uint32(out); pages != 241 {
		t.Fatalf("memory grew to %d pages, want 241 (limit 256)", pages)
	}
	if s.Quarantined() != nil {
		t.Fatal("quarantined")
	}
}

func TestHandleAbuseGetsClearStatuses(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	victim := f.session(t, f.mustLoad(t, "good_stage"), f.defaultConfig("victim"))
	victimStream := abi.MakeHandle(abi.KindStream, victim.native.state.table.tag, 1)
	victimHang := victim.Owner().Streams()[0].(*sim.Stream).Inject(sim.Fault{Kind: sim.Hang})
	defer victimHang()
	for _, tc := range []struct {
		name  string
		input []byte
		want  []abi.Status
	}{
		{"forged_handle", nil, []abi.Status{abi.StatusForeignHandle}},
		{"zero_handle", nil, []abi.Status{abi.StatusBadHandle}},
		{"unissued_handle", nil, []abi.Status{abi.StatusBadHandle}},
		{"wrong_kind_handle", nil, []abi.Status{abi.StatusBadHandle}},
		{"stale_handle", nil, []abi.Status{abi.StatusStaleHandle}},
		{"foreign_handle", binary.LittleEndian.AppendUint64(nil, uint64(victimStream)), []abi.Status{abi.StatusForeignHandle}},
		{"oob_pointer", nil, []abi.Status{abi.StatusOutOfBounds, abi.StatusOutOfBounds, abi.StatusOutOfBounds, abi.StatusOutOfBounds, abi.StatusOutOfBounds}},
		{"bad_batch", nil, []abi.Status{abi.StatusBadHandle, 1}}, // and the stream stayed idle: nothing was enqueued
	} {
		s := f.session(t, f.mustLoad(t, tc.name), f.defaultConfig(tc.name))
		out, err := s.Run(ctx, tc.input, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := statuses(out)
		if len(got) != len(tc.want) {
			t.Fatalf("%s: statuses %v, want %v", tc.name, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%s: statuses %v, want %v", tc.name, got, tc.want)
			}
		}
		if s.Quarantined() != nil {
			t.Fatalf("%s: quarantined", tc.name)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatalf("%s: close: %v", tc.name, err)
		}
	}
	// The foreign handle never reached the victim's stream: it has no work.
	if st := victim.Owner().Streams()[0]; !st.Idle() || st.(*sim.Stream).Submitted() != 0 {
		t.Fatal("another session's handle reached the victim's stream")
	}
}

func TestOutputLargerThanItsLimit(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	s := f.session(t, f.mustLoad(t, "big_output"), f.defaultConfig("big").WithOutputLimit(32<<10))
	out, err := s.Run(callCtx, nil, nil)
	var ce *ClientError
	if !errors.As(err, &ce) || ce.Code != 7 {
		t.Fatalf("got %v", err)
	}
	if len(out) != 32<<10 {
		t.Fatalf("kept %d bytes of output, want exactly the limit", len(out))
	}
	for _, b := range out {
		if b != 0x5A {
			t.Fatal("output corrupted")
		}
	}
}

func TestFencesThatCannotBeProvenQuarantine(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	for _, tc := range []struct {
		name string
		hang bool
	}{{"loop_fence", false}, {"trap_fence", false}, {"lying_fence", true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := f.session(t, f.mustLoad(t, tc.name), f.defaultConfig(tc.name))
			if tc.hang {
				release := s.Owner().Streams()[0].(*sim.Stream).Inject(sim.Fault{Kind: sim.Hang})
				defer release()
			}
			charged := s.Owner().Budget().Used()
			_, err := s.Run(ctx, nil, nil)
			if !errors.Is(err, errdefs.ErrDeviceLost) {
				t.Fatalf("the failing fence's call: %v", err)
			}
			if s.Quarantined() == nil {
				t.Fatal("not quarantined")
			}
			if _, err := s.Run(ctx, nil, nil); !errors.Is(err, errdefs.ErrDeviceLost) {
				t.Fatalf("later call: %v", err)
			}
			if s.Owner().Budget().Used() != charged {
				t.Fatal("quarantine released charges")
			}
			if err := s.Close(ctx); !errors.Is(err, errdefs.ErrDeviceLost) {
				t.Fatalf("close: %v", err)
			}
			f.controlStillWorks(t)
		})
	}
	st := f.rt.Stats()
	if len(st.Quarantined) != 3 {
		t.Fatalf("runtime quarantines %v", st.Quarantined)
	}
}

func TestFenceRunsAfterATrappedStage(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	// trap_stage has no fence of its own, so the built-in drain runs; a
	// hung stream makes that drain time out, which proves it ran after the
	// trap and that the trap did not skip it.
	f := newWasmFixture(t)
	trap := f.session(t, f.mustLoad(t, "trap_stage"), f.defaultConfig("trap").WithFenceTimeout(20*time.Millisecond))
	release := trap.Owner().Streams()[0].(*sim.Stream).Inject(sim.Fault{Kind: sim.Hang})
	defer release()
	// Give the hung stream work so the drain must wait on it.
	if _, err := trap.Owner().Streams()[0].Submit(&hw.Command{Program: mustNoop(t, trap)}); err != nil {
		t.Fatal(err)
	}
	_, err := trap.Run(callCtx, nil, nil)
	if !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("got %v: the drain after the trap should have timed out and quarantined", err)
	}
	if !strings.Contains(trap.Quarantined().Error(), "stage had failed") || !strings.Contains(trap.Quarantined().Error(), "unreachable") {
		t.Fatalf("quarantine reason does not name the trap: %v", trap.Quarantined())
	}
}

func mustNoop(t *testing.T, s *Session) hw.Program {
	t.Helper()
	for _, e := range s.native.state.table.declared {
		if e.kind == abi.KindProgram {
			return e.program
		}
	}
	t.Fatal("no program")
	return nil
}

func TestDrainFenceOverridesTheModulesOwnFence(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	s := f.session(t, f.mustLoad(t, "loop_fence"), f.defaultConfig("drain").WithDrainFence())
	if _, err := s.Run(callCtx, nil, nil); err != nil || s.Quarantined() != nil {
		t.Fatalf("the module's looping fence ran despite WithDrainFence: %v, %v", err, s.Quarantined())
	}
}

func TestNamedAllocationsSurviveInstanceReplacement(t *testing.T) {
	f := newWasmFixture(t)
	bin, err := os.ReadFile(filepath.Join("testdata", "abi", "named_alloc.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := f.eng.Load(context.Background(), bin, SHA256(bin), NewLoadConfig().WithName("named"))
	if err != nil {
		t.Fatal(err)
	}
	s := f.session(t, m, f.defaultConfig("named"))
	ctx := testutil.Context(t, time.Minute)
	first, err := s.Run(ctx, []byte{0}, nil)
	if err != nil || len(first) != 8 {
		t.Fatalf("%x %v", first, err)
	}
	used := s.Owner().Budget().Used()
	if _, err := s.Run(ctx, []byte{1}, nil); !errors.Is(err, errdefs.ErrFault) || s.Replacements() != 1 {
		t.Fatalf("trap: %v, %d replacements", err, s.Replacements())
	}
	again, err := s.Run(ctx, []byte{0}, nil)
	if err != nil || string(again) != string(first) {
		t.Fatalf("the new instance got %x, want the same handle %x (%v)", again, first, err)
	}
	if s.Owner().Budget().Used() != used {
		t.Fatalf("budget %d after the replacement, want %d: the buffer was allocated twice", s.Owner().Budget().Used(), used)
	}
	out, err := s.Run(ctx, []byte{2}, nil)
	if err != nil || len(out) != 4 || abi.Status(binary.LittleEndian.Uint32(out)) != abi.StatusInvalidArgument {
		t.Fatalf("same name, other size: %x %v", out, err)
	}
}

func TestUploadStagingIsBoundedAndLosesNothing(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	rt, err := host.NewRuntime(host.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := sim.New()
	defer p.Close()
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig().WithLatency(time.Millisecond)) // uploads queue up
	if err != nil {
		t.Fatal(err)
	}
	eng := engineForTest(t)
	bin, err := os.ReadFile(filepath.Join("testdata", "abi", "many_uploads.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := eng.Load(context.Background(), bin, SHA256(bin), NewLoadConfig().WithName("uploads"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewSessionConfig("uploads", gpu).WithStreams("s0").WithBuffer("big", 1<<20).WithBudget(2 << 20)
	s, err := eng.NewSession(context.Background(), rt, m, cfg.WithStagingLimit(128<<10))
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.Run(callCtx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range out {
		if int(b) != i || len(out) != 16 {
			t.Fatalf("read back %v: an upload's staged bytes were overwritten before it ran", out)
		}
	}
	if c := cap(s.native.state.arena); c > 128<<10 {
		t.Fatalf("staging grew to %d bytes, past its 128 KiB limit", c)
	}
	small, err := eng.NewSession(context.Background(), rt, m, cfg.WithStagingLimit(32<<10))
	if err != nil {
		t.Fatal(err)
	}
	var ce *ClientError
	if _, err := small.Run(callCtx, nil, nil); !errors.As(err, &ce) || ce.Code != 102 {
		t.Fatalf("an upload larger than the staging limit: %v", err)
	}
}

// TestInstantiationTrapWithoutAStartFunction: a module whose data
// segment lies past its memory traps when it is instantiated; with no
// start function, the error names the instantiation, not a start
// function the module does not have.
func TestInstantiationTrapWithoutAStartFunction(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	bin, err := os.ReadFile(filepath.Join("testdata", "instantiate", "data_oob.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := f.eng.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithName("data_oob"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := f.eng.NewSession(ctx, f.rt, m, f.defaultConfig("data_oob"))
	if err == nil {
		t.Cleanup(func() { s.Close(context.Background()) })
		_, err = s.Run(ctx, nil, nil)
	}
	if err == nil || !errors.Is(err, errdefs.ErrFault) || !strings.Contains(err.Error(), `instantiation of session "data_oob" trapped`) ||
		!strings.Contains(err.Error(), "out of bounds") || strings.Contains(err.Error(), "start function") {
		t.Fatalf("got %v; want a fault naming the instantiation (not a start function) and the out-of-bounds segment", err)
	}
}

// TestTableGrowIsCapped: table_grow grows a table declared without a
// maximum by ten million elements; every table's maximum is capped at
// MaxTableElements, so that grow returns -1 (the module checks it, and
// that growing to exactly the cap works and one more does not: it
// returns the failed check's number otherwise).
func TestTableGrowIsCapped(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	s := f.session(t, f.mustLoad(t, "table_grow"), f.defaultConfig("table").WithDeadline(10*time.Second))
	if _, err := s.Run(ctx, nil, nil); err != nil {
		t.Fatalf("table_grow: %v (a client error N: check N failed)", err)
	}
}

// TestTableMinimumOverTheCapIsRefused: a table whose minimum is above
// MaxTableElements is refused when the module is loaded, naming the
// numbers.
func TestTableMinimumOverTheCapIsRefused(t *testing.T) {
	f := newWasmFixture(t)
	bin, err := os.ReadFile(filepath.Join("testdata", "instantiate", "table_min.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.eng.Load(context.Background(), bin, SHA256(bin), NewLoadConfig().WithName("table_min"))
	verr := Validate(bin, NewLoadConfig().WithName("table_min"))
	for _, err := range []error{err, verr} {
		if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "table 0 needs at least 2000000 elements, the limit is 1048576") {
			t.Fatalf("got %v; want invalid_argument naming the table's minimum and the limit (Load and Validate)", err)
		}
	}
}
