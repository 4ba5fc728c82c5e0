package ops

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

func f32s(n int) spec { return zeros(4 * n) }

// Every op refuses the launches its contract rules out, naming the
// argument; nothing is run.
func TestValidationRefusesHostileLaunches(t *testing.T) {
	big := uint64(MaxElems) + 1
	cases := []struct {
		name  string
		specs []spec
		want  string
	}{
		// Counts and kinds.
		{"exp", []spec{f32s(4)}, "exp: takes 2 arguments, got 1"},
		{"exp", []spec{sc(4), f32s(4)}, "exp: x (argument 0) is a scalar, want a buffer range"},
		{"affine", []spec{f32s(4), f32s(4), f32s(1), scF(0)}, "affine: a (argument 2) is a buffer range, want a scalar"},
		{"affine", []spec{f32s(4), f32s(4), sc(1 << 32), scF(0)}, "affine: a = 4,294,967,296 does not fit 32 bits"},
		// Lengths.
		{"exp", []spec{f32s(4), f32s(5)}, "exp: y has 5 values, len(x) = 4"},
		{"exp", []spec{zeros(6), zeros(6)}, "exp: x has 6 bytes, not a whole number of f32 values"},
		{"exp.f16", []spec{zeros(6), zeros(4)}, "exp.f16: y has 2 values, len(x) = 3"},
		{"exp", []spec{f32s(0), f32s(0)}, "exp: x has 0 values: zero-size launches are refused"},
		{"softmax", []spec{f32s(4096), f32s(4097), sc(1), sc(4097), sc(0)}, "softmax: x has 4,096 values, rows*cols = 4,097"},
		{"softmax", []spec{f32s(8), f32s(8), sc(2), sc(4), sc(5)}, "softmax: causal = 5 exceeds cols = 4"},
		{"layernorm", []spec{f32s(8), f32s(3), f32s(4), f32s(8), sc(2), sc(4), scF(1e-5)}, "layernorm: gamma has 3 values, cols = 4"},
		{"rmsnorm.bf16", []spec{zeros(16), zeros(8), zeros(14), sc(2), sc(4), scF(1e-5)}, "rmsnorm.bf16: y has 7 values, rows*cols = 8"},
		// Zero and huge dims, overflowing products.
		{"reduce_sum", []spec{f32s(4), f32s(1), sc(1), sc(0), sc(4)}, "reduce_sum: n = 0: dimensions must be at least 1"},
		{"reduce_sum", []spec{f32s(4), f32s(1), sc(big), sc(1), sc(1)}, "reduce_sum: outer = 2,147,483,648 exceeds the limit 2,147,483,647"},
		{"reduce_sum", []spec{f32s(4), f32s(1), sc(65536), sc(65536), sc(65536)}, "reduce_sum: outer*n*inner exceeds the limit 2,147,483,647"},
		{"gemm", []spec{f32s(4), f32s(4), f32s(4), sc(1 << 30), sc(1 << 30), sc(4), sc(0), sc(0), scF(1), scF(0), sc(1), sc(0), sc(0), sc(0)}, "gemm: (batch-1)*strideA + M*K exceeds the limit"},
		{"gemm", []spec{f32s(6), f32s(5), f32s(4), sc(2), sc(2), sc(3), sc(0), sc(0), scF(1), scF(0), sc(1), sc(0), sc(0), sc(0)}, "gemm: B has 5 values, (batch-1)*strideB + K*N = 6"},
		{"conv2d", []spec{f32s(1), f32s(1), f32s(0), f32s(1), sc(1), sc(1), sc(1), sc(1), sc(1), sc(1), sc(1), pack(1, 1), pack(0, 0), pack(1, 1), sc(0)}, "conv2d: groups = 0"},
		// Broadcasting.
		{"add", []spec{f32s(6), f32s(4), f32s(6), sc(1), sc(1), sc(2), sc(3), sc(1), sc(1), sc(2), sc(2)}, "add: dim 3: a3 = 3 and b3 = 2 do not broadcast"},
		{"mul", []spec{f32s(6), f32s(3), f32s(5), sc(1), sc(1), sc(2), sc(3), sc(1), sc(1), sc(1), sc(3)}, "mul: c has 5 values, the broadcast shape's product = 6"},
		{"sub", []spec{f32s(6), f32s(3), f32s(6), sc(1), sc(1), sc(2), sc(3), sc(1), sc(1), sc(0), sc(3)}, "sub: b2 = 0: dimensions must be at least 1"},
		// Overlaps.
		{"exp", []spec{f32s(8), {buffer: true, alias: 1}}, ""}, // in place: allowed
		{"add", []spec{f32s(3), f32s(6), aliasOf(0), sc(1), sc(1), sc(1), sc(3), sc(1), sc(1), sc(2), sc(3)}, "add: c has 3 values, the broadcast shape's product = 6"},
		{"gemm", []spec{f32s(4), f32s(4), aliasOf(0), sc(2), sc(2), sc(2), sc(0), sc(0), scF(1), scF(0), sc(1), sc(0), sc(0), sc(0)}, "gemm: C overlaps A"},
		{"reduce_max", []spec{f32s(4), aliasOf(0), sc(1), sc(1), sc(4)}, "reduce_max: y overlaps x"},
		{"gemm", []spec{f32s(8), f32s(4), f32s(6), sc(2), sc(2), sc(2), sc(0), sc(0), scF(1), scF(0), sc(2), sc(4), sc(0), sc(2)}, "gemm: strideC = 2 is less than M*N = 4"},
		// Op-specific scalars.
		{"gemm", []spec{f32s(4), f32s(4), f32s(4), sc(2), sc(2), sc(2), sc(2), sc(0), scF(1), scF(0), sc(1), sc(0), sc(0), sc(0)}, "gemm: transA = 2, want 0 or 1"},
		{"transpose", []spec{f32s(6), f32s(6), sc(1), sc(1), sc(2), sc(3), sc(0), sc(1), sc(1), sc(3)}, "transpose: p0..p3 = 0 1 1 3 is not a permutation of 0..3"},
		{"conv2d", []spec{f32s(16), f32s(9), f32s(0), f32s(4), sc(1), sc(1), sc(4), sc(4), sc(1), sc(3), sc(3), pack(0, 1), pack(0, 0), pack(1, 1), sc(1)}, "conv2d: stride = (0, 1): both halves must be at least 1"},
		{"conv2d", []spec{f32s(16), f32s(25), f32s(0), f32s(1), sc(1), sc(1), sc(4), sc(4), sc(1), sc(5), sc(5), pack(1, 1), pack(0, 0), pack(1, 1), sc(1)}, "conv2d: the height window spans 5 values, more than the padded input's 4"},
		{"conv2d", []spec{f32s(16), f32s(9), f32s(2), f32s(4), sc(1), sc(1), sc(4), sc(4), sc(1), sc(3), sc(3), pack(1, 1), pack(0, 0), pack(1, 1), sc(1)}, "conv2d: bias has 2 values, want K = 1 or none"},
		{"conv2d", []spec{f32s(48), f32s(9), f32s(0), f32s(8), sc(1), sc(3), sc(4), sc(4), sc(2), sc(3), sc(3), pack(1, 1), pack(0, 0), pack(1, 1), sc(2)}, "conv2d: groups = 2 divides neither C = 3 nor K = 2 evenly"},
		{"maxpool2d", []spec{f32s(16), f32s(4), sc(1), sc(1), sc(4), sc(4), sc(2), sc(2), pack(2, 2), pack(0, 0)}, ""},
		{"maxpool2d", []spec{f32s(16), f32s(5), sc(1), sc(1), sc(4), sc(4), sc(2), sc(2), pack(2, 2), pack(0, 0)}, "maxpool2d: y has 5 values, N*C*P*Q = 4"},
		{"gather", []spec{f32s(6), zeros(0), f32s(0), sc(3), sc(2)}, "gather: idx has 0 values"},
		{"gather", []spec{f32s(6), i32s(1, 2), f32s(3), sc(3), sc(2)}, "gather: out has 3 values, len(idx)*cols = 4"},
		{"cast", []spec{f32s(2), zeros(4), sc(0), sc(4)}, "cast: to = 4 is not a dtype code"},
		{"cast", []spec{f32s(2), zeros(6), sc(0), sc(1)}, "cast: y has 3 f16 values, len(x) = 2"},
		{"cast", []spec{zeros(8), zeros(4), sc(1), sc(2)}, "cast: y has 2 bf16 values, len(x) = 4"},
	}
	for _, c := range cases {
		err := validate(c.name, c.specs...)
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: refused a valid launch: %v", c.name, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: got %v, want an *Error containing %q", c.name, err, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q, want it to contain %q", c.name, err, c.want)
		}
	}
}

// Partial overlaps are refused; exact aliasing only where allowed.
func TestPartialOverlapIsRefused(t *testing.T) {
	k, _ := Lookup("exp")
	args := []Arg{{Buffer: true, Addr: 4096, Len: 32}, {Buffer: true, Addr: 4100, Len: 32}}
	if err := k.Validate(args); err == nil || !strings.Contains(err.Error(), "y partially overlaps x") {
		t.Fatalf("exp with a shifted output: %v", err)
	}
	args[1].Addr = 4096
	if err := k.Validate(args); err != nil {
		t.Fatalf("exp in place: %v", err)
	}
	// Misaligned ranges.
	args[0].Addr = 4098
	if err := k.Validate(args); err == nil || !strings.Contains(err.Error(), "x is not 4-byte aligned") {
		t.Fatalf("misaligned x: %v", err)
	}
	// A range wrapping the address space.
	args[0] = Arg{Buffer: true, Addr: ^uint64(0) - 8, Len: 32}
	if err := k.Validate(args); err == nil || !strings.Contains(err.Error(), "wraps") {
		t.Fatalf("wrapping x: %v", err)
	}
}

// Run refuses memory that does not match the arguments, so a bad caller
// cannot make it read outside a range.
func TestRunRefusesMismatchedMemory(t *testing.T) {
	k, _ := Lookup("exp")
	args := []Arg{{Buffer: true, Addr: 4096, Len: 8}, {Buffer: true, Addr: 8192, Len: 8}}
	if err := k.Run(args, [][]byte{make([]byte, 8), make([]byte, 4)}); err == nil {
		t.Fatal("Run took 4 bytes of memory for an 8-byte range")
	}
}

// The table: every program has a description, the names follow the
// OP[.f16|.bf16][.fast] rule, and the half and fast variants exist exactly
// where the contract says.
func TestTableNamesAndVariants(t *testing.T) {
	want := map[string]bool{}
	for _, op := range []string{"exp", "log", "tanh", "sigmoid", "gelu_tanh", "gelu_erf", "silu", "rsqrt", "sqrt", "neg", "abs",
		"affine", "add", "sub", "mul", "div", "max", "min", "reduce_sum", "reduce_mean", "reduce_max", "reduce_argmax",
		"softmax", "log_softmax", "layernorm", "rmsnorm", "transpose", "gemm"} {
		want[op], want[op+".f16"], want[op+".bf16"] = true, true, true
	}
	for _, n := range []string{"gather", "conv2d", "maxpool2d", "avgpool2d", "cast", "gemm.fast", "gemm.f16.fast", "gemm.bf16.fast", "conv2d.fast"} {
		want[n] = true
	}
	names := Names()
	if len(names) != len(want) {
		t.Errorf("%d programs, want %d: %v", len(names), len(want), names)
	}
	for _, n := range names {
		if !want[n] {
			t.Errorf("unexpected program %q", n)
		}
		k, _ := Lookup(n)
		in := k.Info()
		if in.Doc == "" || in.Tier == "" || in.Exactness == "" || len(in.Args) == 0 || len(in.Args) > 16 {
			t.Errorf("%s: incomplete description %+v", n, in)
		}
		for _, a := range in.Args {
			if a.Type == "T" {
				t.Errorf("%s: argument %s has no storage type", n, a.Name)
			}
		}
	}
	if k, _ := Lookup("gemm.bf16.fast"); k.DType != BF16 || !k.Fast || k.Op != "gemm" || k.Info().Tier != TierFast {
		t.Errorf("gemm.bf16.fast: %+v", k)
	}
}

func TestNumbersHaveSeparators(t *testing.T) {
	for v, want := range map[uint64]string{0: "0", 999: "999", 1000: "1,000", 4097: "4,097", 2147483647: "2,147,483,647", 100000: "100,000"} {
		if got := num(v); got != want {
			t.Errorf("num(%d) = %q, want %q", v, got, want)
		}
	}
}

// Validating a valid launch allocates nothing (backends validate on every
// submit).
func TestValidateAllocatesNothing(t *testing.T) {
	for _, name := range []string{"softmax", "gemm.bf16", "conv2d", "add"} {
		k, _ := Lookup(name)
		args := validLaunch(rand.New(rand.NewPCG(1, 2)), k)
		if err := k.Validate(args); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { _ = k.Validate(args) }); n != 0 {
			t.Errorf("%s: Validate allocates %v times", name, n)
		}
	}
}
