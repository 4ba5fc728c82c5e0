package service

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/internal/requestid"
	"github.com/stagehost/stagehost/internal/tracing"
)

// traceContext extracts a run's incoming W3C trace context (traceparent,
// tracestate). It is used explicitly, never through OpenTelemetry's
// global propagator: with no SDK configured the incoming span context
// still becomes the context's, and the lattice passes it on unchanged.
var traceContext = propagation.TraceContext{}

// runRoute is the route of a run, the span's http.route.
const runRoute = "/v1/sessions/{name}/run"

// startRun starts a run's server span, a child of the request's
// traceparent, and returns the writer and request to serve the run with
// and the function that ends the span with the answer's status. Without
// a TracerProvider the span is a no-op that carries the incoming span
// context (if any) in the request's context.
func (s *Server) startRun(w http.ResponseWriter, r *http.Request) (http.ResponseWriter, *http.Request, func()) {
	ctx := traceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.tracer.Start(ctx, tracing.SpanRun, trace.WithSpanKind(trace.SpanKindServer))
	if !span.IsRecording() {
		// A no-op span (no provider: the incoming span context, if any),
		// or one not sampled: its context only is passed on.
		if span.SpanContext().IsValid() {
			r = r.WithContext(ctx)
		}
		return w, r, func() {}
	}
	r = r.WithContext(ctx)
	route := runRoute
	if _, p, ok := strings.Cut(r.Pattern, " "); ok {
		route = p // an infer of the Open Inference Protocol (oip.go)
	}
	span.SetAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", route),
		attribute.String("url.path", r.URL.Path), tracing.SessionKey.String(r.PathValue("name")), tracing.RequestIDKey.String(requestid.FromContext(ctx)))
	rec := &recorder{ResponseWriter: w}
	return rec, r, func() {
		status := rec.status
		if status == 0 {
			status = http.StatusOK
		}
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if status < 400 {
			span.SetAttributes(tracing.ClassKey.String(tracing.ClassOK))
		}
		span.End()
	}
}

// spanError records an error answer on the request's span: its class,
// the host that answered it (in a lattice, when another did), and for a
// 5xx class an error status with the public message. Routes other than
// a run have no span: it does nothing there.
func spanError(ctx context.Context, class, msg, host string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(tracing.ClassKey.String(class), tracing.ErrorTypeKey.String(class))
	if host != "" {
		span.SetAttributes(tracing.HostKey.String(host))
	}
	if classStatus(class) >= 500 {
		span.SetStatus(codes.Error, msg)
	}
}
