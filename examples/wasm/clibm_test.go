package wasm_test

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stagehost/stagehost/stages"
)

// TestCStageWithLibm builds a C stage that calls libm (expf, tanhf, powf,
// sqrtf) with wasi-libc, as the C scaffold's build.sh does when wasi-libc
// is installed, and runs it on the host with no WASI grant: libm's
// functions import nothing, so the module imports only stagehost_v1
// functions and loads. Its results are within 1 ulp of the float64
// functions rounded to float32. Skipped without clang, wasm-ld or
// wasi-libc.
func TestCStageWithLibm(t *testing.T) {
	sysroot := "/usr"
	if v := os.Getenv("WASI_SYSROOT"); v != "" {
		sysroot = v
	}
	if _, err := os.Stat(filepath.Join(sysroot, "lib", "wasm32-wasi", "libc.a")); err != nil {
		t.Skip("no wasi-libc (Debian: apt-get install -y wasi-libc)")
	}
	for _, tool := range []string{"clang", "wasm-ld"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on PATH (Debian: apt-get install -y clang lld)", tool)
		}
	}
	dir := t.TempDir()
	src := `#include "stagehost.h"
#include <math.h>
STAGEHOST_ABI_V1();
STAGEHOST_EXPORT("stagehost_run") int32_t run(void) {
	float v[4] = {expf(1.0f), tanhf(0.5f), powf(2.0f, 0.5f), sqrtf(3.0f)};
	return stagehost_output_write(v, sizeof v);
}
`
	if err := os.WriteFile(filepath.Join(dir, "libm.c"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	wasm := filepath.Join(dir, "libm.wasm")
	out, err := exec.Command("clang", "--target=wasm32-wasi", "--sysroot="+sysroot, "-O2", "-nostdlib", "-I../../guest-sdk/c",
		"-Wl,--no-entry", "-o", wasm, filepath.Join(dir, "libm.c"), "-lc").CombinedOutput()
	if err != nil {
		t.Fatalf("clang: %v\n%s", err, out)
	}
	f := newFixture(t)
	m := load(t, wasm, "libm", stages.NewLoadConfig()) // no WASI granted
	s, err := engine(t).NewSession(context.Background(), f.rt, m, stages.NewSessionConfig("libm", f.gpu))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	got, err := s.Run(context.Background(), nil, nil)
	if err != nil || len(got) != 16 {
		t.Fatalf("%x, %v", got, err)
	}
	for i, want := range []float64{math.E, math.Tanh(0.5), math.Sqrt2, math.Sqrt(3)} {
		g := math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:]))
		w := float32(want)
		if d := int64(math.Float32bits(g)) - int64(math.Float32bits(w)); d < -1 || d > 1 {
			t.Errorf("value %d: %v, want %v within 1 ulp", i, g, w)
		}
	}
}
