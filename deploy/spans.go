package deploy

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/internal/tracing"
)

// childSpan starts a span under ctx's span, with that span's provider:
// a call that the HTTP service or the lattice traces gets its children
// wherever it runs, and one that is not traced (no provider, or not
// sampled) starts nothing and allocates nothing (so the caller sets the
// span's attributes only when it records).
func childSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, noSpan
	}
	return parent.TracerProvider().Tracer(tracing.TracerName).Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
}

// noSpan is the span of what is not traced: ending it does nothing.
var noSpan = trace.SpanFromContext(context.Background())

// endChild ends a child span with its call's outcome: the class, and an
// error status on an error.
func endChild(ctx context.Context, span trace.Span, err error) {
	if span.IsRecording() {
		class := Outcome(ctx, err)
		span.SetAttributes(tracing.ClassKey.String(class))
		if err != nil {
			span.SetAttributes(tracing.ErrorTypeKey.String(class))
			span.SetStatus(codes.Error, PublicMessage(err))
		}
	}
	span.End()
}
