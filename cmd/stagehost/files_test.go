//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestEveryNamedFileIsReadOnlyIfRegular: every file a flag names is read
// with manifest.ReadFile or opened with manifest.OpenFile, so a device
// (which never ends) or a named pipe (which blocks the open until a
// writer comes) is refused with exit 65 naming the flag, at once.
func TestEveryNamedFileIsReadOnlyIfRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	two := filepath.Join(dir, "two.tokens")
	if err := os.WriteFile(two, []byte("# admin\n0123456789abcdef0123 fedcba9876543210fedc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.tokens")
	if err := os.WriteFile(good, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	host := "../../host.toml"
	for _, tc := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"serve", host, "--admin-token-file", "/dev/zero"}, exitInvalid, []string{"--admin-token-file /dev/zero", "not a regular file: it is a character device"}},
		{[]string{"serve", host, "--admin-token-file", fifo}, exitInvalid, []string{"--admin-token-file " + fifo, "not a regular file: it is a named pipe"}},
		{[]string{"serve", host, "--invoke-token-file", fifo}, exitInvalid, []string{"--invoke-token-file " + fifo, "named pipe"}},
		{[]string{"serve", host, "--tls-cert", fifo, "--tls-key", good}, exitInvalid, []string{"--tls-cert: ", "named pipe"}},
		{[]string{"serve", host, "--tls-cert", good, "--tls-key", "/dev/zero"}, exitInvalid, []string{"--tls-key: ", "character device"}},
		{[]string{"serve", host, "--admin-token-file", two}, exitInvalid, []string{"--admin-token-file " + two, "line 2: white space inside a token: put one token on each line"}},
		{[]string{"serve", host, "--addr", "nonsense"}, exitUsage, []string{`--addr "nonsense" is not a valid address`}},
		{[]string{"serve", host, "--addr", "127.0.0.1:80800"}, exitUsage, []string{`--addr "127.0.0.1:80800" is not a valid address: port "80800"`}},
		{[]string{"run", host, "--session", "classify", "--input", fifo}, exitInvalid, []string{"--input: ", "named pipe"}},
		{[]string{"trace", fifo}, exitInvalid, []string{"named pipe"}},
		{[]string{"admin", "--token-file", fifo, "modules"}, exitInvalid, []string{"--token-file: ", "named pipe"}},
		{[]string{"admin", "--token-file", two, "modules"}, exitInvalid, []string{"--token-file: ", "line 2: white space inside a token"}},
		{[]string{"admin", "upload", "m", fifo}, exitInvalid, []string{"upload: ", "named pipe"}},
		{[]string{"admin", "load", "m", fifo}, exitInvalid, []string{"load: ", "named pipe"}},
	} {
		type result struct {
			code     int
			out, err string
		}
		done := make(chan result, 1)
		go func() {
			code, out, errs := runCLI(t, tc.args...)
			done <- result{code, out, errs}
		}()
		select {
		case r := <-done:
			if r.code != tc.code {
				t.Errorf("%v: exit %d, want %d:\n%s%s", tc.args, r.code, tc.code, r.out, r.err)
				continue
			}
			for _, w := range tc.want {
				if !strings.Contains(r.err, w) {
					t.Errorf("%v: stderr lacks %q:\n%s", tc.args, w, r.err)
				}
			}
			if strings.Contains(r.err, "0123456789abcdef0123") {
				t.Errorf("%v: stderr shows a token:\n%s", tc.args, r.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%v: still running after 30s (blocked on a file?)", tc.args)
		}
	}
}
