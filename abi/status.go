package abi

import (
	"errors"

	"github.com/stagehost/stagehost/hw"
)

// Status is a host function's result code. This file is the only place
// where status codes and host error classes are translated.
type Status int32

// Status codes of ABI v1 (ABI.md §5).
const (
	StatusOK Status = iota
	StatusBusy
	StatusDeviceLost
	StatusUnsupported
	StatusInvalidArgument
	StatusNotFound
	StatusOutOfBudget
	StatusDeadlineExceeded
	StatusRejected
	StatusFault
	StatusClosed
	StatusBadHandle
	StatusStaleHandle
	StatusForeignHandle
	StatusOutOfBounds
	StatusOutputTooLarge
	numStatus
)

// ABI-specific errors. Each belongs to a host error class, so callers that
// only care about classes can still use errors.Is with hw classes.
var (
	ErrBadHandle      = hw.Errorf(hw.ErrInvalidArgument, "bad handle")
	ErrStaleHandle    = hw.Errorf(hw.ErrInvalidArgument, "stale handle")
	ErrForeignHandle  = hw.Errorf(hw.ErrInvalidArgument, "handle of another session")
	ErrOutOfBounds    = hw.Errorf(hw.ErrInvalidArgument, "pointer or length outside guest memory")
	ErrOutputTooLarge = hw.Errorf(hw.ErrOutOfBudget, "output larger than its limit")
)

type statusInfo struct {
	name  string
	err   error // the sentinel: an ABI error or an hw class
	class error
}

var statuses = [numStatus]statusInfo{
	StatusOK:               {"OK", nil, nil},
	StatusBusy:             {"BUSY", hw.ErrBusy, hw.ErrBusy},
	StatusDeviceLost:       {"DEVICE_LOST", hw.ErrDeviceLost, hw.ErrDeviceLost},
	StatusUnsupported:      {"UNSUPPORTED", hw.ErrUnsupported, hw.ErrUnsupported},
	StatusInvalidArgument:  {"INVALID_ARGUMENT", hw.ErrInvalidArgument, hw.ErrInvalidArgument},
	StatusNotFound:         {"NOT_FOUND", hw.ErrNotFound, hw.ErrNotFound},
	StatusOutOfBudget:      {"OUT_OF_BUDGET", hw.ErrOutOfBudget, hw.ErrOutOfBudget},
	StatusDeadlineExceeded: {"DEADLINE_EXCEEDED", hw.ErrDeadlineExceeded, hw.ErrDeadlineExceeded},
	StatusRejected:         {"REJECTED", hw.ErrRejected, hw.ErrRejected},
	StatusFault:            {"FAULT", hw.ErrFault, hw.ErrFault},
	StatusClosed:           {"CLOSED", hw.ErrClosed, hw.ErrClosed},
	StatusBadHandle:        {"BAD_HANDLE", ErrBadHandle, hw.ErrInvalidArgument},
	StatusStaleHandle:      {"STALE_HANDLE", ErrStaleHandle, hw.ErrInvalidArgument},
	StatusForeignHandle:    {"FOREIGN_HANDLE", ErrForeignHandle, hw.ErrInvalidArgument},
	StatusOutOfBounds:      {"OUT_OF_BOUNDS", ErrOutOfBounds, hw.ErrInvalidArgument},
	StatusOutputTooLarge:   {"OUTPUT_TOO_LARGE", ErrOutputTooLarge, hw.ErrOutOfBudget},
}

func (s Status) String() string {
	if s >= 0 && s < numStatus {
		return statuses[s].name
	}
	return "UNKNOWN_STATUS"
}

// StatusOf maps an error to the status a guest sees: nil is OK, an ABI
// error its own code, anything else its host error class. An error of no
// class is a FAULT (the host never returns codes outside the table).
func StatusOf(err error) Status {
	if err == nil {
		return StatusOK
	}
	// The specific ABI errors first: they also match their broader class.
	for s := StatusBadHandle; s < numStatus; s++ {
		if errors.Is(err, statuses[s].err) {
			return s
		}
	}
	class := hw.ClassOf(err)
	for s := StatusBusy; s < StatusBadHandle; s++ {
		if statuses[s].class == class {
			return s
		}
	}
	return StatusFault
}

// Err maps a status back to an error of its class (nil for OK). Guest
// SDKs use it to give guests typed errors.
func (s Status) Err() error {
	if s == StatusOK {
		return nil
	}
	if s > 0 && s < numStatus {
		return statuses[s].err
	}
	return hw.Errorf(hw.ErrFault, "unknown status %d", int32(s))
}

// Class returns the host error class of a status (nil for OK).
func (s Status) Class() error {
	if s >= 0 && s < numStatus {
		return statuses[s].class
	}
	return hw.ErrFault
}
