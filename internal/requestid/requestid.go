// Package requestid carries a request id in a context: the HTTP service's
// id of a request (its X-Request-Id), or the one the lattice carried with
// a call, so that the logs of the call, on whichever host runs it, carry
// it too.
package requestid

import "context"

type ctxKey struct{}

// FromContext returns the request id ctx carries ([With]): the
// HTTP service's id of the request, or the one the lattice carried with a
// call ("" for none).
func FromContext(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

// With returns ctx carrying a request id, as the service's own
// requests do (the lattice carries it to the host that runs a call, so
// that the call's logs there carry it too). An invalid id
// ([Valid]) is ignored.
func With(ctx context.Context, id string) context.Context {
	if !Valid(id) {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, id)
}

// Valid accepts a request id (an incoming X-Request-Id): 1 to
// 128 of A-Z a-z 0-9 - _ . :
func Valid(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}
