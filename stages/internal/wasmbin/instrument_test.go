package wasmbin

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// testNamespace is the import module the tests instrument with.
const testNamespace = "stagehost_interrupt"

var testOpts = InterruptOptions{Module: testNamespace, Name: "interrupt", Fuel: 1 << 30}

// errSentinel is what the panicking host function panics with.
var errSentinel = errors.New("interrupted by the host")

// fuelHost is the host side of the countdown: it counts calls, and once
// armed panics with errSentinel.
type fuelHost struct {
	fuel  int32
	calls int
	armed bool
}

func (h *fuelHost) interrupt(context.Context) int32 {
	h.calls++
	if h.armed {
		panic(errSentinel)
	}
	return h.fuel
}

// instantiate compiles bin with the compiler and instantiates it with an
// env.add import and, when h is not nil, the interrupt import.
func instantiate(t testing.TB, ctx context.Context, bin []byte, h *fuelHost) (wazero.Runtime, api.Module) {
	t.Helper()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	t.Cleanup(func() { rt.Close(ctx) })
	if _, err := rt.NewHostModuleBuilder("env").
		NewFunctionBuilder().WithFunc(func(_ context.Context, a, b int32) int32 { return a + b }).Export("add").
		Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	if h != nil {
		if _, err := rt.NewHostModuleBuilder(testNamespace).
			NewFunctionBuilder().WithFunc(h.interrupt).Export("interrupt").
			Instantiate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mod, err := rt.Instantiate(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	return rt, mod
}

// callAll calls every exported function (all take no parameters) and
// returns their results by name.
func callAll(t testing.TB, ctx context.Context, mod api.Module) map[string][]uint64 {
	t.Helper()
	res := map[string][]uint64{}
	for name := range mod.ExportedFunctionDefinitions() {
		r, err := mod.ExportedFunction(name).Call(ctx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res[name] = r
	}
	return res
}

func instrumentFile(t testing.TB, path string, opt InterruptOptions) ([]byte, []byte, InstrumentStats) {
	t.Helper()
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	out, st, err := Instrument(m, opt)
	if err != nil {
		t.Fatal(err)
	}
	return bin, out, st
}

func testModules(t testing.TB) []string {
	files, err := filepath.Glob("testdata/instrument/*.wasm")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test modules: %v", err)
	}
	return files
}

func TestInstrumentedModulesComputeTheSameResults(t *testing.T) {
	ctx := context.Background()
	for _, path := range testModules(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			src, err := os.ReadFile(strings.TrimSuffix(path, ".wasm") + ".wat")
			if err != nil {
				t.Fatal(err)
			}
			_, plainMod := instantiate(t, ctx, mustRead(t, path), nil)
			want := callAll(t, ctx, plainMod)
			for _, fuel := range []int32{1 << 30, 7, 1} {
				opt := testOpts
				opt.Fuel = fuel
				_, out, st := instrumentFile(t, path, opt)
				if loops := strings.Count(string(src), "(loop"); st.Loops != loops {
					t.Errorf("fuel %d: %d loop checks, the source has %d loops", fuel, st.Loops, loops)
				}
				h := &fuelHost{fuel: fuel}
				_, mod := instantiate(t, ctx, out, h)
				got := callAll(t, ctx, mod)
				for name, w := range want {
					if !slices.Equal(got[name], w) {
						t.Errorf("fuel %d: %s returned %v, want %v", fuel, name, got[name], w)
					}
				}
				// Only memory.grow reaches the host under this fuel: the
				// host is called before every grow.
				if grows := strings.Count(string(src), "(memory.grow"); fuel == 1<<30 && h.calls != grows {
					t.Errorf("fuel %d: the host was called %d times, want %d (once per memory.grow)", fuel, h.calls, grows)
				}
				if fuel < 10 && h.calls == 0 {
					t.Errorf("fuel %d: the host was never called", fuel)
				}
			}
		})
	}
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHostPanicUnwindsTheGuest(t *testing.T) {
	ctx := context.Background()
	for _, path := range testModules(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			// The host returns 0 while instantiating (the start function
			// may run out), so every later check calls it.
			opt := testOpts
			opt.Fuel = 1
			_, out, _ := instrumentFile(t, path, opt)
			h := &fuelHost{fuel: 0}
			_, mod := instantiate(t, ctx, out, h)
			h.armed = true
			for name := range mod.ExportedFunctionDefinitions() {
				_, err := mod.ExportedFunction(name).Call(ctx)
				if !errors.Is(err, errSentinel) {
					t.Errorf("%s: got %v, want the host's error", name, err)
				}
			}
		})
	}
}

func TestInstrumentKeepsFunctionNames(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	for _, path := range testModules(t) {
		bin, out, _ := instrumentFile(t, path, testOpts)
		plain, err := rt.CompileModule(ctx, bin)
		if err != nil {
			t.Fatal(err)
		}
		inst, err := rt.CompileModule(ctx, out)
		if err != nil {
			t.Fatal(err)
		}
		for name, d := range plain.ExportedFunctions() {
			if d.Name() == "" {
				t.Errorf("%s: export %s has no debug name", path, name)
			}
			if got := inst.ExportedFunctions()[name].Name(); got != d.Name() {
				t.Errorf("%s: export %s is named %q, want %q", path, name, got, d.Name())
			}
		}
		m, err := Parse(out)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Imports) == 0 {
			t.Fatalf("%s: no imports", path)
		}
		im := m.Imports[len(m.Imports)-1]
		if im.Module != testOpts.Module || im.Name != testOpts.Name || len(im.Type.Params) != 0 || !bytes.Equal(im.Type.Results, []byte{valI32}) {
			t.Errorf("%s: last import %+v", path, im)
		}
	}
}

// checkBytes is the check of weight w on countdown local 1 and global 2,
// at the entry of a function with loops and in a loop with parameters.
func checkBytes(w byte) []byte {
	return []byte{
		opLocalGet, 1, opI32Const, w, opI32Sub, opLocalTee, 1,
		opI32Const, 0, opI32LtS, opIf, 0x40, opCall, 0, opLocalTee, 1, opGlobalSet, 2, opEnd,
	}
}

// entryBytes is the entry's check of a function without loops of weight w on global 2, through
// local 1, calling import 0.
func entryBytes(w byte) []byte {
	return []byte{
		opGlobalGet, 2, opI32Const, w, opI32Sub, opLocalTee, 1, opLocalGet, 1, opGlobalSet, 2,
		opI32Const, 0, opI32LtS, opIf, 0x40, opCall, 0, opGlobalSet, 2, opEnd,
	}
}

// loopOpenBytes opens a loop of empty block type inside its wrappers
// ($done, $retry, $slow) with a check of weight w that leaves for $slow.
func loopOpenBytes(w byte) []byte {
	return []byte{
		opBlock, 0x40, opLoop, 0x40, opBlock, 0x40, opLoop, 0x40,
		opLocalGet, 1, opI32Const, w, opI32Sub, opLocalTee, 1, opI32Const, 0, opI32LtS, opBrIf, 1,
	}
}

// loopCloseBytes follows the loop's end: leave $done, or (from $slow)
// call the host, add w back and enter $retry.
func loopCloseBytes(w byte) []byte {
	return []byte{
		opBr, 2, opEnd,
		opCall, 0, opI32Const, w, opI32Add, opLocalTee, 1, opGlobalSet, 2, opBr, 0, opEnd, opEnd,
	}
}

var (
	storeBytes = []byte{opLocalGet, 1, opGlobalSet, 2} // local countdown to the global
	loadBytes  = []byte{opGlobalGet, 2, opLocalSet, 1} // and back
)

func TestInstrumentInjectsWeightedChecks(t *testing.T) {
	// One function: local.get 0; loop; nop; nop; loop; br 0; end; br_if 0; end; drop; call 0
	body := []byte{
		0x00, // no locals
		opLocalGet, 0, opLoop, 0x40, 0x01, 0x01, opLoop, 0x40, opBr, 0, opEnd,
		opLocalGet, 0, opBrIf, 0, opEnd, opCall, 0, opEnd,
	}
	bin := cmBuild(cmSpec{params: []byte{valI32}, body: body, noImport: true})
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	out, st, err := Instrument(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	if st != (InstrumentStats{Loops: 2, Functions: 1}) {
		t.Fatalf("stats %+v", st)
	}
	m2, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(m2.Code) != 1 {
		t.Fatalf("%d bodies", len(m2.Code))
	}
	fb := m2.Code[0]
	got := out[fb.LocalsStart:fb.End]
	// Entry: local.get, loop, call, end (4); outer loop: nop nop loop
	// local.get br_if end (6); inner loop: br end (2). The call now names
	// function 1 (the import is function 0). The countdown lives in a new
	// local, 1 (after the parameter): loaded at entry and after the call,
	// stored before the call and at the final end. Neither br leaves the
	// function, so neither stores.
	var want []byte
	want = append(want, 0x01, 0x01, valI32)
	want = append(want, loadBytes...)
	want = append(want, checkBytes(4)...)
	want = append(want, opLocalGet, 0)
	want = append(want, loopOpenBytes(6)...)
	want = append(want, 0x01, 0x01)
	want = append(want, loopOpenBytes(2)...)
	want = append(want, opBr, 0, opEnd) // the inner loop's own label: unchanged
	want = append(want, loopCloseBytes(2)...)
	want = append(want, opLocalGet, 0, opBrIf, 0, opEnd)
	want = append(want, loopCloseBytes(6)...)
	want = append(want, storeBytes...)
	want = append(want, opCall, 1)
	want = append(want, loadBytes...)
	want = append(want, storeBytes...)
	want = append(want, opEnd)
	if !bytes.Equal(got, want) {
		t.Fatalf("body\n got % x\nwant % x", got, want)
	}
	compile(t, out)
}

func TestInstrumentChargesLoopFreeFunctionsOnTheGlobal(t *testing.T) {
	// One function without loops: local.get 0; if; local.get 0; call 0;
	// return; end; br 0; end. It charges the global at its entry
	// (weight 8) and
	// touches the countdown nowhere else: no store or load around the
	// call, before the return or the br to the body, or at the end.
	body := []byte{
		0x00, // no locals
		opLocalGet, 0, opIf, 0x40, opLocalGet, 0, opCall, 0, opReturn, opEnd, opBr, 0, opEnd,
	}
	bin := cmBuild(cmSpec{params: []byte{valI32}, body: body, noImport: true})
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	out, st, err := Instrument(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	if st != (InstrumentStats{Functions: 1}) {
		t.Fatalf("stats %+v", st)
	}
	m2, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	fb := m2.Code[0]
	var want []byte
	want = append(want, 0x01, 0x01, valI32)
	want = append(want, entryBytes(8)...)
	want = append(want, opLocalGet, 0, opIf, 0x40, opLocalGet, 0, opCall, 1, opReturn, opEnd, opBr, 0, opEnd)
	if got := out[fb.LocalsStart:fb.End]; !bytes.Equal(got, want) {
		t.Fatalf("body\n got % x\nwant % x", got, want)
	}
	compile(t, out)
}

func TestInstrumentRenumbersFunctions(t *testing.T) {
	// One function import, so the new import is function 1 and defined
	// functions move from 1.. to 2..
	path := "testdata/instrument/indirect.wasm"
	bin, out, _ := instrumentFile(t, path, testOpts)
	m, _ := Parse(bin)
	m2, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if m2.NumFuncs() != m.NumFuncs()+1 || len(m2.Globals) != len(m.Globals)+1 {
		t.Fatalf("functions %d -> %d, globals %d -> %d", m.NumFuncs(), m2.NumFuncs(), len(m.Globals), len(m2.Globals))
	}
	if len(m2.Globals) == 0 {
		t.Fatal("no globals")
	}
	g := m2.Globals[len(m2.Globals)-1]
	if g.Type != valI32 || !g.Mutable {
		t.Fatalf("countdown global %+v", g)
	}
	for i, e := range m.Exports {
		if i >= len(m2.Exports) {
			t.Fatalf("%d exports, want %d", len(m2.Exports), len(m.Exports))
		}
		e2 := m2.Exports[i]
		if e.Kind == KindFunc && e2.Index != e.Index+1 {
			t.Errorf("export %s: index %d -> %d", e.Name, e.Index, e2.Index)
		}
	}
	if err := m2.ValidateCode(); err != nil {
		t.Fatal(err)
	}
}

func TestInstrumentAddsMissingSections(t *testing.T) {
	// No import or global section: both are created in their places.
	bin := cmBuild(cmSpec{body: []byte{0x00, opLoop, 0x40, opEnd, opEnd}, noImport: true})
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := Instrument(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	compile(t, out)
	m2, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	var ids []byte
	for _, s := range m2.sections {
		ids = append(ids, s.id)
	}
	if !bytes.Contains(ids, []byte{secType, secImport, secFunction}) || !bytes.Contains(ids, []byte{secGlobal}) {
		t.Fatalf("sections %v", ids)
	}
}

func TestInstrumentRefusesTheReservedNamespace(t *testing.T) {
	bin := cmBuild(cmSpec{body: []byte{0x00, opEnd}, importModule: testNamespace})
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Instrument(m, testOpts); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("got %v", err)
	}
	opt := testOpts
	opt.Fuel = 0
	if _, _, err := Instrument(m, opt); err == nil {
		t.Fatal("fuel 0 accepted")
	}
}

func TestInstrumentDropsDebugSections(t *testing.T) {
	b := cmBuild(cmSpec{body: []byte{0x00, opEnd}})
	b = cmSection(b, secCustom, append(appendName(nil, ".debug_info"), 1, 2, 3))
	b = cmSection(b, secCustom, append(appendName(nil, "producers"), 0))
	m, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := Instrument(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte(".debug_info")) || !bytes.Contains(out, []byte("producers")) {
		t.Fatal("want .debug_info dropped and producers kept")
	}
}

func compile(t testing.TB, bin []byte) {
	t.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	defer rt.Close(ctx)
	if _, err := rt.CompileModule(ctx, bin); err != nil {
		t.Fatal(err)
	}
}

// repoModules lists the checked-in .wasm files of the repository.
func repoModules(t testing.TB) []string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "stages")); err == nil {
				break
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("repository root not found")
		}
		dir = parent
	}
	var files []string
	cmd := exec.Command("git", "ls-files", "*.wasm")
	cmd.Dir = dir
	if outb, err := cmd.Output(); err == nil {
		for _, f := range strings.Fields(string(outb)) {
			files = append(files, filepath.Join(dir, f))
		}
		return files
	}
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".wasm") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestInstrumentRepositoryModules instruments every module of the
// repository but the Go guests (TestInstrumentRepositoryGoGuests) and
// compiles it, and the module as given, with wazero.
func TestInstrumentRepositoryModules(t *testing.T) {
	files := repoModules(t)
	if len(files) == 0 {
		t.Skip("no modules")
	}
	instrumentAndCompile(t, slices.DeleteFunc(files, isGoGuest))
}

// TestInstrumentRepositoryGoGuests is TestInstrumentRepositoryModules for
// the Go guests (a go.mod beside the module), about 2 MB each.
func TestInstrumentRepositoryGoGuests(t *testing.T) {
	testutil.GoGuests(t)
	files := slices.DeleteFunc(repoModules(t), func(p string) bool { return !isGoGuest(p) })
	if len(files) < 3 {
		t.Fatalf("found %d Go guests, want the 3 of examples/wasm: %v", len(files), files)
	}
	instrumentAndCompile(t, files)
}

// isGoGuest reports whether the module at path is a Go guest: its
// directory has a go.mod.
func isGoGuest(path string) bool {
	_, err := os.Stat(filepath.Join(filepath.Dir(path), "go.mod"))
	return err == nil
}

func instrumentAndCompile(t *testing.T, files []string) {
	t.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	defer rt.Close(ctx)
	for _, path := range files {
		bin := mustRead(t, path)
		m, err := Parse(bin)
		if err != nil {
			continue // modules kept as malformed examples
		}
		_, plainErr := rt.CompileModule(ctx, bin)
		if err := m.ValidateCode(); err != nil {
			if plainErr == nil {
				t.Errorf("%s: refused, but the engine compiles it: %v", path, err)
			}
			continue
		}
		if plainErr != nil {
			continue
		}
		out, st, err := Instrument(m, testOpts)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if _, err := rt.CompileModule(ctx, out); err != nil {
			t.Errorf("%s: instrumented module does not compile: %v", path, err)
		}
		t.Logf("%s: %d functions, %d loops, %d -> %d bytes", filepath.Base(path), st.Functions, st.Loops, len(bin), len(out))
	}
}

// largestRepoModule returns the largest checked-in module.
func largestRepoModule(b testing.TB) []byte {
	var best []byte
	for _, path := range repoModules(b) {
		if bin := mustRead(b, path); len(bin) > len(best) {
			best = bin
		}
	}
	return best
}

func BenchmarkInstrument(b *testing.B) {
	bin := largestRepoModule(b)
	b.SetBytes(int64(len(bin)))
	b.ReportAllocs()
	for b.Loop() {
		m, err := Parse(bin)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := Instrument(m, testOpts); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkValidateCode(b *testing.B) {
	bin := largestRepoModule(b)
	m, err := Parse(bin)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(bin)))
	b.ReportAllocs()
	for b.Loop() {
		if err := m.ValidateCode(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInstrumentedLoop runs the triple loop of loops.wasm plain and
// instrumented, to measure what the checks cost.
func BenchmarkInstrumentedLoop(b *testing.B) {
	ctx := context.Background()
	path := "testdata/instrument/loops.wasm"
	bin, out, _ := instrumentFile(b, path, testOpts)
	for _, c := range []struct {
		name string
		bin  []byte
		h    *fuelHost
	}{{"plain", bin, nil}, {"instrumented", out, &fuelHost{fuel: testOpts.Fuel}}} {
		b.Run(c.name, func(b *testing.B) {
			_, mod := instantiate(b, ctx, c.bin, c.h)
			f := mod.ExportedFunction("nested")
			for b.Loop() {
				if _, err := f.Call(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCalleesWorkIsCounted runs 100 calls of a leaf that loops 60 times
// (about 780 instructions, less than the fuel of 1000, so a leaf alone
// never runs out), leaving by each way out of a function. Every leaf
// iteration must be paid for: the leaves run 66,000 instructions or more
// and the driver about 3,000, so the host is called 66 to 100 times. A
// countdown local not stored back on some way out would lose the leaves'
// work, and only the driver's would count (about 3 calls).
func TestCalleesWorkIsCounted(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join("testdata", "instrument", "calls.wasm")
	opt := testOpts
	opt.Fuel = 1000
	_, out, _ := instrumentFile(t, path, opt)
	for _, exit := range []string{"fallthrough", "return", "br", "br_table"} {
		h := &fuelHost{fuel: opt.Fuel}
		_, mod := instantiate(t, ctx, out, h)
		res, err := mod.ExportedFunction(exit).Call(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res[0] != 100*60 {
			t.Errorf("%s: result %d, want 6000", exit, res[0])
		}
		if h.calls < 66 || h.calls > 100 {
			t.Errorf("%s: the host was called %d times for 69,000 to 100,000 instructions at a fuel of 1000", exit, h.calls)
		}
	}
}

// TestLoopExitsStoreTheCountdown runs exits.wasm's leaves, each of which
// leaves its loop from inside in another way (a br to an enclosing block
// or to the function, a br_table, a return, a br out of a nested loop,
// a loop with parameters falling through), 100 times each under a fuel
// of 1000: the leaves run 50,000 to 70,000 instructions and the driver
// about 3,000, so the host is called 45 to 80 times. A countdown local
// not stored back on some way out would lose the leaves' work.
func TestLoopExitsStoreTheCountdown(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join("testdata", "instrument", "exits.wasm")
	opt := testOpts
	opt.Fuel = 1000
	_, out, _ := instrumentFile(t, path, opt)
	for _, exit := range []string{"block", "body", "table", "return", "nested", "params"} {
		h := &fuelHost{fuel: opt.Fuel}
		_, mod := instantiate(t, ctx, out, h)
		res, err := mod.ExportedFunction(exit).Call(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res[0] != 100*40 {
			t.Errorf("%s: result %d, want 4000", exit, res[0])
		}
		if h.calls < 45 || h.calls > 80 {
			t.Errorf("%s: the host was called %d times for 53,000 to 73,000 instructions at a fuel of 1000", exit, h.calls)
		}
	}
}

// TestLoopFreeCallTreesAreCharged runs a call tree without loops, 1,111
// calls of about 13,000 instructions in all, at a fuel of 1000: each
// function charges the global at its entry, so the host is called 10 to
// 20 times. A loop-free function that charged only a local would never
// call it.
func TestLoopFreeCallTreesAreCharged(t *testing.T) {
	ctx := context.Background()
	tenCalls := func(f uint32) []byte { return bytes.Repeat(call(f), 10) }
	leaf := bytes.Repeat([]byte{opI32Const, 1, 0x1a}, 5) // i32.const 1; drop
	bin := eqModule{funcs: []eqFunc{
		fn(0, tenCalls(1)).exported("run"),
		fn(0, tenCalls(2)),
		fn(0, tenCalls(3)),
		fn(0, leaf),
	}}.build()
	m, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	opt := testOpts
	opt.Fuel = 1000
	out, _, err := Instrument(m, opt)
	if err != nil {
		t.Fatal(err)
	}
	h := &fuelHost{fuel: opt.Fuel}
	_, mod := instantiate(t, ctx, out, h)
	if _, err := mod.ExportedFunction("run").Call(ctx); err != nil {
		t.Fatal(err)
	}
	if h.calls < 10 || h.calls > 20 {
		t.Errorf("the host was called %d times for about 13,000 instructions at a fuel of 1000", h.calls)
	}
}

// TestBulkWorkIsCharged: an instruction whose work grows with its length
// operand is charged that length (bulk memory: a unit per 16 bytes;
// tables: per 2 elements), and memory.grow calls the host, so that
// a loop of large fills reaches the host about once per fill, not once
// per 2^18 iterations. Under a fuel of 1000, a loop-free 4 MiB fill
// reaches it once, 16 copies of 1 MiB in a loop 16 times, a 4096-element
// table fill once, and two grows twice; charged as one instruction each,
// none would reach it.
func TestBulkWorkIsCharged(t *testing.T) {
	ctx := context.Background()
	opt := testOpts
	opt.Fuel = 1000
	_, out, st := instrumentFile(t, filepath.Join("testdata", "instrument", "bulkcost.wasm"), opt)
	if st.Bulk != 8 {
		t.Errorf("%d bulk charges, want 8 (fill, copy, init, 3 table instructions, 2 grows)", st.Bulk)
	}
	for _, c := range []struct {
		name     string
		min, max int
	}{{"fill", 1, 1}, {"copy_loop", 16, 17}, {"init", 0, 0}, {"tables", 1, 2}, {"grow", 2, 2}} {
		h := &fuelHost{fuel: opt.Fuel}
		_, mod := instantiate(t, ctx, out, h)
		if _, err := mod.ExportedFunction(c.name).Call(ctx); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if h.calls < c.min || h.calls > c.max {
			t.Errorf("%s: the host was called %d times, want %d to %d", c.name, h.calls, c.min, c.max)
		}
	}
}
