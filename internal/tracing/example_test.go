package tracing_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/internal/tracing"
	"github.com/stagehost/stagehost/manifest"
)

// ExampleNew builds the tracer provider of a manifest whose [tracing]
// table names the file exporter, records one span, and shuts the
// provider down, which writes the span to the file: one JSON object a
// line, as stdouttrace encodes a span.
func ExampleNew() {
	dir, _ := os.MkdirTemp("", "tracing-example-*")
	defer os.RemoveAll(dir)
	src := `version = 1
[tracing]
exporter = "file"
file = "spans.json"        # relative to the manifest's directory
[[device]]
name = "cpu0"
backend = "sim"
engine = "cpu"
`
	m, err := manifest.Decode(filepath.Join(dir, "host.toml"), []byte(src), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := tracing.New((*tracing.Config)(m.Tracing), tracing.Options{HostID: "h1", Lattice: "prod"})
	if err != nil {
		fmt.Println(err)
		return
	}
	_, span := tracing.Tracer(p.TracerProvider()).Start(context.Background(), "example", trace.WithSpanKind(trace.SpanKindServer))
	span.End()
	if err := p.Shutdown(context.Background()); err != nil { // flushes
		fmt.Println(err)
		return
	}

	f, err := os.Open(m.Tracing.File)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		var s struct {
			Name     string
			SpanKind trace.SpanKind
			Resource []struct {
				Key   string
				Value struct{ Value any }
			}
			InstrumentationScope struct{ Name string }
		}
		if err := json.Unmarshal(lines.Bytes(), &s); err != nil {
			fmt.Println(err)
			return
		}
		res := map[string]any{}
		for _, kv := range s.Resource {
			res[kv.Key] = kv.Value.Value
		}
		fmt.Println(s.Name, s.SpanKind, s.InstrumentationScope.Name)
		fmt.Println(res["service.name"], res["stagehost.host_id"], res["stagehost.lattice"])
	}
	// Output:
	// example server github.com/stagehost/stagehost
	// stagehost h1 prod
}
