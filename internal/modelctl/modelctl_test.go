package modelctl_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/fileread"
	"github.com/stagehost/stagehost/internal/modelctl"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

func module(t testing.TB, name string) (path string, bin []byte, sha string) {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("../../stages/testdata/hostile", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	bin, err = os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, bin, stages.SHA256(bin)
}

// open opens a deployment of one sim gpu with session b on module good
// (good_stage: it answers "ok"), or on module good2 (the same bytes
// under another name) with renamed.
func open(t *testing.T, renamed bool) *deploy.Deployment {
	t.Helper()
	good, _, sha := module(t, "good_stage")
	name := "good"
	if renamed {
		name = "good2"
	}
	path := filepath.Join(t.TempDir(), "m.toml")
	body := fmt.Sprintf(`version = 1
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
name = "b"
stage = %q
device = "gpu0"
programs = ["noop"]
`, name, good, sha, name)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

func run(t *testing.T, d *deploy.Deployment, in string) string {
	t.Helper()
	out, err := d.Pool("b").Run(context.Background(), []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// state records module v2 (echo) and the swap of b to it, made when the
// manifest's stage of b was good.
func state(t *testing.T, st modelctl.Store) (echoSHA string) {
	t.Helper()
	ctx := context.Background()
	_, echo, echoSHA := module(t, "echo")
	_, _, goodSHA := module(t, "good_stage")
	if err := st.PutBlob(ctx, echoSHA, echo); err != nil {
		t.Fatal(err)
	}
	if err := st.Update(ctx, func(s *modelctl.State) error {
		s.AddModule(modelctl.ModuleRecord{Name: "v2", SHA256: echoSHA, Source: "upload"})
		s.SetSwap(modelctl.SwapRecord{Session: "b", Stage: "v2@" + echoSHA, ManifestStage: "good@" + goodSHA})
		s.SetSwap(modelctl.SwapRecord{Session: "gone", Stage: "v2@" + echoSHA, ManifestStage: "x@y"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return echoSHA
}

// Restore loads the recorded modules and applies the recorded swaps, and
// says what it did; what it cannot apply is a note.
func TestRestore(t *testing.T) {
	st := modelctl.OpenDir(t.TempDir())
	echoSHA := state(t, st)
	d := open(t, false)
	if got := run(t, d, "hi"); got != "ok" {
		t.Fatalf("before the restore: %q", got)
	}
	r := modelctl.Restore(context.Background(), d, st, nil)
	applied, notes := r.Applied, r.Notes
	if r.Revision != 1 {
		t.Errorf("revision %d; want 1 (one update)", r.Revision)
	}
	if want := fmt.Sprint([]string{"restored module v2@" + echoSHA, "restored swap of b to v2@" + echoSHA}); fmt.Sprint(applied) != want {
		t.Errorf("applied %q; want %q", applied, want)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], `swap of gone to v2@`) || !strings.Contains(notes[0], `the manifest has no session "gone"`) {
		t.Errorf("notes %q; want the swap of a session the manifest has not", notes)
	}
	if got := run(t, d, "hi"); got != "hi" {
		t.Errorf("after the restore: %q; want the swapped module's answer", got)
	}
}

// A module whose bytes are corrupt, and a swap made when the manifest
// gave the session another stage, are notes, not applied.
func TestRestoreReportsWhatItCannotApply(t *testing.T) {
	dir := t.TempDir()
	st := modelctl.OpenDir(dir)
	echoSHA := state(t, st)
	if err := os.WriteFile(filepath.Join(dir, "modules", echoSHA+".wasm"), []byte("\x00asm garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := open(t, true) // b's stage is now good2
	r := modelctl.Restore(context.Background(), d, st, nil)
	applied, notes := r.Applied, r.Notes
	if len(applied) != 0 {
		t.Errorf("applied %q; want nothing", applied)
	}
	joined := strings.Join(notes, "\n")
	for _, want := range []string{
		"module v2@" + echoSHA + " not restored: model state: " + filepath.Join(dir, "modules", echoSHA+".wasm") + " is corrupt",
		"swap of b to v2@" + echoSHA + " not restored: the manifest's stage of b is now good2@",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("notes:\n%s\nwant %q", joined, want)
		}
	}
	if got := run(t, d, "hi"); got != "ok" {
		t.Errorf("after the restore: %q; want the manifest's module", got)
	}
}

// The store: blobs are checked against their sha256, the state is
// versioned, and a swap back to the manifest's stage drops the record.
func TestDir(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st := modelctl.OpenDir(dir)
	if s, err := st.Load(ctx); err != nil || len(s.Modules)+len(s.Swaps) != 0 {
		t.Fatalf("an empty store: %+v %v", s, err)
	}
	_, echo, sha := module(t, "echo")
	if err := st.PutBlob(ctx, strings.Repeat("0", 64), echo); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a blob under the wrong sha256: %v", err)
	}
	if err := st.PutBlob(ctx, "../x", echo); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a blob under a path: %v", err)
	}
	if _, err := st.Blob(ctx, sha); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a missing blob: %v", err)
	}
	if err := st.PutBlob(ctx, sha, echo); err != nil {
		t.Fatal(err)
	}
	if b, err := st.Blob(ctx, sha); err != nil || string(b) != string(echo) {
		t.Errorf("the blob back: %d bytes, %v", len(b), err)
	}
	sw := modelctl.SwapRecord{Session: "b", Stage: "v2@" + sha, ManifestStage: "good@x"}
	if err := st.Update(ctx, func(s *modelctl.State) error { s.SetSwap(sw); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := st.Update(ctx, func(s *modelctl.State) error { return errors.New("no") }); err == nil {
		t.Error("Update's error was lost")
	}
	if s, _ := st.Load(ctx); len(s.Swaps) != 1 || s.Swaps[0] != sw || s.Revision != 1 {
		t.Errorf("after a swap: %+v", s)
	}
	back := modelctl.SwapRecord{Session: "b", Stage: "good@x", ManifestStage: "good@x"}
	if err := st.Update(ctx, func(s *modelctl.State) error { s.SetSwap(back); return nil }); err != nil {
		t.Fatal(err)
	}
	if s, _ := st.Load(ctx); len(s.Swaps) != 0 || s.Revision != 2 {
		t.Errorf("after a swap back to the manifest's stage: %+v", s)
	}
	if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"version": 9}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Load(ctx); !errors.Is(err, errdefs.ErrUnsupported) || !strings.Contains(err.Error(), "version 9") {
		t.Errorf("a state of another version: %v", err)
	}
	// A state record over 16 MiB is refused, not read whole.
	if err := os.Truncate(filepath.Join(dir, "state.json"), 16<<20+1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Load(ctx); !errors.Is(err, fileread.ErrTooLarge) {
		t.Errorf("a state record over 16 MiB: %v", err)
	}
}

// A worker's endpoint answers each operation, and a refusal with its
// class.
func TestServeAndCall(t *testing.T) {
	nc := testutil.NATS(t)
	d := open(t, false)
	st := modelctl.OpenDir(t.TempDir())
	sub, err := modelctl.Serve(nc, "l", "w1", d, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func(req modelctl.Request) modelctl.Reply {
		t.Helper()
		rep, err := modelctl.Call(ctx, nc, "l", "w1", req)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	_, echo, sha := module(t, "echo")
	// A load whose bytes are not in the store: not found.
	rep := call(modelctl.Request{Op: modelctl.OpLoad, Module: &deploy.ModuleRequest{Name: "v2", SHA256: sha}})
	if rep.Class != errdefs.ClassNotFound || rep.Host != "w1" || !errors.Is(rep.Err(), errdefs.ErrNotFound) {
		t.Errorf("a load of bytes not stored: %+v", rep)
	}
	if err := st.PutBlob(ctx, sha, echo); err != nil {
		t.Fatal(err)
	}
	if rep := call(modelctl.Request{Op: modelctl.OpLoad, Module: &deploy.ModuleRequest{Name: "v2", SHA256: sha}}); rep.Err() != nil || !rep.Created || rep.Module.Ref != "v2@"+sha {
		t.Errorf("load: %+v", rep)
	}
	if rep := call(modelctl.Request{Op: modelctl.OpModules}); len(rep.Modules) != 2 {
		t.Errorf("modules: %+v", rep.Modules)
	}
	if rep := call(modelctl.Request{Op: modelctl.OpSwap, Session: "nope", Stage: "v2"}); rep.Class != errdefs.ClassNotFound {
		t.Errorf("a swap of an unknown session: %+v", rep)
	}
	rep = call(modelctl.Request{Op: modelctl.OpSwap, Session: "b", Stage: "v2"})
	if rep.Err() != nil || rep.Swap.To != "v2@"+sha || !strings.HasPrefix(rep.ManifestStage, "good@") {
		t.Errorf("swap: %+v", rep)
	}
	if got := run(t, d, "hi"); got != "hi" {
		t.Errorf("after the swap: %q", got)
	}
	if rep := call(modelctl.Request{Op: modelctl.OpUnload, Ref: "v2"}); rep.Class != errdefs.ClassInvalidArgument {
		t.Errorf("unload of a module in use: %+v", rep)
	}
	if rep := call(modelctl.Request{Op: modelctl.OpReset, Session: "b"}); rep.Err() != nil || rep.Reset == nil || rep.Reset.Session != "b" {
		t.Errorf("reset: %+v", rep)
	}
	// restore: the store's state (none here: revision 0) applied again.
	if rep := call(modelctl.Request{Op: modelctl.OpRestore}); rep.Err() != nil || rep.Restored == nil || rep.Restored.Revision != 0 {
		t.Errorf("restore: %+v", rep)
	}
	if rep := call(modelctl.Request{Op: "bogus"}); rep.Class != errdefs.ClassInvalidArgument {
		t.Errorf("an unknown op: %+v", rep)
	}
	// A host nobody serves: unavailable.
	if _, err := modelctl.Call(ctx, nc, "l", "w9", modelctl.Request{Op: modelctl.OpModules}); deploy.Class(err) != errdefs.ClassUnavailable {
		t.Errorf("a call to no host: %v (%s)", err, deploy.Class(err))
	}
}
