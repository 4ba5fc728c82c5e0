//go:build !wasip1

package stagehost

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The C header's op helpers build the argument records the Go helpers
// build: c/testdata/ops.c checks them natively (skipped without a C
// compiler).
func TestCHeaderOpHelpers(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	bin := filepath.Join(t.TempDir(), "ops")
	out, err := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Ic", "c/testdata/ops.c", "-o", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("compiling c/testdata/ops.c: %v\n%s", err, out)
	}
	out, err = exec.Command(bin).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("c/testdata/ops.c: %v\n%s", err, out)
	}
}
