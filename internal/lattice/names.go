package lattice

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
)

// Headers of lattice requests and answers.
const (
	// DeadlineHeader carries the caller's remaining deadline as a Go
	// duration ("250ms"), as the HTTP service's Stagehost-Deadline. The
	// host applies it as the call's context deadline (the wait for an
	// instance included).
	DeadlineHeader = "Stagehost-Deadline"
	// DeadlineAtHeader carries the call's absolute deadline, Unix
	// nanoseconds of the front's wall clock. A host prefers it to
	// DeadlineHeader: a call that waited in a paused host's socket keeps
	// its deadline. It assumes the members' clocks agree to well within
	// a second (docs/lattice.md, "Delivery").
	DeadlineAtHeader = "Stagehost-Deadline-At"
	// CallIDHeader carries the call's id: new for each call the front
	// sends, the same on every copy of it sent again. It is the call's
	// key in the calls bucket.
	CallIDHeader = "Stagehost-Call-Id"
	// ClaimAfterHeader says from when (Unix nanoseconds of the front's
	// clock) a host must claim the call's id in the calls bucket before
	// it starts it: the first copy carries its send time plus half the
	// front's AckTimeout, a copy sent again "0" (always). A host never
	// starts a call whose claim failed.
	ClaimAfterHeader = "Stagehost-Claim-After"
	// TraceparentHeader is the W3C trace context header (with
	// "tracestate"): the front's client span's context, or with no
	// tracer provider the caller's unchanged (or one the front makes).
	// The host parents its span on it and logs it with the call.
	TraceparentHeader = "traceparent"
	// AckHeader, on a request, asks the host that takes it to answer at
	// once with an empty message carrying HostHeader (the ack), before the
	// answer. The front uses it to know which host holds each call in
	// flight, so a call on a host that dies is answered "host <id> went
	// away" when the host's heartbeat expires, not at its deadline.
	AckHeader = "Stagehost-Ack"
	// RequestIDHeader carries the HTTP request id of the call (the
	// service's X-Request-Id): the host logs it with the call and its
	// stage's logs carry it.
	RequestIDHeader = "X-Request-Id"
	// HostHeader names the host that answered (or acked).
	HostHeader = "Stagehost-Host"
	// ClassHeader is the error class of an error answer (deploy's class
	// names); the micro service's Nats-Service-Error-Code header holds its
	// HTTP status and Nats-Service-Error the public message.
	ClassHeader = "Stagehost-Class"
	// NotRunHeader, on an error answer, says that the call ran nowhere:
	// every instance of the session on that host went out of service
	// while it waited for one, and the host left the session's queue
	// group. The front sends such a call again (at most
	// MaxNotRunResends times, within its deadline).
	NotRunHeader = "Stagehost-Not-Run"
	// ModelRevisionHeader, on a session call, carries the revision of
	// the session's desired module that the front knows as committed
	// (every live host acknowledged it: docs/lattice.md, "Model control
	// in a lattice"). A host that has applied an older one does not run
	// the call: it answers NotRunHeader, and the front sends it again.
	ModelRevisionHeader = "Stagehost-Model-Revision"
)

// placementExclusive is the placement a heartbeat and an endpoint's
// metadata name for a session one host at a time serves (the session's
// placement = "exclusive", deploy.Pool.Exclusive).
const placementExclusive = "exclusive"

// MaxNotRunResends bounds how many times a front sends a call again
// after NotRunHeader answers.
const MaxNotRunResends = 3

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// ValidName reports whether s may name a lattice, a host, a session or a
// resident session in a lattice: one NATS subject token and one KV key
// token, letters, digits, '-' or '_'.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// checkName checks a lattice name, host id, session or resident name:
// each is one NATS subject token and one KV key token.
func checkName(what, s string) error {
	if !nameRE.MatchString(s) {
		return fmt.Errorf("lattice: %s %q must be letters, digits, '-' or '_'", what, s)
	}
	return nil
}

// SessionSubject is the subject of a session's run endpoint: every host
// that serves the session subscribes to it in one queue group.
func SessionSubject(lattice, session string) string {
	return "stagehost." + lattice + ".session." + session + ".run"
}

// QueueGroup is the queue group of a session's endpoint.
func QueueGroup(lattice, session string) string {
	return "stagehost." + lattice + ".session." + session
}

// ResidentStartSubject is the subject of a resident session's start
// endpoint, and ResidentStatusSubject of its status endpoint: every host
// that has the resident subscribes to both in the resident's queue group
// ([ResidentQueueGroup]), so one of them answers each request.
func ResidentStartSubject(lattice, resident string) string {
	return "stagehost." + lattice + ".resident." + resident + ".start"
}

// ResidentStatusSubject: see [ResidentStartSubject].
func ResidentStatusSubject(lattice, resident string) string {
	return "stagehost." + lattice + ".resident." + resident + ".status"
}

// ResidentQueueGroup is the queue group of a resident session's
// endpoints.
func ResidentQueueGroup(lattice, resident string) string {
	return "stagehost." + lattice + ".resident." + resident
}

// ServiceName is the micro service name of a lattice's hosts
// ($SRV.PING.<name> finds them all).
func ServiceName(lattice string) string { return "stagehost-" + lattice }

// HostsBucket, QuarantineBucket and PlacementBucket name a lattice's KV
// buckets.
func HostsBucket(lattice string) string      { return "stagehost-" + lattice + "-hosts" }
func QuarantineBucket(lattice string) string { return "stagehost-" + lattice + "-quarantine" }
func PlacementBucket(lattice string) string  { return "stagehost-" + lattice + "-placement" }

// CallsBucket names a lattice's bucket of call claims.
func CallsBucket(lattice string) string { return "stagehost-" + lattice + "-calls" }

// Error is a call's error as the lattice answers it: the service's error
// class (deploy's class names, docs/service.md) and its public message
// (never a stack trace), and the host that answered, if any.
type Error struct {
	Class   string `json:"class"`
	Message string `json:"error"`
	Host    string `json:"host,omitempty"`
	Code    *int32 `json:"code,omitempty"` // the stage's code, for class client_error
}

func (e *Error) Error() string { return e.Message }

// Status is the HTTP status of the error's class.
func (e *Error) Status() int { return errdefs.HTTPStatus(e.Class) }

// Class returns the service's error class of err: an [*Error]'s class, or
// deploy.Class of a local error.
func Class(err error) string {
	var le *Error
	if errors.As(err, &le) {
		return le.Class
	}
	return deploy.Class(err)
}

func unavailable(host, format string, args ...any) *Error {
	return &Error{Class: errdefs.ClassUnavailable, Message: fmt.Sprintf(format, args...), Host: host}
}

// PayloadHeadroom is what a call's input or output leaves of the NATS
// server's max_payload for the message's headers (deadline, trace
// context, request id, host, class). A payload that does not fit in the
// rest goes through the payload store ([PayloadHeader]).
const PayloadHeadroom = 4 << 10
