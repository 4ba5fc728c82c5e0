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
