package hw

import "github.com/stagehost/stagehost/errdefs"

// The error classes moved to package errdefs. These names remain while
// the last packages move over; new code uses errdefs.
//
// Deprecated: use the names of package errdefs.
var (
	ErrBusy             = errdefs.ErrBusy
	ErrDeviceLost       = errdefs.ErrDeviceLost
	ErrUnsupported      = errdefs.ErrUnsupported
	ErrInvalidArgument  = errdefs.ErrInvalidArgument
	ErrNotFound         = errdefs.ErrNotFound
	ErrOutOfBudget      = errdefs.ErrOutOfBudget
	ErrDeadlineExceeded = errdefs.ErrDeadlineExceeded
	ErrRejected         = errdefs.ErrRejected
	ErrFault            = errdefs.ErrFault
	ErrClosed           = errdefs.ErrClosed
	Errorf              = errdefs.Errorf
	ContextError        = errdefs.ContextError
	ClassOf             = errdefs.ClassOf
	Classes             = errdefs.Classes
)
