package sim_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// TestEmulatorArgumentDirections: the guest SDK's emulator restates the
// argument directions of the built-in kernels outside the op library
// (guest-sdk/emu/host.go, builtinDirs), to refuse weights as an argument a
// kernel writes as the host does (ABI.md §3.4). They must be these
// kernels' descriptions' directions, argument for argument.
func TestEmulatorArgumentDirections(t *testing.T) {
	src, err := os.ReadFile("../../guest-sdk/emu/host.go")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?s)var builtinDirs = map\[string\]\[\]string\{(.*?)\n\}`).FindSubmatch(src)
	if block == nil {
		t.Fatal("builtinDirs not found in guest-sdk/emu/host.go")
	}
	emu := map[string][]string{}
	for _, m := range regexp.MustCompile(`"(\w+)":\s*\{([^}]*)\}`).FindAllStringSubmatch(string(block[1]), -1) {
		var dirs []string
		for _, d := range strings.Split(m[2], ",") {
			dirs = append(dirs, strings.Trim(strings.TrimSpace(d), `"`))
		}
		emu[m[1]] = dirs
	}
	if len(emu) == 0 {
		t.Fatal("builtinDirs is empty")
	}
	for name, dirs := range emu {
		i := slices.IndexFunc(sim.KernelInfos(), func(k hw.KernelInfo) bool { return k.Name == name })
		if i < 0 {
			t.Errorf("emu builtinDirs lists %q, which hw/sim does not describe", name)
			continue
		}
		var want []string
		for _, a := range sim.KernelInfos()[i].Args {
			want = append(want, a.Dir)
		}
		if !slices.Equal(dirs, want) {
			t.Errorf("%s: emu directions %v, hw/sim %v", name, dirs, want)
		}
	}
}
