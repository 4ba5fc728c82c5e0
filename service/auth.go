package service

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/stagehost/stagehost/errdefs"
)

// tokenScope is what a bearer token may do.
type tokenScope int

// The scopes. An admin token may do everything an invoke token may.
const (
	// scopePublic: no token is needed (liveness and readiness).
	scopePublic tokenScope = iota
	// scopeInvoke: run sessions and read their state.
	scopeInvoke
	// scopeAdmin: metrics, the trace, resident starts and reads.
	scopeAdmin
)

func (s tokenScope) String() string {
	switch s {
	case scopeInvoke:
		return "invoke"
	case scopeAdmin:
		return "admin"
	}
	return "public"
}

// authenticator checks bearer tokens. With no token at all, it lets
// every request through.
type authenticator struct {
	admin, invoke [][sha256.Size]byte
}

func newAuthenticator(admin, invoke []string) *authenticator {
	a := &authenticator{}
	for _, t := range admin {
		a.admin = append(a.admin, sha256.Sum256([]byte(t)))
	}
	for _, t := range invoke {
		a.invoke = append(a.invoke, sha256.Sum256([]byte(t)))
	}
	return a
}

func (a *authenticator) enabled() bool { return len(a.admin)+len(a.invoke) > 0 }

// matches compares h with every token of list in constant time (the
// hashes have one length, and every token is compared).
func matches(list [][sha256.Size]byte, h [sha256.Size]byte) bool {
	ok := 0
	for i := range list {
		ok |= subtle.ConstantTimeCompare(list[i][:], h[:])
	}
	return ok == 1
}

// check returns nil when r may use a route of scope need, else the error
// to answer with (class unauthenticated or permission_denied).
func (a *authenticator) check(r *http.Request, need tokenScope) error {
	if need == scopePublic || !a.enabled() {
		return nil
	}
	auth := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(auth, " ")
	if auth == "" {
		return &serviceError{errdefs.ClassUnauthenticated, "this route needs a bearer token (Authorization: Bearer TOKEN)"}
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return &serviceError{errdefs.ClassUnauthenticated, "the Authorization header must be \"Bearer TOKEN\""}
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	isAdmin, isInvoke := matches(a.admin, h), matches(a.invoke, h)
	switch {
	case isAdmin:
		return nil
	case isInvoke && need == scopeInvoke:
		return nil
	case isInvoke:
		return &serviceError{errdefs.ClassPermissionDenied, "this route needs a token of scope admin; the token has scope invoke"}
	}
	return &serviceError{errdefs.ClassUnauthenticated, "the bearer token is not valid"}
}
