package stagehost_test

import (
	"errors"
	"fmt"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

var statusTable = []struct {
	s     stagehost.Status
	name  string
	err   error
	class stagehost.Status
}{
	{stagehost.StatusBusy, "BUSY", stagehost.ErrBusy, stagehost.StatusBusy},
	{stagehost.StatusDeviceLost, "DEVICE_LOST", stagehost.ErrDeviceLost, stagehost.StatusDeviceLost},
	{stagehost.StatusUnsupported, "UNSUPPORTED", stagehost.ErrUnsupported, stagehost.StatusUnsupported},
	{stagehost.StatusInvalidArgument, "INVALID_ARGUMENT", stagehost.ErrInvalidArgument, stagehost.StatusInvalidArgument},
	{stagehost.StatusNotFound, "NOT_FOUND", stagehost.ErrNotFound, stagehost.StatusNotFound},
	{stagehost.StatusOutOfBudget, "OUT_OF_BUDGET", stagehost.ErrOutOfBudget, stagehost.StatusOutOfBudget},
	{stagehost.StatusDeadlineExceeded, "DEADLINE_EXCEEDED", stagehost.ErrDeadlineExceeded, stagehost.StatusDeadlineExceeded},
	{stagehost.StatusRejected, "REJECTED", stagehost.ErrRejected, stagehost.StatusRejected},
	{stagehost.StatusFault, "FAULT", stagehost.ErrFault, stagehost.StatusFault},
	{stagehost.StatusClosed, "CLOSED", stagehost.ErrClosed, stagehost.StatusClosed},
	{stagehost.StatusBadHandle, "BAD_HANDLE", stagehost.ErrBadHandle, stagehost.StatusInvalidArgument},
	{stagehost.StatusStaleHandle, "STALE_HANDLE", stagehost.ErrStaleHandle, stagehost.StatusInvalidArgument},
	{stagehost.StatusForeignHandle, "FOREIGN_HANDLE", stagehost.ErrForeignHandle, stagehost.StatusInvalidArgument},
	{stagehost.StatusOutOfBounds, "OUT_OF_BOUNDS", stagehost.ErrOutOfBounds, stagehost.StatusInvalidArgument},
	{stagehost.StatusOutputTooLarge, "OUTPUT_TOO_LARGE", stagehost.ErrOutputTooLarge, stagehost.StatusOutOfBudget},
}

func TestStatuses(t *testing.T) {
	if stagehost.StatusOK.String() != "OK" || stagehost.StatusOK.Err() != nil {
		t.Error("OK")
	}
	for i, c := range statusTable {
		if int(c.s) != i+1 {
			t.Errorf("%s = %d, want %d", c.name, c.s, i+1)
		}
		if c.s.String() != c.name {
			t.Errorf("%d.String() = %q, want %q", c.s, c.s.String(), c.name)
		}
		if c.s.Err() != c.err {
			t.Errorf("%v.Err() is not the sentinel", c.s)
		}
		if c.s.Class() != c.class {
			t.Errorf("%v.Class() = %v, want %v", c.s, c.s.Class(), c.class)
		}
		err := fmt.Errorf("wrapped: %w", &stagehost.Error{Op: "stream_sync", Status: c.s})
		if !errors.Is(err, c.err) {
			t.Errorf("%v: errors.Is(op error, sentinel) is false", c.s)
		}
		if !errors.Is(err, c.class.Err()) {
			t.Errorf("%v: does not match its class %v", c.s, c.class)
		}
		if !errors.Is(err, &stagehost.Error{Op: "stream_sync", Status: c.s}) {
			t.Errorf("%v: does not match an equal *Error", c.s)
		}
		if errors.Is(err, &stagehost.Error{Op: "stream_read", Status: c.s}) {
			t.Errorf("%v: matches an *Error of another op", c.s)
		}
		for _, other := range statusTable {
			if other.s != c.s && other.s != c.class && errors.Is(err, other.err) {
				t.Errorf("%v matches %v", c.s, other.s)
			}
		}
		if got := stagehost.StatusOf(err); got != c.s {
			t.Errorf("StatusOf(%v error) = %v", c.s, got)
		}
	}
	// The class relation is one-way.
	if errors.Is(stagehost.ErrInvalidArgument, stagehost.ErrBadHandle) {
		t.Error("INVALID_ARGUMENT matches BAD_HANDLE")
	}
	if s := stagehost.Status(99); s.String() != "UNKNOWN_STATUS(99)" || s.Class() != s || s.Err() == nil {
		t.Errorf("unknown status: %v %v %v", s, s.Class(), s.Err())
	}
	if !errors.Is(stagehost.Status(99).Err(), stagehost.Status(99).Err()) {
		t.Error("unknown status error does not match itself")
	}
	if got := (&stagehost.Error{Op: "buffer_get", Status: stagehost.StatusNotFound}).Error(); got != "stagehost: buffer_get: NOT_FOUND" {
		t.Errorf("Error() = %q", got)
	}
	if stagehost.ErrBadHandle.Error() != "stagehost: BAD_HANDLE" {
		t.Errorf("sentinel Error() = %q", stagehost.ErrBadHandle.Error())
	}
}

func TestStatusOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want stagehost.Status
	}{
		{nil, 0},
		{errors.New("plain"), 1},
		{stagehost.ErrNotFound, stagehost.StatusNotFound},
		{fmt.Errorf("ctx: %w", stagehost.ErrOutOfBudget), stagehost.StatusOutOfBudget},
		{&stagehost.Error{Op: "x"}, 1}, // a zero status must not report success
		{errors.Join(errors.New("a"), stagehost.ErrRejected), stagehost.StatusRejected},
	} {
		if got := stagehost.StatusOf(c.err); got != c.want {
			t.Errorf("StatusOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestLevels(t *testing.T) {
	for l, want := range map[stagehost.Level]string{0: "debug", 1: "info", 2: "warn", 3: "error", 7: "level(7)"} {
		if l.String() != want {
			t.Errorf("%d: %q", l, l.String())
		}
	}
}
