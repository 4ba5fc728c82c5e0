package wasmbin

import (
	"context"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// Recursive functions of type (i64) -> i64, exported as "rec", for the
// recursion depth the instrumentation leaves.
var (
	// facRec is the spec's fac-rec: n == 0 ? 1 : n * rec(n-1). It keeps
	// only n across its one call, not the engine's context pointers.
	facRec = []byte{0x00,
		opLocalGet, 0, opI64Const, 0, 0x51, opIf, valI64, opI64Const, 1, opElse, // i64.eq
		opLocalGet, 0, opLocalGet, 0, opI64Const, 1, 0x7d, opCall, 0, 0x7e, opEnd, // i64.sub, i64.mul
		opEnd}
	// twoCalls is n == 0 ? 0 : leaf(n) + rec(n-1), with leaf(n) = n & 1:
	// the engine keeps its context pointers across the first call.
	twoCalls = []byte{0x00,
		opLocalGet, 0, opI64Const, 0, 0x51, opIf, valI64, opI64Const, 0, opElse,
		opLocalGet, 0, opCall, 1, opLocalGet, 0, opI64Const, 1, 0x7d, opCall, 0, 0x7c, opEnd, // i64.add
		opEnd}
	leafBody = []byte{0x00, opLocalGet, 0, opI64Const, 1, 0x83, opEnd} // i64.and
)

// recModule is a module whose function 0, exported as "rec", has body
// rec, and whose function 1 has body leafBody.
func recModule(rec []byte) []byte {
	b := newBuilder()
	b.section(secType, vec(functype([]byte{valI64}, []byte{valI64})))
	b.section(secFunction, vec([]byte{0}, []byte{0}))
	b.section(secExport, vec(append(name("rec"), KindFunc, 0)))
	b.section(secCode, vec(append(appendU32(nil, uint32(len(rec))), rec...), append(appendU32(nil, uint32(len(leafBody))), leafBody...)))
	return b.out
}

// recursion instantiates bin (with the interrupt import returning
// 2^30) on a runtime of cfg, and returns a function that reports
// whether rec(n) returns rather than overflowing the stack.
func recursion(t testing.TB, cfg wazero.RuntimeConfig, bin []byte) func(n int) bool {
	t.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	t.Cleanup(func() { rt.Close(ctx) })
	if _, err := rt.NewHostModuleBuilder(testNamespace).NewFunctionBuilder().
		WithGoFunction(api.GoFunc(func(_ context.Context, st []uint64) { st[0] = 1 << 30 }), nil, []api.ValueType{api.ValueTypeI32}).
		Export(testOpts.Name).Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	mod, err := rt.Instantiate(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	rec := mod.ExportedFunction("rec")
	return func(n int) bool {
		_, err := rec.Call(ctx, uint64(n))
		if err != nil && !strings.Contains(err.Error(), "stack overflow") {
			t.Fatal(err)
		}
		return err == nil
	}
}

// deepest returns the deepest recursion for which returns holds, within
// 1 % or, if exact, exactly (at least 2^10 frames return).
func deepest(returns func(int) bool, exact bool) int {
	lo, hi := 1<<10, 1<<16
	for returns(hi) {
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 && (exact || hi-lo > lo/100) {
		if mid := (lo + hi) / 2; returns(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// TestInstrumentedRecursionDepth measures under the compiler the deepest
// recursion the plain module returns from, and requires the instrumented
// module to return from a fraction of it: 0.9 for a function that keeps
// the engine's context pointers across a call anyway (twoCalls: 0.998
// measured on amd64), 0.7 for fac-rec, which does not, and must for the
// entry's call of the host (0.715 measured: 56-byte frames against 40;
// RATIONALE.md, "Recursion depth under the compiler"). Under the
// interpreter, which counts frames, the depths are equal.
func TestInstrumentedRecursionDepth(t *testing.T) {
	if testing.Short() {
		t.Skip("recurses about two million frames deep")
	}
	for _, tc := range []struct {
		name string
		body []byte
		want float64
	}{
		{"fac_rec", facRec, 0.7},
		{"two_calls", twoCalls, 0.9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := recModule(tc.body)
			m, err := Parse(bin)
			if err != nil {
				t.Fatal(err)
			}
			out, _, err := Instrument(m, testOpts)
			if err != nil {
				t.Fatal(err)
			}
			plain := deepest(recursion(t, wazero.NewRuntimeConfigCompiler(), bin), false)
			n := int(float64(plain) * tc.want)
			if !recursion(t, wazero.NewRuntimeConfigCompiler(), out)(n) {
				t.Errorf("compiler: the plain module returns from %d frames, the instrumented one not from %d (%.2f of it)", plain, n, tc.want)
			}
			ip := deepest(recursion(t, wazero.NewRuntimeConfigInterpreter(), bin), true)
			ii := deepest(recursion(t, wazero.NewRuntimeConfigInterpreter(), out), true)
			if ii != ip {
				t.Errorf("interpreter: the plain module returns from %d frames at most, the instrumented one from %d", ip, ii)
			}
		})
	}
}

// BenchmarkRecursionDepth reports the deepest recursion (within 1 %)
// that returns under the compiler, plain and instrumented, and their
// ratio.
func BenchmarkRecursionDepth(b *testing.B) {
	for _, tc := range []struct {
		name string
		body []byte
	}{{"fac_rec", facRec}, {"two_calls", twoCalls}} {
		b.Run(tc.name, func(b *testing.B) {
			bin := recModule(tc.body)
			m, err := Parse(bin)
			if err != nil {
				b.Fatal(err)
			}
			out, _, err := Instrument(m, testOpts)
			if err != nil {
				b.Fatal(err)
			}
			var plain, inst int
			for b.Loop() {
				plain = deepest(recursion(b, wazero.NewRuntimeConfigCompiler(), bin), false)
				inst = deepest(recursion(b, wazero.NewRuntimeConfigCompiler(), out), false)
			}
			b.ReportMetric(float64(plain), "plain-frames")
			b.ReportMetric(float64(inst), "instrumented-frames")
			b.ReportMetric(float64(inst)/float64(plain), "ratio")
		})
	}
}
