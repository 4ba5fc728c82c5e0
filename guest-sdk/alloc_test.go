//go:build !race

package stagehost

import (
	"testing"

	"github.com/stagehost/stagehost/guest-sdk/internal/host"
)

type nopHost struct{ host.Host }

func (nopHost) StreamSubmit(uint64, uint64, []byte, uint32) int32 { return 0 }

// Submit must not allocate. (The race detector makes sync.Pool drop items,
// so this runs without it.)
func TestSubmitDoesNotAllocate(t *testing.T) {
	detach := host.Attach(nopHost{})
	defer detach()
	s, p, b := Stream{1}, Program{2}, Buffer{3}
	n := testing.AllocsPerRun(100, func() {
		if err := s.Submit(p, Buf(b, 0, 64), Whole(b), U32(4), U32(4), U32(4), F32(1)); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Errorf("Submit allocates %v times per call", n)
	}
}
