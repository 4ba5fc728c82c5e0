package lattice_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/sessions/deploy"
	"github.com/stagehost/stagehost/sessions/lattice"
	"github.com/stagehost/stagehost/stages"
)

// TestPayloadLimits: on a server whose max_payload is 32 KiB, an input
// the lattice cannot carry is refused out_of_budget at once, and so is
// an output the host cannot send (big_output writes 64 KiB), instead of
// the call waiting for its deadline; a call within the limit runs.
func TestPayloadLimits(t *testing.T) {
	srv, err := lattice.StartEmbedded(lattice.EmbeddedConfig{StoreDir: t.TempDir(), MaxPayload: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := srv.ClientURL()
	abs, err := filepath.Abs(filepath.Join(repo, "stages/testdata/hostile/big_output.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(abs)
	if err != nil {
		t.Fatal(err)
	}
	extra := "[[module]]\nname = \"big\"\npath = \"" + abs + "\"\nsha256 = \"" + stages.SHA256(b) + "\"\n" +
		"[[session]]\nname = \"big\"\nstage = \"big\"\ndevice = \"gpu0\"\n"
	join(t, url, "pl", "h1", manifestOpts{extra: extra}, lattice.HostConfig{TTL: ttl})
	f := newFront(t, url, "pl", lattice.FrontConfig{TTL: ttl})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if out, err := f.Call(ctx, "steady", make([]byte, 16<<10)); err != nil || string(out) != "ok" {
		t.Fatalf("a 16 KiB input: %q %v", out, err)
	}
	start := time.Now()
	_, err = f.Call(ctx, "steady", make([]byte, 40<<10))
	if lattice.Class(err) != deploy.ClassOutOfBudget || !strings.Contains(err.Error(), "input of 40960 bytes") || !strings.Contains(err.Error(), "max_payload is 32768 bytes") {
		t.Errorf("a 40 KiB input: %v (class %s)", err, lattice.Class(err))
	}
	_, err = f.Call(ctx, "big", nil)
	if lattice.Class(err) != deploy.ClassOutOfBudget || !strings.Contains(err.Error(), "output of 65536 bytes") {
		t.Errorf("a 64 KiB output: %v (class %s)", err, lattice.Class(err))
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the refusals took %v: they waited instead of answering", took)
	}
}
