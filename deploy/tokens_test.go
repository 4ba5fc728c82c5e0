//go:build unix

package deploy_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/manifest"
)

// TestReadersRefuseWhatIsNotARegularFile: the token and credential
// readers refuse a device and a named pipe at once (never reading the
// one forever, never waiting on the other), and a token line holding
// white space inside its token.
func TestReadersRefuseWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	two := filepath.Join(dir, "two")
	if err := os.WriteFile(two, []byte("0123456789abcdef0123\n\n0123456789abcdef0123\tfedcba9876543210fedc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		read func() error
		want func(error) bool
	}{
		{"tokens /dev/zero", func() error { _, err := deploy.ReadTokens("/dev/zero", ""); return err }, notRegular},
		{"tokens fifo", func() error { _, err := deploy.ReadTokens(fifo, ""); return err }, notRegular},
		{"credential /dev/zero", func() error { _, err := deploy.ReadCredentialFile("/dev/zero"); return err }, notRegular},
		{"credential fifo", func() error { _, err := deploy.ReadCredentialFile(fifo); return err }, notRegular},
		{"two tokens on a line", func() error { _, err := deploy.ReadTokens(two, ""); return err }, func(err error) bool {
			return err != nil && strings.Contains(err.Error(), "line 3: white space inside a token") && !strings.Contains(err.Error(), "0123456789")
		}},
	} {
		done := make(chan error, 1)
		go func() { done <- tc.read() }()
		select {
		case err := <-done:
			if !tc.want(err) {
				t.Errorf("%s: %v", tc.name, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: still reading after 30s", tc.name)
		}
	}
}

func notRegular(err error) bool { return errors.Is(err, manifest.ErrNotRegular) }
