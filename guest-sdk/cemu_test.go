//go:build !wasip1

package stagehost

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The C emulator (c/emu.c) runs the shared cases (testdata/emucases.txt)
// that the Go and Rust emulators and the host run: c/testdata/emucases_test.c
// interprets them natively (skipped without a C compiler).
func TestCEmulatorSharedCases(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	bin := filepath.Join(t.TempDir(), "emucases")
	out, err := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Ic", "c/testdata/emucases_test.c", "c/emu.c", "-lm", "-o", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("compiling c/emu.c and c/testdata/emucases_test.c: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "testdata/emucases.txt")
	stdout, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(stdout)) != "ok" {
		t.Fatalf("the C emulator disagrees with the shared cases: %v\n%s", err, stdout)
	}
}

// The C emulator's gelu ops agree with the simulator's values
// (testdata/gelu.txt, from the host's op library) within 1 ulp:
// c/testdata/gelu_test.c checks each (skipped without a C compiler).
func TestCEmulatorGelu(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	bin := filepath.Join(t.TempDir(), "gelu")
	out, err := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Ic", "c/testdata/gelu_test.c", "c/emu.c", "-lm", "-o", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("compiling c/emu.c and c/testdata/gelu_test.c: %v\n%s", err, out)
	}
	stdout, err := exec.Command(bin, "testdata/gelu.txt").CombinedOutput()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(stdout)), "\nok") {
		t.Fatalf("the C emulator's gelu ops disagree with the simulator's: %v\n%s", err, stdout)
	}
	t.Logf("%s", stdout)
}

// The C emulator's vendor kernels: a declared one runs, and every launch
// the host refuses (a built-in program, submit and batch, the shape, the
// arguments against the declaration, read-only weights) is refused with
// the host's status and last error; c/testdata/launch_test.c (skipped
// without a C compiler).
func TestCEmulatorLaunch(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	bin := filepath.Join(t.TempDir(), "launch")
	out, err := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Ic", "c/testdata/launch_test.c", "c/emu.c", "-lm", "-o", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("compiling c/emu.c and c/testdata/launch_test.c: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(stdout)) != "ok" {
		t.Fatalf("the C emulator's vendor kernels: %v\n%s%s", err, stdout, stderr.String())
	}
}
