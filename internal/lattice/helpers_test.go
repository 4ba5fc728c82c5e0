package lattice_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// repo is the repository root, from this package's directory.
const repo = "../.."

// startServer starts an embedded nats-server for the test.
func startServer(t testing.TB) string {
	t.Helper()
	srv, err := lattice.EmbeddedServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv.ClientURL()
}

func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append(lattice.ConnOptions(), nats.Name(t.Name()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// manifestOpts shape the test manifest: one sim gpu device, the good
// stage, and session "steady" with instances instances.
type manifestOpts struct {
	latency   time.Duration
	instances int
	fence     string // "" (builtin) or "spin": the module's fence never returns
	extra     string // appended TOML
}

func manifestBody(t testing.TB, o manifestOpts) string {
	t.Helper()
	abs, err := filepath.Abs(repo)
	if err != nil {
		t.Fatal(err)
	}
	mod := func(name, path, kind string) string {
		b, err := os.ReadFile(filepath.Join(abs, path))
		if err != nil {
			t.Fatal(err)
		}
		return "[[module]]\nname = \"" + name + "\"\npath = \"" + filepath.Join(abs, path) + "\"\nsha256 = \"" + stages.SHA256(b) + "\"\nkind = \"" + kind + "\"\n"
	}
	var sb strings.Builder
	sb.WriteString("version = 1\n[runtime]\ncache_dir = \"off\"\n[[device]]\nname = \"gpu0\"\nbackend = \"sim\"\nengine = \"gpu\"\n")
	if o.latency > 0 {
		sb.WriteString("[device.sim]\nlatency = \"" + o.latency.String() + "\"\n")
	}
	sb.WriteString(mod("good", "stages/testdata/hostile/good_stage.wasm", "stage"))
	fence := ""
	if o.fence == "spin" {
		sb.WriteString(mod("spin", "stages/testdata/hostile/loop_fence.wasm", "fence"))
		fence = "fence = \"spin\"\nfence_timeout = \"50ms\"\n"
	}
	sb.WriteString("[[session]]\nname = \"steady\"\nstage = \"good\"\ndevice = \"gpu0\"\nprograms = [\"noop\"]\n" + fence)
	sb.WriteString("instances = " + itoa(max(o.instances, 1)) + "\n")
	sb.WriteString(o.extra)
	return sb.String()
}

func itoa(n int) string { return strconv.Itoa(n) }

// openDeployment opens a deployment of the test manifest; the test closes
// it (or the caller does, earlier: Close twice is not supported, so the
// cleanup is skipped once closed is set).
func openDeployment(t testing.TB, o manifestOpts) *deployment {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.toml")
	if err := os.WriteFile(path, []byte(manifestBody(t, o)), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig().WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	dd := &deployment{Deployment: d}
	t.Cleanup(func() { dd.close() })
	return dd
}

type deployment struct {
	*deploy.Deployment
	once sync.Once
}

func (d *deployment) close() { d.once.Do(func() { _ = d.Close(context.Background()) }) }

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
}

// member is one host of a test lattice: its connection, deployment and
// lattice host.
type member struct {
	id string
	nc *nats.Conn
	d  *deployment
	h  *lattice.Host
}

func join(t testing.TB, url, lat, id string, o manifestOpts, cfg lattice.HostConfig) *member {
	t.Helper()
	nc := connect(t, url)
	d := openDeployment(t, o)
	cfg.Lattice, cfg.ID = lat, id
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	cfg = hostDefaults(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := lattice.NewHost(ctx, nc, d.Deployment, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return &member{id: id, nc: nc, d: d, h: h}
}

// kill takes a host away abruptly: its connection closes first (no
// goodbye, no answers), then its deployment.
func (m *member) kill() {
	m.nc.Close()
	m.d.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = m.h.Close(ctx)
}

func newFront(t testing.TB, url, lat string, cfg lattice.FrontConfig) *lattice.Front {
	t.Helper()
	cfg.Lattice = lat
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if cfg.TTL <= 0 {
		cfg.TTL = manifest.DefaultHeartbeatTTL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := lattice.NewFront(ctx, connect(t, url), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

func listed(f *lattice.Front, id string) bool {
	for _, r := range f.Hosts() {
		if r.ID == id {
			return true
		}
	}
	return false
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// moduleSession is manifest TOML for a [[module]] and a [[session]] on
// gpu0, both called name, of the test module
// stages/testdata/hostile/<file>.wasm.
func moduleSession(t testing.TB, file, name string) string {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join(repo, "stages/testdata/hostile", file+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(abs)
	if err != nil {
		t.Fatal(err)
	}
	return "[[module]]\nname = \"" + name + "\"\npath = \"" + abs + "\"\nsha256 = \"" + stages.SHA256(b) + "\"\n" +
		"[[session]]\nname = \"" + name + "\"\nstage = \"" + name + "\"\ndevice = \"gpu0\"\n"
}

// blackHole joins the queue group of subject with a member that takes
// every request the server gives it and never acknowledges or answers
// one (a host that died as it got them), and counts them.
func blackHole(t testing.TB, url, subject, queue string) *atomic.Int64 {
	t.Helper()
	nc := connect(t, url)
	var swallowed atomic.Int64
	if _, err := nc.QueueSubscribe(subject, queue, func(*nats.Msg) { swallowed.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &swallowed
}

// hostDefaults fills in what a [lattice] table without those keys would
// give a host (the lattice has no defaults of its own): the manifest's
// heartbeat_ttl, claim_ttl (or twice the TTL, where that is longer) and
// fence_failures. A negative FenceFailures stays: never.
func hostDefaults(cfg lattice.HostConfig) lattice.HostConfig {
	if cfg.TTL <= 0 {
		cfg.TTL = manifest.DefaultHeartbeatTTL
	}
	if cfg.ClaimTTL <= 0 {
		cfg.ClaimTTL = max(manifest.DefaultClaimTTL, 2*cfg.TTL)
	}
	if cfg.FenceFailures == 0 {
		cfg.FenceFailures = manifest.DefaultFenceFailures
	}
	return cfg
}
