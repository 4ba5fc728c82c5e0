package net_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stagehost/stagehost/examples/wasm/cnn/net"
	"github.com/stagehost/stagehost/examples/wasm/internal/modeltest"
	"github.com/stagehost/stagehost/examples/wasm/internal/simrun"
	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/internal/testutil"
)

// Bound is the largest error allowed against the float64 reference, per
// value: Tolerance·(1 + |reference|). The float32 ops (the exact tier plus
// softmax within 1 ulp) stay far inside it; the error measured is logged.
const Tolerance = 1e-5

// The committed module on the simulator matches the NumPy float64
// reference within the bound, and the emulator's run of the same stage
// code gives the same bytes.
func TestNetMatchesReferenceOnSimAndEmu(t *testing.T) {
	inputs, expected := modeltest.Read(t, net.InputSize, net.Classes)
	for i, in := range inputs {
		if want := stagehost.Float32Bytes(net.Values(uint32(2000+i), net.H*net.W, 1)); !bytes.Equal(in, want) {
			t.Fatalf("input %d: reference.py's Values differs from Go's", i)
		}
	}
	simOut := simrun.Run(t, "../stage/cnn.wasm", net.Programs, inputs...)
	emuOut := modeltest.RunEmu(t, modeltest.Emu(net.Programs, net.Run), inputs)
	for i := range inputs {
		if !bytes.Equal(simOut[i], emuOut[i]) {
			t.Errorf("input %d: sim and emu outputs differ", i)
		}
	}
	worst := modeltest.Within(t, simOut, expected, net.Classes, Tolerance)
	t.Logf("largest error |got-ref|/(1+|ref|): %.3g (bound %g)", worst, Tolerance)
}

func TestBadInput(t *testing.T) {
	e := modeltest.Emu(net.Programs, net.Run)
	_, err := e.Run("main", make([]byte, 3))
	var ce *emu.ClientError
	if !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusInvalidArgument) {
		t.Fatalf("%v", err)
	}
}

// BenchmarkNet: one call (upload, the network's batch of 6 launches, the
// download) on the simulator, through the committed module, and on the
// emulator.
func BenchmarkNet(b *testing.B) {
	in := stagehost.Float32Bytes(net.Values(2000, net.H*net.W, 1))
	b.Run("sim", func(b *testing.B) {
		call := simrun.Open(b, "../stage/cnn.wasm", net.Programs)
		for b.Loop() {
			if _, err := call(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("emu", func(b *testing.B) {
		e := modeltest.Emu(net.Programs, net.Run)
		for b.Loop() {
			if _, err := e.Run("main", in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The committed module on cuda0 (gemm.fast through cuBLAS when it loads)
// stays within the float64 reference's bound. It skips without a usable
// GPU, unless STAGEHOST_REQUIRE_GPU=1.
func TestNetOnCUDA(t *testing.T) {
	p, err := cuda.Open(cuda.NewConfig())
	testutil.GPU(t, err)
	t.Cleanup(func() { p.Close() })
	inputs, expected := modeltest.Read(t, net.InputSize, net.Classes)
	out := simrun.RunOn(t, "../stage/cnn.wasm", net.Programs, p.Devices()[0], inputs...)
	worst := modeltest.Within(t, out, expected, net.Classes, Tolerance)
	t.Logf("%d inputs on cuda0: largest error |got-ref|/(1+|ref|): %.3g (bound %g)", len(inputs), worst, Tolerance)
}
