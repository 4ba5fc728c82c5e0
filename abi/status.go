package abi

import (
	"errors"

	"github.com/stagehost/stagehost/errdefs"
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

// ABI-specific errors. Each belongs to an error class of package errdefs,
// so callers that only care about classes can still use errors.Is with
// the errdefs classes.
var (
	ErrBadHandle      = errdefs.Errorf(errdefs.ErrInvalidArgument, "bad handle")
	ErrStaleHandle    = errdefs.Errorf(errdefs.ErrInvalidArgument, "stale handle")
	ErrForeignHandle  = errdefs.Errorf(errdefs.ErrInvalidArgument, "handle of another session")
	ErrOutOfBounds    = errdefs.Errorf(errdefs.ErrInvalidArgument, "pointer or length outside guest memory")
	ErrOutputTooLarge = errdefs.Errorf(errdefs.ErrOutOfBudget, "output larger than its limit")
)

type statusInfo struct {
	name  string
	err   error // the sentinel: an ABI error or an errdefs class
	class error
}

var statuses = [numStatus]statusInfo{
	StatusOK:               {"OK", nil, nil},
	StatusBusy:             {"BUSY", errdefs.ErrBusy, errdefs.ErrBusy},
	StatusDeviceLost:       {"DEVICE_LOST", errdefs.ErrDeviceLost, errdefs.ErrDeviceLost},
	StatusUnsupported:      {"UNSUPPORTED", errdefs.ErrUnsupported, errdefs.ErrUnsupported},
	StatusInvalidArgument:  {"INVALID_ARGUMENT", errdefs.ErrInvalidArgument, errdefs.ErrInvalidArgument},
	StatusNotFound:         {"NOT_FOUND", errdefs.ErrNotFound, errdefs.ErrNotFound},
	StatusOutOfBudget:      {"OUT_OF_BUDGET", errdefs.ErrOutOfBudget, errdefs.ErrOutOfBudget},
	StatusDeadlineExceeded: {"DEADLINE_EXCEEDED", errdefs.ErrDeadlineExceeded, errdefs.ErrDeadlineExceeded},
	StatusRejected:         {"REJECTED", errdefs.ErrRejected, errdefs.ErrRejected},
	StatusFault:            {"FAULT", errdefs.ErrFault, errdefs.ErrFault},
	StatusClosed:           {"CLOSED", errdefs.ErrClosed, errdefs.ErrClosed},
	StatusBadHandle:        {"BAD_HANDLE", ErrBadHandle, errdefs.ErrInvalidArgument},
	StatusStaleHandle:      {"STALE_HANDLE", ErrStaleHandle, errdefs.ErrInvalidArgument},
	StatusForeignHandle:    {"FOREIGN_HANDLE", ErrForeignHandle, errdefs.ErrInvalidArgument},
	StatusOutOfBounds:      {"OUT_OF_BOUNDS", ErrOutOfBounds, errdefs.ErrInvalidArgument},
	StatusOutputTooLarge:   {"OUTPUT_TOO_LARGE", ErrOutputTooLarge, errdefs.ErrOutOfBudget},
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
	class := errdefs.ClassOf(err)
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
	return errdefs.Errorf(errdefs.ErrFault, "unknown status %d", int32(s))
}

// Class returns the host error class of a status (nil for OK).
func (s Status) Class() error {
	if s >= 0 && s < numStatus {
		return statuses[s].class
	}
	return errdefs.ErrFault
}
