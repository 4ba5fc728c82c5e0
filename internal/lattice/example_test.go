package lattice_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// Example joins one host to a lattice on an embedded NATS server and
// calls its session through a front, as a second process would.
func Example() {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir, _ := os.MkdirTemp("", "lattice-example-*")
	defer os.RemoveAll(dir)

	srv, err := lattice.EmbeddedServer(filepath.Join(dir, "nats"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()

	// A deployment with one session on a sim GPU.
	ctx := context.Background()
	d, err := simDeployment(ctx, dir, "good", "../../stages/testdata/hostile/good_stage.wasm", "steady", "noop")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close(ctx)

	hostConn, _ := nats.Connect(srv.ClientURL())
	defer hostConn.Close()
	h, err := lattice.NewHost(ctx, hostConn, d, lattice.HostConfig{Lattice: "demo", ID: "h1", TTL: 3 * time.Second, ClaimTTL: 10 * time.Second, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Close(ctx)

	frontConn, _ := nats.Connect(srv.ClientURL())
	defer frontConn.Close()
	f, err := lattice.NewFront(ctx, frontConn, lattice.FrontConfig{Lattice: "demo", TTL: 3 * time.Second, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()
	out, err := f.Call(ctx, "steady", nil)
	fmt.Println(string(out), err, f.Serving("steady"))
	// Output:
	// ok <nil> [h1]
}

// ExampleFront_SwapSession swaps a session lattice-wide: the front
// stores the module's bytes and the session's desired module in the
// lattice, and answers once every live host runs it.
func ExampleFront_SwapSession() {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir, _ := os.MkdirTemp("", "lattice-swap-example-*")
	defer os.RemoveAll(dir)
	srv, err := lattice.EmbeddedServer(filepath.Join(dir, "nats"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()

	// A host whose session "ver" runs version 1 (it answers "v1").
	ctx := context.Background()
	d, err := simDeployment(ctx, dir, "ver", "testdata/version1.wasm", "ver")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close(ctx)
	hostConn, _ := nats.Connect(srv.ClientURL())
	defer hostConn.Close()
	h, err := lattice.NewHost(ctx, hostConn, d, lattice.HostConfig{Lattice: "demo", ID: "h1", TTL: 3 * time.Second, ClaimTTL: 10 * time.Second, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Close(ctx)

	frontConn, _ := nats.Connect(srv.ClientURL())
	defer frontConn.Close()
	f, err := lattice.NewFront(ctx, frontConn, lattice.FrontConfig{Lattice: "demo", TTL: 3 * time.Second, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()

	// Version 2, which the host has never loaded.
	bin2, _ := os.ReadFile("testdata/version2.wasm")
	ans, err := f.SwapSession(ctx, lattice.DesiredModule{Session: "ver", Module: "ver", SHA256: stages.SHA256(bin2)}, bin2)
	if err != nil {
		fmt.Println(err)
		return
	}
	out, err := f.Call(ctx, "ver", nil)
	fmt.Println(ans.Revision, len(ans.Hosts), ans.Hosts[0].Acknowledged, string(out), err)
	// Output:
	// 1 1 true v2 <nil>
}

// simDeployment writes into dir a manifest of one sim GPU, "gpu0", and
// one session on it, session, whose stage is the module called module
// at path (relative to this directory), with programs, and opens it,
// logging nothing.
func simDeployment(ctx context.Context, dir, module, path, session string, programs ...string) (*deploy.Deployment, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(abs)
	if err != nil {
		return nil, err
	}
	src := fmt.Sprintf(`version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = %q
path = %q
sha256 = %q
[[session]]
name = %q
stage = %q
device = "gpu0"
`, module, abs, stages.SHA256(bin), session, module)
	if len(programs) > 0 {
		q := make([]string, len(programs))
		for i, p := range programs {
			q[i] = strconv.Quote(p)
		}
		src += "programs = [" + strings.Join(q, ", ") + "]\n"
	}
	manifestPath := filepath.Join(dir, "host.toml")
	if err := os.WriteFile(manifestPath, []byte(src), 0o644); err != nil {
		return nil, err
	}
	m, err := manifest.Load(manifestPath)
	if err != nil {
		return nil, err
	}
	return deploy.Open(ctx, m, deploy.NewConfig().WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
}
