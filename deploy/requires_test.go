package deploy_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// echoNeeding returns echo.wasm with a stagehost.requires section of r.
func echoNeeding(t *testing.T, r *abi.Requires) []byte {
	t.Helper()
	bin, err := os.ReadFile(filepath.Join(repo, "stages/testdata/hostile/echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	r.Version = abi.RequiresVersion
	out, err := stages.SetRequires(bin, r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// needsMatmul needs programs the session "fill" of fillManifest does not
// list, weights, and a later ABI revision than the host's.
var needsMatmul = &abi.Requires{Programs: []string{"fill", "matmul", "softmax"}, Weights: []string{"digits"}, ABIRevision: abi.Revision + 1}

// wantMissing is the one error that lists every missing item of
// needsMatmul for session "fill".
func wantMissing(module string) string {
	return `module "` + module + `" needs programs "matmul", "softmax" not listed by session "fill"; weights "digits": session "fill" lists no weights; ABI revision ` +
		string(rune('0'+abi.Revision+1)) + `, the host has ` + string(rune('0'+abi.Revision))
}

const fillManifest = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "echo"
path = "@ECHO@"
sha256 = "@ECHOSHA@"
[[session]]
name = "fill"
stage = "echo"
device = "gpu0"
programs = ["fill", "saxpy"]
`

func fillManifestWith(t *testing.T, echo []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "echo.wasm")
	if err := os.WriteFile(path, echo, 0o644); err != nil {
		t.Fatal(err)
	}
	return strings.NewReplacer("@ECHO@", path, "@ECHOSHA@", stages.SHA256(echo)).Replace(fillManifest)
}

// TestSwapRefusesAModuleWhoseRequirementsTheSessionLacks: the swap is
// refused, naming every missing item in one failed_precondition error,
// and the session keeps its module and serves; without the check the
// swap succeeded and the module failed in its calls.
func TestSwapRefusesAModuleWhoseRequirementsTheSessionLacks(t *testing.T) {
	plain, err := os.ReadFile(filepath.Join(repo, "stages/testdata/hostile/echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	d := open(t, fillManifestWith(t, plain))
	ctx := context.Background()
	needy := echoNeeding(t, needsMatmul)
	// Loaded under another name: no session names it as its stage, so
	// only the host's revision is checked at the load.
	_, _, err = d.LoadModule(ctx, deploy.ModuleRequest{Name: "needy", SHA256: stages.SHA256(needy)}, needy, "upload")
	if err == nil || !strings.Contains(err.Error(), "ABI revision") || strings.Contains(err.Error(), "programs") {
		t.Fatalf("load: %v", err)
	}
	// Without the revision, the load succeeds and the swap is refused.
	r := *needsMatmul
	r.ABIRevision = 0
	needy = echoNeeding(t, &r)
	if _, _, err := d.LoadModule(ctx, deploy.ModuleRequest{Name: "needy", SHA256: stages.SHA256(needy)}, needy, "upload"); err != nil {
		t.Fatal(err)
	}
	_, err = d.SwapSession(ctx, "fill", "needy")
	want := `session "fill" keeps its module: module "needy" needs programs "matmul", "softmax" not listed by session "fill"; weights "digits": session "fill" lists no weights`
	if err == nil || err.Error() != want || !errors.Is(err, errdefs.ErrFailedPrecondition) || deploy.Class(err) != errdefs.ClassFailedPrecondition {
		t.Fatalf("swap: %v\nwant %s", err, want)
	}
	if st := d.Pool("fill").Status(); st.Stage != "echo" || st.State != "ready" {
		t.Fatalf("after the refused swap: stage %q, state %q", st.Stage, st.State)
	}
	out, err := d.Pool("fill").Run(ctx, []byte("hi"))
	if err != nil || string(out) != "hi" {
		t.Fatalf("the session after the refused swap: %q %v", out, err)
	}
	// A module whose requirements the session meets swaps in.
	fits := echoNeeding(t, &abi.Requires{Programs: []string{"saxpy"}, Streams: []string{"s0"}, MinBudgetBytes: 1 << 20})
	if _, _, err := d.LoadModule(ctx, deploy.ModuleRequest{Name: "fits", SHA256: stages.SHA256(fits)}, fits, "upload"); err != nil {
		t.Fatal(err)
	}
	if res, err := d.SwapSession(ctx, "fill", "fits"); err != nil || !res.Swapped {
		t.Fatalf("swap of a module that fits: %+v %v", res, err)
	}
}

// TestLoadChecksTheSessionsThatNameTheModule: a new version of a
// session's stage module (an upload of that name) is checked against
// that session at the load.
func TestLoadChecksTheSessionsThatNameTheModule(t *testing.T) {
	plain, err := os.ReadFile(filepath.Join(repo, "stages/testdata/hostile/echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	d := open(t, fillManifestWith(t, plain))
	r := *needsMatmul
	r.ABIRevision = 0
	needy := echoNeeding(t, &r)
	_, _, err = d.LoadModule(context.Background(), deploy.ModuleRequest{Name: "echo", SHA256: stages.SHA256(needy)}, needy, "upload")
	if err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), `needs programs "matmul", "softmax" not listed by session "fill"`) {
		t.Fatalf("load: %v", err)
	}
	if n := len(d.Modules()); n != 1 {
		t.Fatalf("%d versions loaded after the refusal", n)
	}
}

// TestManifestAndOpenRefuseAModuleTheSessionCannotServe: stagehost check
// (manifest.Load) names the session's stage key; deploy.Open refuses a
// manifest made without that check.
func TestManifestAndOpenRefuseAModuleTheSessionCannotServe(t *testing.T) {
	needy := echoNeeding(t, needsMatmul)
	_, err := manifest.Load(writeManifest(t, fillManifestWith(t, needy)))
	if err == nil || !strings.Contains(err.Error(), "session[0].stage: "+wantMissing("echo")) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("manifest: %v", err)
	}
	plain, _ := os.ReadFile(filepath.Join(repo, "stages/testdata/hostile/echo.wasm"))
	m, err := manifest.Load(writeManifest(t, fillManifestWith(t, plain)))
	if err != nil {
		t.Fatal(err)
	}
	m.Modules[0].Bytes, m.Modules[0].SHA256 = needy, stages.SHA256(needy)
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig())
	if err == nil {
		d.Close(context.Background())
	}
	if err == nil || err.Error() != `session "fill": `+wantMissing("echo") || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("open: %v", err)
	}
}
