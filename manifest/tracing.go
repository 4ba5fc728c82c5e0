package manifest

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Tracing is the [tracing] table: the OpenTelemetry spans `stagehost
// serve` records and where it exports them (docs/lattice.md, "Tracing").
// Without the table no span is recorded or exported; the W3C
// traceparent is still passed on and logged.
type Tracing struct {
	// Exporter is TracingOTLP or TracingFile; required.
	Exporter string
	// Endpoint is the base URL of an OTLP/HTTP collector (TracingOTLP
	// only): spans are posted to Endpoint + "/v1/traces". Default
	// DefaultTracingEndpoint; "" with the file exporter.
	Endpoint string
	// File is the file the file exporter appends spans to, one JSON
	// object a line, resolved against the manifest's directory
	// (TracingFile only; required with it).
	File string
	// SampleRatio is the share (0..1) of the traces this process starts
	// that are sampled; a call that arrives with a sampled traceparent is
	// sampled whatever it is (parent-based). Default 1.
	SampleRatio float64
	// ServiceName is the spans' service.name; default DefaultServiceName.
	ServiceName string
}

// The [tracing] exporters.
const (
	TracingOTLP = "otlp" // OTLP over HTTP (protobuf) to Endpoint
	TracingFile = "file" // JSON lines appended to File
)

// TracingExporters lists the [tracing] exporters.
var TracingExporters = []string{TracingOTLP, TracingFile}

// Defaults of the [tracing] table.
const (
	// DefaultTracingEndpoint is an OTLP/HTTP collector on this machine
	// (the OpenTelemetry Collector's default HTTP port).
	DefaultTracingEndpoint = "http://localhost:4318"
	// DefaultServiceName is the spans' default service.name.
	DefaultServiceName = "stagehost"
)

func (d *decoder) tracing(root *table, m *Manifest) {
	if !root.has("tracing") {
		return
	}
	t := root.sub("tracing")
	if t == nil {
		return
	}
	tr := &Tracing{SampleRatio: 1, ServiceName: DefaultServiceName}
	m.Tracing = tr
	exp, expOK := t.str("exporter", "", true)
	if expOK && !slices.Contains(TracingExporters, exp) {
		d.errorf(t.path.key("exporter"), "unknown exporter %q (want %s)", exp, strings.Join(TracingExporters, " or "))
		expOK = false
	}
	if expOK {
		tr.Exporter = exp
	}
	d.tracingEndpoint(t, tr, exp, expOK)
	d.tracingFile(t, tr, exp, expOK)
	tr.SampleRatio, _ = t.fraction("sample_ratio", 1)
	if name, ok := t.str("service_name", DefaultServiceName, false); ok && t.has("service_name") {
		if strings.TrimSpace(name) == "" {
			d.errorf(t.path.key("service_name"), "must not be empty: leave service_name out for %q", DefaultServiceName)
		} else {
			tr.ServiceName = name
		}
	}
	t.finish()
}

// tracingEndpoint decodes endpoint, which only the otlp exporter has
// (exp is the exporter as written, expOK whether it decoded).
func (d *decoder) tracingEndpoint(t *table, tr *Tracing, exp string, expOK bool) {
	if u, ok := t.str("endpoint", "", false); ok && t.has("endpoint") {
		switch {
		case expOK && exp != TracingOTLP:
			d.errorf(t.path.key("endpoint"), "endpoint is for the otlp exporter: it needs exporter = %q", TracingOTLP)
		default:
			if err := checkOTLPEndpoint(u); err != nil {
				d.errorf(t.path.key("endpoint"), "%v", err)
			} else if exp == TracingOTLP {
				tr.Endpoint = strings.TrimSuffix(u, "/")
			}
		}
	}
	if exp == TracingOTLP && tr.Endpoint == "" && !t.has("endpoint") {
		tr.Endpoint = DefaultTracingEndpoint
	}
}

// tracingFile decodes file, which the file exporter requires and no
// other has.
func (d *decoder) tracingFile(t *table, tr *Tracing, exp string, expOK bool) {
	f, fileOK := t.str("file", "", exp == TracingFile)
	switch {
	case !fileOK || !t.has("file"):
	case expOK && exp != TracingFile:
		d.errorf(t.path.key("file"), "file is for the file exporter: it needs exporter = %q", TracingFile)
	case f == "":
		d.errorf(t.path.key("file"), "must not be empty: the file exporter appends the spans to it")
	case exp == TracingFile:
		tr.File = resolve(d.dir, f)
	}
}

// checkOTLPEndpoint checks an OTLP/HTTP collector's base URL: http or
// https, a host, no credentials, no query and no fragment.
func checkOTLPEndpoint(s string) error {
	u, err := url.Parse(s)
	if err == nil && u.User != nil {
		// Not echoed: the user part may be a secret written by mistake.
		return fmt.Errorf("the URL holds credentials: the manifest never holds them")
	}
	if err != nil || u.Host == "" || u.Opaque != "" {
		return fmt.Errorf("%q is not a URL with a scheme and a host (for example %q)", s, DefaultTracingEndpoint)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q: the scheme must be http or https, not %q", s, u.Scheme)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return fmt.Errorf("%q: no query or fragment: the exporter posts to the URL's path + /v1/traces", s)
	case u.Port() != "" && !validPort(u.Port()):
		return fmt.Errorf("%q: bad port %q", s, u.Port())
	}
	return nil
}
