package lattice_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/requestid"
	"github.com/stagehost/stagehost/internal/tracing"
	"github.com/stagehost/stagehost/manifest"
)

// recorder is an SDK tracer provider that exports every span to memory
// as it ends.
type recorder struct {
	tp  *sdktrace.TracerProvider
	exp *tracetest.InMemoryExporter
}

func newRecorder(t *testing.T) *recorder {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &recorder{tp: tp, exp: exp}
}

// only returns the one call span recorded (a front's or a host's),
// failing the test otherwise. The spans of the call's session (its wait
// for an instance and its run, deploy's) must be that span's children.
func (r *recorder) only(t *testing.T, who string) tracetest.SpanStub {
	t.Helper()
	var top, kids []tracetest.SpanStub
	for _, s := range r.exp.GetSpans() {
		if s.Name == tracing.SpanAcquire || s.Name == tracing.SpanStage {
			kids = append(kids, s)
		} else {
			top = append(top, s)
		}
	}
	if len(top) != 1 {
		t.Fatalf("%s recorded %d call spans, want 1: %+v", who, len(top), top)
	}
	for _, k := range kids {
		if k.Parent.SpanID() != top[0].SpanContext.SpanID() {
			t.Errorf("%s: %s is not a child of %s", who, k.Name, top[0].Name)
		}
	}
	return top[0]
}

// children returns the names of the session spans recorded, with their
// instance and device, in order.
func (r *recorder) children() []string {
	var out []string
	for _, s := range r.exp.GetSpans() {
		if s.Name == tracing.SpanAcquire || s.Name == tracing.SpanStage {
			out = append(out, s.Name+" "+attr(s, tracing.InstanceKey)+" "+attr(s, tracing.DeviceKey)+" "+attr(s, tracing.ClassKey))
		}
	}
	return out
}

// attr is a span's attribute's value ("" when absent).
func attr(s tracetest.SpanStub, key attribute.Key) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}

// checkAttrs checks span attributes by key.
func checkAttrs(t *testing.T, who string, s tracetest.SpanStub, want map[attribute.Key]string) {
	t.Helper()
	for k, v := range want {
		if got := attr(s, k); got != v {
			t.Errorf("%s span %s: %s = %q, want %q", who, s.Name, k, got, v)
		}
	}
}

// ids formats a span context as trace id/span id.
func ids(sc trace.SpanContext) string { return sc.TraceID().String() + "/" + sc.SpanID().String() }

const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestTracingAcrossHosts: a front and a host, each with an SDK tracer
// provider. One call gives the front a client span and the host a server
// span of the same trace, the host's a child of the front's; a
// traceparent in the caller's context is the client span's parent; a
// failed call records its class on both.
func TestTracingAcrossHosts(t *testing.T) {
	url := startServer(t)
	hostSpans, frontSpans := newRecorder(t), newRecorder(t)
	join(t, url, "tr1", "h1", manifestOpts{extra: moduleSession(t, "trap_stage", "trap")}, lattice.HostConfig{TTL: ttl, TracerProvider: hostSpans.tp})
	f := newFront(t, url, "tr1", lattice.FrontConfig{TTL: ttl, TracerProvider: frontSpans.tp})

	// A call with no trace context: the front's span starts a trace.
	ctx := requestid.With(context.Background(), "rid-1")
	if out, err := f.Call(ctx, "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("call: %q %v", out, err)
	}
	client, server := frontSpans.only(t, "the front"), hostSpans.only(t, "the host")
	if client.Name != tracing.SpanLatticeCall || client.SpanKind != trace.SpanKindClient || client.Parent.IsValid() {
		t.Errorf("client span: %s %v, parent %s", client.Name, client.SpanKind, ids(client.Parent))
	}
	if server.Name != tracing.SpanLatticeServe || server.SpanKind != trace.SpanKindServer {
		t.Errorf("server span: %s %v", server.Name, server.SpanKind)
	}
	if server.SpanContext.TraceID() != client.SpanContext.TraceID() || server.Parent.SpanID() != client.SpanContext.SpanID() || !server.Parent.IsRemote() {
		t.Errorf("the host's span is not the front's child: client %s, server %s with parent %s", ids(client.SpanContext), ids(server.SpanContext), ids(server.Parent))
	}
	checkAttrs(t, "client", client, map[attribute.Key]string{tracing.SessionKey: "steady", tracing.HostKey: "h1", tracing.ClassKey: "ok",
		tracing.ResendsKey: "0", tracing.RequestIDKey: "rid-1", tracing.LatticeKey: "tr1", tracing.ErrorTypeKey: ""})
	checkAttrs(t, "server", server, map[attribute.Key]string{tracing.SessionKey: "steady", tracing.HostKey: "h1", tracing.ClassKey: "ok",
		tracing.RequestIDKey: "rid-1", tracing.LatticeKey: "tr1"})
	if attr(server, tracing.TookKey) == "" {
		t.Errorf("server span has no %s", tracing.TookKey)
	}
	// The host's call has the session's spans as children: its wait for
	// an instance, then its run on it.
	if got, want := hostSpans.children(), []string{"session.acquire 0 gpu0 ok", "session.run 0 gpu0 ok"}; !slices.Equal(got, want) {
		t.Errorf("the host's session spans: %q, want %q", got, want)
	}
	if len(client.Events) != 1 || client.Events[0].Name != "acknowledged" {
		t.Errorf("client span events: %+v", client.Events)
	}

	// A traceparent in the context is the client span's parent.
	frontSpans.exp.Reset()
	hostSpans.exp.Reset()
	if _, err := f.Call(lattice.WithTraceparent(context.Background(), incoming), "steady", nil); err != nil {
		t.Fatal(err)
	}
	client, server = frontSpans.only(t, "the front"), hostSpans.only(t, "the host")
	if client.Parent.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || client.Parent.SpanID().String() != "00f067aa0ba902b7" ||
		client.SpanContext.TraceID() != client.Parent.TraceID() {
		t.Errorf("client span %s, parent %s: want the incoming traceparent's child", ids(client.SpanContext), ids(client.Parent))
	}
	if server.Parent.SpanID() != client.SpanContext.SpanID() || server.SpanContext.TraceID() != client.Parent.TraceID() {
		t.Errorf("server span %s, parent %s; client %s", ids(server.SpanContext), ids(server.Parent), ids(client.SpanContext))
	}

	// A failed call: the class of the host's answer, on both spans.
	frontSpans.exp.Reset()
	hostSpans.exp.Reset()
	_, err := f.Call(context.Background(), "trap", nil)
	if lattice.Class(err) != errdefs.ClassFault {
		t.Fatalf("call to trap: %v (class %s)", err, lattice.Class(err))
	}
	client, server = frontSpans.only(t, "the front"), hostSpans.only(t, "the host")
	for _, s := range []tracetest.SpanStub{client, server} {
		checkAttrs(t, "failed", s, map[attribute.Key]string{tracing.ClassKey: "fault", tracing.ErrorTypeKey: "fault", tracing.HostKey: "h1", tracing.SessionKey: "trap"})
		if s.Status.Code != codes.Error || s.Status.Description == "" || strings.Contains(s.Status.Description, "wasm stack trace") {
			t.Errorf("failed %s span status: %+v", s.Name, s.Status)
		}
	}
	if server.Parent.SpanID() != client.SpanContext.SpanID() {
		t.Errorf("failed call: server parent %s, client %s", ids(server.Parent), ids(client.SpanContext))
	}

	// A call no host serves is refused before it is sent: no span.
	frontSpans.exp.Reset()
	if _, err := f.Call(context.Background(), "nowhere", nil); lattice.Class(err) != errdefs.ClassUnavailable {
		t.Fatalf("call to nowhere: %v", err)
	}
	if spans := frontSpans.exp.GetSpans(); len(spans) != 0 {
		t.Errorf("a refused call has spans: %+v", spans)
	}
}

// TestTracingResends: a call sent again because no host acknowledged it
// records each sending again (an event) and their count, and the host
// that took it in the end.
func TestTracingResends(t *testing.T) {
	url := startServer(t)
	const lat = "tr2"
	join(t, url, lat, "h1", manifestOpts{}, lattice.HostConfig{TTL: ttl})
	swallowed := blackHole(t, url, lattice.SessionSubject(lat, "steady"), lattice.QueueGroup(lat, "steady"))
	spans := newRecorder(t)
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl, AckTimeout: 20 * time.Millisecond, TracerProvider: spans.tp})
	for i := 0; swallowed.Load() == 0 && i < 64; i++ { // the queue group picks the hole half the time
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := f.Call(ctx, "steady", nil)
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if swallowed.Load() == 0 {
		t.Fatal("the hole got no call in 64")
	}
	total := 0
	for _, s := range spans.exp.GetSpans() {
		n := 0
		for _, e := range s.Events {
			if strings.HasPrefix(e.Name, "sent again") {
				n++
			}
		}
		if got := attr(s, tracing.ResendsKey); got != itoa(n) {
			t.Errorf("span with %d sent-again events has %s = %s", n, tracing.ResendsKey, got)
		}
		if attr(s, tracing.HostKey) != "h1" || attr(s, tracing.ClassKey) != "ok" {
			t.Errorf("span attributes: %v", s.Attributes)
		}
		total += n
	}
	if int64(total) != swallowed.Load() {
		t.Errorf("%d calls swallowed, %d recorded as sent again", swallowed.Load(), total)
	}
}

// TestTraceparentWithoutProvider: a front with no tracer provider passes
// the caller's traceparent to the host unchanged (trace id and parent
// span id: the host's span is the caller's span's child); with none in
// the context it makes one, which Member.Call returns for the HTTP
// service's log lines and the host logs and parents its span on.
func TestTraceparentWithoutProvider(t *testing.T) {
	dir := t.TempDir()
	lt := lattice.Config{Name: "tr3", Embedded: true, Listen: "127.0.0.1:0", StoreDir: filepath.Join(dir, "js"), HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3}
	ctx := context.Background()
	front, err := lattice.Join(ctx, nil, lattice.MemberConfig{Lattice: lt, HostID: "front", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	var logs syncBuffer
	hostSpans := newRecorder(t)
	d := openDeployment(t, manifestOpts{})
	w, err := lattice.Join(ctx, d.Deployment, lattice.MemberConfig{Lattice: lattice.Config{Name: "tr3", URL: front.ClientURL(), HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3},
		HostID: "worker", Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), TracerProvider: hostSpans.tp})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := front.Front().WaitFor(ctx, func() bool { return len(front.Front().Serving("steady")) == 1 }); err != nil {
		t.Fatal(err)
	}

	out, tp, err := front.Call(lattice.WithTraceparent(ctx, incoming), "steady", nil)
	if err != nil || string(out) != "ok" {
		t.Fatalf("call: %q %v", out, err)
	}
	if tp != incoming || !strings.Contains(logs.String(), "traceparent="+incoming) {
		t.Errorf("sent %q; want %q unchanged, logged by the host:\n%s", tp, incoming, logs.String())
	}
	server := hostSpans.only(t, "the host")
	if server.Parent.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || server.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("host span's parent %s: want the caller's span", ids(server.Parent))
	}

	hostSpans.exp.Reset()
	out, tp, err = front.Call(ctx, "steady", nil)
	if err != nil || string(out) != "ok" {
		t.Fatalf("call: %q %v", out, err)
	}
	m := regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-01$`).FindStringSubmatch(tp)
	if m == nil || m[1] == "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("the front made %q", tp)
	}
	if n := strings.Count(logs.String(), "traceparent="+tp); n != 1 {
		t.Errorf("the host logged the made traceparent %d times:\n%s", n, logs.String())
	}
	server = hostSpans.only(t, "the host")
	if server.Parent.TraceID().String() != m[1] || server.Parent.SpanID().String() != m[2] {
		t.Errorf("host span's parent %s: want the made %s", ids(server.Parent), tp)
	}
	if _, tp2, _ := front.Call(ctx, "steady", nil); tp2 == tp {
		t.Errorf("two calls, one made traceparent %s", tp)
	}
}
