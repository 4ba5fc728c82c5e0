package manifest

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestTracing checks the [tracing] table's defaults for each exporter
// (good.toml has the otlp form with every other key), that the file is
// resolved against the manifest's directory, and that a manifest without
// the table has no tracing.
func TestTracing(t *testing.T) {
	const dev = "[[device]]\nname = \"d\"\nbackend = \"sim\"\nengine = \"cpu\"\n"
	m, err := Decode("host.toml", []byte("version = 1\n"+dev), noFiles)
	if err != nil || m.Tracing != nil {
		t.Fatalf("no [tracing]: %v, %+v", err, m)
	}
	m, err = Decode("host.toml", []byte("version = 1\n[tracing]\nexporter = \"otlp\"\n"+dev), noFiles)
	if err != nil {
		t.Fatal(err)
	}
	want := Tracing{Exporter: "otlp", Endpoint: "http://localhost:4318", SampleRatio: 1, ServiceName: "stagehost"}
	if *m.Tracing != want {
		t.Errorf("otlp defaults:\n got %+v\nwant %+v", *m.Tracing, want)
	}
	m, err = Decode(filepath.Join("deploy", "host.toml"), []byte("version = 1\n[tracing]\nexporter = \"file\"\nfile = \"spans/out.json\"\nsample_ratio = 0\n"+dev), noFiles)
	if err != nil {
		t.Fatal(err)
	}
	want = Tracing{Exporter: "file", File: filepath.Join("deploy", "spans", "out.json"), SampleRatio: 0, ServiceName: "stagehost"}
	if *m.Tracing != want {
		t.Errorf("file form:\n got %+v\nwant %+v", *m.Tracing, want)
	}
	m, err = Decode("host.toml", []byte("version = 1\n[tracing]\nexporter = \"file\"\nfile = \"/var/log/spans.json\"\nsample_ratio = 1\n"+dev), noFiles)
	if err != nil || m.Tracing.File != "/var/log/spans.json" || m.Tracing.SampleRatio != 1 {
		t.Errorf("absolute file, integer ratio: %v %+v", err, m.Tracing)
	}
}

// TestTracingErrors decodes one bad [tracing] table per error and checks
// the key and the message of each (the goldens tracing*.toml show them
// in full).
func TestTracingErrors(t *testing.T) {
	const dev = "[[device]]\nname = \"d\"\nbackend = \"sim\"\nengine = \"cpu\"\n"
	for _, tc := range []struct {
		name, table, key, msg string
	}{
		{"not a table", `tracing = "otlp"`, "tracing", "must be a table ([tracing]), not a string"},
		{"no exporter", "[tracing]\nsample_ratio = 0.5", "tracing.exporter", "required key is missing"},
		{"exporter type", "[tracing]\nexporter = 1", "tracing.exporter", "must be a string, not an integer"},
		{"unknown exporter", "[tracing]\nexporter = \"grpc\"", "tracing.exporter", `unknown exporter "grpc" (want otlp or file)`},
		{"endpoint for file", "[tracing]\nexporter = \"file\"\nfile = \"s.json\"\nendpoint = \"http://c:4318\"", "tracing.endpoint", `endpoint is for the otlp exporter: it needs exporter = "otlp"`},
		{"endpoint type", "[tracing]\nexporter = \"otlp\"\nendpoint = 4318", "tracing.endpoint", "must be a string, not an integer"},
		{"endpoint scheme", "[tracing]\nexporter = \"otlp\"\nendpoint = \"grpc://c:4317\"", "tracing.endpoint", `the scheme must be http or https, not "grpc"`},
		{"endpoint without scheme", "[tracing]\nexporter = \"otlp\"\nendpoint = \"localhost:4318\"", "tracing.endpoint", `"localhost:4318" is not a URL with a scheme and a host`},
		{"endpoint without host", "[tracing]\nexporter = \"otlp\"\nendpoint = \"http:///v1\"", "tracing.endpoint", "is not a URL with a scheme and a host"},
		{"endpoint empty", "[tracing]\nexporter = \"otlp\"\nendpoint = \"\"", "tracing.endpoint", `"" is not a URL`},
		{"endpoint credentials", "[tracing]\nexporter = \"otlp\"\nendpoint = \"http://u:s3cr3t@c:4318\"", "tracing.endpoint", "the URL holds credentials"},
		{"endpoint query", "[tracing]\nexporter = \"otlp\"\nendpoint = \"http://c:4318/?x=1\"", "tracing.endpoint", "no query or fragment"},
		{"endpoint fragment", "[tracing]\nexporter = \"otlp\"\nendpoint = \"http://c:4318/#x\"", "tracing.endpoint", "no query or fragment"},
		{"endpoint port", "[tracing]\nexporter = \"otlp\"\nendpoint = \"http://c:99999\"", "tracing.endpoint", `bad port "99999"`},
		{"file for otlp", "[tracing]\nexporter = \"otlp\"\nfile = \"s.json\"", "tracing.file", `file is for the file exporter: it needs exporter = "file"`},
		{"no file", "[tracing]\nexporter = \"file\"", "tracing.file", "required key is missing"},
		{"file empty", "[tracing]\nexporter = \"file\"\nfile = \"\"", "tracing.file", "must not be empty"},
		{"file type", "[tracing]\nexporter = \"file\"\nfile = true", "tracing.file", "must be a string, not a boolean"},
		{"ratio range", "[tracing]\nexporter = \"otlp\"\nsample_ratio = 2", "tracing.sample_ratio", "must be between 0 and 1, not 2"},
		{"ratio type", "[tracing]\nexporter = \"otlp\"\nsample_ratio = \"half\"", "tracing.sample_ratio", "must be a number between 0 and 1, not a string"},
		{"service name empty", "[tracing]\nexporter = \"otlp\"\nservice_name = \"\"", "tracing.service_name", "must not be empty"},
		{"service name type", "[tracing]\nexporter = \"otlp\"\nservice_name = [\"a\"]", "tracing.service_name", "must be a string, not an array"},
		{"unknown key", "[tracing]\nexporter = \"otlp\"\nheaders = {}", "tracing.headers", "unknown key"},
		{"misspelt key", "[tracing]\nexporter = \"otlp\"\nservice_nme = \"x\"", "tracing.service_nme", `unknown key (did you mean "service_name"?)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "version = 1\n" + tc.table + "\n" + dev
			_, err := Decode("host.toml", []byte(src), noFiles)
			var errs *Errors
			if !errors.As(err, &errs) {
				t.Fatalf("no *Errors: %v", err)
			}
			checkErrors(t, "host.toml", errs)
			if len(errs.List) != 1 {
				t.Fatalf("%d errors, want 1:\n%v", len(errs.List), err)
			}
			e := errs.List[0]
			if e.Key != tc.key || !strings.Contains(e.Msg, tc.msg) {
				t.Errorf("got %s: %s\nwant %s: …%s…", e.Key, e.Msg, tc.key, tc.msg)
			}
			if e.Line == 0 {
				t.Errorf("no line: %v", e)
			}
			if strings.Contains(e.Error(), "s3cr3t") {
				t.Errorf("the error echoes the credentials: %v", e)
			}
		})
	}
}
