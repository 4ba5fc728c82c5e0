package wasmbin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// The types every eqModule declares, in this order.
var eqTypes = [][]byte{
	functype(nil, nil),                                       // 0: () -> ()
	functype(nil, []byte{valI32}),                            // 1: () -> i32
	functype([]byte{valI32}, []byte{valI32}),                 // 2: (i32) -> i32
	functype([]byte{valI32, valI32}, []byte{valI32}),         // 3: (i32 i32) -> i32
	functype([]byte{valI64}, []byte{valI64}),                 // 4: (i64) -> i64
	functype(nil, []byte{valI32, valI32}),                    // 5: () -> (i32 i32)
	functype(nil, []byte{valI64}),                            // 6: () -> i64
	functype([]byte{valI32, valI32}, []byte{valI32, valI32}), // 7: (i32 i32) -> (i32 i32)
}

// eqFunc is a defined function of an eqModule.
type eqFunc struct {
	typ    byte
	locals []byte // the locals' declaration vector; nil for none
	code   []byte // without the final end
	export string
	name   string // its entry in the name section, if the module has one
}

// eqModule describes a small module for the instrumented-equals-plain
// comparison. Function indices in code count the import env.add (type
// 3) first when imp is set.
type eqModule struct {
	name    string
	imp     bool
	funcs   []eqFunc
	start   uint32 // 1 + the start function's index; 0 for none
	memory  bool
	table   uint32   // the funcref table's size; 0 for none
	elems   []uint32 // function indices at table offset 0
	globals int      // mutable i32 globals, initialised to 0
	names   bool     // a name section with the funcs' names
	// rawNames, when set, are the name section's function names
	// (index, name), in this order.
	rawNames []funcName
	want     []string // substrings the plain outcome must contain
}

func (s eqModule) build() []byte {
	b := newBuilder()
	b.section(secType, vec(eqTypes...))
	if s.imp {
		b.section(secImport, vec(append(append(name("env"), name("add")...), KindFunc, 3)))
	}
	var fs [][]byte
	for _, f := range s.funcs {
		fs = append(fs, []byte{f.typ})
	}
	b.section(secFunction, vec(fs...))
	if s.table > 0 {
		b.section(secTable, vec(append([]byte{valFuncref, 0x00}, appendU32(nil, s.table)...)))
	}
	if s.memory {
		b.section(secMemory, vec([]byte{0x00, 0x01}))
	}
	if s.globals > 0 {
		var gs [][]byte
		for range s.globals {
			gs = append(gs, []byte{valI32, 1, opI32Const, 0, opEnd})
		}
		b.section(secGlobal, vec(gs...))
	}
	var ex [][]byte
	nImp := uint32(0)
	if s.imp {
		nImp = 1
	}
	for i, f := range s.funcs {
		if f.export != "" {
			ex = append(ex, appendU32(append(name(f.export), KindFunc), nImp+uint32(i)))
		}
	}
	b.section(secExport, vec(ex...))
	if s.start > 0 {
		b.section(secStart, appendU32(nil, s.start-1))
	}
	if len(s.elems) > 0 {
		var idx [][]byte
		for _, x := range s.elems {
			idx = append(idx, appendU32(nil, x))
		}
		b.section(secElement, vec(append([]byte{0x00, opI32Const, 0, opEnd}, vec(idx...)...)))
	}
	var bodies [][]byte
	for _, f := range s.funcs {
		body := f.locals
		if body == nil {
			body = []byte{0}
		}
		body = append(append(slices.Clip(body), f.code...), opEnd)
		bodies = append(bodies, append(appendU32(nil, uint32(len(body))), body...))
	}
	b.section(secCode, vec(bodies...))
	if s.names || s.rawNames != nil {
		var ns [][]byte
		for i, f := range s.funcs {
			if f.name != "" {
				ns = append(ns, append(appendU32(nil, nImp+uint32(i)), name(f.name)...))
			}
		}
		for _, e := range s.rawNames {
			ns = append(ns, append(appendU32(nil, e.index), name(e.name)...))
		}
		sub := vec(ns...)
		b.section(secCustom, append(append(name("name"), 1), append(appendU32(nil, uint32(len(sub))), sub...)...))
	}
	return b.out
}

// Instructions for the modules below.
func i32c(v int32) []byte                { return appendS32([]byte{opI32Const}, v) }
func call(f uint32) []byte               { return appendU32([]byte{opCall}, f) }
func cat(p ...[]byte) []byte             { return slices.Concat(p...) }
func fn(typ byte, code ...[]byte) eqFunc { return eqFunc{typ: typ, code: cat(code...)} }

func (f eqFunc) exported(n string) eqFunc { f.export = n; return f }
func (f eqFunc) named(n string) eqFunc    { f.name = n; return f }
func (f eqFunc) withLocals(l ...byte) eqFunc {
	f.locals = l
	return f
}

var (
	unreachable = []byte{0x00}
)

// eqModules returns the comparison's modules: traps of every kind the
// engine reports, in nested calls, indirect calls, loops and start
// functions, with and without an import and a name section, and code
// that returns normally.
func eqModules() []eqModule {
	var ms []eqModule
	// Each shape once without and once with the import, which moves
	// every defined function's index by one (d).
	for _, imp := range []bool{false, true} {
		d := uint32(0)
		suffix := ""
		if imp {
			d, suffix = 1, "_import"
		}
		add := func(m eqModule) {
			m.name += suffix
			m.imp = imp
			ms = append(ms, m)
		}
		nested := []eqFunc{
			fn(0, call(d+1)).exported("run"),
			fn(0, call(d+2)),
			fn(0, unreachable),
		}
		add(eqModule{name: "unreachable_nested", funcs: nested, want: []string{"unreachable", fmt.Sprintf(".$%d()", d+2)}})
		named := slices.Clone(nested)
		named[1] = named[1].named("middle")
		add(eqModule{name: "unreachable_some_named", funcs: named, names: true, want: []string{".middle()", fmt.Sprintf(".$%d()", d+2)}})
		named = slices.Clone(named)
		for i := range named {
			named[i] = named[i].named(fmt.Sprintf("f%d", i))
		}
		add(eqModule{name: "unreachable_named", funcs: named, names: true, want: []string{".f2()"}})
		// The engine reads a function names map in one pass expecting
		// ascending indices: here it finds only "c", and prints the others
		// by index; and it prints an empty name by index too.
		add(eqModule{name: "names_out_of_order", funcs: nested, rawNames: []funcName{{d + 2, "c"}, {d + 1, "b"}},
			want: []string{".c()", fmt.Sprintf(".$%d()", d+1)}})
		add(eqModule{name: "names_empty", funcs: nested, rawNames: []funcName{{d, ""}, {d + 1, "b"}},
			want: []string{".b()", fmt.Sprintf(".$%d()", d)}})
		startTrap := []eqFunc{fn(0, call(d+1)), fn(0, unreachable)}
		add(eqModule{name: "start_trap", funcs: startTrap, start: d + 1, want: []string{fmt.Sprintf("start function[%d] failed", d), "unreachable", fmt.Sprintf(".$%d()", d+1)}})
		startTrap = slices.Clone(startTrap)
		startTrap[0] = startTrap[0].exported("init")
		add(eqModule{name: "start_trap_exported", funcs: startTrap, start: d + 1, want: []string{"start function"}})
		add(eqModule{name: "start_ok", globals: 1, start: d + 1, funcs: []eqFunc{
			fn(0, i32c(42), []byte{opGlobalSet, 0}),
			fn(1, []byte{opGlobalGet, 0}).exported("run"),
		}, want: []string{"run: [42]"}})
		add(eqModule{name: "div_by_zero", funcs: []eqFunc{
			fn(1, i32c(7), call(d+1)).exported("run"),
			fn(2, []byte{opLocalGet, 0}, i32c(0), []byte{0x6d}), // i32.div_s
		}, want: []string{"integer divide by zero"}})
		add(eqModule{name: "overflow", funcs: []eqFunc{
			fn(1, i32c(-1<<31), i32c(-1), []byte{0x6d}).exported("run"),
		}, want: []string{"integer overflow"}})
		add(eqModule{name: "invalid_conversion", funcs: []eqFunc{
			fn(1, []byte{opF32Const, 0x00, 0x00, 0xc0, 0x7f, 0xa8}).exported("run"), // i32.trunc_f32_s NaN
		}, want: []string{"invalid conversion"}})
		add(eqModule{name: "oob_load", memory: true, funcs: []eqFunc{
			fn(1, i32c(65536), []byte{opI32Load, 2, 0}).exported("run"),
		}, want: []string{"out of bounds memory access"}})
		add(eqModule{name: "oob_store_in_loop", memory: true, funcs: []eqFunc{
			fn(0, call(d+1)).exported("run"),
			fn(0, []byte{opLoop, 0x40, opLocalGet, 0}, i32c(4096), []byte{opI32Add, opLocalTee, 0, opLocalGet, 0, 0x36, 2, 0, opBr, 0, opEnd}).withLocals(1, 1, valI32),
		}, want: []string{"out of bounds memory access"}})
		add(eqModule{name: "indirect_oob", table: 1, elems: []uint32{d + 1}, funcs: []eqFunc{
			fn(1, i32c(5), []byte{opCallIndirect, 1, 0}).exported("run"),
			fn(1, i32c(3)),
		}, want: []string{"invalid table access"}})
		add(eqModule{name: "indirect_type", table: 1, elems: []uint32{d + 1}, funcs: []eqFunc{
			fn(1, i32c(0), []byte{opCallIndirect, 1, 0}).exported("run"),
			fn(2, []byte{opLocalGet, 0}),
		}, want: []string{"indirect call type mismatch"}})
		add(eqModule{name: "indirect_null", table: 2, elems: []uint32{d + 1}, funcs: []eqFunc{
			fn(1, i32c(1), []byte{opCallIndirect, 1, 0}).exported("run"),
			fn(1, i32c(3)),
		}, want: []string{"invalid table access"}})
		add(eqModule{name: "indirect_trap", table: 1, elems: []uint32{d + 1}, funcs: []eqFunc{
			fn(1, i32c(0), []byte{opCallIndirect, 1, 0}).exported("run"),
			fn(1, call(d+2)),
			fn(1, unreachable),
		}, want: []string{fmt.Sprintf(".$%d() i32", d+1)}})
		add(eqModule{name: "indirect_ok", table: 1, elems: []uint32{d + 1}, funcs: []eqFunc{
			fn(1, i32c(0), []byte{opCallIndirect, 1, 0}).exported("run"),
			fn(1, i32c(3)),
		}, want: []string{"run: [3]"}})
		add(eqModule{name: "stack_overflow", funcs: []eqFunc{
			fn(0, call(d+1)).exported("run"),
			fn(0, call(d+1)),
		}, want: []string{"stack overflow"}})
		add(eqModule{name: "recursion_returns", funcs: []eqFunc{
			fn(6, []byte{opI64Const, 0xe8, 0x07}, call(d+1)).exported("run"), // fac-rec of 1,000
			fn(4, []byte{opLocalGet, 0, opI64Const, 0, 0x51, opIf, valI64, opI64Const, 1, opElse,
				opLocalGet, 0, opLocalGet, 0, opI64Const, 1, 0x7d}, call(d+1), []byte{0x7e, opEnd}),
		}, want: []string{"run: [0]"}})
		add(eqModule{name: "loop_sum", funcs: []eqFunc{
			fn(1, []byte{opLoop, 0x40,
				opLocalGet, 1, opLocalGet, 0, opI32Add, opLocalSet, 1,
				opLocalGet, 0}, i32c(1), []byte{opI32Add, opLocalTee, 0}, i32c(1000), []byte{opI32LtS, opBrIf, 0, opEnd,
				opLocalGet, 1}).exported("run").withLocals(1, 2, valI32),
		}, want: []string{"run: [499500]"}})
		add(eqModule{name: "loop_params", funcs: []eqFunc{
			fn(1, i32c(0), []byte{opLoop, 2}, i32c(3), []byte{opI32Add, opLocalTee, 0, opLocalGet, 0}, i32c(300),
				[]byte{opI32LtS, opBrIf, 0, opEnd}).exported("run").withLocals(1, 1, valI32),
		}, want: []string{"run: [300]"}})
		add(eqModule{name: "br_table_out", funcs: []eqFunc{
			fn(1, []byte{opBlock, 0x40, opLoop, 0x40, opLocalGet, 0}, i32c(1), []byte{opI32Add, opLocalTee, 0},
				i32c(50), []byte{opI32LtS, opBrTable, 1, 1, 0, opEnd, opEnd, opLocalGet, 0}).exported("run").withLocals(1, 1, valI32),
		}, want: []string{"run: [50]"}})
		add(eqModule{name: "trap_in_loop_callee", funcs: []eqFunc{
			fn(1, []byte{opLoop, 0x40, opLocalGet, 0}, i32c(1), []byte{opI32Add, opLocalTee, 0}, call(d+1),
				[]byte{0x1a, opBr, 0, opEnd}, i32c(0)).exported("run").withLocals(1, 1, valI32),
			fn(2, i32c(100), i32c(10), []byte{opLocalGet, 0, opI32Sub, 0x6d}), // 100 / (10 - x): traps at x = 10
		}, want: []string{"integer divide by zero"}})
		add(eqModule{name: "multi_value", funcs: []eqFunc{
			fn(5, i32c(1), i32c(2), call(d+1)).exported("run"),
			fn(7, []byte{opLocalGet, 1, opLocalGet, 0}),
		}, want: []string{"run: [2 1]"}})
		add(eqModule{name: "globals_through_calls", globals: 2, funcs: []eqFunc{
			fn(1, call(d+1), call(d+1), call(d+1), []byte{opGlobalGet, 0, opGlobalGet, 1, opI32Add}).exported("run"),
			fn(0, []byte{opGlobalGet, 0}, i32c(5), []byte{opI32Add, opGlobalSet, 0, opGlobalGet, 1}, i32c(1), []byte{opI32Add, opGlobalSet, 1}),
		}, want: []string{"run: [18]"}})
		add(eqModule{name: "memory_grow", memory: true, funcs: []eqFunc{
			fn(1, i32c(2), []byte{opMemoryGrow, 0, opMemorySize, 0, opI32Add}).exported("run"),
		}, want: []string{"run: [4]"}})
		add(eqModule{name: "memory_fill_oob", memory: true, funcs: []eqFunc{
			fn(0, i32c(65000), i32c(1), i32c(1000), []byte{opMiscPrefix, 11, 0}).exported("run"),
		}, want: []string{"out of bounds memory access"}})
		add(eqModule{name: "table_get_oob", table: 1, funcs: []eqFunc{
			fn(1, i32c(3), []byte{opTableGet, 0, opRefIsNull}).exported("run"),
		}, want: []string{"invalid table access"}})
		add(eqModule{name: "ref_func_table_set", table: 2, elems: []uint32{d + 1}, funcs: []eqFunc{
			fn(1, i32c(1), []byte{opRefFunc}, appendU32(nil, d+1), []byte{opTableSet, 0}, i32c(1), []byte{opCallIndirect, 1, 0}).exported("run"),
			fn(1, i32c(9)),
		}, want: []string{"run: [9]"}})
	}
	// The import itself, called.
	ms = append(ms, eqModule{name: "host_call", imp: true, funcs: []eqFunc{
		fn(1, i32c(2), i32c(3), call(0)).exported("run"),
	}, want: []string{"run: [5]"}})
	return ms
}

// eqOutcome instantiates bin on a fresh runtime of cfg, with env.add
// and, when fuel > 0, the interrupt import returning fuel, then calls
// every exported function; it returns what happened, one line per step.
// For an instrumented module, want and got are the plain and the
// instrumented start function's descriptions.
func eqOutcome(t *testing.T, cfg wazero.RuntimeConfig, bin []byte, fuel int32, got, want string) []string {
	t.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	defer rt.Close(ctx)
	if _, err := rt.NewHostModuleBuilder("env").NewFunctionBuilder().
		WithGoFunction(api.GoFunc(func(_ context.Context, st []uint64) { st[0] = uint64(uint32(st[0]) + uint32(st[1])) }),
			[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}).Export("add").
		Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	if fuel > 0 {
		if _, err := rt.NewHostModuleBuilder(testNamespace).NewFunctionBuilder().
			WithGoFunction(api.GoFunc(func(_ context.Context, st []uint64) { st[0] = uint64(fuel) }), nil, []api.ValueType{api.ValueTypeI32}).
			Export(testOpts.Name).Instantiate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mod, err := rt.InstantiateWithConfig(ctx, bin, wazero.NewModuleConfig().WithName(""))
	if err != nil {
		return []string{"instantiate: " + RenameStart(err, got, want).Error()}
	}
	out := []string{"instantiate: ok"}
	var names []string
	for n := range mod.ExportedFunctionDefinitions() {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		res, err := mod.ExportedFunction(n).Call(ctx)
		if err != nil {
			out = append(out, n+": "+err.Error())
		} else {
			out = append(out, fmt.Sprintf("%s: %v", n, res))
		}
	}
	return out
}

// TestInstrumentedEqualsPlain runs every eqModule plain and instrumented
// (with a fuel of 1, so that every check calls the host, and of 2^18, as
// the host runs modules) on the interpreter and the compiler, and
// requires the same outcome: whether instantiation fails and with which
// message (the start function named by its index in the input), and each
// export's results or trap message with its stack trace.
func TestInstrumentedEqualsPlain(t *testing.T) {
	engines := []struct {
		name string
		cfg  wazero.RuntimeConfig
	}{
		{"interpreter", wazero.NewRuntimeConfigInterpreter()},
		{"compiler", wazero.NewRuntimeConfigCompiler()},
	}
	mods := eqModules()
	if len(mods) < 50 {
		t.Fatalf("only %d modules", len(mods))
	}
	for _, s := range mods {
		t.Run(s.name, func(t *testing.T) {
			bin := s.build()
			m, err := Parse(bin)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.ValidateCode(); err != nil {
				t.Fatal(err)
			}
			want, _ := m.StartDesc()
			for _, e := range engines {
				plain := eqOutcome(t, e.cfg, bin, 0, "", "")
				joined := strings.Join(plain, "\n")
				for _, w := range s.want {
					if !strings.Contains(joined, w) {
						t.Errorf("%s: the plain outcome %q does not contain %q", e.name, joined, w)
					}
				}
				for _, fuel := range []int32{1, 1 << 18} {
					opt := testOpts
					opt.Fuel = fuel
					out, _, err := Instrument(m, opt)
					if err != nil {
						t.Fatal(err)
					}
					m2, err := Parse(out)
					if err != nil {
						t.Fatal(err)
					}
					got, _ := m2.StartDesc()
					inst := eqOutcome(t, e.cfg, out, fuel, got, want)
					if !slices.Equal(plain, inst) {
						t.Errorf("%s, fuel %d:\n plain:        %q\n instrumented: %q", e.name, fuel, plain, inst)
					}
				}
			}
		})
	}
}
