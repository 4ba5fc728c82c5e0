package tracing_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/internal/tracing"
	"github.com/stagehost/stagehost/manifest"
)

// remote is a sampled span context as a traceparent header carries it.
func remote(t *testing.T, flags trace.TraceFlags) trace.SpanContext {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags, Remote: true})
}

// TestOff: without [tracing] the provider is a no-op that passes a
// remote span context on unchanged, and Shutdown does nothing.
func TestOff(t *testing.T) {
	p, err := tracing.New(nil, tracing.Options{HostID: "h1"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Enabled() || p.String() != "off" {
		t.Errorf("enabled %v, %q", p.Enabled(), p)
	}
	parent := remote(t, trace.FlagsSampled)
	_, span := tracing.Tracer(p.TracerProvider()).Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "x")
	if span.IsRecording() || !span.SpanContext().Equal(parent) {
		t.Errorf("no-op span: recording %v, context %v, want %v", span.IsRecording(), span.SpanContext(), parent)
	}
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, span := tracing.Tracer(nil).Start(context.Background(), "x"); span.SpanContext().IsValid() {
		t.Errorf("a nil provider's span has a context: %v", span.SpanContext())
	}
	if tracing.Records(p.TracerProvider()) || tracing.Records(nil) {
		t.Error("Records is true for a no-op or nil provider")
	}
	on, err := tracing.New(&tracing.Config{Exporter: tracing.ExporterFile, File: filepath.Join(t.TempDir(), "spans.jsonl"), SampleRatio: 1, ServiceName: "s"}, tracing.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = on.Shutdown(context.Background()) }()
	if !tracing.Records(on.TracerProvider()) {
		t.Error("Records is false for the [tracing] provider")
	}
}

// TestOTLP: the OTLP exporter posts protobuf to the endpoint's path +
// /v1/traces, on shutdown at the latest.
func TestOTLP(t *testing.T) {
	var mu sync.Mutex
	var posts []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		posts = append(posts, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type")+" "+string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	m, err := manifest.Decode("host.toml", []byte("version = 1\n[tracing]\nexporter = \"otlp\"\nendpoint = \""+srv.URL+"/collector/\"\nservice_name = \"edge\"\n[[device]]\nname = \"d\"\nbackend = \"sim\"\nengine = \"cpu\"\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tracing.New((*tracing.Config)(m.Tracing), tracing.Options{HostID: "h7", Lattice: "l"})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Enabled() || p.String() != "otlp to "+srv.URL+"/collector/v1/traces, sample_ratio 1" {
		t.Errorf("enabled %v, %q", p.Enabled(), p)
	}
	_, span := tracing.Tracer(p.TracerProvider()).Start(context.Background(), "otlp-span")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(posts) != 1 || !strings.HasPrefix(posts[0], "POST /collector/v1/traces application/x-protobuf ") ||
		!strings.Contains(posts[0], "otlp-span") || !strings.Contains(posts[0], "edge") || !strings.Contains(posts[0], "h7") {
		t.Errorf("posts: %q", posts)
	}
}

// TestSampling: with sample_ratio 0 a trace started here is not sampled,
// but a call whose parent is sampled is (parent-based).
func TestSampling(t *testing.T) {
	file := filepath.Join(t.TempDir(), "spans.json")
	p, err := tracing.New(&tracing.Config{Exporter: tracing.ExporterFile, File: file, SampleRatio: 0, ServiceName: "s"}, tracing.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tr := tracing.Tracer(p.TracerProvider())
	_, root := tr.Start(context.Background(), "root")
	root.End()
	_, child := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), remote(t, trace.FlagsSampled)), "child of sampled")
	child.End()
	_, unsampled := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), remote(t, 0)), "child of unsampled")
	unsampled.End()
	if root.SpanContext().IsSampled() || !child.SpanContext().IsSampled() || unsampled.SpanContext().IsSampled() {
		t.Errorf("sampled: root %v, child of sampled %v, child of unsampled %v",
			root.SpanContext().IsSampled(), child.SpanContext().IsSampled(), unsampled.SpanContext().IsSampled())
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	names := spanNames(t, file)
	if len(names) != 1 || names[0] != "child of sampled" {
		t.Errorf("spans in the file: %q", names)
	}
}

// TestFileAppends: the file exporter appends (a second provider on the
// same file keeps the first one's spans), and a file that cannot be
// opened is New's error.
func TestFileAppends(t *testing.T) {
	file := filepath.Join(t.TempDir(), "spans.json")
	for _, name := range []string{"first", "second"} {
		p, err := tracing.New(&tracing.Config{Exporter: tracing.ExporterFile, File: file, SampleRatio: 1, ServiceName: "s"}, tracing.Options{})
		if err != nil {
			t.Fatal(err)
		}
		_, span := tracing.Tracer(p.TracerProvider()).Start(context.Background(), name)
		span.End()
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if names := spanNames(t, file); strings.Join(names, ",") != "first,second" {
		t.Errorf("spans in the file: %q", names)
	}
	_, err := tracing.New(&tracing.Config{Exporter: tracing.ExporterFile, File: filepath.Join(t.TempDir(), "no", "such", "dir.json"), SampleRatio: 1}, tracing.Options{})
	if err == nil || !strings.Contains(err.Error(), "tracing: span file:") {
		t.Errorf("a file in a missing directory: %v", err)
	}
}

// spanNames reads a file exporter's file: one JSON span a line.
func spanNames(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		var s struct{ Name string }
		if err := json.Unmarshal(lines.Bytes(), &s); err != nil {
			t.Fatalf("not one JSON span a line: %v: %s", err, lines.Text())
		}
		names = append(names, s.Name)
	}
	return names
}

// TestExportersAreTheManifests: the exporter values a Config takes are
// the [tracing] table's, so a converted table needs no mapping.
func TestExportersAreTheManifests(t *testing.T) {
	if !slices.Equal(manifest.TracingExporters, []string{tracing.ExporterOTLP, tracing.ExporterFile}) {
		t.Fatalf("manifest exporters %q, tracing's %q %q", manifest.TracingExporters, tracing.ExporterOTLP, tracing.ExporterFile)
	}
}
