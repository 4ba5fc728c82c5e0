package lattice

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/requestid"
)

// transportLocal is the stagehost.transport attribute of the spans of a
// call that went over the local transport (internal/localcall) instead
// of NATS.
var transportLocal = attribute.String("stagehost.transport", "local")

// StartLocal starts the front's client span of a call sent to a host
// over the local transport, and puts its trace context (traceparent,
// tracestate) in carrier, for the host's [Host.CallLocal]. end ends the
// span with the host that answered and the call's error.
func (f *Front) StartLocal(ctx context.Context, session string, carrier map[string][]string) (_ context.Context, end func(host string, err error)) {
	ctx, span := f.startCall(ctx, session, requestid.FromContext(ctx))
	if span.IsRecording() {
		span.SetAttributes(transportLocal)
	}
	injectCall(ctx, carrier)
	return ctx, func(host string, err error) { endCall(span, host, 0, err) }
}

// CallLocal is [Host.Call] for a call that came over the local
// transport: its server span has the trace context traceparent and
// tracestate (as the front's [Front.StartLocal] sent them) as its
// parent, and ctx gets the request id rid.
//
// # Errors
//
// Those of [Host.Call].
func (h *Host) CallLocal(ctx context.Context, session, rid, traceparent, tracestate string, input []byte) ([]byte, error) {
	hs := h.sessions[session]
	if hs == nil {
		return nil, &Error{Class: errdefs.ClassNotFound, Message: fmt.Sprintf("no session %q on host %s", session, h.cfg.ID), Host: h.cfg.ID}
	}
	hdr := map[string][]string{}
	if traceparent != "" {
		hdr[TraceparentHeader] = []string{traceparent}
	}
	if tracestate != "" {
		hdr["tracestate"] = []string{tracestate}
	}
	if rid != "" {
		hdr[RequestIDHeader] = []string{rid}
	}
	sctx, span := h.startServe(hs, hdr)
	if span.IsRecording() {
		span.SetAttributes(transportLocal)
	}
	ctx = trace.ContextWithSpan(ctx, trace.SpanFromContext(sctx))
	if rid != "" {
		ctx = requestid.With(ctx, rid)
	}
	start := time.Now()
	out, _, err := h.call(ctx, session, input, nil)
	endServe(span, time.Since(start), err)
	var le *Error
	if errors.As(err, &le) { // the host's own refusals, with their class
		return nil, &errdefs.RemoteError{Class: le.Class, Message: le.Message, Host: le.Host, Code: le.Code}
	}
	return out, err
}
