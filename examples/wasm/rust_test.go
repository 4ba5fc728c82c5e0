package wasm_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"testing"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/stages"
)

// TestRustSoftmax runs the Rust example (rust/softmax.wasm, built from
// rust/src/lib.rs with the Rust SDK) on the sim backend: one batch of
// softmax and reduce_argmax on the device, one read. The probabilities
// are the simulator's bytes, which the Rust and Go emulators give too.
func TestRustSoftmax(t *testing.T) {
	f := newFixture(t)
	m := load(t, "rust/softmax.wasm", "softmax", stages.NewLoadConfig())
	s, err := engine(t).NewSession(context.Background(), f.rt, m,
		stages.NewSessionConfig("softmax", f.gpu).WithStreams("s0").WithPrograms("softmax", "reduce_argmax").WithBudget(4096))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	in := binary.LittleEndian.AppendUint32(nil, 2)
	in = binary.LittleEndian.AppendUint32(in, 4)
	in = append(in, f32bytes(1, 2, 3, 4, 0.5, 9, -1, 0)...)
	out, err := s.Run(context.Background(), in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 40 {
		t.Fatalf("%d bytes out, want 40", len(out))
	}
	// Row 0: softmax(1, 2, 3, 4), as in guest-sdk/testdata/emucases.txt.
	if got, want := hex.EncodeToString(out[:16]), "e24f033db878b23d6991723e91d7243f"; got != want {
		t.Errorf("row 0 probabilities %s, want %s", got, want)
	}
	if c0, c1 := binary.LittleEndian.Uint32(out[32:]), binary.LittleEndian.Uint32(out[36:]); c0 != 3 || c1 != 1 {
		t.Errorf("classes %d, %d; want 3, 1", c0, c1)
	}
	// A wrong input is the stage's client error, with its message.
	var ce *stages.ClientError
	if _, err := s.Run(context.Background(), in[:12], nil); err == nil || !errors.As(err, &ce) || ce.Code != 4 {
		t.Errorf("short input: %v", err)
	}
}

func f32bytes(v ...float32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// TestRustSoftmaxOnCUDA runs the Rust example, unchanged, on cuda0 and on
// sim: the classes must be equal and each probability within softmax's
// CUDA bound of the simulator's (docs/kernels.md: (cols/256 + 16) ulp +
// 2^-126 of the float64 result, which the simulator's is within 1 ulp
// of). Skips without a usable GPU, unless STAGEHOST_REQUIRE_GPU=1.
func TestRustSoftmaxOnCUDA(t *testing.T) {
	p := requireCUDA(t)
	gpu, err := p.Device("cuda0")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	m := load(t, "rust/softmax.wasm", "softmax", stages.NewLoadConfig())
	const rows, cols = 8, 300
	in := binary.LittleEndian.AppendUint32(nil, rows)
	in = binary.LittleEndian.AppendUint32(in, cols)
	for i := range rows * cols {
		in = binary.LittleEndian.AppendUint32(in, math.Float32bits(float32((i*7919)%1000)/97-5))
	}
	var outs [2][]byte
	for i, dev := range []hw.Device{f.gpu, gpu} {
		cfg := stages.NewSessionConfig("softmax-"+dev.Name(), dev).WithStreams("s0").WithPrograms("softmax", "reduce_argmax").WithBudget(1 << 20)
		s, err := engine(t).NewSession(context.Background(), f.rt, m, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if outs[i], err = s.Run(context.Background(), in, nil); err != nil {
			t.Fatalf("%s: %v", dev.Name(), err)
		}
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	sim, dev := outs[0], outs[1]
	if len(sim) != len(dev) || len(sim) != 4*(rows*cols+rows) {
		t.Fatalf("%d and %d bytes out", len(sim), len(dev))
	}
	bound := int64(cols/256 + 16 + 1)
	worst := int64(0)
	for i := range rows * cols {
		a := int64(binary.LittleEndian.Uint32(sim[4*i:]))
		b := int64(binary.LittleEndian.Uint32(dev[4*i:]))
		d := max(a-b, b-a)
		worst = max(worst, d)
		if d > bound {
			t.Errorf("probability %d: sim %v, cuda0 %v: %d ulp apart, bound %d", i,
				math.Float32frombits(uint32(a)), math.Float32frombits(uint32(b)), d, bound)
		}
	}
	if string(sim[4*rows*cols:]) != string(dev[4*rows*cols:]) {
		t.Errorf("classes differ: sim %x, cuda0 %x", sim[4*rows*cols:], dev[4*rows*cols:])
	}
	t.Logf("%d probabilities: at most %d ulp between sim and cuda0; classes equal", rows*cols, worst)
}
