package stages

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

func snapModule(t testing.TB, eng *Engine, name string, snapshot bool) *Module {
	t.Helper()
	bin, err := os.ReadFile(filepath.Join("testdata", "snapshot", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := eng.Load(context.Background(), bin, SHA256(bin), NewLoadConfig().WithName(name).WithWASI(GrantGoRuntime).WithSnapshot(snapshot))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// stateOut decodes snap_state's output.
type stateOut struct {
	prev, start     string
	calls, pages, g uint32
	page1           uint32
}

func runState(t *testing.T, s *Session, input string) (stateOut, error) {
	t.Helper()
	out, err := s.Run(context.Background(), []byte(input), nil)
	if len(out) != 24 {
		if err == nil {
			t.Fatalf("output %q: want 24 bytes", out)
		}
		return stateOut{}, err
	}
	u := func(i int) uint32 { return binary.LittleEndian.Uint32(out[i:]) }
	return stateOut{prev: string(out[0:4]), start: string(out[4:8]), calls: u(8), pages: u(12), g: u(16), page1: u(20)}, err
}

func TestSnapshotIsTakenOfInitialisedState(t *testing.T) {
	f := newWasmFixture(t)
	m := snapModule(t, f.eng, "snap_state", true)
	if ok, why := m.Snapshot(); !ok {
		t.Fatalf("snap_state is not snapshotted: %s", why)
	}
	s := f.session(t, m, f.defaultConfig("state"))
	defer s.Close(context.Background())
	got, err := runState(t, s, "AAAA")
	if err != nil {
		t.Fatal(err)
	}
	// The data segment, the start function and the globals as they were
	// after initialisation.
	want := stateOut{prev: "init", start: "strt", calls: 1, pages: 1, g: 7, page1: 0xffffffff}
	if got != want {
		t.Fatalf("first call = %+v, want %+v", got, want)
	}
}

// TestSnapshotWritesStayInTheirSession: what a call writes into its
// instance's memory and globals shows up in that session's next call,
// never in another session, a new session or the snapshot.
func TestSnapshotWritesStayInTheirSession(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	m := snapModule(t, f.eng, "snap_state", true)
	image := make([]byte, m.snap.img.size)
	if err := m.snap.img.copyInto(image); err != nil {
		t.Fatal(err)
	}
	a := f.session(t, m, f.defaultConfig("a"))
	defer a.Close(ctx)
	b := f.session(t, m, f.defaultConfig("b"))
	defer b.Close(ctx)
	if got, _ := runState(t, a, "AAAA"); got.prev != "init" || got.calls != 1 {
		t.Fatalf("a, call 1: %+v", got)
	}
	if got, _ := runState(t, b, "BBBB"); got.prev != "init" || got.calls != 1 {
		t.Fatalf("b, call 1 sees a's write: %+v", got)
	}
	if got, _ := runState(t, a, "aaaa"); got.prev != "AAAA" || got.calls != 2 {
		t.Fatalf("a, call 2 lost its own write or sees b's: %+v", got)
	}
	c := f.session(t, m, f.defaultConfig("c"))
	defer c.Close(ctx)
	if got, _ := runState(t, c, "CCCC"); got.prev != "init" || got.calls != 1 {
		t.Fatalf("a new session sees earlier writes: %+v", got)
	}
	after := make([]byte, m.snap.img.size)
	if err := m.snap.img.copyInto(after); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(image, after) {
		t.Fatal("the snapshot's memory changed")
	}
}

// TestSnapshotMemoryGrowsAndIsReplaced: an instance that grows its memory
// keeps working; after a trap its replacement starts from the snapshot's
// size and contents, and the grown pages do not come back.
func TestSnapshotMemoryGrowsAndIsReplaced(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	m := snapModule(t, f.eng, "snap_state", true)
	s := f.session(t, m, f.defaultConfig("grow"))
	defer s.Close(ctx)
	if got, _ := runState(t, s, "GGGG"); got.pages != 2 || got.page1 != 0 || got.prev != "init" {
		t.Fatalf("grow 1: %+v", got)
	}
	if got, _ := runState(t, s, "GGGG"); got.pages != 3 || got.page1 != 0x65676170 || got.prev != "GGGG" {
		t.Fatalf("grow 2: %+v (the grown page lost its write)", got)
	}
	if _, err := runState(t, s, "TTTT"); !errors.Is(err, errdefs.ErrFault) {
		t.Fatalf("trap: %v, want Fault", err)
	}
	if s.inst == nil {
		t.Fatal("no instance is ready after the trap: the next call would instantiate")
	}
	if got, _ := runState(t, s, "xxxx"); got != (stateOut{prev: "init", start: "strt", calls: 1, pages: 1, g: 7, page1: 0xffffffff}) {
		t.Fatalf("after the trap: %+v, want the snapshot's state", got)
	}
	if got, _ := runState(t, s, "GGGG"); got.pages != 2 || got.page1 != 0 {
		t.Fatalf("grown again: %+v, want a zero page (the old instance's pages must not come back)", got)
	}
	if n := len(s.retired); n != 0 {
		t.Fatalf("%d retired memories kept after proven fences", n)
	}
}

// TestSnapshotResetPerCall: every call starts from the snapshot, also
// after a call that grew the memory.
func TestSnapshotResetPerCall(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	m := snapModule(t, f.eng, "snap_state", true)
	s := f.session(t, m, f.defaultConfig("reset").WithResetPerCall(true))
	defer s.Close(ctx)
	pristine := stateOut{prev: "init", start: "strt", calls: 1, pages: 1, g: 7, page1: 0xffffffff}
	for i, in := range []string{"AAAA", "BBBB", "CCCC"} {
		if got, err := runState(t, s, in); err != nil || got != pristine {
			t.Fatalf("call %d: %+v, %v; want %+v", i, got, err, pristine)
		}
	}
	if s.Resets() != 3 || s.Replacements() != 0 {
		t.Fatalf("resets %d, replacements %d; want 3 and 0", s.Resets(), s.Replacements())
	}
	if got, _ := runState(t, s, "GGGG"); got.pages != 2 || got.prev != "init" {
		t.Fatalf("grow: %+v", got)
	}
	if got, _ := runState(t, s, "AAAA"); got != pristine {
		t.Fatalf("after a grown call: %+v, want %+v", got, pristine)
	}
	// Without the mode, state carries over.
	s2 := f.session(t, m, f.defaultConfig("keep"))
	defer s2.Close(ctx)
	runState(t, s2, "AAAA")
	if got, _ := runState(t, s2, "BBBB"); got.prev != "AAAA" || got.calls != 2 {
		t.Fatalf("without reset: %+v", got)
	}
}

// TestSnapshotRefusals: what cannot be snapshotted loads and runs as
// without snapshots, and Snapshot says why.
func TestSnapshotRefusals(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	for name, why := range map[string]string{
		"snap_hostcall": "stagehost_v1.log",
		"snap_optout":   "stagehost_no_snapshot",
		"snap_table":    "table.set",
		"snap_vglobal":  "mutable v128",
	} {
		t.Run(name, func(t *testing.T) {
			m := snapModule(t, f.eng, name, true)
			ok, reason := m.Snapshot()
			if ok || !strings.Contains(reason, why) {
				t.Fatalf("Snapshot() = %v, %q; want false naming %q", ok, reason, why)
			}
			s := f.session(t, m, f.defaultConfig(name))
			defer s.Close(ctx)
			if out, err := s.Run(ctx, nil, nil); err != nil || string(out) != "ok" {
				t.Fatalf("Run = %q, %v", out, err)
			}
		})
	}
	m := snapModule(t, f.eng, "snap_state", false)
	if ok, reason := m.Snapshot(); ok || !strings.Contains(reason, "turned off") {
		t.Fatalf("WithSnapshot(false): %v, %q", ok, reason)
	}
}

// TestSnapshotOfALoopingInitialisation: an initialisation that does not
// end is given up at the snapshot timeout; sessions then initialise
// themselves and fail at their own init timeout, as without snapshots.
func TestSnapshotOfALoopingInitialisation(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	eng, err := NewEngine(ctx, NewEngineConfig().WithCacheDir("").WithSnapshotTimeout(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	f := newWasmFixture(t)
	for _, name := range []string{"loop_initialize", "loop_start", "trap_init"} {
		bin := hostile(t, name)
		m, err := eng.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithName(name))
		if err != nil {
			t.Fatal(err)
		}
		ok, why := m.Snapshot()
		if name == "trap_init" {
			// Its trap is in stagehost_init, which every session runs.
			if !ok {
				t.Fatalf("%s: not snapshotted: %s", name, why)
			}
		} else if ok || !strings.Contains(why, "deadline") {
			t.Fatalf("%s: Snapshot() = %v, %q; want false naming the deadline", name, ok, why)
		}
		_, err = eng.NewSession(ctx, f.rt, m, f.defaultConfig(name).WithInitTimeout(20*time.Millisecond))
		want := errdefs.ErrDeadlineExceeded
		if name == "trap_init" {
			want = errdefs.ErrFault
		}
		if !errors.Is(err, want) {
			t.Fatalf("%s: NewSession = %v, want %v", name, err, want)
		}
	}
}

// TestSnapshotMemoryIsAFreshInstancesMemory: for every example, corpus
// and benchmark module that is snapshotted, the snapshot's memory is
// byte for byte the memory of an instance that wazero instantiated
// (data segments, start function) and that then ran _initialize.
func TestSnapshotMemoryIsAFreshInstancesMemory(t *testing.T) {
	_, others := corpus(t, snapshotCorpus...)
	if snapped := compareSnapshotMemory(t, others); snapped < 30 {
		t.Fatalf("only %d modules were snapshotted", snapped)
	}
}

// TestSnapshotMemoryOfGoGuestsIsAFreshInstancesMemory is
// TestSnapshotMemoryIsAFreshInstancesMemory for the Go guests.
func TestSnapshotMemoryOfGoGuestsIsAFreshInstancesMemory(t *testing.T) {
	testutil.GoGuests(t)
	goGuests, _ := corpus(t, snapshotCorpus...)
	if snapped := compareSnapshotMemory(t, goGuests); snapped != len(goGuests) {
		t.Fatalf("%d of the %d Go guests were snapshotted", snapped, len(goGuests))
	}
}

var snapshotCorpus = []string{
	"testdata/hostile/*.wasm", "testdata/abi/*.wasm", "testdata/bench/*.wasm", "testdata/snapshot/*.wasm",
	"../examples/wasm/*/*.wasm", "../examples/wasm/*/*/*.wasm",
}

// compareSnapshotMemory compares, for each module of files that loads
// and is snapshotted, the snapshot's memory with a fresh instance's after
// its initialisation, and returns how many it compared.
func compareSnapshotMemory(t *testing.T, files []string) int {
	t.Helper()
	ctx := context.Background()
	// Both read wazero's deterministic clocks and random stream, so that
	// what initialisation read from them is the same in both.
	cfg := NewEngineConfig().WithCacheDir("").WithSnapshotTimeout(time.Second)
	cfg.fixedGuestSources = true
	eng, err := NewEngine(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	snapped := 0
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".wasm")
		if strings.HasPrefix(name, "loop_") {
			continue // their initialisation never ends
		}
		bin, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		cfg := NewLoadConfig().WithName(name).WithWASI(GrantGoRuntime)
		sm, err := eng.Load(ctx, bin, SHA256(bin), cfg)
		if err != nil {
			continue // refused at load: nothing to compare
		}
		if ok, _ := sm.Snapshot(); !ok {
			continue
		}
		pm, err := eng.Load(ctx, bin, SHA256(bin), cfg.WithSnapshot(false))
		if err != nil {
			t.Fatal(err)
		}
		mod, err := eng.runtime.InstantiateModule(ctx, pm.compiled, wazero.NewModuleConfig().WithName(""))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if pm.hasInitialize {
			if _, err := mod.ExportedFunction("_initialize").Call(ctx); err != nil {
				t.Fatalf("%s: _initialize: %v", name, err)
			}
		}
		fresh, _ := mod.Memory().Read(0, mod.Memory().Size())
		image := make([]byte, sm.snap.img.size)
		if err := sm.snap.img.copyInto(image); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, image) {
			at := 0
			for at < min(len(fresh), len(image)) && fresh[at] == image[at] {
				at++
			}
			t.Errorf("%s: the snapshot's memory (%d bytes) differs from a fresh instance's (%d bytes) at byte %d", name, len(image), len(fresh), at)
		}
		_ = mod.Close(ctx)
		snapped++
	}
	t.Logf("%d snapshotted modules compared", snapped)
	return snapped
}

// TestSnapshotOfAGoGuestDropsItsEmptyLeadingTableEntries: a Go guest's
// table starts with 4096 empty entries, which its snapshot drops.
func TestSnapshotOfAGoGuestDropsItsEmptyLeadingTableEntries(t *testing.T) {
	testutil.GoGuests(t)
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	bin, err := os.ReadFile("../examples/wasm/minimal/minimal.wasm")
	if err != nil {
		t.Fatal(err)
	}
	goGuest, err := f.eng.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithName("minimal").WithWASI(GrantGoRuntime))
	if err != nil {
		t.Fatal(err)
	}
	if goGuest.tableShift != 4096 {
		t.Fatalf("the Go guest's table shift is %d, want 4096", goGuest.tableShift)
	}
}

// TestSnapshotDropsEmptyLeadingTableEntries: a snapshot's module drops
// the table entries before the first element (4096 of a Go guest's:
// TestSnapshotOfAGoGuestDropsItsEmptyLeadingTableEntries), and
// computes what the module as given does: the same table.size, the same
// indirect calls, a trap through an empty entry.
func TestSnapshotDropsEmptyLeadingTableEntries(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	snap := snapModule(t, f.eng, "snap_table_gap", true)
	plain := snapModule(t, f.eng, "snap_table_gap", false)
	if snap.tableShift != 128 || plain.tableShift != 0 {
		t.Fatalf("table shift %d (snapshot) and %d (plain); want 128 and 0", snap.tableShift, plain.tableShift)
	}
	for _, m := range []*Module{snap, plain} {
		s := f.session(t, m, f.defaultConfig("gap"))
		for _, c := range []struct {
			in   string
			want []byte
		}{{"\x00", []byte{200, 0, 0, 0, 11, 0, 0, 0}}, {"\x01", []byte{200, 0, 0, 0, 22, 0, 0, 0}}} {
			out, err := s.Run(ctx, []byte(c.in), nil)
			if err != nil || !bytes.Equal(out, c.want) {
				t.Fatalf("shift %d, input %q: %v, %v; want %v", m.tableShift, c.in, out, err, c.want)
			}
		}
		if _, err := s.Run(ctx, []byte("x"), nil); !errors.Is(err, errdefs.ErrFault) {
			t.Fatalf("shift %d: a call through an empty entry = %v, want Fault", m.tableShift, err)
		}
		_ = s.Close(ctx)
	}
}

// TestSnapshotMemoryOutlivesAReadInFlight: a stream_read cut short by the
// deadline lands after its instance was discarded, while the fence
// drains. The discarded instance's mapped memory must stay mapped until
// then (were it unmapped at the discard, the device's write would crash
// the process), and is released once the fence proved the stream idle.
func TestSnapshotMemoryOutlivesAReadInFlight(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	slow, err := f.p.AddDevice("slow0", hw.EngineGPU, sim.NewDeviceConfig().WithLatency(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	m := snapModule(t, f.eng, "snap_read_late", true)
	if ok, why := m.Snapshot(); !ok {
		t.Fatalf("not snapshotted: %s", why)
	}
	s := f.session(t, m, NewSessionConfig("late", slow).WithStreams("s0").WithBuffer("b0", 64).
		WithDeadline(10*time.Millisecond).WithFenceTimeout(5*time.Second))
	defer s.Close(ctx)
	start := time.Now()
	if _, err := s.Run(ctx, nil, nil); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("Run = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("the call returned after %v, before the read could land: the fence did not drain it", d)
	}
	if err := s.Quarantined(); err != nil {
		t.Fatalf("quarantined: %v", err)
	}
	if s.Replacements() != 1 || len(s.retired) != 0 {
		t.Fatalf("replacements %d, retired memories kept %d; want 1 and 0", s.Replacements(), len(s.retired))
	}
}

// TestTrappedInstanceIsReplacedBeforeTheCallReturns: after a call whose
// stage trapped, the replacement instance is already made when the call
// returns, from a snapshot or not, so the next call pays no
// instantiation.
func TestTrappedInstanceIsReplacedBeforeTheCallReturns(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	for _, snapshot := range []bool{true, false} {
		m := snapModule(t, f.eng, "snap_state", snapshot)
		s := f.session(t, m, f.defaultConfig("trap"))
		if _, err := runState(t, s, "TTTT"); !errors.Is(err, errdefs.ErrFault) {
			t.Fatalf("snapshot %v: trap: %v, want Fault", snapshot, err)
		}
		if s.inst == nil || s.Replacements() != 1 {
			t.Fatalf("snapshot %v: instance ready %v, replacements %d; want a replacement made before the call returned", snapshot, s.inst != nil, s.Replacements())
		}
		_ = s.Close(ctx)
	}
}
