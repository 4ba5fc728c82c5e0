package deploy

import "context"

type ctxKey struct{}

// RequestID returns the request id ctx carries ([WithRequestID]): the
// HTTP service's id of the request, or the one the lattice carried with a
// call ("" for none).
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

// WithRequestID returns ctx carrying a request id, as the service's own
// requests do (the lattice carries it to the host that runs a call, so
// that the call's logs there carry it too). An invalid id
// ([ValidRequestID]) is ignored.
func WithRequestID(ctx context.Context, id string) context.Context {
	if !ValidRequestID(id) {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, id)
}

// ValidRequestID accepts a request id (an incoming X-Request-Id): 1 to
// 128 of A-Z a-z 0-9 - _ . :
func ValidRequestID(id string) bool {
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
