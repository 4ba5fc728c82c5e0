package stages

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

// The containment tests pin down the exact outcome of every hostile module
// of stages/testdata/hostile (see its README) that attacks an entry into
// guest code other than a plain stage call, device failures under each
// kind of fence, unsigned sizes, load-time refusals and malformed
// binaries.

// TestContainmentInitEntriesAreBounded: a start function, _initialize or
// stagehost_init that never returns is interrupted at the init timeout,
// and one that traps fails the instantiation; either way no session is
// made, the error names the entry, and the runtime's compute lane stays
// free.
func TestContainmentInitEntriesAreBounded(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	entries := []string{"start", abi.ExportInitialize, abi.ExportInit}
	for _, tc := range []struct {
		name  string
		class error
		entry string
	}{
		{"loop_start", errdefs.ErrDeadlineExceeded, "start"},
		{"loop_initialize", errdefs.ErrDeadlineExceeded, abi.ExportInitialize},
		{"loop_init", errdefs.ErrDeadlineExceeded, abi.ExportInit},
		{"trap_init", errdefs.ErrFault, abi.ExportInit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Neutral module and session names, so that the error can only
			// name the entry by itself.
			bin := hostile(t, tc.name)
			m, err := f.eng.Load(ctx, bin, SHA256(bin), NewLoadConfig().WithName("m"))
			if err != nil {
				t.Fatal(err)
			}
			cfg := f.defaultConfig("s").WithInitTimeout(100 * time.Millisecond)
			s, err := f.eng.NewSession(ctx, f.rt, m, cfg)
			if err == nil {
				_ = s.Close(ctx)
				t.Fatal("NewSession succeeded")
			}
			if !errors.Is(err, tc.class) {
				t.Fatalf("NewSession = %v, want class %v", err, tc.class)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.entry) {
				t.Errorf("%q does not name the entry %s", msg, tc.entry)
			}
			for _, other := range entries {
				if other != tc.entry && !strings.Contains(tc.entry, other) && strings.Contains(msg, other) {
					t.Errorf("%q names %s, but %s is the entry that failed", msg, other, tc.entry)
				}
			}
			f.controlStillWorks(t)
		})
	}
}

// TestContainmentFailedReplacementFailsTheSession: loop_init_on_replace
// traps in every call, and its stagehost_init loops forever in every
// instance but the first. The first call is a trap; the second must make
// a new instance, which cannot be made within the init timeout, so the
// session has failed: that call and every later one get DeadlineExceeded,
// the same error, without another attempt; nothing is quarantined and the
// compute lane is free.
func TestContainmentFailedReplacementFailsTheSession(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	// The stage deadline is far longer than the init timeout, so only the
	// init timeout can end the replacement.
	cfg := f.defaultConfig("replace").WithInitTimeout(100 * time.Millisecond).WithDeadline(time.Minute)
	s := f.session(t, f.mustLoad(t, "loop_init_on_replace"), cfg)
	if err := s.Failed(); err != nil {
		t.Fatalf("Failed before any call = %v", err)
	}
	if _, err := s.Run(ctx, nil, nil); !errors.Is(err, errdefs.ErrFault) || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("first call = %v, want the trap (Fault, unreachable)", err)
	}
	if s.Replacements() != 1 {
		t.Fatalf("Replacements = %d after the trap, want 1", s.Replacements())
	}
	_, failed := s.Run(ctx, nil, nil)
	if !errors.Is(failed, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("second call = %v, want DeadlineExceeded (the replacement's stagehost_init)", failed)
	}
	if !strings.Contains(failed.Error(), abi.ExportInit) {
		t.Errorf("%q does not name %s", failed, abi.ExportInit)
	}
	if err := s.Failed(); err == nil || err.Error() != failed.Error() {
		t.Errorf("Failed() = %v, want the error that failed the session, %q", err, failed)
	}
	if s.Quarantined() != nil {
		t.Fatalf("a failed replacement quarantined the session: %v", s.Quarantined())
	}
	for i := range 3 {
		_, err := s.Run(ctx, nil, nil)
		if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
			t.Fatalf("call %d after the failure = %v, want DeadlineExceeded", i+3, err)
		}
		if err.Error() != failed.Error() {
			t.Errorf("call %d after the failure = %q, want the error that failed the session, %q", i+3, err, failed)
		}
	}
	if s.Quarantined() != nil {
		t.Fatalf("quarantined: %v", s.Quarantined())
	}
	if s.Replacements() != 1 {
		t.Errorf("Replacements = %d, want 1: a failed session makes no more instances", s.Replacements())
	}
	f.controlStillWorks(t)
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close of a failed session: %v", err)
	}
}

// TestContainmentSyncPastTheDeadlineIsNeverOK: sync_deadline_then_ok
// waits in stream_sync for a command that takes far longer than its
// deadline, gets DEADLINE_EXCEEDED, and returns 0. The call is
// DeadlineExceeded, and the fence (whose timeout is longer than the
// command) drains: no quarantine.
func TestContainmentSyncPastTheDeadlineIsNeverOK(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	slow, err := f.p.AddDevice("slow", hw.EngineGPU, sim.NewDeviceConfig().WithLatency(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewSessionConfig("sync-deadline", slow).WithStreams("s0").WithPrograms("noop").
		WithDeadline(100 * time.Millisecond).WithFenceTimeout(time.Minute)
	s := f.session(t, f.mustLoad(t, "sync_deadline_then_ok"), cfg)
	out, err := s.Run(ctx, nil, nil)
	if err == nil {
		t.Fatal("the call succeeded although stream_sync ran past the deadline")
	}
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("Run = %v, want DeadlineExceeded", err)
	}
	var ce *ClientError
	if errors.As(err, &ce) {
		t.Fatalf("Run = %v, a client error; the stage returned 0", err)
	}
	if got := statuses(out); len(got) != 1 || got[0] != abi.StatusDeadlineExceeded {
		t.Errorf("stream_sync gave the guest %v, want [DEADLINE_EXCEEDED]", got)
	}
	if s.Quarantined() != nil {
		t.Fatalf("quarantined although the fence could drain: %v", s.Quarantined())
	}
	if !s.Owner().Streams()[0].Idle() {
		t.Fatal("the fence returned before the stream drained")
	}
	f.controlStillWorks(t)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestContainmentFailedDeviceWorkIsNeverOK: unsynced_submit submits a
// command that fails on the device and returns 0 without looking. Under
// the built-in fence, under a fence module that returns the FAULT it got
// from stream_sync, and under one that returns 0 regardless, the call is
// a Fault, never success and never a quarantine. The next call, whose
// command succeeds, is OK again.
func TestContainmentFailedDeviceWorkIsNeverOK(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	for _, fence := range []string{"", "fence_sync_status", "fence_sync_ok"} {
		name := fence
		if name == "" {
			name = "builtin"
		}
		t.Run(name, func(t *testing.T) {
			cfg := f.defaultConfig("unsynced-" + name)
			if fence != "" {
				fm, err := f.load(t, fence, NewLoadConfig().WithKind(FenceModule))
				if err != nil {
					t.Fatal(err)
				}
				cfg = cfg.WithFenceModule(fm)
			}
			s := f.session(t, f.mustLoad(t, "unsynced_submit"), cfg)
			stream := s.Owner().Streams()[0].(*sim.Stream)
			stream.Inject(sim.Fault{Kind: sim.FailCompletion, Count: 1})
			_, err := s.Run(ctx, nil, nil)
			if err == nil {
				t.Fatal("failed device work reached the caller as success")
			}
			if !errors.Is(err, errdefs.ErrFault) || errors.Is(err, errdefs.ErrDeviceLost) {
				t.Fatalf("Run = %v, want Fault (and not DeviceLost)", err)
			}
			var ce *ClientError
			if errors.As(err, &ce) {
				t.Fatalf("Run = %v, a client error; the stage returned 0", err)
			}
			if s.Quarantined() != nil {
				t.Fatalf("quarantined, although the fence drained: %v", s.Quarantined())
			}
			if !stream.Idle() {
				t.Fatal("the stream still has work after the fence")
			}
			if _, err := s.Run(ctx, nil, nil); err != nil {
				t.Fatalf("the next call, whose command succeeds: %v", err)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			f.controlStillWorks(t)
		})
	}
}

// TestContainmentSizesAreUnsigned: buffer_alloc(0x80000000) asks for
// 2 GiB. It is OUT_OF_BUDGET under a 64 MiB budget, and succeeds (sim maps
// the 2 GiB lazily) under a 4 GiB budget, reporting a size of 0x80000000.
func TestContainmentSizesAreUnsigned(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	m := f.mustLoad(t, "alloc_2gib")
	for _, tc := range []struct {
		budget int64
		want   []uint32
	}{
		{64 << 20, []uint32{uint32(abi.StatusOutOfBudget)}},
		{4 << 30, []uint32{uint32(abi.StatusOK), uint32(abi.StatusOK), 0x80000000, uint32(abi.StatusOK)}},
	} {
		t.Run(fmt.Sprintf("budget_%dMiB", tc.budget>>20), func(t *testing.T) {
			s := f.session(t, m, f.defaultConfig("alloc").WithBudget(tc.budget).WithDeadline(10*time.Second))
			out, err := s.Run(ctx, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []uint32
			for i := 0; i+4 <= len(out); i += 4 {
				got = append(got, binary.LittleEndian.Uint32(out[i:]))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("output %v, want %v (as u32 words: status, then buffer_size's status, size and buffer_free's status)", got, tc.want)
			}
			if s.Quarantined() != nil {
				t.Fatal("quarantined")
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if used := s.Owner().Budget().Used(); used != 0 {
				t.Fatalf("%d bytes still charged after Close", used)
			}
		})
	}
}

// TestContainmentLoadRefusals: modules that Load and Validate must refuse
// before anything is instantiated.
func TestContainmentLoadRefusals(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	for _, tc := range []struct {
		name  string
		bin   []byte
		cfg   LoadConfig
		words []string
	}{
		{"wasi_wrong_type", hostile(t, "wasi_wrong_type"), NewLoadConfig().WithWASI(GrantGoRuntime),
			[]string{"fd_write", "(i32,i32)->(i32)", "(i32,i32,i32,i32)->(i32)"}},
		{"wasi_wrong_type", hostile(t, "wasi_wrong_type"), NewLoadConfig(), []string{"fd_write"}},
		{"shared_memory", sharedMemoryModule(), NewLoadConfig(), []string{"shared"}},
		{"reserved_import", hostile(t, "reserved_import"), NewLoadConfig(), []string{"stagehost_internal.yield", "reserved"}},
	} {
		cfg := tc.cfg.WithName(tc.name)
		errV := Validate(tc.bin, cfg)
		_, errL := f.eng.Load(ctx, tc.bin, SHA256(tc.bin), cfg)
		for what, err := range map[string]error{"Validate": errV, "Load": errL} {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s: %s = %v, want InvalidArgument", tc.name, what, err)
				continue
			}
			for _, w := range append(tc.words, tc.name) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: %s: %q does not mention %q", tc.name, what, err, w)
				}
			}
		}
	}
}

// sharedMemoryModule is testdata/hostile's shared_memory case: a valid
// stage whose memory is shared (limits flag 0x03, min 1, max 1). It is
// built here because wat2wasm writes a shared memory only with
// --enable-threads, which build.sh does not pass. The bytes are what
// `wat2wasm --enable-threads` makes of
//
//	(module
//	  (memory (export "memory") 1 1 shared)
//	  (func (export "stagehost_abi_v1"))
//	  (func (export "stagehost_run") (result i32) (i32.const 0)))
func sharedMemoryModule() []byte {
	return wasmModule(
		wasmSection(1, wasmVec(2, []byte{0x60, 0, 0}, []byte{0x60, 0, 1, 0x7f})),
		wasmSection(3, wasmVec(2, []byte{0, 1})),
		wasmSection(5, wasmVec(1, []byte{0x03, 1, 1})),
		wasmSection(7, wasmVec(3, wasmExport("memory", 2, 0), wasmExport(abi.Marker, 0, 0), wasmExport(abi.ExportRun, 0, 1))),
		wasmSection(10, wasmVec(2, wasmBody(nil, 0x0b), wasmBody(nil, 0x41, 0, 0x0b))),
	)
}

// TestContainmentModuleSizeLimit: an engine with a module size limit of
// 1 KiB refuses a larger module at Load, naming the limit, and loads a
// smaller one.
func TestContainmentModuleSizeLimit(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	e, err := NewEngine(ctx, NewEngineConfig().WithCacheDir("").WithMaxModuleSize(1024))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	small := hostile(t, "good_stage")
	if len(small) > 1024 {
		t.Fatalf("good_stage is %d bytes; the test needs a module under 1 KiB", len(small))
	}
	// good_stage with a custom section that takes it past 1 KiB.
	big := append(append([]byte(nil), small...), wasmSection(0, wasmName("padding"), make([]byte, 1024))...)
	if _, err := e.Load(ctx, small, SHA256(small), NewLoadConfig().WithName("small")); err != nil {
		t.Fatalf("a %d-byte module: %v", len(small), err)
	}
	_, err = e.Load(ctx, big, SHA256(big), NewLoadConfig().WithName("big"))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "1024") {
		t.Fatalf("a %d-byte module under a limit of 1024 bytes: %v, want InvalidArgument naming the limit", len(big), err)
	}
}

// malformedCaseEnv names the case that a child process of
// TestContainmentMalformedBinaries runs.
const malformedCaseEnv = "STAGEHOST_CONTAINMENT_MALFORMED_CASE"

// malformedCases are binaries built here, each checked in a process of its
// own so that a host that crashes or exhausts memory on one fails that
// case alone instead of the whole test binary. refuse: Validate and Load
// must both refuse with InvalidArgument; otherwise the module must load
// and run.
var malformedCases = []struct {
	name   string
	refuse bool
	build  func(t *testing.T) []byte
}{
	{"import_count_overflow", true, func(*testing.T) []byte {
		// 15 bytes: the header, then an import section of 5 bytes whose
		// count is 2^32-1.
		return []byte("\x00asm\x01\x00\x00\x00\x02\x05\xff\xff\xff\xff\x0f")
	}},
	{"data_count_overflow", true, func(*testing.T) []byte {
		// A valid stage whose data section declares 2^32-1 segments and
		// holds one.
		return minimalStage(wasmBody(nil, 0x41, 0, 0x0b),
			wasmSection(11, wasmU32(0xffffffff), []byte{0, 0x41, 0, 0x0b, 0}))
	}},
	{"locals_overflow", true, func(*testing.T) []byte {
		// stagehost_run declares 2^32-1 locals of type i32.
		return minimalStage(wasmBody([][2]uint32{{0xffffffff, 0x7f}}, 0x41, 0, 0x0b))
	}},
	{"imports_and_exports_120k", true, func(*testing.T) []byte {
		return manyImportsAndExports(120_000)
	}},
	{"empty_data_segments_32k", false, emptySegmentsStage},
}

// TestContainmentMalformedBinaries runs every malformed case in a child
// process (this test binary again, selecting the case through the
// environment). A child that crashes fails its case with its output.
func TestContainmentMalformedBinaries(t *testing.T) {
	if name := os.Getenv(malformedCaseEnv); name != "" {
		limitAddressSpace(t)
		for _, c := range malformedCases {
			if c.name == name {
				runMalformedCase(t, c.name, c.refuse, c.build(t))
				return
			}
		}
		t.Fatalf("no case %q", name)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range malformedCases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(exe, "-test.run=^TestContainmentMalformedBinaries$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), malformedCaseEnv+"="+c.name, "GOTRACEBACK=single")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("the case's process failed (%v):\n%s", err, crashExcerpt(out))
			}
			if !bytes.Contains(out, []byte("--- PASS: TestContainmentMalformedBinaries")) {
				t.Fatalf("the case's process did not run the test:\n%s", out)
			}
		})
	}
}

// crashExcerpt is the part of a child's output that says why it failed:
// from a fatal error or panic on, else its end; at most 4000 bytes.
func crashExcerpt(out []byte) []byte {
	for _, mark := range []string{"fatal error:", "panic:"} {
		if i := bytes.Index(out, []byte(mark)); i >= 0 {
			out = out[max(i-200, 0):]
			if len(out) > 4000 {
				out = append(out[:4000:4000], "\n..."...)
			}
			return out
		}
	}
	if len(out) > 4000 {
		out = append([]byte("...\n"), out[len(out)-4000:]...)
	}
	return out
}

// limitAddressSpace caps a child's address space at 3 GiB, so that a host
// that tries to allocate for a count of 2^32 fails inside the child, not
// on the machine. The race detector reserves far more address space for
// its shadow memory, so a race build runs without the cap.
func limitAddressSpace(t *testing.T) {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				return
			}
		}
	}
	if runtime.GOOS != "linux" {
		return
	}
	lim := syscall.Rlimit{Cur: 3 << 30, Max: 3 << 30}
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &lim); err != nil {
		t.Logf("cannot cap the address space: %v", err)
	}
}

func runMalformedCase(t *testing.T, name string, refuse bool, bin []byte) {
	ctx := context.Background()
	cfg := NewLoadConfig().WithName(name)
	if !refuse {
		cfg = cfg.WithMemoryLimit(256 << 20)
	}
	errV := Validate(bin, cfg)
	eng := engineForTest(t)
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	m, errL := eng.Load(ctx, bin, SHA256(bin), cfg)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if refuse {
		for what, err := range map[string]error{"Validate": errV, "Load": errL} {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s of a %d-byte module = %v, want InvalidArgument", what, len(bin), truncated(err))
			}
		}
		if m != nil {
			t.Error("Load returned a module")
		}
		if strings.HasPrefix(name, "imports_") && errL != nil && !strings.Contains(errL.Error(), "env.f") {
			t.Errorf("Load's error does not name an import: %v", truncated(errL))
		}
		return
	}
	if errV != nil || errL != nil {
		t.Fatalf("Validate = %v, Load = %v; want both to accept the module", errV, errL)
	}
	// Merging 32,768 empty segments 4 KiB apart into one would make 128 MiB
	// of zeros out of no data at all. Loading the module must not cost
	// anything near that.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("Load allocated %d MiB for a %d-byte module with no data: the segments were inflated", alloc>>20, len(bin))
	}
	t.Logf("data segments before and after rewriting: %v", m.segments)
	f := newWasmFixture(t)
	s := f.session(t, m, f.defaultConfig(name).WithDeadline(10*time.Second))
	out, err := s.Run(ctx, nil, nil)
	if err != nil || string(out) != "ok" {
		t.Fatalf("Run = %q, %v; want \"ok\"", out, err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func truncated(err error) string {
	if err == nil {
		return "<nil>"
	}
	s := err.Error()
	if len(s) > 300 {
		s = s[:300] + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return s
}

// minimalStage is a stage with memory 1 1, the marker, stagehost_run with
// the given body, and the extra sections (which must come after code).
func minimalStage(runBody []byte, extra ...[]byte) []byte {
	secs := [][]byte{
		wasmSection(1, wasmVec(2, []byte{0x60, 0, 0}, []byte{0x60, 0, 1, 0x7f})),
		wasmSection(3, wasmVec(2, []byte{0, 1})),
		wasmSection(5, wasmVec(1, []byte{0x01, 1, 1})),
		wasmSection(7, wasmVec(3, wasmExport("memory", 2, 0), wasmExport(abi.Marker, 0, 0), wasmExport(abi.ExportRun, 0, 1))),
		wasmSection(10, wasmVec(2, wasmBody(nil, 0x0b), runBody)),
	}
	return wasmModule(append(secs, extra...)...)
}

// manyImportsAndExports imports n functions env.f0… of type () -> (),
// which ABI v1 forbids, and exports each of them again as e0…, next to a
// valid memory, marker and stagehost_run.
func manyImportsAndExports(n int) []byte {
	var imports, exports [][]byte
	for i := range n {
		imports = append(imports, wasmName("env"), wasmName(fmt.Sprintf("f%d", i)), []byte{0, 0})
		exports = append(exports, wasmExport(fmt.Sprintf("e%d", i), 0, uint32(i)))
	}
	exports = append(exports, wasmExport("memory", 2, 0), wasmExport(abi.Marker, 0, uint32(n)), wasmExport(abi.ExportRun, 0, uint32(n+1)))
	return wasmModule(
		wasmSection(1, wasmVec(2, []byte{0x60, 0, 0}, []byte{0x60, 0, 1, 0x7f})),
		wasmSection(2, wasmVec(n, imports...)),
		wasmSection(3, wasmVec(2, []byte{0, 1})),
		wasmSection(5, wasmVec(1, []byte{0x01, 1, 1})),
		wasmSection(7, wasmVec(len(exports), exports...)),
		wasmSection(10, wasmVec(2, wasmBody(nil, 0x0b), wasmBody(nil, 0x41, 0, 0x0b))),
	)
}

// emptySegmentsStage is good_stage with a memory of 2049 pages and 32,768
// empty active data segments, at 4096, 8192, … 32768·4096, after its own
// segments.
func emptySegmentsStage(t *testing.T) []byte {
	good := hostile(t, "good_stage")
	out := wasmModule()
	for _, s := range wasmSections(t, good) {
		switch s.id {
		case 5:
			out = append(out, wasmSection(5, wasmVec(1, append([]byte{0x01}, append(wasmU32(2049), wasmU32(2049)...)...)))...)
		case 11:
			n, rest := readU32(t, s.payload)
			segs := [][]byte{rest}
			for k := uint32(1); k <= 32768; k++ {
				segs = append(segs, append(append([]byte{0, 0x41}, wasmS32(int32(k*4096))...), 0x0b, 0))
			}
			out = append(out, wasmSection(11, wasmVec(int(n)+32768, segs...))...)
		case 12:
			t.Fatal("good_stage has a data count section; the test must update it")
		default:
			out = append(out, wasmSection(s.id, s.payload)...)
		}
	}
	return out
}

type wasmSec struct {
	id      byte
	payload []byte
}

func wasmSections(t *testing.T, bin []byte) []wasmSec {
	var secs []wasmSec
	rest := bin[8:]
	for len(rest) > 0 {
		id := rest[0]
		n, after := readU32(t, rest[1:])
		secs = append(secs, wasmSec{id, after[:n]})
		rest = after[n:]
	}
	return secs
}

func readU32(t *testing.T, b []byte) (uint32, []byte) {
	var v uint32
	for i := 0; i < 5 && i < len(b); i++ {
		v |= uint32(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			return v, b[i+1:]
		}
	}
	t.Fatal("bad LEB128")
	return 0, nil
}

func wasmModule(sections ...[]byte) []byte {
	return bytes.Join(append([][]byte{[]byte("\x00asm\x01\x00\x00\x00")}, sections...), nil)
}

func wasmSection(id byte, payload ...[]byte) []byte {
	p := bytes.Join(payload, nil)
	return append(append([]byte{id}, wasmU32(uint32(len(p)))...), p...)
}

func wasmVec(n int, items ...[]byte) []byte {
	return append(wasmU32(uint32(n)), bytes.Join(items, nil)...)
}

func wasmName(s string) []byte { return append(wasmU32(uint32(len(s))), s...) }

func wasmExport(name string, kind byte, index uint32) []byte {
	return append(append(wasmName(name), kind), wasmU32(index)...)
}

// wasmBody is a function body: local declarations (count, type) and code.
func wasmBody(locals [][2]uint32, code ...byte) []byte {
	b := wasmU32(uint32(len(locals)))
	for _, l := range locals {
		b = append(append(b, wasmU32(l[0])...), byte(l[1]))
	}
	b = append(b, code...)
	return append(wasmU32(uint32(len(b))), b...)
}

func wasmU32(v uint32) []byte { return binary.AppendUvarint(nil, uint64(v)) }

func wasmS32(v int32) []byte {
	var b []byte
	x := int64(v)
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if (x == 0 && c&0x40 == 0) || (x == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// lateTimerContext has a deadline but never reports its end: a caller's
// context whose timer has not fired yet when its deadline has passed.
type lateTimerContext struct {
	context.Context
	deadline time.Time
}

func (c lateTimerContext) Deadline() (time.Time, bool) { return c.deadline, true }

// TestContainmentCallersDeadlineDoesNotFailTheSession: a replacement cut
// short by its caller's deadline is the caller's, even before the
// caller's context reports it (its timer fires late): the session has
// not failed, and the next call makes the instance itself.
// loop_init_on_replace's replacements loop in stagehost_init until
// something interrupts them; the init timeout is long, so only the
// caller's 50 ms deadline does.
func TestContainmentCallersDeadlineDoesNotFailTheSession(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	cfg := f.defaultConfig("callers").WithInitTimeout(time.Minute).WithDeadline(time.Minute)
	s := f.session(t, f.mustLoad(t, "loop_init_on_replace"), cfg)
	late := lateTimerContext{Context: ctx, deadline: time.Now().Add(50 * time.Millisecond)}
	if _, err := s.Run(late, nil, nil); err == nil {
		t.Fatal("the first call did not fail")
	}
	// The first call's instance was lost; its replacement ran right
	// after the call, under the caller's context, and was interrupted
	// at the caller's deadline.
	if err := s.Failed(); err != nil {
		t.Fatalf("the session failed for its caller's deadline: %v", err)
	}
}

// TestContainmentInstanceMadeInACallIgnoresTheCallersDeadline: when a
// call finds its instance missing (its replacement right after the last
// call was cut short by that caller), it makes the instance under the
// init timeout, not its own caller's deadline, as ABI.md §4.2 says: a
// client that keeps giving short deadlines cannot keep the instance
// from being made. loop_init_on_replace's replacements loop in
// stagehost_init until the init timeout (here 300 ms) ends them, which
// fails the session; had the caller's 20 ms deadline ended it, the
// session would not have failed.
func TestContainmentInstanceMadeInACallIgnoresTheCallersDeadline(t *testing.T) {
	f := newWasmFixture(t)
	ctx := testutil.Context(t, time.Minute)
	cfg := f.defaultConfig("made").WithInitTimeout(300 * time.Millisecond).WithDeadline(time.Minute)
	s := f.session(t, f.mustLoad(t, "loop_init_on_replace"), cfg)
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 20*time.Millisecond) }
	c1, cancel1 := short()
	defer cancel1()
	if _, err := s.Run(c1, nil, nil); err == nil {
		t.Fatal("the first call did not fail")
	}
	if err := s.Failed(); err != nil {
		t.Fatalf("failed after the first call (its replacement was cut short by its caller): %v", err)
	}
	c2, cancel2 := short()
	defer cancel2()
	start := time.Now()
	_, err := s.Run(c2, nil, nil)
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Fatalf("the second call ended after %v: its instance was made under its 20 ms deadline, not the 300 ms init timeout (%v)", took, err)
	}
	if s.Failed() == nil || !strings.Contains(s.Failed().Error(), abi.ExportInit) {
		t.Fatalf("Failed() = %v after a replacement that the init timeout ended, want the session failed naming %s", s.Failed(), abi.ExportInit)
	}
}
