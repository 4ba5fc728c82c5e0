package stages

import (
	"errors"
	"testing"

	"github.com/stagehost/stagehost/abi"
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
