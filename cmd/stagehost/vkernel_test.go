package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestVendorKernelCLI: check verifies a manifest's [[kernel]] and names
// it, kernels --manifest lists it, and run launches it on sim from a
// stage with stream_launch (y = 2x for x = 1, 2, 3, 4).
func TestVendorKernelCLI(t *testing.T) {
	m := filepath.Join("testdata", "vkernel", "host.toml")
	code, out, errs := runCLI(t, "check", m)
	if code != exitOK || !strings.Contains(out, "kernel double       entry double (x f32[] in, y f32[] out, n u32); wasm sha256 943488418cf6… ok; ptx sha256 ebd4d2b5ac52… ok") {
		t.Fatalf("check: exit %d\n%s%s", code, out, errs)
	}
	// The PTX is verified against the driver where there is one; here
	// (no GPU in CI) check says it was not.
	if !strings.Contains(out, "kernel double       ptx verified on cuda0") && !strings.Contains(out, "note: vendor PTX not verified against a driver here (") {
		t.Fatalf("check says nothing of the PTX:\n%s", out)
	}
	code, out, errs = runCLI(t, "kernels", "--manifest", m)
	if code != exitOK || !strings.Contains(out, "double  double  wasm 943488418cf6…, ptx ebd4d2b5ac52…  x f32[] in, y f32[] out, n u32") {
		t.Fatalf("kernels --manifest: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = runCLI(t, "run", m, "--session", "launch", "--input", filepath.Join("testdata", "vkernel", "input.bin"), "--quiet")
	// launch status 0, sync status 0, y = 2, 4, 6, 8, last_error OK and empty.
	if code != exitOK || !strings.Contains(out, "output: 000000000000000000000040000080400000c040000000410000000000000000") {
		t.Fatalf("run: exit %d\n%s%s", code, out, errs)
	}
}
