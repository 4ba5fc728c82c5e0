package main

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

func newSession() *emu.Emulator {
	return emu.New(emu.NewConfig().WithBudget(4096)).Stream("s0").Programs("matmul", "bias", "relu", "argmax")
}

// fusedSession lists mlp_forward only: the stage must not need the others.
func fusedSession() *emu.Emulator {
	return emu.New(emu.NewConfig().WithBudget(4096)).Stream("s0").Programs("mlp_forward")
}

func TestMatchesReference(t *testing.T) {
	for _, c := range []struct {
		name string
		e    *emu.Emulator
	}{{"six launches", newSession()}, {"mlp_forward", fusedSession()}} {
		e := c.e
		for i, x := range append(model.TestInputs(64), model.RoundingInputs(64)...) {
			in := model.EncodeInput(x)
			out, err := e.Run("main", in)
			if err != nil {
				t.Fatalf("%s: input %d: %v", c.name, i, err)
			}
			want, _ := model.Predict(in)
			if !bytes.Equal(out, want) {
				c1, s1, _ := model.DecodeOutput(out)
				c2, s2, _ := model.DecodeOutput(want)
				t.Fatalf("%s: input %d: stage %d %v, reference %d %v", c.name, i, c1, s1, c2, s2)
			}
		}
		// Weights and work buffers were allocated once for the session.
		if used := e.BudgetUsed(); used != 4*model.NumParams+workSize {
			t.Errorf("%s: budget used %d", c.name, used)
		}
	}
}

// TestPrefersMLPForward: with mlp_forward listed, the six-launch batch is
// never submitted (its programs here fail if they run).
func TestPrefersMLPForward(t *testing.T) {
	e := emu.New(emu.NewConfig().WithBudget(4096)).Stream("s0").Programs("mlp_forward")
	for _, name := range []string{"matmul", "bias", "relu", "argmax"} {
		e.Kernel(name, func([]emu.Arg) error { return errors.New(name + " ran") })
	}
	in := model.EncodeInput(model.TestInputs(1)[0])
	want, _ := model.Predict(in)
	for range 3 {
		if out, err := e.Run("main", in); err != nil || !bytes.Equal(out, want) {
			t.Fatalf("%x %v", out, err)
		}
	}
}

func TestNewSessionReinitialises(t *testing.T) {
	in := model.EncodeInput(model.TestInputs(1)[0])
	want, _ := model.Predict(in)
	for i := range 4 {
		e := newSession() // a new session: cached handles are foreign there
		if i%2 == 1 {
			e = fusedSession() // and the other path
		}
		out, err := e.Run("main", in)
		if err != nil || !bytes.Equal(out, want) {
			t.Fatalf("%x %v", out, err)
		}
	}
}

func TestBadInput(t *testing.T) {
	_, err := newSession().Run("main", make([]byte, 31))
	var ce *emu.ClientError
	if !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusInvalidArgument) {
		t.Fatalf("%v", err)
	}
}

func TestMissingProgram(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("matmul", "bias", "relu")
	_, err := e.Run("main", make([]byte, model.InputSize))
	var ce *emu.ClientError
	if !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusNotFound) {
		t.Fatalf("%v", err)
	}
}

func TestBudgetTooSmall(t *testing.T) {
	e := emu.New(emu.NewConfig().WithBudget(512)).Stream("s0").Programs("matmul", "bias", "relu", "argmax")
	_, err := e.Run("main", make([]byte, model.InputSize))
	var ce *emu.ClientError
	if !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusOutOfBudget) {
		t.Fatalf("%v", err)
	}
}
