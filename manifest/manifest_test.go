package manifest

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/stages"
)

var update = flag.Bool("update", false, "rewrite testdata/bad/*.golden from the current output")

// TestBad loads every testdata/bad/NAME.toml and compares the complete
// error output with NAME.golden.
func TestBad(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.toml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 18 {
		t.Fatalf("only %d bad manifests", len(files))
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".toml")
		t.Run(name, func(t *testing.T) {
			m, err := Load(file)
			if err == nil {
				t.Fatalf("Load succeeded: %+v", m)
			}
			if m != nil {
				t.Errorf("Load returned a manifest with its errors")
			}
			var errs *Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error is %T, not *Errors", err)
			}
			checkErrors(t, file, errs)
			got := err.Error() + "\n"
			golden := strings.TrimSuffix(file, ".toml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("errors differ from %s (run go test -update to accept)\n--- got\n%s--- want\n%s", golden, got, want)
			}
		})
	}
}

// checkErrors checks the invariants every error list keeps: non-empty,
// sorted by line, every error naming the file, one line per error with
// nothing unprintable in it, and an errdefs class on each.
func checkErrors(t *testing.T, file string, errs *Errors) {
	t.Helper()
	if len(errs.List) == 0 {
		t.Fatal("empty *Errors")
	}
	for i, e := range errs.List {
		if e.File != file {
			t.Errorf("error %d names file %q, want %q", i, e.File, file)
		}
		if !strings.HasPrefix(e.Error(), file+":") {
			t.Errorf("error %d does not start with %q: %s", i, file+":", e)
		}
		if strings.Contains(e.Error(), "\n") {
			t.Errorf("error %d spans lines: %q", i, e)
		}
		if msg := unprintable(e.Error()); msg != "" {
			t.Errorf("error %d holds %s: %q", i, msg, e)
		}
		if i > 0 && e.Line < errs.List[i-1].Line {
			t.Errorf("errors not sorted by line: %d after %d", e.Line, errs.List[i-1].Line)
		}
		if errdefs.ClassOf(e) == nil {
			t.Errorf("error %d has no errdefs class: %s", i, e)
		}
	}
}

func TestGood(t *testing.T) {
	m, err := Load("testdata/good.toml")
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	want := &Manifest{
		Path:    "testdata/good.toml",
		Dir:     "testdata",
		Version: 1,
		Runtime: Runtime{Capacity: 32, TraceBuffer: 1024, CacheDir: filepath.Join("testdata", "cache"), MaxModuleSize: 1 << 20},
		Service: Service{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 20 * time.Second, WriteTimeout: 0, IdleTimeout: 90 * time.Second,
			MaxConnections: 100, MaxInFlight: 0, DrainDelay: 3 * time.Second, ReadyQuarantinedShare: 0.5,
			AdminTokenFile: filepath.Join("testdata", "service", "admin.tokens"), AdminTokenEnv: "STAGEHOST_ADMIN_TOKENS",
			InvokeTokenFile: filepath.Join("testdata", "service", "invoke.tokens"), InvokeTokenEnv: "STAGEHOST_INVOKE_TOKENS",
			TLSCert: filepath.Join("testdata", "service", "cert.pem"), TLSKey: filepath.Join("testdata", "service", "key.pem")},
		Lattice: &Lattice{Name: "prod", HostID: "host-1", Embedded: true, Listen: "127.0.0.1:4333", StoreDir: filepath.Join("testdata", "nats"),
			TokenFile: filepath.Join("testdata", "service", "lattice.token"), TLSCA: filepath.Join("testdata", "service", "cert.pem"),
			TLSCert: filepath.Join("testdata", "service", "cert.pem"), TLSKey: filepath.Join("testdata", "service", "key.pem"),
			HeartbeatTTL: time.Second, ClaimTTL: 4 * time.Second, FenceFailures: 0, QuarantineOnDeviceLost: false, Replicas: 3, PayloadStoreMax: 512 << 20},
		Tracing: &Tracing{Exporter: "otlp", Endpoint: "https://collector.example:4318/otlp", SampleRatio: 0.25, ServiceName: "stagehost-prod"},
		Devices: []Device{
			{Name: "gpu0", Backend: BackendSim, Engine: hw.EngineGPU, MaxParked: 32,
				Sim: &Sim{QueueDepth: 1024, Faults: []Fault{}}},
			{Name: "npu0", Backend: BackendSim, Engine: hw.EngineNPU, Memory: 8 << 20,
				Sim: &Sim{Latency: 50 * time.Microsecond, QueueDepth: 64, Faults: []Fault{
					{Kind: FaultHang, Count: 1, Session: "full"},
					{Kind: FaultReject, Count: 3},
				}}},
			{Name: "cuda1", Backend: BackendCUDA, Engine: hw.EngineGPU, Index: 1, Memory: 1 << 30, MaxParked: 8},
			{Name: "host-cpu", Backend: BackendCUDA, Engine: hw.EngineCPU},
		},
		Modules: []Module{
			{Name: "stage", Path: "modules/good_stage.wasm", File: "testdata/modules/good_stage.wasm",
				SHA256: "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b",
				Kind:   stages.StageModule, MemoryLimit: 64 << 20, MaxSize: 1 << 20, WASI: []string{}, Snapshot: true,
				Bytes: read("testdata/modules/good_stage.wasm")},
			{Name: "go_stage", Path: "modules/wasi_stage.wasm", File: "testdata/modules/wasi_stage.wasm",
				SHA256: "375136f6df2ed617e7b938cc6e1de77f8690c38b14f8748731bee9a565feb75f",
				Kind:   stages.StageModule, MemoryLimit: 4 << 30, MaxSize: 2 << 20, WASI: []string{"go-runtime"}, Snapshot: false,
				Bytes: read("testdata/modules/wasi_stage.wasm")},
			{Name: "fence", Path: "modules/drain_fence.wasm", File: "testdata/modules/drain_fence.wasm",
				SHA256: "58f5b5536499f956528a0c66ff5437be7b7c29334fd4e773d91540f66373b932",
				Kind:   stages.FenceModule, MemoryLimit: 1 << 20, MaxSize: 1 << 20, WASI: []string{}, Snapshot: true,
				Bytes: read("testdata/modules/drain_fence.wasm")},
		},
		Sessions: []Session{
			{Name: "minimal", Stage: "stage", Fence: FenceBuiltin, Device: "gpu0", Devices: []string{"gpu0"},
				Instances: 1, QueueLimit: 256, QueueTimeout: 10 * time.Second,
				Streams: []string{"s0"}, Programs: []string{}, Budget: 64 << 20, OutputLimit: 16 << 20,
				Deadline: 5 * time.Second, FenceTimeout: 10 * time.Second, InitTimeout: 5 * time.Second, Reset: "none", Placement: "any", Entry: "main", OutputFormat: "hex", MaxInput: 64 << 20, Buffers: []Buffer{}},
			{Name: "full", Stage: "go_stage", Fence: "fence", Device: "npu0", Devices: []string{"npu0"},
				Instances: 1, QueueLimit: 256, QueueTimeout: 10 * time.Second,
				Streams: []string{"s0", "s1"}, Programs: []string{"matmul", "relu"}, Budget: 4 << 20, OutputLimit: 1_000_000,
				Deadline: 250 * time.Millisecond, FenceTimeout: 2 * time.Second, InitTimeout: 750 * time.Millisecond, Reset: "call", Placement: "any", Entry: "classify", OutputFormat: "class",
				Input: filepath.Join("testdata", "inputs", "sample.bin"), MaxInput: 1 << 20,
				Buffers: []Buffer{{Name: "weights", Size: 4096}, {Name: "bias", Size: 512}}},
			{Name: "drained", Stage: "stage", Fence: FenceDrain, Device: "cuda1", Devices: []string{"cuda1"},
				Instances: 1, QueueLimit: 256, QueueTimeout: 10 * time.Second,
				Streams: []string{}, Programs: []string{}, Budget: 64 << 20, OutputLimit: 16 << 20,
				Deadline: 5 * time.Second, FenceTimeout: 10 * time.Second, InitTimeout: 5 * time.Second, Reset: "none", Placement: "any", Entry: "main", OutputFormat: "hex", MaxInput: 64 << 20, Buffers: []Buffer{}},
			{Name: "pooled", Stage: "stage", Fence: FenceBuiltin, Device: "gpu0", Devices: []string{"gpu0"},
				Instances: 3, QueueLimit: 0, QueueTimeout: 250 * time.Millisecond,
				Streams: []string{"s0"}, Programs: []string{}, Budget: 64 << 20, OutputLimit: 16 << 20,
				Deadline: 5 * time.Second, FenceTimeout: 10 * time.Second, InitTimeout: 5 * time.Second, Reset: "none", Placement: "exclusive", Entry: "main", OutputFormat: "hex", MaxInput: 64 << 20, Buffers: []Buffer{}},
		},
		Residents: []Resident{
			{Name: "pingpong", GPU: "gpu0", NPU: "npu0", Rounds: 16, Payload: 192,
				StartupDeadline: time.Second, JoinDeadline: 5 * time.Second, Budget: 1 << 20, MaxRuns: 4, History: 100, MaxQuarantined: 4},
			{Name: "on-cpu", GPU: "cuda1", NPU: "host-cpu", Rounds: 1_000_000, Payload: 192,
				StartupDeadline: 100 * time.Millisecond, JoinDeadline: 30 * time.Second, Budget: 8192, MaxRuns: 2, History: 10, MaxQuarantined: 1},
		},
	}
	if !reflect.DeepEqual(m, want) {
		t.Errorf("decoded manifest differs\n got: %+v\nwant: %+v", m, want)
		for i := range min(len(m.Devices), len(want.Devices)) {
			if !reflect.DeepEqual(m.Devices[i], want.Devices[i]) {
				t.Errorf("device %d: got %+v (sim %+v), want %+v (sim %+v)", i, m.Devices[i], m.Devices[i].Sim, want.Devices[i], want.Devices[i].Sim)
			}
		}
	}
	// Lookups.
	if m.Session("full") != &m.Sessions[1] || m.Session("nope") != nil {
		t.Error("Session lookup")
	}
	if m.Module("fence") != &m.Modules[2] || m.Module("nope") != nil {
		t.Error("Module lookup")
	}
	if m.Device("cuda1") != &m.Devices[2] || m.Device("nope") != nil {
		t.Error("Device lookup")
	}
	if m.Resident("on-cpu") != &m.Residents[1] || m.Resident("nope") != nil {
		t.Error("Resident lookup")
	}
	// Every module loads with its own config.
	for _, mod := range m.Modules {
		if err := stages.Validate(mod.Bytes, mod.LoadConfig()); err != nil {
			t.Errorf("module %s: %v", mod.Name, err)
		}
	}
}

// TestMinimal checks the defaults of the smallest valid manifest, and of
// the runtime table when it is left out.
func TestMinimal(t *testing.T) {
	m, err := Decode("host.toml", []byte("version = 1\n[[device]]\nname = \"d\"\nbackend = \"sim\"\nengine = \"cpu\"\n"), noFiles)
	if err != nil {
		t.Fatal(err)
	}
	if m.Runtime != (Runtime{Capacity: 64, TraceBuffer: 4096, MaxModuleSize: 64 << 20}) {
		t.Errorf("runtime defaults: %+v", m.Runtime)
	}
	if m.Service != (Service{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: time.Minute,
		IdleTimeout: 2 * time.Minute, MaxConnections: 1024, MaxInFlight: 256}) {
		t.Errorf("service defaults: %+v", m.Service)
	}
	if m.Dir != "." || m.Path != "host.toml" {
		t.Errorf("Path %q Dir %q", m.Path, m.Dir)
	}
	if len(m.Modules)+len(m.Sessions)+len(m.Residents) != 0 {
		t.Errorf("unexpected entries: %+v", m)
	}
}

// TestLattice checks the [lattice] table's defaults and its url form
// (good.toml has the embedded form), and that a manifest without the
// table has no lattice.
func TestLattice(t *testing.T) {
	const dev = "[[device]]\nname = \"d\"\nbackend = \"sim\"\nengine = \"cpu\"\n"
	m, err := Decode("host.toml", []byte("version = 1\n"+dev), noFiles)
	if err != nil || m.Lattice != nil {
		t.Fatalf("no [lattice]: %v, %+v", err, m)
	}
	m, err = Decode("host.toml", []byte("version = 1\n[lattice]\nname = \"l\"\nurl = \"nats://10.0.0.5:4222,tls://10.0.0.6:4222\"\ntoken_env = \"NATS_TOKEN\"\n"+dev), noFiles)
	if err != nil {
		t.Fatal(err)
	}
	want := Lattice{Name: "l", URL: "nats://10.0.0.5:4222,tls://10.0.0.6:4222", TokenEnv: "NATS_TOKEN", Listen: DefaultLatticeListen,
		HeartbeatTTL: 3 * time.Second, ClaimTTL: 10 * time.Second, FenceFailures: 3, QuarantineOnDeviceLost: true, Replicas: 1, PayloadStoreMax: 1 << 30}
	if *m.Lattice != want {
		t.Errorf("url form:\n got %+v\nwant %+v", *m.Lattice, want)
	}
	m, err = Decode("host.toml", []byte("version = 1\n[lattice]\nname = \"l\"\nembedded = true\n"+dev), noFiles)
	if err != nil {
		t.Fatal(err)
	}
	want = Lattice{Name: "l", Embedded: true, Listen: "127.0.0.1:4222", HeartbeatTTL: 3 * time.Second, ClaimTTL: 10 * time.Second, FenceFailures: 3, QuarantineOnDeviceLost: true, Replicas: 1, PayloadStoreMax: 1 << 30}
	if *m.Lattice != want {
		t.Errorf("embedded defaults:\n got %+v\nwant %+v", *m.Lattice, want)
	}
	m, err = Decode("host.toml", []byte("version = 1\n[lattice]\nname = \"l\"\nembedded = true\npayload_store_max = \"2GiB\"\n"+dev), noFiles)
	if err != nil || m.Lattice.PayloadStoreMax != 2<<30 {
		t.Fatalf("payload_store_max = \"2GiB\": %v, %+v", err, m)
	}
	// The exported defaults are the ones decoded above and the ones
	// docs/manifest.md and docs/lattice.md give.
	if DefaultPayloadStoreMax != 1<<30 {
		t.Errorf("DefaultPayloadStoreMax %d: the documented default is 1GiB", DefaultPayloadStoreMax)
	}
	if DefaultHeartbeatTTL != 3*time.Second || DefaultClaimTTL != 10*time.Second || DefaultFenceFailures != 3 {
		t.Errorf("DefaultHeartbeatTTL %v, DefaultClaimTTL %v, DefaultFenceFailures %d: the documented defaults are 3s, 10s and 3",
			DefaultHeartbeatTTL, DefaultClaimTTL, DefaultFenceFailures)
	}
}

func noFiles(string, int64) ([]byte, error) { return nil, os.ErrNotExist }

// TestDecodeReadsRelativeToManifest checks which paths Decode passes to
// readFile, and that each file is read once, even when two modules name it.
func TestDecodeReadsRelativeToManifest(t *testing.T) {
	bin, err := os.ReadFile("testdata/modules/good_stage.wasm")
	if err != nil {
		t.Fatal(err)
	}
	src := `version = 1
[[device]]
name = "d"
backend = "sim"
engine = "gpu"
[[module]]
name = "m"
path = "stage/m.wasm"
sha256 = "` + stages.SHA256(bin) + `"
[[module]]
name = "m2"
path = "stage/m.wasm"
sha256 = "` + stages.SHA256(bin) + `"
[[session]]
name = "s"
stage = "m"
device = "d"
input = "in/x.bin"
`
	reads := map[string]int{}
	m, err := Decode(filepath.Join("deploy", "host.toml"), []byte(src), func(p string, _ int64) ([]byte, error) {
		reads[p]++
		switch p {
		case filepath.Join("deploy", "stage", "m.wasm"):
			return bin, nil
		case filepath.Join("deploy", "in", "x.bin"):
			return []byte("x"), nil
		}
		return nil, os.ErrNotExist
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{filepath.Join("deploy", "stage", "m.wasm"): 1, filepath.Join("deploy", "in", "x.bin"): 1}
	if !reflect.DeepEqual(reads, want) {
		t.Errorf("reads %v, want %v", reads, want)
	}
	if m.Sessions[0].Input != filepath.Join("deploy", "in", "x.bin") || m.Modules[0].File != filepath.Join("deploy", "stage", "m.wasm") {
		t.Errorf("resolved paths: %q %q", m.Sessions[0].Input, m.Modules[0].File)
	}
}

func TestLoadMissingManifest(t *testing.T) {
	_, err := Load("testdata/nonexistent.toml")
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("got %v, want an ErrNotFound", err)
	}
	if got, want := err.Error(), `testdata/nonexistent.toml: file "testdata/nonexistent.toml" does not exist`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestErrorClasses checks that errors.Is sees the classes through *Errors.
func TestErrorClasses(t *testing.T) {
	_, err := Load("testdata/bad/module_checks.toml")
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.Is(err, errdefs.ErrUnsupported) {
		t.Errorf("module_checks: want InvalidArgument and Unsupported (wrong ABI version) in %v", err)
	}
	_, err = Load("testdata/bad/missing_files.toml")
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing_files: want NotFound in %v", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.File != "testdata/bad/missing_files.toml" || e.Line == 0 || e.Key == "" {
		t.Errorf("errors.As *Error: %+v", e)
	}
}

func TestErrorFormat(t *testing.T) {
	for _, c := range []struct {
		e    Error
		want string
	}{
		{Error{File: "h.toml", Line: 3, Key: "session[1].budget", Msg: "bad"}, "h.toml:3: session[1].budget: bad"},
		{Error{File: "h.toml", Key: "version", Msg: "required key is missing"}, "h.toml: version: required key is missing"},
		{Error{File: "h.toml", Line: 7, Msg: "invalid TOML: x"}, "h.toml:7: invalid TOML: x"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
}

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"0B": 0, "512B": 512, "4KiB": 4096, "64MiB": 64 << 20, "1GiB": 1 << 30,
		"1KB": 1000, "3MB": 3_000_000, "2GB": 2_000_000_000, "8589934591GiB": 8589934591 << 30,
	}
	for s, want := range good {
		if got, err := ParseSize(s); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
		if back, err := ParseSize(FormatSize(want)); err != nil || back != want {
			t.Errorf("FormatSize(%d) = %q does not read back", want, FormatSize(want))
		}
	}
	for s, msg := range map[string]string{
		"":                      "not a size",
		"KiB":                   "not a size",
		"-1KiB":                 "negative",
		"1.5MiB":                "whole number",
		"4096":                  "no unit",
		"4kb":                   `unknown size unit "kb"`,
		"4 KiB":                 `unknown size unit " KiB"`,
		"1TiB":                  `unknown size unit "TiB"`,
		"1_024B":                `unknown size unit "_024B"`,
		"8589934592GiB":         "too large",
		"99999999999999999999B": "too large",
	} {
		if _, err := ParseSize(s); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseSize(%q) error %v, want it to mention %q", s, err, msg)
		}
	}
	for n, want := range map[int64]string{0: "0B", 100: "100B", 1024: "1KiB", 4160: "4160B", 1536 << 10: "1536KiB", 3 << 30: "3GiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestDeepNesting checks that deeply nested input is refused before the
// TOML parser, whose cost grows faster than linearly with nesting, sees
// it.
func TestDeepNesting(t *testing.T) {
	for name, src := range map[string]string{
		"dotted key": strings.Repeat("a.", 20000) + "a = 1\n",
		"header":     "version = 1\n[" + strings.Repeat("a.", 20000) + "a]\n",
		"arrays":     "x = " + strings.Repeat("[", 20000) + "\n",
		"inline":     "x = " + strings.Repeat("{a=", 20000) + "\n",
	} {
		start := time.Now()
		_, err := Decode("deep.toml", []byte(src), noFiles)
		if err == nil || !strings.Contains(err.Error(), "nested too deeply") || strings.Count(err.Error(), "\n") != 0 {
			t.Errorf("%s: got %v", name, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: took %v", name, d)
		}
	}
}

// TestDocs keeps docs/manifest.md honest: the bad manifests it shows and
// their outputs are the goldens', and its full example has no error but
// its placeholder sha256s and absent files.
func TestDocs(t *testing.T) {
	doc, err := os.ReadFile("../docs/manifest.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"many_errors", "unknown_keys", "budget_overflow", "quoted_values"} {
		for _, ext := range []string{".toml", ".golden"} {
			b, err := os.ReadFile("testdata/bad/" + name + ext)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(doc), "```\n"+string(b)+"```\n") && !strings.Contains(string(doc), "```toml\n"+string(b)+"```\n") {
				t.Errorf("docs/manifest.md does not show testdata/bad/%s%s verbatim", name, ext)
			}
		}
	}
	_, example, ok := strings.Cut(string(doc), "## A full example\n\n```toml\n")
	if !ok {
		t.Fatal("no full example")
	}
	example, _, _ = strings.Cut(example, "```\n")
	_, err = Decode("host.toml", []byte(example), noFiles)
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("full example: %v", err)
	}
	for _, e := range errs.List {
		if !strings.Contains(e.Msg, "must be 64 hexadecimal digits") && !strings.Contains(e.Msg, "does not exist") {
			t.Errorf("full example: %v", e)
		}
	}
}

// TestModuleErrorEscapes: a module check's message, which may show the
// module's own strings unquoted, reaches the errors one line each, with
// its unprintable characters escaped and the rest as it was.
func TestModuleErrorEscapes(t *testing.T) {
	d := &decoder{file: "host.toml", idx: indexLines(nil)}
	err := errdefs.Errorf(errdefs.ErrInvalidArgument, "module %q: import env.\x1b[2J is not granted\nexport caf\u00e9\u202e\xff is not a function", "m")
	d.moduleError(keyPath{}.key("module").at(0).key("path"), "m", err)
	want := []string{
		`host.toml: module[0].path: module check failed: import env.\x1b[2J is not granted`,
		`host.toml: module[0].path: module check failed: export café\u202e\xff is not a function`,
	}
	if len(d.errs) != len(want) {
		t.Fatalf("%d errors, want %d: %v", len(d.errs), len(want), d.errs)
	}
	for i, e := range d.errs {
		if e.Error() != want[i] {
			t.Errorf("error %d:\n got %s\nwant %s", i, e, want[i])
		}
		if !errors.Is(e, errdefs.ErrInvalidArgument) {
			t.Errorf("error %d: class %v", i, errdefs.ClassOf(e))
		}
	}
}

// TestLatticeCluster: cluster_listen and cluster_routes make the
// embedded server a cluster node; they need embedded = true, and
// cluster_routes needs cluster_listen.
func TestLatticeCluster(t *testing.T) {
	const dev = "[[device]]\nname = \"d\"\nbackend = \"sim\"\nengine = \"cpu\"\n"
	m, err := Decode("host.toml", []byte("version = 1\n[lattice]\nname = \"l\"\nembedded = true\nreplicas = 3\ncluster_listen = \"0.0.0.0:6222\"\n"+
		"cluster_routes = \"nats-route://n1:6222, nats-route://n2:6222,nats-route://n3:6222\"\n"+dev), noFiles)
	if err != nil {
		t.Fatal(err)
	}
	if lt := m.Lattice; lt.ClusterListen != "0.0.0.0:6222" || lt.ClusterRoutes != "nats-route://n1:6222, nats-route://n2:6222,nats-route://n3:6222" || lt.Replicas != 3 {
		t.Errorf("%+v", *lt)
	}
	for body, want := range map[string]string{
		"url = \"nats://a:4222\"\ncluster_listen = \"0.0.0.0:6222\"\n":                "lattice.cluster_listen: cluster_listen is for an embedded server: it needs embedded = true",
		"embedded = true\ncluster_routes = \"nats-route://n1:6222\"\n":                "lattice.cluster_routes: cluster_routes needs cluster_listen",
		"embedded = true\ncluster_listen = \"0.0.0.0:6222\"\ncluster_routes = \"\"\n": "lattice.cluster_routes: must not be empty",
	} {
		_, err := Decode("host.toml", []byte("version = 1\n[lattice]\nname = \"l\"\n"+body+dev), noFiles)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}
