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

var doubleArgs = []emu.VendorArg{
	{Name: "x", Kind: "buffer", DType: "f32", Dir: "in"},
	{Name: "y", Kind: "buffer", DType: "f32", Dir: "out"},
	{Name: "n", Kind: "u32"},
}

// double is the Go stand-in for a vendor kernel: y[i] = 2*x[i].
func double(args []emu.Arg) error {
	n := int(args[2].Value)
	for i := range n {
		v := math.Float32frombits(binary.LittleEndian.Uint32(args[0].Bytes[4*i:]))
		binary.LittleEndian.PutUint32(args[1].Bytes[4*i:], math.Float32bits(2*v))
	}
	return nil
}

// Launch a vendor kernel that the emulator runs through a Go function
// registered with VendorKernel.
func ExampleEmulator_VendorKernel() {
	e := emu.New(emu.NewConfig()).Stream("s0").
		BufferData("x", []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40}). // 1.0, 2.0
		Buffer("y", 8).
		VendorKernel("double", doubleArgs, double)
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s0")
		x, _ := c.Buffer("x")
		y, _ := c.Buffer("y")
		k, _ := c.Program("double")
		if err := s.Launch(k, stagehost.Dim3{1, 1, 1}, stagehost.Dim3{2, 1, 1}, 0, stagehost.Whole(x), stagehost.Whole(y), stagehost.U32(2)); err != nil {
			return err
		}
		out := make([]byte, 8)
		if err := s.Read(y, 0, out); err != nil {
			return err
		}
		return c.Write(out)
	})
	out, err := e.Run("main", nil)
	fmt.Printf("%x %v\n", out, err)
	// Output: 0000004000008040 <nil>
}

// TestVendorKernelRefusals: the emulator refuses what the host refuses,
// with the host's messages: a vendor kernel through Submit, a shape over
// the fixed limits, arguments not matching the declaration, a built-in
// program through Launch.
func TestVendorKernelRefusals(t *testing.T) {
	for _, row := range []struct {
		name string
		run  func(s stagehost.Stream, k, fill stagehost.Program, x, y stagehost.Buffer) error
		want string
	}{
		{"submit", func(s stagehost.Stream, k, _ stagehost.Program, x, y stagehost.Buffer) error {
			return s.Submit(k, stagehost.Whole(x), stagehost.Whole(y), stagehost.U32(2))
		}, `program "double" is a vendor kernel: launch it with stream_launch`},
		{"block over", func(s stagehost.Stream, k, _ stagehost.Program, x, y stagehost.Buffer) error {
			return s.Launch(k, stagehost.Dim3{1, 1, 1}, stagehost.Dim3{2048, 1, 1}, 0, stagehost.Whole(x), stagehost.Whole(y), stagehost.U32(2))
		}, `block.x = 2048, over the device's limit of 1024`},
		{"shared over", func(s stagehost.Stream, k, _ stagehost.Program, x, y stagehost.Buffer) error {
			return s.Launch(k, stagehost.Dim3{1, 1, 1}, stagehost.Dim3{1, 1, 1}, 1<<20, stagehost.Whole(x), stagehost.Whole(y), stagehost.U32(2))
		}, `1048576 bytes of shared memory, over the device's limit of 49152`},
		{"arg count", func(s stagehost.Stream, k, _ stagehost.Program, x, y stagehost.Buffer) error {
			return s.Launch(k, stagehost.Dim3{1, 1, 1}, stagehost.Dim3{1, 1, 1}, 0, stagehost.Whole(x), stagehost.Whole(y))
		}, `kernel "double" takes 3 arguments, got 2`},
		{"arg kind", func(s stagehost.Stream, k, _ stagehost.Program, x, y stagehost.Buffer) error {
			return s.Launch(k, stagehost.Dim3{1, 1, 1}, stagehost.Dim3{1, 1, 1}, 0, stagehost.Whole(x), stagehost.U32(1), stagehost.U32(2))
		}, `argument 1 (y) is a buffer (f32, out), got a scalar`},
		{"built in", func(s stagehost.Stream, _, fill stagehost.Program, x, y stagehost.Buffer) error {
			return s.Launch(fill, stagehost.Dim3{1, 1, 1}, stagehost.Dim3{1, 1, 1}, 0, stagehost.Whole(y), stagehost.F32(1))
		}, `program "fill" is built in`},
	} {
		t.Run(row.name, func(t *testing.T) {
			e := emu.New(emu.NewConfig()).Stream("s0").Buffer("x", 8).Buffer("y", 8).Programs("fill").
				VendorKernel("double", doubleArgs, double)
			e.Stage("main", func(c *stagehost.Call) error {
				s, _ := c.Stream("s0")
				x, _ := c.Buffer("x")
				y, _ := c.Buffer("y")
				k, _ := c.Program("double")
				fill, _ := c.Program("fill")
				err := row.run(s, k, fill, x, y)
				var se *stagehost.Error
				if !errors.As(err, &se) || se.Status != stagehost.StatusInvalidArgument {
					return fmt.Errorf("got %v, want INVALID_ARGUMENT", err)
				}
				if msg := stagehost.LastError(); !strings.Contains(msg, row.want) {
					return fmt.Errorf("last error %q, want it to contain %q", msg, row.want)
				}
				return nil
			})
			if _, err := e.Run("main", nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestVendorKernelRefusalsAsTheHostWordsThem: a vendor kernel in a batch
// is refused naming the command, and weights bound where a scalar is
// declared are refused as a buffer for a scalar (a scalar's direction is
// "in"), as the host (stages) says both.
func TestVendorKernelRefusalsAsTheHostWordsThem(t *testing.T) {
	for _, row := range []struct {
		name string
		run  func(s stagehost.Stream, k stagehost.Program, x, w stagehost.Buffer) error
		want string
	}{
		{"batch", func(s stagehost.Stream, k stagehost.Program, x, _ stagehost.Buffer) error {
			return s.SubmitBatch(stagehost.Cmd(k, stagehost.Whole(x), stagehost.Whole(x), stagehost.U32(2)))
		}, `command 0: program "double" is a vendor kernel: launch it with stream_launch`},
		{"weights for a scalar", func(s stagehost.Stream, k stagehost.Program, x, w stagehost.Buffer) error {
			return s.Launch(k, stagehost.Dim3{1, 1, 1}, stagehost.Dim3{1, 1, 1}, 0, stagehost.Whole(w), stagehost.Whole(x), stagehost.Whole(w))
		}, `kernel "double": argument 2 (n) is a u32 scalar, got a buffer`},
	} {
		t.Run(row.name, func(t *testing.T) {
			e := emu.New(emu.NewConfig().WithWeights("w", make([]byte, 8))).Stream("s0").Buffer("x", 8).
				VendorKernel("double", doubleArgs, double)
			e.Stage("main", func(c *stagehost.Call) error {
				s, _ := c.Stream("s0")
				x, _ := c.Buffer("x")
				k, _ := c.Program("double")
				w, err := stagehost.LookupWeights("w")
				if err != nil {
					return err
				}
				err = row.run(s, k, x, w)
				var se *stagehost.Error
				if !errors.As(err, &se) || se.Status != stagehost.StatusInvalidArgument {
					return fmt.Errorf("got %v, want INVALID_ARGUMENT", err)
				}
				if msg := stagehost.LastError(); !strings.Contains(msg, row.want) {
					return fmt.Errorf("last error %q, want it to contain %q", msg, row.want)
				}
				return nil
			})
			if _, err := e.Run("main", nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}
