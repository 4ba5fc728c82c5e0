package lattice_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
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
	stage, _ := filepath.Abs("../../stages/testdata/hostile/good_stage.wasm")
	bin, _ := os.ReadFile(stage)
	src := fmt.Sprintf(`version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "good"
path = %q
sha256 = %q
[[session]]
name = "steady"
stage = "good"
device = "gpu0"
programs = ["noop"]
`, stage, stages.SHA256(bin))
	path := filepath.Join(dir, "host.toml")
	_ = os.WriteFile(path, []byte(src), 0o644)
	m, err := manifest.Load(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	d, err := deploy.Open(ctx, m, deploy.NewConfig().WithLogger(quiet))
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
	v1, _ := filepath.Abs("testdata/version1.wasm")
	bin1, _ := os.ReadFile(v1)
	src := fmt.Sprintf(`version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "ver"
path = %q
sha256 = %q
[[session]]
name = "ver"
stage = "ver"
device = "gpu0"
`, v1, stages.SHA256(bin1))
	path := filepath.Join(dir, "host.toml")
	_ = os.WriteFile(path, []byte(src), 0o644)
	m, err := manifest.Load(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	d, err := deploy.Open(ctx, m, deploy.NewConfig().WithLogger(quiet))
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
