package deploy_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/manifest"
)

// TestVendorPTXRefused: a plain deployment refuses a session on a cuda
// GPU that lists a vendor kernel, before opening any device (so without
// a GPU too), naming serve --supervise.
func TestVendorPTXRefused(t *testing.T) {
	src := filepath.Join(repo, "cmd", "stagehost", "testdata", "vkernel")
	dir := t.TempDir()
	for _, f := range []string{"stage.wasm", "double.wasm", "double.ptx", "host.toml"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "host.toml" {
			b = []byte(strings.Replace(string(b), `backend = "sim"`, `backend = "cuda"`, 1))
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := manifest.Load(filepath.Join(dir, "host.toml"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = deploy.Open(context.Background(), m, deploy.NewConfig())
	if !errors.Is(err, errdefs.ErrUnsupported) || !strings.Contains(err.Error(), `session "launch": vendor PTX kernel "double" runs only in a worker process of its tenant: start with serve --supervise`) {
		t.Fatalf("Open: %v", err)
	}
	// The session belongs to the kernel's tenant, "double": the shared
	// worker does not serve it, and the tenant's worker runs it; neither
	// refuses the manifest (without a GPU, opening the cuda device fails
	// afterwards, for another reason).
	if got := m.Session("launch").TenantName(); got != "double" {
		t.Fatalf("tenant of session launch = %q, want the kernel's name", got)
	}
	for _, tenant := range []string{"", "double"} {
		d, err := deploy.Open(context.Background(), m, deploy.NewConfig().WithTenant(tenant))
		if err != nil && strings.Contains(err.Error(), "runs only in a worker process of its tenant") {
			t.Fatalf("Open in the worker of tenant %q: %v", tenant, err)
		}
		if d != nil {
			d.Close(context.Background())
		}
	}
}
