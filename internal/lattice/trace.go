package lattice

import (
	"context"
	"crypto/rand"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/internal/tracing"
)

// traceContext injects and extracts the W3C trace context (traceparent,
// tracestate) of lattice messages. It is used explicitly, never through
// OpenTelemetry's global propagator, so that a traceparent passes through
// a process that configured no SDK and no global.
var traceContext = propagation.TraceContext{}

// natsCarrier is a NATS message's headers as a propagation carrier. NATS
// header names are case-sensitive: the trace context is "traceparent"
// and "tracestate", in lower case.
type natsCarrier map[string][]string

func (c natsCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c natsCarrier) Set(key, value string) { c[key] = []string{value} }

func (c natsCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// WithTraceparent returns ctx with the W3C traceparent tp as its remote
// span context: the parent of the front's span of a call with ctx, and
// what the call carries to the host when no SDK records spans. A
// malformed tp leaves ctx as it is (the front then makes a traceparent of
// its own).
func WithTraceparent(ctx context.Context, tp string) context.Context {
	return traceContext.Extract(ctx, natsCarrier{TraceparentHeader: {tp}})
}

// Traceparent returns the W3C traceparent of ctx's span context (the
// parent a call with ctx would have), or "" when ctx carries none.
func Traceparent(ctx context.Context) string {
	c := natsCarrier{}
	traceContext.Inject(ctx, c)
	return c.Get(TraceparentHeader)
}

// newSpanContext is a span context of the front's own, for a call that
// came with none while no SDK records spans: a random trace id and span
// id, sampled (flags 01).
func newSpanContext() trace.SpanContext {
	var tid trace.TraceID
	var sid trace.SpanID
	for !tid.IsValid() {
		_, _ = rand.Read(tid[:])
	}
	for !sid.IsValid() {
		_, _ = rand.Read(sid[:])
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// injectCall puts ctx's trace context in a call's headers, and returns
// the traceparent it put there. A ctx without a span context (no SDK,
// and none came in) gets one of the front's own, so that the logs of
// both sides can be correlated.
func injectCall(ctx context.Context, hdr nats.Header) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, newSpanContext())
	}
	traceContext.Inject(ctx, natsCarrier(hdr))
	return hdr.Get(TraceparentHeader)
}

// startCall starts a front's client span of a call sent through the
// lattice.
func (f *Front) startCall(ctx context.Context, session, rid string) (context.Context, trace.Span) {
	ctx, span := f.tracer.Start(ctx, tracing.SpanLatticeCall, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(tracing.SessionKey.String(session), tracing.LatticeKey.String(f.cfg.Lattice),
			attribute.String("messaging.system", "nats"), attribute.String("messaging.destination.name", SessionSubject(f.cfg.Lattice, session)))
		if rid != "" {
			span.SetAttributes(tracing.RequestIDKey.String(rid))
		}
	}
	return ctx, span
}

// endCall ends a front's client span with the call's outcome: the host
// that acknowledged or answered it, how many times it was sent again, its
// class.
func endCall(span trace.Span, host string, resends int, err error) {
	if span.IsRecording() {
		var le *Error
		if host == "" && errors.As(err, &le) {
			host = le.Host
		}
		if host != "" {
			span.SetAttributes(tracing.HostKey.String(host))
		}
		span.SetAttributes(tracing.ResendsKey.Int(resends))
		setOutcome(span, err)
	}
	span.End()
}

// setOutcome records a call's class on its span, and its error.
func setOutcome(span trace.Span, err error) {
	if err == nil {
		span.SetAttributes(tracing.ClassKey.String(tracing.ClassOK))
		return
	}
	class := Class(err)
	span.SetAttributes(tracing.ClassKey.String(class), tracing.ErrorTypeKey.String(class))
	span.SetStatus(codes.Error, deploy.PublicMessage(err)) // never a stack trace: the log has the full error
}

// startServe starts a host's server span of a call it took from the
// lattice, with the span context of the call's headers as its parent.
func (h *Host) startServe(hs *hostSession, hdr map[string][]string) (context.Context, trace.Span) {
	if !h.traced {
		// Nothing below would record a span or send the trace context
		// on (the log takes the header as it came): decoding it would be
		// wasted (about 2 µs a call, 2-vCPU).
		return context.Background(), noop.Span{}
	}
	ctx := traceContext.Extract(context.Background(), natsCarrier(hdr))
	ctx, span := h.tracer.Start(ctx, tracing.SpanLatticeServe, trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() {
		span.SetAttributes(tracing.SessionKey.String(hs.name), tracing.HostKey.String(h.cfg.ID), tracing.LatticeKey.String(h.cfg.Lattice))
		if rid := natsCarrier(hdr).Get(RequestIDHeader); rid != "" {
			span.SetAttributes(tracing.RequestIDKey.String(rid))
		}
	}
	return ctx, span
}

// endServe ends a host's server span with the call's class and how long
// the host took over it.
func endServe(span trace.Span, took time.Duration, err error) {
	if span.IsRecording() {
		span.SetAttributes(tracing.TookKey.Float64(float64(took) / float64(time.Millisecond)))
		setOutcome(span, err)
	}
	span.End()
}
