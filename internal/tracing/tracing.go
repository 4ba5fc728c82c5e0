// Package tracing builds the OpenTelemetry tracer provider of a
// `stagehost serve` process from its [Config]: its manifest's [tracing]
// table, which the caller translates (docs/lattice.md, "Tracing";
// docs/manifest.md, "[tracing]"). It does not import the manifest's
// package (ARCHITECTURE.md).
//
// Without the table, [New] returns a provider whose tracers are no-ops:
// no SDK runs, no span is recorded, and a span context that arrives with
// a call (a W3C traceparent) is passed on unchanged. With it, spans go
// through a batch span processor to an OTLP/HTTP collector or to a file,
// sampled by trace id at sample_ratio unless their parent decided
// (parent-based), and [Provider.Shutdown] flushes what is queued.
//
// The packages that record spans (deploy, internal/lattice)
// take a trace.TracerProvider in their configuration and use
// [TracerName]; none of them touches OpenTelemetry's globals, and the
// W3C trace context is injected and extracted with
// propagation.TraceContext explicitly.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracerName is the instrumentation scope of every span stagehost
// records.
const TracerName = "github.com/stagehost/stagehost"

// ShutdownTimeout bounds [Provider.Shutdown]: the time it gives the
// exporter to write or send the spans still queued.
const ShutdownTimeout = 5 * time.Second

// OTLPPath is the path, under the [tracing] endpoint, that the OTLP
// exporter posts spans to.
const OTLPPath = "/v1/traces"

// Resource attribute keys besides service.name.
const (
	// HostIDKey is the lattice host id of the process (also its
	// service.instance.id).
	HostIDKey = attribute.Key("stagehost.host_id")
	// LatticeKey is the name of the lattice the process is in (on spans
	// too: a front's and a host's lattice spans).
	LatticeKey = attribute.Key("stagehost.lattice")
)

// Span attribute keys (docs/lattice.md, "Tracing").
const (
	// SessionKey is the session a call is to.
	SessionKey = attribute.Key("stagehost.session")
	// RequestIDKey is the call's HTTP request id (X-Request-Id).
	RequestIDKey = attribute.Key("stagehost.request_id")
	// HostKey is the lattice host that took the call: on a front's span
	// the host that acknowledged (or answered) it, on a host's span the
	// host itself.
	HostKey = attribute.Key("stagehost.host")
	// ClassKey is the call's outcome: "ok" or its error class (the
	// service's classes, docs/service.md).
	ClassKey = attribute.Key("stagehost.class")
	// ErrorTypeKey is OpenTelemetry's error.type: the error class, on a
	// failed call only.
	ErrorTypeKey = attribute.Key("error.type")
	// ResendsKey counts the times a front sent a call again because no
	// host acknowledged it.
	ResendsKey = attribute.Key("stagehost.resends")
	// TookKey is how long a host took over a call, from its arrival to
	// its answer, in milliseconds.
	TookKey = attribute.Key("stagehost.took_ms")
	// InstanceKey and DeviceKey name the instance of a session that a
	// call got (its index) and the device it runs on.
	InstanceKey = attribute.Key("stagehost.instance")
	DeviceKey   = attribute.Key("stagehost.device")
)

// ClassOK is ClassKey's value for a call that succeeded.
const ClassOK = "ok"

// The names of the spans stagehost records.
const (
	// SpanRun is the HTTP service's server span of a session run
	// (POST /v1/sessions/{name}/run, named after its route).
	SpanRun = "POST /v1/sessions/{name}/run"
	// SpanLatticeCall is a front's client span of a call it sends
	// through the lattice.
	SpanLatticeCall = "lattice.call"
	// SpanLatticeServe is a host's server span of a call it took from
	// the lattice.
	SpanLatticeServe = "lattice.serve"
	// SpanAcquire is a call's wait for a free instance of its session
	// (deploy.Pool.Acquire), a child of the call's span.
	SpanAcquire = "session.acquire"
	// SpanStage is a call's run on its instance: the stage, then its
	// fence (deploy.Turn.Run), a child of the call's span.
	SpanStage = "session.run"
)

// Options describe the process in the spans' resource, where known.
type Options struct {
	// HostID is the process's host id in its lattice ("" outside one).
	HostID string
	// Lattice is the lattice's name ("" outside one).
	Lattice string
	// Logger, when set, receives the SDK's errors (a collector that
	// cannot be reached, a file that cannot be written) as warnings: it
	// becomes OpenTelemetry's global error handler, for the process.
	Logger *slog.Logger
}

// Provider is a process's tracer provider and what Shutdown flushes.
type Provider struct {
	tp   trace.TracerProvider
	sdk  *sdktrace.TracerProvider // nil without [tracing]
	file *os.File                 // the file exporter's file, or nil
	desc string
}

// Config is what [New] builds a provider from: the fields of a manifest's
// [tracing] table, validated and with its defaults filled in. The
// manifest's type has these fields in this order, so the caller converts
// it ((*tracing.Config)(m.Tracing)); a field added to one and not the
// other fails to compile there.
type Config struct {
	// Exporter is ExporterOTLP or ExporterFile.
	Exporter string
	// Endpoint is the base URL of an OTLP/HTTP collector (ExporterOTLP):
	// spans are posted to Endpoint + [OTLPPath].
	Endpoint string
	// File is the file the file exporter appends spans to, one JSON
	// object a line (ExporterFile).
	File string
	// SampleRatio is the share (0..1) of the traces this process starts
	// that are sampled (parent-based: a sampled parent is sampled).
	SampleRatio float64
	// ServiceName is the spans' service.name.
	ServiceName string
}

// The exporters of [Config.Exporter]: the [tracing] table's exporter
// values.
const (
	ExporterOTLP = "otlp" // OTLP over HTTP (protobuf) to Endpoint
	ExporterFile = "file" // JSON lines appended to File
)

// New builds the tracer provider cfg describes: nil cfg (a manifest
// without [tracing]) gives a no-op provider. The file exporter's file is
// opened for appending (created if need be, mode 0644) here; the OTLP
// exporter connects when it first exports.
//
// # Errors
//
// The file exporter's file cannot be opened; the exporter or the
// resource cannot be made.
func New(cfg *Config, opt Options) (*Provider, error) {
	if cfg == nil {
		return &Provider{tp: noop.NewTracerProvider(), desc: "off"}, nil
	}
	p := &Provider{}
	var exp sdktrace.SpanExporter
	switch cfg.Exporter {
	case ExporterOTLP:
		e, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(cfg.Endpoint+OTLPPath))
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP exporter to %s: %w", cfg.Endpoint, err)
		}
		exp, p.desc = e, "otlp to "+cfg.Endpoint+OTLPPath
	case ExporterFile:
		f, err := os.OpenFile(cfg.File, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("tracing: span file: %w", err)
		}
		e, err := stdouttrace.New(stdouttrace.WithWriter(f))
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("tracing: file exporter: %w", err)
		}
		exp, p.file, p.desc = e, f, "file "+cfg.File
	default:
		return nil, fmt.Errorf("tracing: unknown exporter %q", cfg.Exporter)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.ServiceName)}
	if opt.HostID != "" {
		attrs = append(attrs, attribute.String("service.instance.id", opt.HostID), HostIDKey.String(opt.HostID))
	}
	if opt.Lattice != "" {
		attrs = append(attrs, LatticeKey.String(opt.Lattice))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		_ = exp.Shutdown(context.Background())
		if p.file != nil {
			_ = p.file.Close()
		}
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	if opt.Logger != nil {
		log := opt.Logger
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing: exporting spans failed", "err", err) }))
	}
	p.sdk = sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	)
	p.tp = p.sdk
	p.desc += fmt.Sprintf(", sample_ratio %g", cfg.SampleRatio)
	return p, nil
}

// TracerProvider is the provider to pass to the packages that record
// spans (service.Config, lattice.HostConfig, lattice.FrontConfig,
// lattice.MemberConfig).
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// Enabled reports whether spans are recorded and exported (the manifest
// has [tracing]).
func (p *Provider) Enabled() bool { return p.sdk != nil }

// String describes where spans go: "off", "otlp to URL, sample_ratio R"
// or "file PATH, sample_ratio R".
func (p *Provider) String() string { return p.desc }

// Shutdown ends the provider: the spans still queued are exported, within
// ShutdownTimeout (or ctx's end, if sooner), then the exporter stops and
// the file exporter's file is closed. Tracers of the provider record
// nothing afterwards. A no-op provider returns nil at once.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, ShutdownTimeout)
	defer cancel()
	err := p.sdk.Shutdown(ctx)
	if p.file != nil {
		err = errors.Join(err, p.file.Close())
		p.file = nil
	}
	if err != nil {
		return fmt.Errorf("tracing: flushing spans (%s): %w", p.desc, err)
	}
	return nil
}

// Records reports whether tp can record spans: false for nil and for
// OpenTelemetry's no-op provider (what [New] gives without [tracing]).
// A process whose provider records nothing has no use for an incoming
// trace context beyond passing it on, so it can skip decoding one.
func Records(tp trace.TracerProvider) bool {
	if tp == nil {
		return false
	}
	_, off := tp.(noop.TracerProvider)
	return !off
}

// Tracer is the tracer of tp under [TracerName]; a nil tp gives a no-op
// tracer, which records nothing and passes a span context in its
// context on unchanged.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(TracerName)
}
