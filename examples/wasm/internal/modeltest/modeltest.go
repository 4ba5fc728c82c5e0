// Package modeltest holds what the tests of the example models that
// reference.py checks (cnn/net, transformer/block) share: their reference
// data ([Read]), the check of outputs against it ([Within]), and their
// stage on the guest SDK's emulator ([Emu], [RunEmu]).
package modeltest

import (
	"encoding/binary"
	"math"
	"os"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// Read reads the reference data that ../reference.py writes into the
// test's testdata directory: testdata/input.bin, the inputs one after the
// other, inputSize bytes each, and testdata/expected.bin, perInput
// little-endian float64 values per input. It fails t when a file cannot
// be read or the counts do not match.
func Read(t testing.TB, inputSize, perInput int) (inputs [][]byte, expected []float64) {
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
		inputs = append(inputs, in[:inputSize])
		in = in[inputSize:]
	}
	for i := 0; i < len(ex); i += 8 {
		expected = append(expected, math.Float64frombits(binary.LittleEndian.Uint64(ex[i:])))
	}
	if len(expected) != len(inputs)*perInput {
		t.Fatalf("%d expected values for %d inputs", len(expected), len(inputs))
	}
	return inputs, expected
}

// Within checks every float32 of each output against expected (perInput
// values per output, in order): the error |got−ref|/(1+|ref|) must be at
// most tolerance, and each value outside is an error of t naming the
// input and the value. It returns the largest error seen.
func Within(t testing.TB, outs [][]byte, expected []float64, perInput int, tolerance float64) (worst float64) {
	t.Helper()
	for i, out := range outs {
		for j, g := range stagehost.Float32s(out) {
			want := expected[i*perInput+j]
			err := math.Abs(float64(g)-want) / (1 + math.Abs(want))
			worst = max(worst, err)
			if !(err <= tolerance) {
				t.Errorf("input %d value %d: %g, reference %g", i, j, g, want)
			}
		}
	}
	return worst
}

// Emu is the stage run as the entry "main" on the emulator, with the
// stream "s0" and programs.
func Emu(programs []string, run func(*stagehost.Call) error) *emu.Emulator {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs(programs...)
	e.Stage("main", run)
	return e
}

// RunEmu calls the entry "main" of e once per input, failing t on any
// error; it returns the outputs in order.
func RunEmu(t testing.TB, e *emu.Emulator, inputs [][]byte) [][]byte {
	t.Helper()
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
