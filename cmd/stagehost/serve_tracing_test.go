package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeTracingFile runs `stagehost serve` with [tracing] exporter =
// "file": one run with a traceparent header writes its server span, of
// that trace and with the client's span as its parent, to the file once
// serve stops. The batch delay is set far off, so nothing is written
// before the shutdown's flush.
func TestServeTracingFile(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000") // milliseconds: only the shutdown exports
	path := latticeManifest(t, "[tracing]\nexporter = \"file\"\nfile = \"spans.json\"\nservice_name = \"e2e\"\n", "steady")
	file := filepath.Join(filepath.Dir(path), "spans.json") // relative to the manifest
	s := startServe(t, path)
	const tp = "00-5b8aa5a2d2c872e8321cf37308d69df2-051581bf3cb55c13-01"
	if a := s.request(nil, "POST", "/v1/sessions/steady/run", strings.NewReader("x"), "traceparent", tp, "X-Request-Id", "traced-1"); a.code != 200 || string(a.body) != "ok" {
		t.Fatalf("run: %d %s", a.code, a.body)
	}
	if b, err := os.ReadFile(file); err != nil || len(b) != 0 {
		t.Fatalf("before the shutdown the span file holds %d bytes (%v); want it opened and empty", len(b), err)
	}
	_, stderr := s.stop()
	if strings.Contains(stderr, "tracing") {
		t.Errorf("stderr: %s", stderr)
	}

	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type spanContext struct{ TraceID, SpanID string }
	type keyValue struct {
		Key   string
		Value struct{ Value any }
	}
	var found []string
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		var sp struct {
			Name        string
			SpanContext spanContext
			Parent      spanContext
			Attributes  []keyValue
			Resource    []keyValue
		}
		if err := json.Unmarshal(lines.Bytes(), &sp); err != nil {
			t.Fatalf("not one JSON span a line: %v\n%s", err, lines.Text())
		}
		attrs := map[string]any{}
		for _, kv := range append(sp.Attributes, sp.Resource...) {
			attrs[kv.Key] = kv.Value.Value
		}
		found = append(found, sp.Name+" "+sp.SpanContext.TraceID)
		if sp.Name == "POST /v1/sessions/{name}/run" && sp.SpanContext.TraceID == "5b8aa5a2d2c872e8321cf37308d69df2" &&
			sp.Parent.SpanID == "051581bf3cb55c13" && attrs["stagehost.session"] == "steady" && attrs["stagehost.request_id"] == "traced-1" &&
			attrs["service.name"] == "e2e" && attrs["stagehost.class"] == "ok" {
			return
		}
	}
	t.Fatalf("no run span of trace 5b8aa5a2d2c872e8321cf37308d69df2 in %s; spans: %q", file, found)
}

// TestServeSuperviseTracing runs `serve --supervise` over one sim gpu
// with [tracing] exporter = "file": one run through the supervisor gives
// five spans of the client's trace in the file once it stops: the
// supervisor's run span (its parent the client's span), its
// lattice.call, the worker's lattice.serve, each the child of the one
// before, and the serve span's children session.acquire and session.run;
// each process with its own host id in its resource.
func TestServeSuperviseTracing(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000") // milliseconds: only the shutdowns export
	good, goodSHA := hostileModule(t, "good_stage")
	dir := t.TempDir()
	path := filepath.Join(dir, "supervise.toml")
	body := fmt.Sprintf(`version = 1
[runtime]
cache_dir = "off"
[tracing]
exporter = "file"
file = "spans.json"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "good"
path = %q
sha256 = %q
[[session]]
name = "a"
stage = "good"
device = "gpu0"
programs = ["noop"]
`, good, goodSHA)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, path, "--supervise", "--host-id", "sv", "--quiet")
	pollFor(t, 60*time.Second, "session a served by its worker", func() (bool, string) {
		a := s.request(nil, "GET", "/v1/sessions/a/ready", nil)
		return a.code == 200, fmt.Sprintf("%d %s", a.code, a.body)
	})
	const tp = "00-6e0c63257de34c92bf9efcd03927272e-a3ce929d0e0e4736-01"
	if a := s.request(nil, "POST", "/v1/sessions/a/run", strings.NewReader("x"), "traceparent", tp); a.code != 200 || string(a.body) != "ok" {
		t.Fatalf("run: %d %s", a.code, a.body)
	}
	s.stop()

	type span struct {
		name, id, parent, hostID, host string
	}
	var spans []span
	f, err := os.Open(filepath.Join(dir, "spans.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		var sp struct {
			Name                string
			SpanContext, Parent struct{ TraceID, SpanID string }
			Attributes          []struct {
				Key   string
				Value struct{ Value any }
			}
			Resource []struct {
				Key   string
				Value struct{ Value any }
			}
		}
		if err := json.Unmarshal(lines.Bytes(), &sp); err != nil {
			t.Fatalf("not one JSON span a line: %v\n%s", err, lines.Text())
		}
		if sp.SpanContext.TraceID != "6e0c63257de34c92bf9efcd03927272e" {
			continue
		}
		one := span{name: sp.Name, id: sp.SpanContext.SpanID, parent: sp.Parent.SpanID}
		for _, kv := range sp.Resource {
			if kv.Key == "stagehost.host_id" {
				one.hostID, _ = kv.Value.Value.(string)
			}
		}
		for _, kv := range sp.Attributes {
			if kv.Key == "stagehost.host" {
				one.host, _ = kv.Value.Value.(string)
			}
		}
		spans = append(spans, one)
	}
	byName := map[string]span{}
	for _, sp := range spans {
		byName[sp.name] = sp
	}
	run, call, serve := byName["POST /v1/sessions/{name}/run"], byName["lattice.call"], byName["lattice.serve"]
	acquire, stage := byName["session.acquire"], byName["session.run"]
	if len(spans) != 5 || run.parent != "a3ce929d0e0e4736" || call.parent != run.id || serve.parent != call.id ||
		run.hostID != "sv" || call.hostID != "sv" || call.host != "sv-gpu0" || serve.hostID != "sv-gpu0" || serve.host != "sv-gpu0" ||
		acquire.parent != serve.id || stage.parent != serve.id || acquire.hostID != "sv-gpu0" || stage.hostID != "sv-gpu0" {
		t.Fatalf("spans of the trace: %+v", spans)
	}
}
