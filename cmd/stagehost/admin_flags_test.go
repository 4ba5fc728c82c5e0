package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/stagehost/stagehost/deploy"
)

// seen is one request an adminRecorder received.
type seen struct {
	method, path, auth string
	query              url.Values
	body               []byte
}

// adminRecorder is a server that answers every request 200 {} and
// records it.
func adminRecorder(t *testing.T) (string, func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.Method, r.URL.Path, r.Header.Get("Authorization"), r.URL.Query(), b})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
}

// TestAdminKindAndWASI: load sends --kind and --wasi in its JSON body,
// upload in its query, with the names and values the routes and the
// manifest's kind and wasi keys take; without them neither is sent (the
// server keeps the name's newest version's); a bad --kind, or either flag
// on another command, is bad usage.
func TestAdminKindAndWASI(t *testing.T) {
	t.Setenv(defaultTokenEnv, "")
	os.Unsetenv(defaultTokenEnv)
	base, got := adminRecorder(t)
	wasm := filepath.Join(t.TempDir(), "m.wasm")
	if err := os.WriteFile(wasm, []byte("\x00asm\x01\x00\x00\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"load", "--kind", "fence", "--wasi", "go-runtime", "--wasi", "fd_write,clock_time_get", "m", wasm},
		{"upload", "--kind", "stage", "--wasi", "go-runtime", "--wasi", "fd_write", "m", wasm},
		{"load", "m", wasm},
		{"upload", "m", wasm},
	} {
		if code, out, errs := runCLI(t, append([]string{"admin", "--addr", base}, args...)...); code != exitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errs)
		}
	}
	r := got()
	if len(r) != 4 {
		t.Fatalf("%d requests, want 4", len(r))
	}
	var load deploy.ModuleRequest
	if err := json.Unmarshal(r[0].body, &load); err != nil {
		t.Fatal(err)
	}
	if r[0].method != "POST" || r[0].path != "/v1/modules" || load.Kind != "fence" || !reflect.DeepEqual(load.WASI, []string{"go-runtime", "fd_write", "clock_time_get"}) {
		t.Errorf("load: %s %s %+v", r[0].method, r[0].path, load)
	}
	if q := r[1].query; r[1].method != "PUT" || r[1].path != "/v1/modules/m" || !reflect.DeepEqual(q["kind"], []string{"stage"}) ||
		!reflect.DeepEqual(q["wasi"], []string{"go-runtime", "fd_write"}) || len(q["sha256"]) != 1 {
		t.Errorf("upload: %s %s %v", r[1].method, r[1].path, q)
	}
	if b := string(r[2].body); strings.Contains(b, "kind") || strings.Contains(b, "wasi") {
		t.Errorf("load without the flags sent %s", b)
	}
	if q := r[3].query; q.Has("kind") || q.Has("wasi") {
		t.Errorf("upload without the flags sent %v", q)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"admin", "--kind", "driver", "load", "m", wasm}, `--kind "driver": want stage or fence`},
		{[]string{"admin", "--kind", "fence", "swap", "s", "m"}, "--kind and --wasi are for load and upload"},
		{[]string{"admin", "--wasi", "fd_write", "modules"}, "--kind and --wasi are for load and upload"},
		{[]string{"admin", "--wasi", "", "upload", "m", wasm}, "an empty grant"},
	} {
		code, out, errs := runCLI(t, tc.args...)
		if code != exitUsage || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, want 64 and %q\n%s%s", tc.args, code, tc.want, out, errs)
		}
	}
	if n := len(got()); n != 4 {
		t.Errorf("bad usage sent %d requests", n-4)
	}
}

// TestAdminTokenFromEnvironment: the bearer token comes from
// --token-file, else --token-env NAME (the first of its tokens, comma- or
// space-separated as the manifest's admin_token_env), else
// $STAGEHOST_ADMIN_TOKEN; both flags are bad usage; an empty or unset
// named variable, or a short token, exits 65 naming the variable and
// never the token.
func TestAdminTokenFromEnvironment(t *testing.T) {
	const fileTok, envTok, defTok = "from-the-file-0123456789", "from-the-env-0123456789", "from-the-default-0123456789"
	tokFile := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(tokFile, []byte(fileTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ADMIN_TOKENS_TEST", envTok+", second-token-0123456789")
	t.Setenv(defaultTokenEnv, defTok)
	t.Setenv("EMPTY_TOKENS_TEST", " , ")
	t.Setenv("SHORT_TOKENS_TEST", "short-secret")
	base, got := adminRecorder(t)
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--token-file", tokFile}, "Bearer " + fileTok},
		{[]string{"--token-env", "ADMIN_TOKENS_TEST"}, "Bearer " + envTok},
		{nil, "Bearer " + defTok},
	} {
		before := len(got())
		args := append(append([]string{"admin", "--addr", base}, tc.flags...), "modules", "--json")
		if code, out, errs := runCLI(t, args...); code != exitOK {
			t.Fatalf("%v: exit %d\n%s%s", tc.flags, code, out, errs)
		}
		if r := got(); len(r) != before+1 || r[before].auth != tc.want {
			t.Errorf("%v: sent %q, want %q", tc.flags, r[len(r)-1].auth, tc.want)
		}
	}
	os.Unsetenv(defaultTokenEnv)
	before := len(got())
	if code, _, errs := runCLI(t, "admin", "--addr", base, "modules", "--json"); code != exitOK || got()[before].auth != "" {
		t.Errorf("no token anywhere: exit %d, sent %q\n%s", code, got()[before].auth, errs)
	}
	for _, tc := range []struct {
		flags []string
		code  int
		want  string
	}{
		{[]string{"--token-file", tokFile, "--token-env", "ADMIN_TOKENS_TEST"}, exitUsage, "--token-file and --token-env: give one"},
		{[]string{"--token-env", "UNSET_TOKENS_TEST"}, exitInvalid, "--token-env UNSET_TOKENS_TEST: token variable UNSET_TOKENS_TEST is unset or empty"},
		{[]string{"--token-env", "EMPTY_TOKENS_TEST"}, exitInvalid, "token variable EMPTY_TOKENS_TEST is unset or empty"},
		{[]string{"--token-env", "SHORT_TOKENS_TEST"}, exitInvalid, "--token-env SHORT_TOKENS_TEST: a token of 12 bytes is too short"},
	} {
		before := len(got())
		args := append(append([]string{"admin", "--addr", base}, tc.flags...), "modules")
		code, out, errs := runCLI(t, args...)
		if code != tc.code || !strings.Contains(errs, tc.want) || strings.Contains(errs+out, "short-secret") || strings.Contains(errs+out, envTok) {
			t.Errorf("%v: exit %d, want %d and %q\n%s%s", tc.flags, code, tc.code, tc.want, out, errs)
		}
		if len(got()) != before {
			t.Errorf("%v: a request was sent", tc.flags)
		}
	}
	t.Setenv(defaultTokenEnv, "")
	if code, _, errs := runCLI(t, "admin", "--addr", base, "modules"); code != exitInvalid || !strings.Contains(errs, "$"+defaultTokenEnv+": token variable "+defaultTokenEnv+" is unset or empty") {
		t.Errorf("$%s set but empty: exit %d\n%s", defaultTokenEnv, code, errs)
	}
}

// TestAdminMemoryLimitAndSnapshot: load sends --memory-limit (a size with
// its unit, in bytes) and --snapshot in its JSON body, upload in its
// query; a bad value, or either flag on another command, is bad usage.
func TestAdminMemoryLimitAndSnapshot(t *testing.T) {
	t.Setenv(defaultTokenEnv, "")
	os.Unsetenv(defaultTokenEnv)
	base, got := adminRecorder(t)
	wasm := filepath.Join(t.TempDir(), "m.wasm")
	if err := os.WriteFile(wasm, []byte("\x00asm\x01\x00\x00\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"load", "--memory-limit", "128MiB", "--snapshot", "false", "m", wasm},
		{"upload", "--memory-limit", "128MiB", "--snapshot", "false", "m", wasm},
	} {
		if code, out, errs := runCLI(t, append([]string{"admin", "--addr", base}, args...)...); code != exitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errs)
		}
	}
	r := got()
	var load deploy.ModuleRequest
	if len(r) != 2 || json.Unmarshal(r[0].body, &load) != nil || load.MemoryLimit == nil || *load.MemoryLimit != 128<<20 || load.Snapshot == nil || *load.Snapshot {
		t.Fatalf("load: %+v", r)
	}
	if q := r[1].query; q.Get("memory_limit") != "134217728" || q.Get("snapshot") != "false" {
		t.Errorf("upload: %v", q)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"admin", "--memory-limit", "12", "load", "m", wasm}, `--memory-limit "12"`},
		{[]string{"admin", "--snapshot", "maybe", "upload", "m", wasm}, `--snapshot "maybe": want true or false`},
		{[]string{"admin", "--snapshot", "true", "swap", "s", "m"}, "--memory-limit and --snapshot are for load and upload"},
	} {
		if code, _, errs := runCLI(t, tc.args...); code != exitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, exitUsage, tc.want)
		}
	}
}
