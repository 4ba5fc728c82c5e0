package stages

import (
	"context"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/abi"
)

// A launch of an op of the device op library that breaks its contract is
// refused by stream_submit itself (INVALID_ARGUMENT), before anything is
// enqueued, and last_error names the program and the argument; the
// program is found by its dotted name (softmax.bf16).
func TestOpLaunchRefusedAtSubmit(t *testing.T) {
	f := newWasmFixture(t)
	cfg := NewSessionConfig("op", f.gpu).WithStreams("s0").WithPrograms("softmax.bf16")
	s := f.session(t, abiModule(t, f, "op_refused"), cfg)
	out, err := s.Run(context.Background(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := &lastErrorOutput{t, out}
	if st := abi.Status(o.word()); st != abi.StatusInvalidArgument {
		t.Fatalf("stream_submit = %v, want INVALID_ARGUMENT", st)
	}
	if st, idle := abi.Status(o.word()), o.word(); st != abi.StatusOK || idle != 1 {
		t.Errorf("stream_idle = %v, %d; want OK, 1 (nothing enqueued)", st, idle)
	}
	if st := abi.Status(o.word()); st != abi.StatusOK {
		t.Errorf("stream_sync = %v, want OK (no device failure)", st)
	}
	const want = "softmax.bf16: x has 8 values, rows*cols = 9"
	if msg := o.message(); !strings.Contains(msg, want) {
		t.Errorf("last error %q lacks %q", msg, want)
	}
}
