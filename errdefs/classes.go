package errdefs

import "errors"

// The wire names of the error classes: the names the HTTP service's error
// bodies, its metrics' outcome label, /v1/sessions' outcomes and the
// lattice's answers use (docs/service.md, "Errors"). The classes of
// [Classes] are named by the ABI's status names in snake case; the other
// names are classes only the service and the lattice have.
const (
	ClassOK               = "ok"
	ClassBusy             = "busy"              // ErrBusy, and the service's own limits: 429
	ClassDeviceLost       = "device_lost"       // ErrDeviceLost (the session is quarantined or its device lost): 503
	ClassUnsupported      = "unsupported"       // ErrUnsupported: 501
	ClassInvalidArgument  = "invalid_argument"  // ErrInvalidArgument: 400
	ClassNotFound         = "not_found"         // ErrNotFound, and unknown routes: 404
	ClassOutOfBudget      = "out_of_budget"     // ErrOutOfBudget, and a request body over the session's max_input: 413
	ClassDeadlineExceeded = "deadline_exceeded" // ErrDeadlineExceeded: 504
	ClassRejected         = "rejected"          // ErrRejected (the device refused the submission; retry): 503
	ClassFault            = "fault"             // ErrFault (a trap, a failed command): 500
	ClassClosed           = "closed"            // ErrClosed (the session is closing): 503
	ClassClientError      = "client_error"      // the stage returned non-zero (stages.ClientError): 422
	ClassUnavailable      = "unavailable"       // the session could not be created (deploy.ErrUnavailable), or no host can run it: 503
	ClassClientClosed     = "client_closed"     // the client went away before the answer: 499 (never delivered)
	ClassMethodNotAllowed = "method_not_allowed"
	ClassUnauthenticated  = "unauthenticated" // no or wrong bearer token: 401
	ClassPermissionDenied = "permission_denied"
	ClassInternal         = "internal" // an error of no class: 500
	// ClassFailedPrecondition: ErrFailedPrecondition (a module's declared
	// requirements are not met by the session or the host): 409.
	ClassFailedPrecondition = "failed_precondition"
)

// StatusClientClosed is the status recorded (in the access log) for a
// request whose client went away first: nginx's 499. No client sees it.
const StatusClientClosed = 499

// classStatus maps every class name to its HTTP status. The numbers are
// net/http's StatusX constants, written out so that this package, which
// every other imports, does not import net/http.
var classStatus = map[string]int{
	ClassBusy:               429, // Too Many Requests
	ClassDeviceLost:         503, // Service Unavailable
	ClassUnsupported:        501, // Not Implemented
	ClassInvalidArgument:    400, // Bad Request
	ClassNotFound:           404, // Not Found
	ClassOutOfBudget:        413, // Request Entity Too Large
	ClassDeadlineExceeded:   504, // Gateway Timeout
	ClassRejected:           503,
	ClassFault:              500, // Internal Server Error
	ClassClosed:             503,
	ClassClientError:        422, // Unprocessable Entity
	ClassUnavailable:        503,
	ClassClientClosed:       StatusClientClosed,
	ClassMethodNotAllowed:   405, // Method Not Allowed
	ClassUnauthenticated:    401, // Unauthorized
	ClassPermissionDenied:   403, // Forbidden
	ClassInternal:           500,
	ClassFailedPrecondition: 409, // Conflict: the module conflicts with what the session offers
}

// HTTPStatus returns the HTTP status of a class name: the status the HTTP
// service answers an error of that class with, and the code the lattice's
// error answers carry. An unknown name is 500.
func HTTPStatus(class string) int {
	if st, ok := classStatus[class]; ok {
		return st
	}
	return 500
}

// classNames names the classes of [Classes].
var classNames = map[error]string{
	ErrBusy:             ClassBusy,
	ErrDeviceLost:       ClassDeviceLost,
	ErrUnsupported:      ClassUnsupported,
	ErrInvalidArgument:  ClassInvalidArgument,
	ErrNotFound:         ClassNotFound,
	ErrOutOfBudget:      ClassOutOfBudget,
	ErrDeadlineExceeded: ClassDeadlineExceeded,
	ErrRejected:         ClassRejected,
	ErrFault:            ClassFault,
	ErrClosed:           ClassClosed,
	// Not of [Classes] (no ABI status), but a wire name all the same, so
	// that another host's answer unwraps to it ([RemoteError]).
	ErrFailedPrecondition: ClassFailedPrecondition,
}

// Name returns the wire name of err's class ([ClassOf]): "" when err is
// nil or of none of [Classes]; a [*RemoteError]'s own class name.
func Name(err error) string {
	var re *RemoteError
	if errors.As(err, &re) {
		return re.Class
	}
	return classNames[ClassOf(err)]
}

// ByName returns the error class of a wire name: nil for a name that is
// not one of [Classes]' (ok, client_error, unavailable, …).
func ByName(name string) error {
	for class, n := range classNames {
		if n == name {
			return class
		}
	}
	return nil
}

// RemoteError is an error another host (of a lattice) answered a call
// with, or the lattice itself: its wire class name, its public message,
// the host that answered, if any, and the stage's code for class
// client_error. It unwraps to the error class of its name ([ByName]), so
// errors.Is(err, ErrBusy) holds for a call refused busy on another host.
type RemoteError struct {
	Class   string
	Message string
	Host    string
	Code    *int32
}

func (e *RemoteError) Error() string { return e.Message }

// Unwrap returns the class of e.Class, nil for a name of no class of
// [Classes].
func (e *RemoteError) Unwrap() error { return ByName(e.Class) }
