package wasm_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"testing"

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
