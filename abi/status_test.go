package abi

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
)

func TestEveryStatusRoundTripsThroughItsError(t *testing.T) {
	for s := StatusOK; s < numStatus; s++ {
		err := s.Err()
		if got := StatusOf(err); got != s {
			t.Errorf("%v: StatusOf(Err()) = %v", s, got)
		}
		wrapped := fmt.Errorf("context: %w", err)
		if err != nil && StatusOf(wrapped) != s {
			t.Errorf("%v: wrapped maps to %v", s, StatusOf(wrapped))
		}
		if s != StatusOK && !errors.Is(err, s.Class()) {
			t.Errorf("%v: error is not of its class %v", s, s.Class())
		}
	}
}

func TestEveryHostClassHasAStatus(t *testing.T) {
	for _, c := range errdefs.Classes {
		s := StatusOf(errdefs.Errorf(c, "x"))
		if s == StatusOK || s.Class() != c {
			t.Errorf("class %v maps to %v", c, s)
		}
	}
	if StatusOf(errors.New("unclassified")) != StatusFault {
		t.Error("unclassified error must be a FAULT")
	}
	// A class error that wraps a cause of another class keeps its class.
	err := errdefs.Errorf(errdefs.ErrDeviceLost, "fence failed: %w", errdefs.ErrBusy)
	if StatusOf(err) != StatusDeviceLost {
		t.Errorf("got %v", StatusOf(err))
	}
	if Status(99).Err() == nil || Status(99).String() != "UNKNOWN_STATUS" {
		t.Error("unknown status")
	}
}

func TestHandleFields(t *testing.T) {
	h := MakeHandle(KindBuffer, 0xABCDEF, 0xFFFFFFFE)
	if h.Kind() != KindBuffer || h.Tag() != 0xABCDEF || h.Serial() != 0xFFFFFFFE {
		t.Fatalf("%x: %v %x %x", uint64(h), h.Kind(), h.Tag(), h.Serial())
	}
	if MakeHandle(KindStream, MaxTag+5, 1).Tag() != 4 {
		t.Fatal("tag not masked")
	}
}
