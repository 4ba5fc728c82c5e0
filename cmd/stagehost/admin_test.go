package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminUsage: bad usage exits 64 with the usage on stderr; a server
// that cannot be reached exits 69.
func TestAdminUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"admin"}, "want a COMMAND"},
		{[]string{"admin", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"admin", "swap", "s"}, "swap takes 2 arguments (SESSION MODULE), got 1"},
		{[]string{"admin", "modules", "x"}, "modules takes 0 arguments"},
		{[]string{"admin", "--sha256", "ab", "swap", "s", "m"}, "--sha256 is for load and upload"},
		{[]string{"admin", "--addr", "ftp://x", "modules"}, "--addr"},
		{[]string{"admin", "--turbo", "modules"}, "flag provided but not defined"},
		{[]string{"admin", "load", "m", "relative.wasm"}, "PATH must be absolute"},
	} {
		code, out, errs := runCLI(t, tc.args...)
		if code != exitUsage || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, want 64 and %q\n%s%s", tc.args, code, tc.want, out, errs)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if code, _, errs := runCLI(t, "admin", "--addr", addr, "--timeout", "10s", "modules"); code != exitUnreachable || !strings.Contains(errs, "cannot be reached") {
		t.Errorf("a closed port: exit %d\n%s", code, errs)
	}
	if code, _, errs := runCLI(t, "admin", "upload", "m", filepath.Join(t.TempDir(), "none.wasm")); code != exitInvalid || !strings.Contains(errs, "no such file") {
		t.Errorf("a missing FILE: exit %d\n%s", code, errs)
	}
}

// TestAdminEndToEnd runs the real binary: serve with tokens, then
// stagehost admin uploads a new version of the steady session's stage
// (good_stage outputs "ok", big_output 64KiB of Z), swaps the session to
// it and sees its output change; a refused unload exits 1 with the
// server's message and class; a quarantined session is reset, and
// /readyz recovers.
func TestAdminEndToEnd(t *testing.T) {
	dir := t.TempDir()
	const admin, invoke = "admin-e2e-0123456789abcdef", "invoke-e2e-0123456789abcdef"
	adminFile, invokeFile := filepath.Join(dir, "admin"), filepath.Join(dir, "invoke")
	for f, tok := range map[string]string{adminFile: admin, invokeFile: invoke} {
		if err := os.WriteFile(f, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := startServe(t, prodManifest(t, ""), "--admin-token-file", adminFile, "--invoke-token-file", invokeFile)
	auth := []string{"Authorization", "Bearer " + invoke}
	adminCLI := func(args ...string) (int, string, string) {
		t.Helper()
		return runBinary(t, append([]string{"admin", "--addr", s.base, "--token-file", adminFile}, args...)...)
	}
	if a := s.request(nil, "POST", "/v1/sessions/steady/run", nil, auth...); a.code != 200 || string(a.body) != "ok" {
		t.Fatalf("before: %d %s", a.code, a.body)
	}
	big, err := filepath.Abs("../../stages/testdata/hostile/big_output.wasm")
	if err != nil {
		t.Fatal(err)
	}
	if code, out, errs := adminCLI("upload", "good", big); code != 0 || !strings.Contains(out, `"source": "upload"`) {
		t.Fatalf("upload: exit %d\n%s%s", code, out, errs)
	}
	// An invoke token is refused: exit 1, the server's message and class.
	code, _, errs := runBinary(t, "admin", "--addr", s.base, "--token-file", invokeFile, "swap", "steady", "good")
	if code != 1 || !strings.Contains(errs, "class permission_denied, HTTP 403") {
		t.Fatalf("swap with an invoke token: exit %d\n%s", code, errs)
	}
	if code, out, errs := adminCLI("swap", "steady", "good"); code != 0 || !strings.Contains(out, `"swapped": true`) {
		t.Fatalf("swap: exit %d\n%s%s", code, out, errs)
	}
	if a := s.request(nil, "POST", "/v1/sessions/steady/run", nil, auth...); a.code != 200 || len(a.body) != 64<<10 || !bytes.Equal(a.body[:4], []byte("ZZZZ")) {
		t.Fatalf("after the swap: %d %.40q", a.code, a.body)
	}
	code, out, errs := adminCLI("modules")
	if code != 0 || !strings.Contains(out, "good *") || !strings.Contains(out, "steady") || strings.Count(out, "\ngood") != 2 {
		t.Fatalf("modules: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := adminCLI("unload", "good"); code != 1 || !strings.Contains(errs, "in use by session") || !strings.Contains(errs, "class invalid_argument, HTTP 400") {
		t.Fatalf("a refused unload: exit %d\n%s", code, errs)
	}

	// A Go module (GOOS=wasip1 imports) loads only with its grant; a
	// fence module with --kind fence. The token comes from the
	// environment, the variable the manifest's admin_token_env reads.
	goMod, err := filepath.Abs("../../manifest/testdata/modules/wasi_stage.wasm")
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errs := adminCLI("upload", "gomod", goMod); code != 1 || !strings.Contains(errs, "class invalid_argument") {
		t.Fatalf("a Go module without --wasi: exit %d\n%s", code, errs)
	}
	t.Setenv("E2E_ADMIN_TOKENS", admin+",another-token-0123456789")
	if code, out, errs := runBinary(t, "admin", "--addr", s.base, "--token-env", "E2E_ADMIN_TOKENS", "upload", "--wasi", "go-runtime", "gomod", goMod); code != 0 || !strings.Contains(out, `"go-runtime"`) {
		t.Fatalf("a Go module with --wasi go-runtime: exit %d\n%s%s", code, out, errs)
	}
	fence, err := filepath.Abs("../../manifest/testdata/modules/drain_fence.wasm")
	if err != nil {
		t.Fatal(err)
	}
	if code, out, errs := adminCLI("load", "--kind", "fence", "myfence", fence); code != 0 || !strings.Contains(out, `"fence"`) {
		t.Fatalf("a fence module with --kind fence: exit %d\n%s%s", code, out, errs)
	}

	// Quarantine the liar, then reset it.
	if a := s.request(nil, "POST", "/v1/sessions/liar/run", nil, auth...); a.code != 503 {
		t.Fatalf("liar: %d %s", a.code, a.body)
	}
	if code, r := s.ready("/readyz"); code != 503 || r.Ready {
		t.Fatalf("readyz after the quarantine: %d %+v", code, r)
	}
	if code, out, errs := adminCLI("reset", "liar"); code != 0 || !strings.Contains(out, `"resources_kept": true`) {
		t.Fatalf("reset: exit %d\n%s%s", code, out, errs)
	}
	// The reset answered once the fresh instance serves: ready at once.
	if code, r := s.ready("/readyz"); code != 200 || !r.Ready {
		t.Fatalf("readyz after the reset: %d %+v", code, r)
	}
	s.stop()
}
