package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/service"
)

// The model-control routes (admin.go, admin_http.go): load, swap with a
// drain, unload, reset.

func readRepo(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("%d %s: %v", rec.Code, rec.Body, err)
	}
	return v
}

func servePooled(t *testing.T, cfg func(*service.Config)) *served {
	t.Helper()
	// The liars' instances hold a buffer each: the budget a quarantine
	// keeps charged.
	r := strings.NewReplacer("@QUEUE@", "",
		"@LIARSHA@", sha(t, "stages/testdata/hostile/lying_fence.wasm"),
		"@LOOPSHA@", sha(t, "stages/testdata/hostile/loop_stage.wasm"),
		"[[session]]\nname = \"spin\"", "[[session.buffer]]\nname = \"w\"\nsize = \"64KiB\"\n[[session]]\nname = \"spin\"")
	d := open(t, r.Replace(pooled))
	c := service.ConfigFromManifest(d.Manifest)
	if cfg != nil {
		cfg(&c)
	}
	return &served{t: t, srv: service.NewServerConfig(d, nil, c), d: d, log: &syncBuffer{}, header: http.Header{}}
}

// upload PUTs a repository file as a version of module name.
func (s *served) upload(name, path string) *httptest.ResponseRecorder {
	s.t.Helper()
	return s.do("PUT", "/v1/modules/"+name+"?sha256="+sha(s.t, path), bytes.NewReader(readRepo(s.t, path)))
}

const bigOutput = "stages/testdata/hostile/big_output.wasm" // outputs 64KiB of 'Z'; "good" outputs "ok"

// TestSwapLetsACallInFlightFinishOnTheOldVersion: a call holds an old
// instance across the swap; new calls run the new version at once, the
// held call still runs the old one, and the old instance is closed only
// when its call is done.
func TestSwapLetsACallInFlightFinishOnTheOldVersion(t *testing.T) {
	s := servePooled(t, nil)
	ctx := context.Background()
	sess := s.d.Pool("pooled")
	oldSHA := sess.Status().StageSHA256
	if oldSHA != sha(t, "stages/testdata/hostile/good_stage.wasm") {
		t.Fatalf("stage_sha256 %q", oldSHA)
	}
	held, err := sess.Acquire(ctx) // a call in flight on the old version
	if err != nil {
		t.Fatal(err)
	}
	if rec := s.upload("good", bigOutput); rec.Code != http.StatusCreated {
		t.Fatalf("upload: %d %s", rec.Code, rec.Body)
	}
	if rec := s.upload("good", bigOutput); rec.Code != http.StatusOK {
		t.Fatalf("the same upload again: %d %s", rec.Code, rec.Body)
	}
	newSHA := sha(t, bigOutput)
	rec := s.do("POST", "/v1/sessions/pooled/swap", strings.NewReader(`{"stage": "good"}`))
	res := decode[deploy.SwapResult](t, rec)
	if rec.Code != 200 || !res.Swapped || res.Draining != 1 || res.To != "good@"+newSHA || res.From != "good@"+oldSHA ||
		res.Status.StageSHA256 != newSHA || len(res.Status.Instances) != 3 {
		t.Fatalf("swap: %d %s", rec.Code, rec.Body)
	}
	for range 3 {
		if rec := s.do("POST", "/v1/sessions/pooled/run", nil); rec.Code != 200 || rec.Body.Len() != 64<<10 || rec.Body.Bytes()[0] != 'Z' {
			t.Fatalf("a new call after the swap: %d %.40q", rec.Code, rec.Body)
		}
	}
	out, err := held.Run(ctx, nil)
	if err != nil || string(out) != "ok" {
		t.Fatalf("the call in flight: %q, %v; want the old version's ok", out, err)
	}
	if st := sess.Status(); st.Draining != 1 {
		t.Fatalf("draining %d before the release", st.Draining)
	}
	held.Release()
	if st := sess.Status(); st.Draining != 0 || st.State != "ready" || len(st.Retired) != 0 {
		t.Fatalf("after the drain: %+v", st)
	}
	// The old version is no longer used: it may be unloaded; the new one
	// may not.
	mods := decode[struct{ Modules []deploy.ModuleInfo }](t, s.do("GET", "/v1/modules", nil)).Modules
	var goods []deploy.ModuleInfo
	for _, m := range mods {
		if m.Name == "good" {
			goods = append(goods, m)
		}
	}
	if len(goods) != 2 || len(goods[0].Sessions) != 0 || !goods[1].Newest || fmt.Sprint(goods[1].Sessions) != "[pooled]" || goods[1].Source != "upload" {
		t.Fatalf("modules: %+v", goods)
	}
	if rec := s.do("DELETE", "/v1/modules/good@"+oldSHA[:12], nil); rec.Code != 200 {
		t.Fatalf("unloading the old version: %d %s", rec.Code, rec.Body)
	}
	// Swapping back to a name@sha256 version works the same way.
	if rec := s.upload("good", "stages/testdata/hostile/good_stage.wasm"); rec.Code != http.StatusCreated {
		t.Fatalf("upload: %d %s", rec.Code, rec.Body)
	}
	rec = s.do("POST", "/v1/sessions/pooled/swap", strings.NewReader(`{"stage": "good@`+oldSHA+`"}`))
	if res := decode[deploy.SwapResult](t, rec); rec.Code != 200 || res.Draining != 0 || res.Status.StageSHA256 != oldSHA {
		t.Fatalf("swap back: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("POST", "/v1/sessions/pooled/run", nil); rec.Body.String() != "ok" {
		t.Fatalf("after swapping back: %d %.40q", rec.Code, rec.Body)
	}
}

// TestAFailedLoadOrSwapKeepsTheOldVersion: a module that does not load,
// or whose instances cannot be made, changes nothing.
func TestAFailedLoadOrSwapKeepsTheOldVersion(t *testing.T) {
	s := servePooled(t, nil)
	before := s.d.Pool("pooled").Status()
	// A sha256 that does not match; a module that does not validate.
	rec := s.do("PUT", "/v1/modules/good?sha256="+strings.Repeat("0", 64), bytes.NewReader(readRepo(t, bigOutput)))
	if e := errorBody(t, rec); rec.Code != 400 || !strings.Contains(e.Error, "sha256 mismatch") {
		t.Fatalf("a wrong sha256: %d %s", rec.Code, rec.Body)
	}
	if rec := s.upload("bad", "stages/testdata/hostile/no_marker.wasm"); rec.Code != 400 || !strings.Contains(errorBody(t, rec).Error, "marker") {
		t.Fatalf("a module without the marker: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("POST", "/v1/modules", strings.NewReader(`{"name": "z", "path": "/dev/zero", "sha256": "00"}`)); rec.Code != 400 || !strings.Contains(errorBody(t, rec).Error, "not a regular file") {
		t.Fatalf("a path to /dev/zero: %d %s", rec.Code, rec.Body)
	}
	// A module whose stagehost_init traps loads, but no instance of it
	// can be made: the swap fails and the session keeps its version.
	rec = s.do("POST", "/v1/modules", strings.NewReader(fmt.Sprintf(`{"name": "good", "path": %q, "sha256": %q}`,
		"deploy/testdata/init_trap.wasm", sha(t, "deploy/testdata/init_trap.wasm"))))
	if rec.Code != 400 || !strings.Contains(errorBody(t, rec).Error, "no such file") {
		// a relative path is the manifest's directory's: a temp dir here
		t.Fatalf("a relative path: %d %s", rec.Code, rec.Body)
	}
	abs, _ := filepath.Abs(filepath.Join(repo, "deploy/testdata/init_trap.wasm"))
	rec = s.do("POST", "/v1/modules", strings.NewReader(fmt.Sprintf(`{"name": "good", "path": %q, "sha256": %q}`,
		abs, sha(t, "deploy/testdata/init_trap.wasm"))))
	if info := decode[deploy.ModuleInfo](t, rec); rec.Code != 201 || info.Source != "path" || !info.Newest {
		t.Fatalf("load by path: %d %s", rec.Code, rec.Body)
	}
	rec = s.do("POST", "/v1/sessions/pooled/swap", strings.NewReader(`{"stage": "good"}`))
	if e := errorBody(t, rec); rec.Code < 400 || !strings.Contains(e.Error, "keeps good@"+before.StageSHA256) {
		t.Fatalf("a swap to a module whose init traps: %d %s", rec.Code, rec.Body)
	}
	after := s.d.Pool("pooled").Status()
	if after.StageSHA256 != before.StageSHA256 || after.State != "ready" || len(after.Instances) != 3 {
		t.Fatalf("after the failed swap: %+v", after)
	}
	if rec := s.do("POST", "/v1/sessions/pooled/run", nil); rec.Code != 200 || rec.Body.String() != "ok" {
		t.Fatalf("a call after the failed swap: %d %s", rec.Code, rec.Body)
	}
	// Unknown session, unknown module, a fence module, a bad body.
	for _, tc := range []struct {
		path, body string
		code       int
	}{
		{"/v1/sessions/nope/swap", `{"stage": "good"}`, 404},
		{"/v1/sessions/pooled/swap", `{"stage": "nope"}`, 404},
		{"/v1/sessions/pooled/swap", `{"stage": "good@ffffffffff"}`, 404},
		{"/v1/sessions/pooled/swap", `{"stage": ""}`, 400},
		{"/v1/sessions/pooled/swap", `{"stag": "good"}`, 400},
	} {
		if rec := s.do("POST", tc.path, strings.NewReader(tc.body)); rec.Code != tc.code {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, rec.Code, rec.Body)
		}
	}
}

// TestUnloadIsRefusedWhileASessionUsesIt.
func TestUnloadIsRefusedWhileASessionUsesIt(t *testing.T) {
	s := servePooled(t, nil)
	rec := s.do("DELETE", "/v1/modules/good", nil)
	if e := errorBody(t, rec); rec.Code != 400 || e.Class != "invalid_argument" || !strings.Contains(e.Error, "in use by session pooled") {
		t.Fatalf("unloading a used module: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("POST", "/v1/sessions/pooled/run", nil); rec.Body.String() != "ok" {
		t.Fatalf("after the refused unload: %d %s", rec.Code, rec.Body)
	}
	if rec := s.upload("spare", bigOutput); rec.Code != 201 {
		t.Fatalf("upload: %d %s", rec.Code, rec.Body)
	}
	rec = s.do("DELETE", "/v1/modules/spare", nil)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), sha(t, bigOutput)) {
		t.Fatalf("unloading an unused module: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("DELETE", "/v1/modules/spare", nil); rec.Code != 404 {
		t.Fatalf("unloading it again: %d %s", rec.Code, rec.Body)
	}
	if strings.Contains(s.do("GET", "/v1/modules", nil).Body.String(), `"spare"`) {
		t.Fatal("an unloaded module is still listed")
	}
	// Loaded again after its unload, it is compiled anew and serves.
	if rec := s.upload("spare", bigOutput); rec.Code != 201 {
		t.Fatalf("upload again: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("POST", "/v1/sessions/spin/swap", strings.NewReader(`{"stage": "spare"}`)); rec.Code != 200 {
		t.Fatalf("swap: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("POST", "/v1/sessions/spin/run", nil); rec.Code != 200 || rec.Body.Len() != 64<<10 {
		t.Fatalf("run: %d %.40s", rec.Code, rec.Body)
	}
	// loop is used by no session now.
	if rec := s.do("DELETE", "/v1/modules/loop", nil); rec.Code != 200 {
		t.Fatalf("unloading loop: %d %s", rec.Code, rec.Body)
	}
}

// TestResetReplacesQuarantinedInstances: the liars' calls quarantine
// both their instances; a reset gives fresh ones, the session and
// /readyz recover, and the quarantined owners' budget stays counted.
func TestResetReplacesQuarantinedInstances(t *testing.T) {
	s := servePooled(t, nil)
	for range 2 {
		if rec := s.do("POST", "/v1/sessions/liars/run", nil); rec.Code != 503 {
			t.Fatalf("liar: %d %s", rec.Code, rec.Body)
		}
	}
	if rec := s.do("GET", "/readyz", nil); rec.Code != 503 {
		t.Fatalf("readyz: %d", rec.Code)
	}
	q := s.d.Runtime.Stats()
	if len(q.Quarantined) != 2 || q.QuarantinedBytes == 0 {
		t.Fatalf("quarantine stats before: %+v", q)
	}
	st := s.d.Pool("liars").Status()
	var budget int64
	for _, in := range st.Instances {
		budget += in.BudgetBytes
	}
	rec := s.do("POST", "/v1/sessions/liars/reset", nil)
	res := decode[deploy.ResetResult](t, rec)
	if rec.Code != 200 || len(res.Replaced) != 2 || len(res.Skipped) != 0 || res.Status.State != "ready" || res.Status.InstancesOut != 0 {
		t.Fatalf("reset: %d %s", rec.Code, rec.Body)
	}
	st = s.d.Pool("liars").Status()
	if len(st.Retired) != 2 {
		t.Fatalf("retired: %+v", st.Retired)
	}
	var kept int64
	for _, r := range st.Retired {
		if r.State != "quarantined" || !r.Kept || r.Reason == "" || r.StageSHA256 != st.StageSHA256 {
			t.Fatalf("retired: %+v", r)
		}
		kept += r.BudgetBytes
	}
	if kept != budget || kept == 0 {
		t.Fatalf("the retired instances' budget %d, want what they held, %d", kept, budget)
	}
	if after := s.d.Runtime.Stats(); fmt.Sprint(after.Quarantined) != fmt.Sprint(q.Quarantined) || after.QuarantinedBytes != q.QuarantinedBytes {
		t.Fatalf("quarantine stats after the reset: %+v, want %+v (still counted)", after, q)
	}
	for _, in := range st.Instances {
		if in.State != "ready" {
			t.Fatalf("instance %+v", in)
		}
	}
	if rec := s.do("GET", "/readyz", nil); rec.Code != 200 {
		t.Fatalf("readyz after the reset: %d %s", rec.Code, rec.Body)
	}
	// Nothing out of service: a reset replaces nothing.
	if rec := s.do("POST", "/v1/sessions/pooled/reset", nil); rec.Code != 200 || len(decode[deploy.ResetResult](t, rec).Replaced) != 0 {
		t.Fatalf("reset of a healthy session: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("POST", "/v1/sessions/nope/reset", nil); rec.Code != 404 {
		t.Fatalf("reset of no session: %d %s", rec.Code, rec.Body)
	}
}

// TestResetOrSwapOfASessionThatCouldNotBeCreated: a reset retries the
// creation (and fails again for a module whose init traps); a swap to
// another module creates it.
func TestResetOrSwapOfASessionThatCouldNotBeCreated(t *testing.T) {
	d := open(t, strings.ReplaceAll(brokenSessions, "@LOOP@", ""))
	s := &served{t: t, srv: service.NewServerConfig(d, nil, service.ConfigFromManifest(d.Manifest)), d: d, log: &syncBuffer{}, header: http.Header{}}
	rec := s.do("POST", "/v1/sessions/boot_trap/reset", nil)
	if e := errorBody(t, rec); rec.Code < 400 || !strings.Contains(e.Error, "could not be created") {
		t.Fatalf("reset: %d %s", rec.Code, rec.Body)
	}
	if st := d.Pool("boot_trap").Status(); st.State != "failed" {
		t.Fatalf("%+v", st)
	}
	if rec := s.upload("big", bigOutput); rec.Code != 201 {
		t.Fatalf("upload: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("POST", "/v1/sessions/boot_trap/swap", strings.NewReader(`{"stage": "big"}`)); rec.Code != 200 {
		t.Fatalf("swap: %d %s", rec.Code, rec.Body)
	}
	if st := d.Pool("boot_trap").Status(); st.State != "ready" || st.Stage != "big" || d.Pool("boot_trap").Failed() != nil {
		t.Fatalf("%+v", st)
	}
	if rec := s.do("POST", "/v1/sessions/boot_trap/run", nil); rec.Code != 200 || rec.Body.Len() != 64<<10 {
		t.Fatalf("run: %d %.40s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/readyz", nil); rec.Code != 200 {
		t.Fatalf("readyz: %d %s", rec.Code, rec.Body)
	}
}

// TestModelControlNeedsAdmin: an invoke token gets 403 on every route.
func TestModelControlNeedsAdmin(t *testing.T) {
	const admin, invoke = "admin-token-0123456789", "invoke-token-0123456789"
	s := servePooled(t, func(c *service.Config) { c.AdminTokens, c.InvokeTokens = []string{admin}, []string{invoke} })
	for _, r := range [][2]string{{"GET", "/v1/modules"}, {"POST", "/v1/modules"}, {"PUT", "/v1/modules/x"}, {"DELETE", "/v1/modules/good"},
		{"POST", "/v1/sessions/pooled/swap"}, {"POST", "/v1/sessions/liars/reset"}} {
		if rec := s.do(r[0], r[1], strings.NewReader("{}"), "Authorization", "Bearer "+invoke); rec.Code != 403 || errorBody(t, rec).Class != "permission_denied" {
			t.Errorf("%s %s with an invoke token: %d %s", r[0], r[1], rec.Code, rec.Body)
		}
		if rec := s.do(r[0], r[1], nil); rec.Code != 401 {
			t.Errorf("%s %s without a token: %d %s", r[0], r[1], rec.Code, rec.Body)
		}
	}
	if rec := s.do("GET", "/v1/modules", nil, "Authorization", "Bearer "+admin); rec.Code != 200 {
		t.Errorf("admin: %d %s", rec.Code, rec.Body)
	}
}

// unsized hides a body's length, so that the server sees no
// Content-Length and must bound its read.
type unsized struct{ r *bytes.Reader }

func (u unsized) Read(p []byte) (int, error) { return u.r.Read(p) }

// TestUploadIsBoundedByTheModuleSizeLimit: an upload larger than
// runtime.max_module_size is refused, from its Content-Length before a
// byte is read, or after reading one byte past the limit.
func TestUploadIsBoundedByTheModuleSizeLimit(t *testing.T) {
	d := open(t, strings.NewReplacer("@QUEUE@", "",
		"@LIARSHA@", sha(t, "stages/testdata/hostile/lying_fence.wasm"),
		"@LOOPSHA@", sha(t, "stages/testdata/hostile/loop_stage.wasm"),
		"[runtime]\n", "[runtime]\nmax_module_size = \"1KiB\"\n").Replace(pooled))
	s := &served{t: t, srv: service.NewServerConfig(d, nil, service.ConfigFromManifest(d.Manifest)), d: d, log: &syncBuffer{}, header: http.Header{}}
	big := bytes.Repeat([]byte{0}, 4<<10)
	rec := s.do("PUT", "/v1/modules/big?sha256="+strings.Repeat("0", 64), bytes.NewReader(big))
	if e := errorBody(t, rec); rec.Code != 413 || e.Class != "out_of_budget" || !strings.Contains(e.Error, "4096 bytes") {
		t.Fatalf("a known length over the limit: %d %s", rec.Code, rec.Body)
	}
	body := unsized{bytes.NewReader(big)}
	rec = s.do("PUT", "/v1/modules/big?sha256="+strings.Repeat("0", 64), body)
	if e := errorBody(t, rec); rec.Code != 413 || e.Class != "out_of_budget" {
		t.Fatalf("an unknown length over the limit: %d %s", rec.Code, rec.Body)
	}
	if read := len(big) - body.r.Len(); read > 1<<10+512 {
		t.Fatalf("the server read %d bytes of a body over the 1KiB limit", read)
	}
	if rec := s.upload("small", bigOutput); rec.Code != 201 {
		t.Fatalf("a module under the limit: %d %s", rec.Code, rec.Body)
	}
}

// TestSwapsUnderLoadLoseNoCall: calls run while the session is swapped
// back and forth between two versions; each ends with one version's
// output, none fails, and no old instance is left draining.
func TestSwapsUnderLoadLoseNoCall(t *testing.T) {
	s := servePooled(t, nil)
	goodSHA, bigSHA := sha(t, "stages/testdata/hostile/good_stage.wasm"), sha(t, bigOutput)
	if rec := s.upload("good", bigOutput); rec.Code != 201 {
		t.Fatalf("upload: %d %s", rec.Code, rec.Body)
	}
	sess := s.d.Pool("pooled")
	done := make(chan struct{})
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				out, err := sess.Run(context.Background(), nil)
				if err != nil || (string(out) != "ok" && len(out) != 64<<10) {
					errs <- fmt.Errorf("a call during the swaps: %d bytes, %v", len(out), err)
					return
				}
			}
		}()
	}
	for i := range 20 {
		to := goodSHA
		if i%2 == 0 {
			to = bigSHA
		}
		if _, err := s.d.SwapSession(context.Background(), "pooled", "good@"+to); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if st := sess.Status(); st.Draining != 0 || st.State != "ready" || st.StageSHA256 != goodSHA || st.Failures != 0 {
		t.Fatalf("after the swaps: %+v", st)
	}
}
