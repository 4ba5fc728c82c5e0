package emu_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

func f32Bytes(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func f32Values(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// launchOnce runs a stage that launches the vendor kernel k once over
// the declared buffers named in bufs (whole), syncs, and returns the
// buffers' contents afterwards and the sync's error.
func launchOnce(t *testing.T, decl []emu.VendorArg, k emu.Kernel, data map[string][]byte, bufs ...string) (map[string][]float32, error) {
	t.Helper()
	e := emu.New(emu.NewConfig()).Stream("s0").VendorKernel("k", decl, k)
	for name, d := range data {
		e.BufferData(name, d)
	}
	var syncErr error
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s0")
		p, _ := c.Program("k")
		args := make([]stagehost.Arg, len(bufs))
		for i, n := range bufs {
			b, err := c.Buffer(n)
			if err != nil {
				return err
			}
			args[i] = stagehost.Whole(b)
		}
		if err := s.Launch(p, stagehost.Dim3{1, 1, 1}, stagehost.Dim3{1, 1, 1}, 0, args...); err != nil {
			return err
		}
		syncErr = s.Sync()
		return nil
	})
	_, err := e.Run("main", nil)
	if syncErr == nil && err != nil {
		t.Fatal(err)
	}
	got := map[string][]float32{}
	for name := range data {
		b, _ := e.Bytes(name)
		got[name] = f32Values(b)
	}
	return got, syncErr
}

// TestVendorKernelBuffersAreCopiedInAndOut: a vendor kernel gets copies
// of its buffers with the host's rules (ABI.md §3.6): an in range's
// writes are dropped, an out range starts zeroed, an inout range is
// copied in and back, a failed kernel's writes are dropped, and two
// arguments bound to one buffer get separate copies.
func TestVendorKernelBuffersAreCopiedInAndOut(t *testing.T) {
	in := emu.VendorArg{Name: "x", Kind: "buffer", DType: "f32", Dir: "in"}
	out := emu.VendorArg{Name: "y", Kind: "buffer", DType: "f32", Dir: "out"}
	inout := emu.VendorArg{Name: "y", Kind: "buffer", DType: "f32", Dir: "inout"}
	put := func(b []byte, i int, v float32) { binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v)) }
	get := func(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }
	t.Run("in", func(t *testing.T) {
		got, err := launchOnce(t, []emu.VendorArg{in}, func(a []emu.Arg) error {
			put(a[0].Bytes, 0, 99)
			return nil
		}, map[string][]byte{"x": f32Bytes(1, 2)}, "x")
		if err != nil || fmt.Sprint(got["x"]) != "[1 2]" {
			t.Errorf("x = %v (%v), want [1 2]: an in range is not copied back", got["x"], err)
		}
	})
	t.Run("out starts zeroed", func(t *testing.T) {
		var seen []float32
		got, err := launchOnce(t, []emu.VendorArg{out}, func(a []emu.Arg) error {
			seen = f32Values(a[0].Bytes)
			put(a[0].Bytes, 1, 7)
			return nil
		}, map[string][]byte{"y": f32Bytes(5, 6)}, "y")
		if fmt.Sprint(seen) != "[0 0]" {
			t.Errorf("the kernel saw y = %v, want [0 0]", seen)
		}
		if err != nil || fmt.Sprint(got["y"]) != "[0 7]" {
			t.Errorf("y = %v (%v), want [0 7]: the whole out range is copied back", got["y"], err)
		}
	})
	t.Run("inout", func(t *testing.T) {
		got, err := launchOnce(t, []emu.VendorArg{inout}, func(a []emu.Arg) error {
			put(a[0].Bytes, 0, get(a[0].Bytes, 0)+get(a[0].Bytes, 1))
			return nil
		}, map[string][]byte{"y": f32Bytes(5, 6)}, "y")
		if err != nil || fmt.Sprint(got["y"]) != "[11 6]" {
			t.Errorf("y = %v (%v), want [11 6]", got["y"], err)
		}
	})
	for _, fail := range []struct {
		name string
		end  func() error
	}{
		{"failure", func() error { return errors.New("boom") }},
		{"panic", func() error { panic("boom") }},
	} {
		t.Run(fail.name, func(t *testing.T) {
			got, err := launchOnce(t, []emu.VendorArg{in, out}, func(a []emu.Arg) error {
				put(a[1].Bytes, 0, 42)
				return fail.end()
			}, map[string][]byte{"x": f32Bytes(1), "y": f32Bytes(3)}, "x", "y")
			if !errors.Is(err, stagehost.ErrFault) {
				t.Fatalf("sync: %v, want FAULT", err)
			}
			if fmt.Sprint(got["y"]) != "[3]" {
				t.Errorf("y = %v, want [3]: a failed kernel's writes are not copied back", got["y"])
			}
		})
	}
	t.Run("aliased", func(t *testing.T) {
		// y[i] = x[i] + x[0], x and y the same buffer: x is the
		// buffer's bytes before the launch.
		got, err := launchOnce(t, []emu.VendorArg{in, out}, func(a []emu.Arg) error {
			for i := range len(a[0].Bytes) / 4 {
				put(a[1].Bytes, i, get(a[0].Bytes, i)+get(a[0].Bytes, 0))
			}
			return nil
		}, map[string][]byte{"b": f32Bytes(1, 2, 3, 4)}, "b", "b")
		if err != nil || fmt.Sprint(got["b"]) != "[2 3 4 5]" {
			t.Errorf("b = %v (%v), want [2 3 4 5]", got["b"], err)
		}
	})
	t.Run("copied back in argument order", func(t *testing.T) {
		a2 := inout
		a2.Name = "z"
		got, err := launchOnce(t, []emu.VendorArg{inout, a2}, func(a []emu.Arg) error {
			put(a[0].Bytes, 0, 10)
			return nil
		}, map[string][]byte{"b": f32Bytes(1)}, "b", "b")
		if err != nil || fmt.Sprint(got["b"]) != "[1]" {
			t.Errorf("b = %v (%v), want [1]: the second copy, unchanged, lands last", got["b"], err)
		}
	})
}

// TestTooManyArgumentsSetTheLastError: more than 16 arguments, or 1024
// commands, are refused by the host, whose last error names them, not
// left over from an earlier failure.
func TestTooManyArgumentsSetTheLastError(t *testing.T) {
	many := make([]stagehost.Arg, stagehost.MaxArgs+1)
	for i := range many {
		many[i] = stagehost.U32(0)
	}
	decl := make([]emu.VendorArg, 2)
	decl[0] = emu.VendorArg{Name: "a", Kind: "u32"}
	decl[1] = emu.VendorArg{Name: "b", Kind: "u32"}
	for _, row := range []struct {
		name string
		run  func(s stagehost.Stream, fill, k stagehost.Program) error
		want string
	}{
		{"submit", func(s stagehost.Stream, fill, _ stagehost.Program) error { return s.Submit(fill, many...) }, "17 arguments, at most 16"},
		{"launch", func(s stagehost.Stream, _, k stagehost.Program) error {
			return s.Launch(k, stagehost.Dim3{1, 1, 1}, stagehost.Dim3{1, 1, 1}, 0, many...)
		}, "17 arguments, at most 16"},
		{"batch command", func(s stagehost.Stream, fill, _ stagehost.Program) error {
			return s.SubmitBatch(stagehost.Cmd(fill), stagehost.Cmd(fill, many...))
		}, "17 arguments, at most 16"},
		{"batch", func(s stagehost.Stream, fill, _ stagehost.Program) error {
			cmds := make([]stagehost.Command, stagehost.MaxBatch+1)
			for i := range cmds {
				cmds[i] = stagehost.Cmd(fill)
			}
			return s.SubmitBatch(cmds...)
		}, "a batch of 1025 commands, at most 1024"},
	} {
		t.Run(row.name, func(t *testing.T) {
			e := emu.New(emu.NewConfig()).Stream("s0").Programs("fill").VendorKernel("k", decl, func([]emu.Arg) error { return nil })
			e.Stage("main", func(c *stagehost.Call) error {
				s, _ := c.Stream("s0")
				fill, _ := c.Program("fill")
				k, _ := c.Program("k")
				if _, err := c.Program("nope"); err == nil {
					return errors.New("program nope found")
				}
				err := row.run(s, fill, k)
				if !errors.Is(err, stagehost.ErrInvalidArgument) {
					return fmt.Errorf("got %v, want INVALID_ARGUMENT", err)
				}
				if msg := stagehost.LastError(); msg != row.want {
					return fmt.Errorf("last error %q, want %q", msg, row.want)
				}
				return nil
			})
			if _, err := e.Run("main", nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestArgumentRecordRefusalsNameTheProblem: a range outside its buffer
// is refused in the host's words, by a transfer and by a launch: an
// argument record's refusal names the argument, a transfer's does not.
func TestArgumentRecordRefusalsNameTheProblem(t *testing.T) {
	decl := []emu.VendorArg{{Name: "out", Kind: "buffer", DType: "f32", Dir: "out"}}
	e := emu.New(emu.NewConfig()).Stream("s0").Buffer("b", 64).Programs("fill").
		VendorKernel("store", decl, func([]emu.Arg) error { return nil })
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s0")
		b, _ := c.Buffer("b")
		fill, _ := c.Program("fill")
		k, _ := c.Program("store")
		one := stagehost.Dim3{1, 1, 1}
		for _, row := range []struct {
			err  error
			want string
		}{
			{s.Submit(fill, stagehost.Buf(b, 0, 128), stagehost.F32(1)), "argument 0: range [0,+128) outside a buffer of 64 bytes"},
			{s.Submit(fill, stagehost.F32(1), stagehost.Buf(b, 8, 64)), "argument 1: range [8,+64) outside a buffer of 64 bytes"},
			{s.Launch(k, one, one, 0, stagehost.Buf(b, 100, 4)), "argument 0: range [100,+4) outside a buffer of 64 bytes"},
			{s.Launch(k, one, one, 0, stagehost.Buf(b, 100, stagehost.ToEnd)), "argument 0: offset 100 beyond a buffer of 64 bytes"},
			{s.SubmitBatch(stagehost.Cmd(fill, stagehost.Buf(b, 60, 8), stagehost.F32(1))), "argument 0: range [60,+8) outside a buffer of 64 bytes"},
			{s.Write(b, 62, make([]byte, 4)), "range [62,+4) outside a buffer of 64 bytes"},
			{s.Read(b, 64, make([]byte, 1)), "range [64,+1) outside a buffer of 64 bytes"},
		} {
			if !errors.Is(row.err, stagehost.ErrInvalidArgument) {
				return fmt.Errorf("%q: got %v, want INVALID_ARGUMENT", row.want, row.err)
			}
			if msg := row.err.(*stagehost.Error).Reason; msg != row.want {
				return fmt.Errorf("reason %q, want %q", msg, row.want)
			}
		}
		return nil
	})
	if _, err := e.Run("main", nil); err != nil {
		t.Fatal(err)
	}
}

// TestValuesThatDoNotFitGetTheHostsLastError: an offset, length or size
// that does not fit its 32-bit parameter goes to the host as a value it
// refuses, so the error's reason and LastError are the host's text for
// that value, never an earlier failure's.
func TestValuesThatDoNotFitGetTheHostsLastError(t *testing.T) {
	decl := []emu.VendorArg{{Name: "out", Kind: "buffer", DType: "f32", Dir: "out"}}
	e := emu.New(emu.NewConfig()).Stream("s0").Buffer("b", 64).Programs("fill").
		VendorKernel("store", decl, func([]emu.Arg) error { return nil })
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s0")
		b, _ := c.Buffer("b")
		fill, _ := c.Program("fill")
		k, _ := c.Program("store")
		one := stagehost.Dim3{1, 1, 1}
		const record = "range [4294967295,+4294967294) outside a buffer of 64 bytes"
		for _, row := range []struct {
			name string
			call func() error
			want string
		}{
			{"Buf offset", func() error { return s.Submit(fill, stagehost.Buf(b, -1, 4), stagehost.F32(1)) }, "argument 0: " + record},
			{"Buf length", func() error { return s.Submit(fill, stagehost.F32(1), stagehost.Buf(b, 0, 1<<32)) }, "argument 1: " + record},
			{"Launch", func() error { return s.Launch(k, one, one, 0, stagehost.Buf(b, 0, -4)) }, "argument 0: " + record},
			{"SubmitBatch", func() error {
				return s.SubmitBatch(stagehost.Cmd(fill, stagehost.Whole(b), stagehost.F32(1)), stagehost.Cmd(fill, stagehost.Buf(b, -8, 8), stagehost.F32(1)))
			}, "argument 0: " + record},
			{"Write", func() error { return s.Write(b, -1, make([]byte, 4)) }, "range [4294967295,+4) outside a buffer of 64 bytes"},
			{"Read", func() error { return s.Read(b, 1<<32, make([]byte, 1)) }, "range [4294967295,+1) outside a buffer of 64 bytes"},
			{"WriteFrom", func() error { return c.WriteFrom(s, b, 0, -1) }, "range [4294967295,+0) outside a buffer of 64 bytes"},
			{"AllocBuffer", func() error { _, err := stagehost.AllocBuffer(-1); return err }, "buffer size 0"},
			{"AllocBuffer huge", func() error { _, err := stagehost.AllocBuffer(1 << 32); return err }, "buffer size 0"},
			{"AllocNamedBuffer", func() error { _, err := stagehost.AllocNamedBuffer("kv", -1); return err }, "buffer size 0"},
		} {
			// An earlier failure's text, which the row's must replace.
			if _, err := c.Program("nope"); !errors.Is(err, stagehost.ErrNotFound) {
				return fmt.Errorf("%s: program_get: %v", row.name, err)
			}
			err := row.call()
			var se *stagehost.Error
			if !errors.As(err, &se) || se.Status != stagehost.StatusInvalidArgument || se.Reason != row.want {
				return fmt.Errorf("%s: %v, want INVALID_ARGUMENT: %s", row.name, err, row.want)
			}
			if last := stagehost.LastError(); last != row.want {
				return fmt.Errorf("%s: LastError %q, want %q", row.name, last, row.want)
			}
		}
		return nil
	})
	if _, err := e.Run("main", nil); err != nil {
		t.Fatal(err)
	}
}

// TestCommandNumbersCountReads: a failed command's number counts every
// write, read and launch of the stream, as the host's (hw/sim) does.
func TestCommandNumbersCountReads(t *testing.T) {
	decl := []emu.VendorArg{{Name: "out", Kind: "buffer", DType: "f32", Dir: "out"}}
	e := emu.New(emu.NewConfig()).Stream("s0").Buffer("b", 16).
		VendorKernel("fail", decl, func([]emu.Arg) error { return errors.New("boom") })
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s0")
		b, _ := c.Buffer("b")
		k, _ := c.Program("fail")
		z := make([]byte, 16)
		if err := s.Write(b, 0, z); err != nil {
			return err
		}
		if err := s.Read(b, 0, z); err != nil {
			return err
		}
		if err := s.Launch(k, stagehost.Dim3{1, 1, 1}, stagehost.Dim3{1, 1, 1}, 0, stagehost.Whole(b)); err != nil {
			return err
		}
		err := s.Sync()
		if want := `stream "s0": command 3: kernel "fail": boom`; stagehost.LastError() != want {
			return fmt.Errorf("sync: %v, last error %q, want %q", err, stagehost.LastError(), want)
		}
		return nil
	})
	if _, err := e.Run("main", nil); !errors.Is(err, stagehost.ErrFault) || errors.As(err, new(*emu.ClientError)) {
		t.Fatalf("run: %v, want the fault only", err)
	}
}

// TestVendorKernelRegistrationAsAManifest: VendorKernel takes what a
// manifest's [[kernel]] takes and panics on what it refuses.
func TestVendorKernelRegistrationAsAManifest(t *testing.T) {
	buf := emu.VendorArg{Name: "x", Kind: "buffer", DType: "f32", Dir: "in"}
	k := func([]emu.Arg) error { return nil }
	args := func(n int) []emu.VendorArg {
		a := make([]emu.VendorArg, n)
		for i := range a {
			a[i] = emu.VendorArg{Name: fmt.Sprintf("a%d", i), Kind: "u32"}
		}
		return a
	}
	for _, row := range []struct {
		name string
		args []emu.VendorArg
		want string // "" accepted; else in the panic
	}{
		{strings.Repeat("k", 64), []emu.VendorArg{buf}, ""},
		{"a-z_0.9", args(16), ""},
		{"bytes", []emu.VendorArg{{Name: "x", Kind: "buffer", Dir: "out"}}, ""},
		{"", nil, "is not a kernel name"},
		{strings.Repeat("k", 65), nil, "is not a kernel name"},
		{"Double", nil, "is not a kernel name"},
		{"fill", nil, `"fill" is a built-in program's name`},
		{"softmax.bf16", nil, "is a built-in program's name"},
		{"spin", nil, "is a built-in program's name"},
		{"fault", nil, "is a built-in program's name"},
		{"k17", args(17), "17 arguments, more than a launch carries (16)"},
		{"dup", []emu.VendorArg{buf, buf}, `argument 1: the name "x" is given twice`},
		{"noname", []emu.VendorArg{{Kind: "u32"}}, "argument 0: an empty name"},
		{"dtype", []emu.VendorArg{{Name: "n", Kind: "u32", DType: "f32"}}, "only a buffer argument has a dtype or a direction"},
		{"dir", []emu.VendorArg{{Name: "n", Kind: "f32", Dir: "in"}}, "only a buffer argument has a dtype or a direction"},
		{"kind", []emu.VendorArg{{Name: "n", Kind: "u16"}}, `unknown kind "u16"`},
		{"bufdtype", []emu.VendorArg{{Name: "x", Kind: "buffer", DType: "f64", Dir: "in"}}, `unknown dtype "f64"`},
		{"bufdir", []emu.VendorArg{{Name: "x", Kind: "buffer", DType: "f32"}}, `unknown direction ""`},
	} {
		var got string
		func() {
			defer func() {
				if r := recover(); r != nil {
					got = fmt.Sprint(r)
				}
			}()
			emu.New(emu.NewConfig()).VendorKernel(row.name, row.args, k)
		}()
		switch {
		case row.want == "" && got != "":
			t.Errorf("%q: panicked: %s", row.name, got)
		case row.want != "" && !strings.Contains(got, row.want):
			t.Errorf("%q: panic %q, want it to contain %q", row.name, got, row.want)
		}
	}
}

// TestScalarKindsWithTheirArticle: a launch's refusal names a scalar kind
// after its article, as the host does: "an i32", "an f32", "a u32".
func TestScalarKindsWithTheirArticle(t *testing.T) {
	decl := []emu.VendorArg{{Name: "a", Kind: "i32"}, {Name: "f", Kind: "f32"}}
	e := emu.New(emu.NewConfig()).Stream("s0").Buffer("b", 16).VendorKernel("mix", decl, func([]emu.Arg) error { return nil })
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s0")
		b, _ := c.Buffer("b")
		k, _ := c.Program("mix")
		one := stagehost.Dim3{1, 1, 1}
		for _, row := range []struct {
			err  error
			want string
		}{
			{s.Launch(k, one, one, 0, stagehost.U64(1<<32), stagehost.U32(0)), `kernel "mix": argument 0 (a): 0x100000000 does not fit an i32`},
			{s.Launch(k, one, one, 0, stagehost.U32(0), stagehost.Whole(b)), `kernel "mix": argument 1 (f) is an f32 scalar, got a buffer`},
		} {
			var se *stagehost.Error
			if !errors.As(row.err, &se) || se.Status != stagehost.StatusInvalidArgument || se.Reason != row.want {
				return fmt.Errorf("got %v, want %q", row.err, row.want)
			}
		}
		return nil
	})
	if _, err := e.Run("main", nil); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "(this one is an f32 scalar)") {
			t.Errorf("panic %v, want it to name an f32 scalar", r)
		}
	}()
	emu.New(emu.NewConfig()).VendorKernel("k", []emu.VendorArg{{Name: "f", Kind: "f32", Dir: "in"}}, func([]emu.Arg) error { return nil })
}
