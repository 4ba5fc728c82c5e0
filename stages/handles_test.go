package stages

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

func TestHandleTableAnswersEveryKindOfBadHandle(t *testing.T) {
	tab := newHandleTable(7)
	s0 := tab.declare(handleEntry{kind: abi.KindStream}, "s0")
	noop := tab.declare(handleEntry{kind: abi.KindProgram}, "noop")
	buf, err := tab.allocate(&handleEntry{kind: abi.KindBuffer})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		h    abi.Handle
		kind abi.HandleKind
		want error
	}{
		{"declared stream", s0, abi.KindStream, nil},
		{"declared program", noop, abi.KindProgram, nil},
		{"live allocation", buf, abi.KindBuffer, nil},
		{"zero", 0, abi.KindStream, abi.ErrBadHandle},
		{"foreign tag", abi.MakeHandle(abi.KindStream, 8, s0.Serial()), abi.KindStream, abi.ErrForeignHandle},
		{"wrong kind asked", s0, abi.KindBuffer, abi.ErrBadHandle},
		{"kind bits forged", abi.MakeHandle(abi.KindBuffer, 7, s0.Serial()), abi.KindBuffer, abi.ErrBadHandle},
		{"never issued", abi.MakeHandle(abi.KindStream, 7, 99), abi.KindStream, abi.ErrBadHandle},
		{"allocation serial as a stream", abi.MakeHandle(abi.KindStream, 7, buf.Serial()), abi.KindStream, abi.ErrBadHandle},
	} {
		_, err := tab.get(uint64(tc.h), tc.kind)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	tab.free(buf)
	if _, err := tab.get(uint64(buf), abi.KindBuffer); !errors.Is(err, abi.ErrStaleHandle) {
		t.Fatalf("freed: %v", err)
	}
	// Freed handles keep no memory: a session that allocates and frees per
	// call does not grow its table.
	for range 1000 {
		h, _ := tab.allocate(&handleEntry{kind: abi.KindBuffer})
		tab.free(h)
	}
	if tab.live() != 0 || len(tab.allocated) != 0 || len(tab.declared) != 2 {
		t.Fatalf("table holds %d allocations and %d declarations", len(tab.allocated), len(tab.declared))
	}
}

// plainStream hides a stream's SubmitBatch, like a backend without it.
type plainStream struct{ hw.Stream }

func TestBatchesReachStreamsWithAndWithoutBatchSubmission(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	p := sim.New()
	defer p.Close()
	dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, wrap := range []bool{false, true} {
		st, err := dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		x, _ := dev.Alloc(16, 0, nil)
		fill, _ := dev.Prepare("fill")
		relu, _ := dev.Prepare("relu")
		cmds := []hw.Command{
			{Program: fill, Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.Float32(-3)}},
			{Program: relu, Args: []hw.Arg{hw.BufferArg(x, 0, -1)}},
			{Program: fill, Args: []hw.Arg{hw.BufferArg(x, 0, 4), hw.Float32(5)}},
		}
		var target hw.Stream = st
		if wrap {
			target = plainStream{st}
			if _, ok := target.(hw.BatchSubmitter); ok {
				t.Fatal("the wrapper still offers SubmitBatch")
			}
		}
		if err := submitAll(target, cmds); err != nil {
			t.Fatal(err)
		}
		if err := st.Sync(callCtx); err != nil {
			t.Fatal(err)
		}
		b, _ := x.HostBytes()
		got := []float32{math.Float32frombits(binary.NativeEndian.Uint32(b)), math.Float32frombits(binary.NativeEndian.Uint32(b[4:]))}
		if got[0] != 5 || got[1] != 0 || st.(*sim.Stream).Submitted() != 3 {
			t.Fatalf("wrapped %v: %v after %d commands, want [5 0] after 3 in order", wrap, got, st.(*sim.Stream).Submitted())
		}
		_ = st.Close(callCtx)
		_ = x.Free()
	}
}
