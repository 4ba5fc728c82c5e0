package block_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stagehost/stagehost/examples/wasm/internal/modeltest"
	"github.com/stagehost/stagehost/examples/wasm/internal/simrun"
	"github.com/stagehost/stagehost/examples/wasm/transformer/block"
	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// Bound is the largest error allowed against the float64 reference, per
// value: Tolerance·(1 + |reference|). The float32 ops (the exact tier plus
// softmax and gelu_tanh within 1 ulp) stay far inside it; the error measured
// is logged.
const Tolerance = 1e-5

// The committed module on the simulator matches the NumPy float64
// reference within the bound, and the emulator's run of the same stage
// code gives the same bytes.
func TestBlockMatchesReferenceOnSimAndEmu(t *testing.T) {
	if block.S != 8 {
		t.Skip("the reference data is for S = 8 (built without the tag block128)")
	}
	inputs, expected := modeltest.Read(t, block.InputSize, block.S*block.D)
	for i, in := range inputs {
		if want := stagehost.Float32Bytes(block.Values(uint32(1000+i), block.S*block.D, 2)); !bytes.Equal(in, want) {
			t.Fatalf("input %d: reference.py's Values differs from Go's", i)
		}
	}
	simOut := simrun.Run(t, "../stage/transformer.wasm", block.Programs, inputs...)
	emuOut := modeltest.RunEmu(t, modeltest.Emu(block.Programs, block.Run), inputs)
	for i := range inputs {
		if !bytes.Equal(simOut[i], emuOut[i]) {
			t.Errorf("input %d: sim and emu outputs differ", i)
		}
	}
	worst := modeltest.Within(t, simOut, expected, block.S*block.D, Tolerance)
	t.Logf("largest error |got-ref|/(1+|ref|): %.3g (bound %g)", worst, Tolerance)
}

func TestBadInput(t *testing.T) {
	e := modeltest.Emu(block.Programs, block.Run)
	_, err := e.Run("main", make([]byte, 3))
	var ce *emu.ClientError
	if !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusInvalidArgument) {
		t.Fatalf("%v", err)
	}
}

// BenchmarkBlock: one call (upload, the block's batch of 17 launches, the
// download) on the simulator, through the committed module, and on the
// emulator.
func BenchmarkBlock(b *testing.B) {
	if block.S != 8 {
		b.Skip("transformer.wasm is the S = 8 block (built without the tag block128)")
	}
	in := stagehost.Float32Bytes(block.Values(1000, block.S*block.D, 2))
	b.Run("sim", func(b *testing.B) {
		call := simrun.Open(b, "../stage/transformer.wasm", block.Programs)
		for b.Loop() {
			if _, err := call(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("emu", func(b *testing.B) {
		e := modeltest.Emu(block.Programs, block.Run)
		for b.Loop() {
			if _, err := e.Run("main", in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
