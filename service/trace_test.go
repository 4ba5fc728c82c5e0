package service_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/tracing"
	"github.com/stagehost/stagehost/service"
)

const clientTP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func spanAttr(s tracetest.SpanStub, key attribute.Key) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}

// TestRunSpan: with a TracerProvider, a run is a server span, the child
// of the request's traceparent, with the session, the request id, the
// status and the class; a lattice call runs in its context; an error
// answer records its class (and an error status for a 5xx); other routes
// record no span.
func TestRunSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	s := serveHostile(t, "", "", func(c *service.Config) { c.TracerProvider = tp })
	// only returns the run's span; kids holds its children's names,
	// instances, devices and classes (the session's spans), each checked
	// to be the run span's child.
	var kids []string
	only := func(what string) tracetest.SpanStub {
		t.Helper()
		var top []tracetest.SpanStub
		var children []tracetest.SpanStub
		for _, s := range exp.GetSpans() {
			if s.Name == tracing.SpanAcquire || s.Name == tracing.SpanStage {
				children = append(children, s)
			} else {
				top = append(top, s)
			}
		}
		exp.Reset()
		if len(top) != 1 {
			t.Fatalf("%s: %d run spans, want 1: %+v", what, len(top), top)
		}
		kids = nil
		for _, c := range children {
			if c.Parent.SpanID() != top[0].SpanContext.SpanID() {
				t.Errorf("%s: %s is not the run span's child", what, c.Name)
			}
			kids = append(kids, c.Name+" "+spanAttr(c, tracing.InstanceKey)+" "+spanAttr(c, tracing.DeviceKey)+" "+spanAttr(c, tracing.ClassKey))
		}
		return top[0]
	}
	check := func(what string, sp tracetest.SpanStub, want map[attribute.Key]string) {
		t.Helper()
		for k, v := range want {
			if got := spanAttr(sp, k); got != v {
				t.Errorf("%s: %s = %q, want %q", what, k, got, v)
			}
		}
	}

	rec := s.do("POST", "/v1/sessions/steady/run", nil, "traceparent", clientTP, "X-Request-Id", "rid-span")
	if rec.Code != 200 {
		t.Fatalf("run: %d %s", rec.Code, rec.Body)
	}
	sp := only("a local run")
	if sp.Name != tracing.SpanRun || sp.SpanKind != trace.SpanKindServer ||
		sp.SpanContext.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || sp.Parent.SpanID().String() != "b7ad6b7169203331" || !sp.Parent.IsRemote() {
		t.Errorf("run span %s %v %s, parent %s", sp.Name, sp.SpanKind, sp.SpanContext.TraceID(), sp.Parent.SpanID())
	}
	check("a local run", sp, map[attribute.Key]string{tracing.SessionKey: "steady", tracing.RequestIDKey: "rid-span",
		"http.response.status_code": "200", "http.route": "/v1/sessions/{name}/run", tracing.ClassKey: "ok", tracing.ErrorTypeKey: ""})
	if want := []string{"session.acquire 0 gpu0 ok", "session.run 0 gpu0 ok"}; !slices.Equal(kids, want) {
		t.Errorf("a local run's session spans: %q, want %q", kids, want)
	}

	rec = s.do("POST", "/v1/sessions/trap/run", nil)
	sp = only("a trap")
	if rec.Code != 500 || sp.Parent.IsValid() || sp.Status.Code != codes.Error || strings.Contains(sp.Status.Description, "wasm stack trace") {
		t.Errorf("trap: %d, span parent %s status %+v", rec.Code, sp.Parent.SpanID(), sp.Status)
	}
	check("a trap", sp, map[attribute.Key]string{tracing.ClassKey: "fault", tracing.ErrorTypeKey: "fault", "http.response.status_code": "500"})
	if len(kids) != 2 || !strings.HasPrefix(kids[0], "session.acquire ") || !strings.HasPrefix(kids[1], "session.run ") || !strings.HasSuffix(kids[1], " fault") {
		t.Errorf("a trap's session spans: %q, want its run with class fault", kids)
	}

	rec = s.do("POST", "/v1/sessions/nope/run", nil)
	sp = only("an unknown session")
	if rec.Code != 404 || sp.Status.Code == codes.Error {
		t.Errorf("unknown session: %d, span status %+v (a 4xx is not a server error)", rec.Code, sp.Status)
	}
	check("an unknown session", sp, map[attribute.Key]string{tracing.ClassKey: "not_found", "http.response.status_code": "404"})

	f := &fakeLattice{}
	s.srv.SetLattice(f)
	if rec := s.do("POST", "/v1/sessions/far/run", strings.NewReader("x"), "traceparent", clientTP); rec.Code != 200 {
		t.Fatalf("through the lattice: %d %s", rec.Code, rec.Body)
	}
	sp = only("a lattice run")
	if want := "far|00-0af7651916cd43dd8448eb211c80319c-" + sp.SpanContext.SpanID().String() + "-01|"; !strings.HasPrefix(f.calls[0], want) {
		t.Errorf("the lattice call's context is not the run span's: %q, want %s…", f.calls[0], want)
	}
	f.answer = &errdefs.RemoteError{Class: errdefs.ClassUnavailable, Message: "host h2 went away with the call in flight", Host: "h2"}
	if rec := s.do("POST", "/v1/sessions/far/run", strings.NewReader("x")); rec.Code != 503 {
		t.Fatalf("lattice error: %d %s", rec.Code, rec.Body)
	}
	sp = only("a lattice error")
	check("a lattice error", sp, map[attribute.Key]string{tracing.ClassKey: "unavailable", tracing.ErrorTypeKey: "unavailable", tracing.HostKey: "h2"})
	if sp.Status.Code != codes.Error || sp.Status.Description != f.answer.Error() {
		t.Errorf("lattice error status %+v", sp.Status)
	}

	for _, path := range []string{"/v1/sessions", "/readyz", "/v1/sessions/steady"} {
		s.do("GET", path, nil, "traceparent", clientTP)
	}
	if spans := exp.GetSpans(); len(spans) != 0 {
		t.Errorf("routes other than a run recorded spans: %+v", spans)
	}
}

// TestLatticeLogsSentTraceparent: the service's log lines of a run
// through the lattice show the traceparent the call was sent with, the
// one the front made when the client sent none.
func TestLatticeLogsSentTraceparent(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	const made = "00-11111111111111111111111111111111-2222222222222222-01"
	f := &fakeLattice{made: made, answer: &errdefs.RemoteError{Class: errdefs.ClassUnavailable, Message: "no host took the call"}}
	s.srv.SetLattice(f)
	if rec := s.do("POST", "/v1/sessions/far/run", strings.NewReader("x")); rec.Code != 503 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(s.log.String(), `msg="request failed"`) || !strings.Contains(s.log.String(), "traceparent="+made) {
		t.Errorf("the request failed line lacks the traceparent sent:\n%s", s.log.String())
	}
	if !strings.HasPrefix(f.calls[0], "far||") {
		t.Errorf("no traceparent came in, but the lattice got one in its context: %q", f.calls[0])
	}
}
