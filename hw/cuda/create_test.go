package cuda

import (
	"errors"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// A cuStreamCreate that does not return (the H200 with resident kernels
// parked, docs/gpu.md) makes NewStream fail after its bound, not hang; when
// the driver call returns at last, the abandoned stream is destroyed and
// its driver thread exits, and the device keeps working.
func TestNewStreamBoundedWhenCreateHangs(t *testing.T) {
	p, f := newFakePlatform(t, 1, NewConfig().WithStreamCreateTimeout(20*time.Millisecond))
	dev, err := p.Device("cuda0")
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	f.createGate = gate
	_, err = dev.NewStream()
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("NewStream with a hung cuStreamCreate: %v, want ErrDeadlineExceeded", err)
	}
	f.destroyed = make(chan struct{}, 1)
	close(gate) // the driver returns at last
	select {
	case <-f.destroyed:
	case <-time.After(10 * time.Second):
		t.Fatal("the abandoned stream was not destroyed once cuStreamCreate returned")
	}
	f.destroyed = nil
	s, err := dev.NewStream()
	if err != nil {
		t.Fatalf("NewStream after the driver recovered: %v", err)
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}
