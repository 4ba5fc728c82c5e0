package net_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"testing"

	"github.com/stagehost/stagehost/examples/wasm/cnn/net"
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

// testdata/*.bin are written by ../reference.py.
func readTestdata(t *testing.T) (inputs [][]byte, expected []float64) {
	t.Helper()
	in, err := os.ReadFile("testdata/input.bin")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := os.ReadFile("testdata/expected.bin")
	if err != nil {
		t.Fatal(err)
	}
	for len(in) > 0 {
		inputs = append(inputs, in[:net.InputSize])
		in = in[net.InputSize:]
	}
	for i := 0; i < len(ex); i += 8 {
		expected = append(expected, math.Float64frombits(binary.LittleEndian.Uint64(ex[i:])))
	}
	if len(expected) != len(inputs)*net.Classes {
		t.Fatalf("%d expected values for %d inputs", len(expected), len(inputs))
	}
	return inputs, expected
}

func runOnEmu(t *testing.T, inputs [][]byte) [][]byte {
	t.Helper()
	e := emu.New(emu.NewConfig()).Stream("s0").Programs(net.Programs...)
	e.Stage("main", net.Run)
	var outs [][]byte
	for i, in := range inputs {
		out, err := e.Run("main", in)
		if err != nil {
			t.Fatalf("emu, input %d: %v", i, err)
		}
		outs = append(outs, out)
	}
	return outs
}

// The committed module on the simulator matches the NumPy float64
// reference within the bound, and the emulator's run of the same stage
// code gives the same bytes.
func TestNetMatchesReferenceOnSimAndEmu(t *testing.T) {
	inputs, expected := readTestdata(t)
	for i, in := range inputs {
		if want := stagehost.Float32Bytes(net.Values(uint32(2000+i), net.H*net.W, 1)); !bytes.Equal(in, want) {
			t.Fatalf("input %d: reference.py's Values differs from Go's", i)
		}
	}
	simOut := simrun.Run(t, "../stage/cnn.wasm", net.Programs, inputs...)
	emuOut := runOnEmu(t, inputs)
	worst := 0.0
	for i := range inputs {
		if !bytes.Equal(simOut[i], emuOut[i]) {
			t.Errorf("input %d: sim and emu outputs differ", i)
		}
		got := stagehost.Float32s(simOut[i])
		for j, g := range got {
			want := expected[i*net.Classes+j]
			err := math.Abs(float64(g)-want) / (1 + math.Abs(want))
			worst = max(worst, err)
			if !(err <= Tolerance) {
				t.Errorf("input %d value %d: %g, reference %g", i, j, g, want)
			}
		}
	}
	t.Logf("largest error |got-ref|/(1+|ref|): %.3g (bound %g)", worst, Tolerance)
}

func TestBadInput(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs(net.Programs...)
	e.Stage("main", net.Run)
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
		e := emu.New(emu.NewConfig()).Stream("s0").Programs(net.Programs...)
		e.Stage("main", net.Run)
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
	inputs, expected := readTestdata(t)
	out := simrun.RunOn(t, "../stage/cnn.wasm", net.Programs, p.Devices()[0], inputs...)
	worst := 0.0
	for i := range inputs {
		for j, g := range stagehost.Float32s(out[i]) {
			want := expected[i*net.Classes+j]
			err := math.Abs(float64(g)-want) / (1 + math.Abs(want))
			worst = max(worst, err)
			if !(err <= Tolerance) {
				t.Errorf("input %d value %d: %g, reference %g", i, j, g, want)
			}
		}
	}
	t.Logf("%d inputs on cuda0: largest error |got-ref|/(1+|ref|): %.3g (bound %g)", len(inputs), worst, Tolerance)
}
