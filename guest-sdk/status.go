package stagehost

import (
	"errors"
	"strconv"
)

// Status is the i32 result of a host function (ABI.md §5). Zero is success;
// guests treat every other value, including codes this SDK does not know,
// as a failure.
type Status int32

// The status codes of ABI v1 (ABI.md §5). The values are part of the ABI;
// abi/sdk_consistency_test.go in the host module checks them against the
// host's table.
const (
	StatusOK               Status = 0
	StatusBusy             Status = 1
	StatusDeviceLost       Status = 2
	StatusUnsupported      Status = 3
	StatusInvalidArgument  Status = 4
	StatusNotFound         Status = 5
	StatusOutOfBudget      Status = 6
	StatusDeadlineExceeded Status = 7
	StatusRejected         Status = 8
	StatusFault            Status = 9
	StatusClosed           Status = 10
	StatusBadHandle        Status = 11
	StatusStaleHandle      Status = 12
	StatusForeignHandle    Status = 13
	StatusOutOfBounds      Status = 14
	StatusOutputTooLarge   Status = 15
)

// statusNames are the ABI.md §5 names of the codes.
var statusNames = [...]string{
	StatusOK:               "OK",
	StatusBusy:             "BUSY",
	StatusDeviceLost:       "DEVICE_LOST",
	StatusUnsupported:      "UNSUPPORTED",
	StatusInvalidArgument:  "INVALID_ARGUMENT",
	StatusNotFound:         "NOT_FOUND",
	StatusOutOfBudget:      "OUT_OF_BUDGET",
	StatusDeadlineExceeded: "DEADLINE_EXCEEDED",
	StatusRejected:         "REJECTED",
	StatusFault:            "FAULT",
	StatusClosed:           "CLOSED",
	StatusBadHandle:        "BAD_HANDLE",
	StatusStaleHandle:      "STALE_HANDLE",
	StatusForeignHandle:    "FOREIGN_HANDLE",
	StatusOutOfBounds:      "OUT_OF_BOUNDS",
	StatusOutputTooLarge:   "OUTPUT_TOO_LARGE",
}

// statusClasses gives each code the class it belongs to, as in the host's
// error-class column of ABI.md §5: the handle and bounds codes are
// INVALID_ARGUMENT, OUTPUT_TOO_LARGE is OUT_OF_BUDGET, every other code is
// its own class.
var statusClasses = [...]Status{
	StatusOK:               StatusOK,
	StatusBusy:             StatusBusy,
	StatusDeviceLost:       StatusDeviceLost,
	StatusUnsupported:      StatusUnsupported,
	StatusInvalidArgument:  StatusInvalidArgument,
	StatusNotFound:         StatusNotFound,
	StatusOutOfBudget:      StatusOutOfBudget,
	StatusDeadlineExceeded: StatusDeadlineExceeded,
	StatusRejected:         StatusRejected,
	StatusFault:            StatusFault,
	StatusClosed:           StatusClosed,
	StatusBadHandle:        StatusInvalidArgument,
	StatusStaleHandle:      StatusInvalidArgument,
	StatusForeignHandle:    StatusInvalidArgument,
	StatusOutOfBounds:      StatusInvalidArgument,
	StatusOutputTooLarge:   StatusOutOfBudget,
}

// String returns the ABI name of s ("BAD_HANDLE"), or "UNKNOWN_STATUS(n)".
func (s Status) String() string {
	if s >= 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "UNKNOWN_STATUS(" + strconv.Itoa(int(s)) + ")"
}

// Class returns the class of s: s itself, or for the specific codes
// BAD_HANDLE, STALE_HANDLE, FOREIGN_HANDLE and OUT_OF_BOUNDS the class
// INVALID_ARGUMENT, and for OUTPUT_TOO_LARGE the class OUT_OF_BUDGET. An
// unknown code is its own class.
func (s Status) Class() Status {
	if s >= 0 && int(s) < len(statusClasses) {
		return statusClasses[s]
	}
	return s
}

// Err returns nil for StatusOK and otherwise the sentinel *Error of s (a
// new one for an unknown code).
func (s Status) Err() error {
	if s == StatusOK {
		return nil
	}
	if s > 0 && int(s) < len(sentinels) {
		return sentinels[s]
	}
	return &Error{Status: s}
}

// Error is the error of a failed host call: the ABI function (Op, e.g.
// "stream_submit"), the status it returned, the name a lookup did not find
// and the host's reason. SDK functions that reject an argument before
// calling the host use the status the host would have returned.
//
//	stagehost: stream_sync: FAULT: sim: ...: command 3: kernel "saxpy": saxpy: x has 4 values, y 2
//	stagehost: program_get "saxpi": NOT_FOUND
//
// errors.Is(err, ErrX) matches an *Error whose Status is X's, and also one
// whose Status belongs to X's class: errors.Is(err, ErrInvalidArgument)
// holds for a BAD_HANDLE error, errors.Is(err, ErrBadHandle) does not hold
// for a plain INVALID_ARGUMENT one.
type Error struct {
	Op     string
	Status Status
	// Name is the name stream_get, buffer_get or program_get did not
	// find, or "".
	Name string
	// Reason is the host's message for the failure (last_error, read
	// right after the failed call), or "" when it gave none.
	Reason string
}

func (e *Error) Error() string {
	s := "stagehost: "
	if e.Op != "" {
		s += e.Op
		if e.Name != "" {
			s += " " + quote(e.Name)
		}
		s += ": "
	}
	s += e.Status.String()
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Is reports whether target is an *Error without an Op (a sentinel such as
// ErrBadHandle) whose Status is e's status or e's status class, or an
// *Error with e's Op and Status (and e's Name, if target names one; the
// Reason is not compared).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t == nil {
		return false
	}
	if t.Op != "" {
		return t.Op == e.Op && t.Status == e.Status && (t.Name == "" || t.Name == e.Name)
	}
	return t.Status == e.Status || (t.Status != StatusOK && t.Status == e.Status.Class())
}

// Sentinel errors, one per non-zero status. Compare with errors.Is.
var (
	ErrBusy             = &Error{Status: StatusBusy}
	ErrDeviceLost       = &Error{Status: StatusDeviceLost}
	ErrUnsupported      = &Error{Status: StatusUnsupported}
	ErrInvalidArgument  = &Error{Status: StatusInvalidArgument}
	ErrNotFound         = &Error{Status: StatusNotFound}
	ErrOutOfBudget      = &Error{Status: StatusOutOfBudget}
	ErrDeadlineExceeded = &Error{Status: StatusDeadlineExceeded}
	ErrRejected         = &Error{Status: StatusRejected}
	ErrFault            = &Error{Status: StatusFault}
	ErrClosed           = &Error{Status: StatusClosed}
	ErrBadHandle        = &Error{Status: StatusBadHandle}
	ErrStaleHandle      = &Error{Status: StatusStaleHandle}
	ErrForeignHandle    = &Error{Status: StatusForeignHandle}
	ErrOutOfBounds      = &Error{Status: StatusOutOfBounds}
	ErrOutputTooLarge   = &Error{Status: StatusOutputTooLarge}
)

var sentinels = [...]*Error{
	StatusBusy:             ErrBusy,
	StatusDeviceLost:       ErrDeviceLost,
	StatusUnsupported:      ErrUnsupported,
	StatusInvalidArgument:  ErrInvalidArgument,
	StatusNotFound:         ErrNotFound,
	StatusOutOfBudget:      ErrOutOfBudget,
	StatusDeadlineExceeded: ErrDeadlineExceeded,
	StatusRejected:         ErrRejected,
	StatusFault:            ErrFault,
	StatusClosed:           ErrClosed,
	StatusBadHandle:        ErrBadHandle,
	StatusStaleHandle:      ErrStaleHandle,
	StatusForeignHandle:    ErrForeignHandle,
	StatusOutOfBounds:      ErrOutOfBounds,
	StatusOutputTooLarge:   ErrOutputTooLarge,
}

// check turns a host call's status into nil or an *Error naming op, with
// the host's reason (last_error) for a failure.
func check(op string, s Status) error {
	if s == StatusOK {
		return nil
	}
	return &Error{Op: op, Status: s, Reason: LastError()}
}

// checkName is check for a lookup of name. A NOT_FOUND needs no reason:
// the error names what was not found.
func checkName(op, name string, s Status) error {
	if s == StatusOK {
		return nil
	}
	e := &Error{Op: op, Status: s, Name: name}
	if s != StatusNotFound {
		e.Reason = LastError()
	}
	return e
}

// StatusOf returns the status a stage returning err reports to its caller
// (ABI.md §4.1): 0 for nil, the Status of the first *Error in err's chain
// if it has one, and 1 otherwise.
func StatusOf(err error) Status {
	if err == nil {
		return StatusOK
	}
	var e *Error
	if errors.As(err, &e) && e.Status != StatusOK {
		return e.Status
	}
	return 1
}
