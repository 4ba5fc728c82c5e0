package main

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/kernels.md from the kernel registries")

// TestKernelsDocIsCurrent: docs/kernels.md is what the registries of
// hw/sim and hw/cuda render today. With -update it rewrites the file.
func TestKernelsDocIsCurrent(t *testing.T) {
	const path = "../../docs/kernels.md"
	want := kernelsDoc()
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is not current: run go test ./cmd/stagehost -run TestKernelsDocIsCurrent -update", path)
	}
}

// TestKernelsCommand: stagehost kernels prints the table, --markdown the
// reference, --help the usage; all exit 0.
func TestKernelsCommand(t *testing.T) {
	code, out, errs := runCLI(t, "kernels")
	if code != exitOK || errs != "" || !strings.Contains(out, "matmul") || !strings.Contains(out, "A f32[] in, B f32[] in, C f32[] out, M u32, N u32, K u32") {
		t.Errorf("kernels: exit %d\n%s%s", code, out, errs)
	}
	code, out, _ = runCLI(t, "kernels", "--markdown")
	if code != exitOK || out != kernelsDoc() {
		t.Errorf("kernels --markdown: exit %d, not the reference", code)
	}
	for _, args := range [][]string{{"kernels", "--help"}, {"kernels", "-h"}, {"help", "kernels"}} {
		code, out, errs := runCLI(t, args...)
		if code != exitOK || errs != "" || !strings.HasPrefix(out, "Usage: stagehost kernels") ||
			!strings.Contains(out, "  --markdown ") || !strings.Contains(out, "--help, -h") {
			t.Errorf("%v: exit %d\n%s%s", args, code, out, errs)
		}
	}
	if code, _, errs := runCLI(t, "kernels", "extra"); code != exitUsage || !strings.Contains(errs, "takes no arguments") {
		t.Errorf("kernels extra: exit %d\n%s", code, errs)
	}
}
