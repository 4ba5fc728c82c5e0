package lattice_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
)

// TestTimersComeFromTheCaller: the lattice has no timer defaults of its
// own (they are the manifest's): a host or front without its TTLs is
// refused before it touches the connection.
func TestTimersComeFromTheCaller(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range []lattice.HostConfig{
		{Lattice: "l", ID: "h"},
		{Lattice: "l", ID: "h", TTL: 1e9},
		{Lattice: "l", ID: "h", ClaimTTL: 1e9},
	} {
		if _, err := lattice.NewHost(ctx, nil, nil, cfg); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("NewHost TTL %v ClaimTTL %v: %v, want invalid_argument", cfg.TTL, cfg.ClaimTTL, err)
		}
	}
	if _, err := lattice.NewFront(ctx, nil, lattice.FrontConfig{Lattice: "l"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("NewFront without TTL: %v, want invalid_argument", err)
	}
}

// TestRemoteRefusalKeepsItsClass: a call that another host refused busy
// reaches the service as an error that errors.Is matches with
// errdefs.ErrBusy (and device_lost with ErrDeviceLost), with its class
// name, message and host; a class of the service's own (unavailable)
// matches no errdefs class.
func TestRemoteRefusalKeepsItsClass(t *testing.T) {
	answer := &lattice.Error{Class: errdefs.ClassBusy, Message: "session s: 2 of 2 instances busy", Host: "h2"}
	err := lattice.AsServiceError(answer)
	var re *errdefs.RemoteError
	if !errors.Is(err, errdefs.ErrBusy) || errors.Is(err, errdefs.ErrDeviceLost) || !errors.As(err, &re) ||
		re.Class != errdefs.ClassBusy || re.Host != "h2" || err.Error() != answer.Message {
		t.Fatalf("busy on h2: %#v", err)
	}
	if err := lattice.AsServiceError(&lattice.Error{Class: errdefs.ClassDeviceLost, Message: "lost"}); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Errorf("device_lost on another host: %v is not ErrDeviceLost", err)
	}
	if err := lattice.AsServiceError(&lattice.Error{Class: errdefs.ClassUnavailable, Message: "no host"}); errdefs.ClassOf(err) != nil || errdefs.Name(err) != errdefs.ClassUnavailable {
		t.Errorf("unavailable: class %v, name %q", errdefs.ClassOf(err), errdefs.Name(err))
	}
}
