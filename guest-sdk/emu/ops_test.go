package emu_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// The typed helpers derive each op's scalars from the dims and submit the
// launches as one batch.
func TestOpsHelpers(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s").Programs("gemm", "affine", "softmax", "transpose", "add", "reduce_sum")
	var got []float32
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s")
		buf, err := c.Alloc(4 * 64)
		if err != nil {
			return err
		}
		t := func(off int, dims ...int) stagehost.Tensor {
			return stagehost.NewTensor(buf, 4*off, stagehost.DTypeF32, dims...)
		}
		a, b, cm, ct, row, sum := t(0, 2, 3), t(8, 3, 2), t(16, 2, 2), t(20, 2, 2), t(24, 2), t(28, 2)
		if err := s.Write(buf, 0, stagehost.Float32Bytes([]float32{1, 2, 3, 4, 5, 6, 0, 0, 1, 0, 0, 1, 1, 1})); err != nil {
			return err
		}
		if err := s.Write(buf, 4*24, stagehost.Float32Bytes([]float32{0, 1})); err != nil {
			return err
		}
		var o stagehost.Ops
		o.Gemm(a, b, cm, stagehost.GemmOpts{}). // [[1+3, 2+3], [4+6, 5+6]] = [[4 5] [10 11]]
							Affine(cm, cm, 0.5, 0).  // [[2 2.5] [5 5.5]]
							Transpose(cm, ct, 1, 0). // [[2 5] [2.5 5.5]]
							Add(ct, row, ct).        // + [0 1] broadcast: [[2 6] [2.5 6.5]]
							ReduceSum(ct, sum, 0).   // [4.5 12.5]
							Softmax(ct, ct, 0)
		if err := o.Submit(s); err != nil {
			return err
		}
		out := make([]byte, 4*30)
		if err := s.Read(buf, 0, out); err != nil {
			return err
		}
		got = stagehost.Float32s(out)
		return nil
	})
	if _, err := e.Run("main", nil); err != nil {
		t.Fatal(err)
	}
	if got[28] != 4.5 || got[29] != 12.5 {
		t.Errorf("reduce_sum = %v, want [4.5 12.5]", got[28:30])
	}
	e4 := 1 / (1 + math.Exp(-4))
	if d := math.Abs(float64(got[21]) - e4); d > 1e-7 {
		t.Errorf("softmax row 0 = %v, want [%v %v]", got[20:22], 1-e4, e4)
	}
}

// A launch the op's contract refuses fails at submit with
// INVALID_ARGUMENT, naming the op and the argument; nothing runs.
func TestOpsHelpersRefusedAtSubmit(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s").Programs("softmax")
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s")
		buf, _ := c.Alloc(4 * 16)
		x := stagehost.NewTensor(buf, 0, stagehost.DTypeF32, 2, 4)
		var o stagehost.Ops
		return o.Softmax(x, x.Reshape(9), 0).Submit(s) // y: 9 values for 2×4
	})
	_, err := e.Run("main", nil)
	var ce *emu.ClientError
	if !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusInvalidArgument) {
		t.Fatalf("got %v, want INVALID_ARGUMENT", err)
	}
	if !strings.Contains(err.Error(), "softmax: y has 9 values, rows*cols = 8") {
		t.Errorf("error %q does not name the op and argument", err)
	}
	// A program the session may not use.
	e2 := emu.New(emu.NewConfig()).Stream("s")
	e2.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s")
		buf, _ := c.Alloc(16)
		var o stagehost.Ops
		x := stagehost.NewTensor(buf, 0, stagehost.DTypeBF16, 8)
		return o.Exp(x, x).Submit(s)
	})
	if _, err := e2.Run("main", nil); !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusNotFound) {
		t.Fatalf("exp.bf16 without the program: %v", err)
	}
}

// Build a layer's launches with the typed helpers and submit them as one
// batch.
func ExampleOps() {
	e := emu.New(emu.NewConfig()).Stream("s").Programs("gemm", "affine", "gelu_tanh")
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s")
		buf, err := c.Alloc(4 * 12)
		if err != nil {
			return err
		}
		x := stagehost.NewTensor(buf, 0, stagehost.DTypeF32, 1, 4)  // 1×4
		w := stagehost.NewTensor(buf, 16, stagehost.DTypeF32, 4, 1) // 4×1
		y := stagehost.NewTensor(buf, 32, stagehost.DTypeF32, 1, 1)
		if err := s.Write(buf, 0, stagehost.Float32Bytes([]float32{1, 2, 3, 4, 1, 1, 1, 1})); err != nil {
			return err
		}
		var o stagehost.Ops
		o.Gemm(x, w, y, stagehost.GemmOpts{}).Affine(y, y, 0.1, 0).GeluTanh(y, y)
		if err := o.Submit(s); err != nil {
			return err
		}
		out := make([]byte, 4)
		if err := s.Read(buf, 32, out); err != nil {
			return err
		}
		return c.WriteString(fmt.Sprintf("%.4f", stagehost.Float32s(out)[0]))
	})
	out, err := e.Run("main", nil)
	fmt.Println(string(out), err)
	// Output: 0.8412 <nil>
}
