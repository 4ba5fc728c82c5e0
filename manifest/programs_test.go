package manifest

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/stages"
)

// TestEveryRegisteredProgramPasses checks the other side of the program
// check: a session may name every program its device's backend has, on
// each kind of device, and nothing else is reported.
func TestEveryRegisteredProgramPasses(t *testing.T) {
	var gpuKernels []string
	for _, k := range cuda.KernelInfos() {
		gpuKernels = append(gpuKernels, k.Name)
	}
	quote := func(names []string) string {
		q := make([]string, len(names))
		for i, n := range names {
			q[i] = fmt.Sprintf("%q", n)
		}
		return strings.Join(q, ", ")
	}
	bin, err := os.ReadFile("testdata/modules/good_stage.wasm")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "version = 1\n")
	for _, d := range [][3]string{{"simgpu", "sim", "gpu"}, {"simnpu", "sim", "npu"}, {"h200", "cuda", "gpu"}, {"host0", "cuda", "cpu"}} {
		fmt.Fprintf(&b, "[[device]]\nname = %q\nbackend = %q\nengine = %q\n", d[0], d[1], d[2])
	}
	fmt.Fprintf(&b, "[[module]]\nname = \"m\"\npath = \"m.wasm\"\nsha256 = %q\n", stages.SHA256(bin))
	for _, s := range []struct {
		dev   string
		progs []string
	}{{"simgpu", sim.Kernels()}, {"simnpu", sim.Kernels()}, {"h200", gpuKernels}, {"host0", cuda.HostPrograms()}} {
		if len(s.progs) == 0 {
			t.Fatalf("no programs for %s", s.dev)
		}
		fmt.Fprintf(&b, "[[session]]\nname = %q\nstage = \"m\"\ndevice = %q\nprograms = [%s]\n", s.dev, s.dev, quote(s.progs))
	}
	_, err = Decode("host.toml", []byte(b.String()), func(string, int64) ([]byte, error) { return bin, nil })
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
}
