package emu

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/guest-sdk/emu/internal/ops"
)

// TestCEmulatorArgDirs: the C emulator's table of argument directions
// (guest-sdk/c/emu.c, kernel_dirs), by which it refuses a launch that
// would write weights, is this emulator's: every op's Info and the
// built-in kernels' builtinDirs. The Rust emulator's unit tests check
// its directions against the same table.
func TestCEmulatorArgDirs(t *testing.T) {
	b, err := os.ReadFile("../c/emu.c")
	if err != nil {
		t.Fatal(err)
	}
	table := map[string]string{}
	for _, m := range regexp.MustCompile(`\{"(\w+)", "([iox]+)"\}`).FindAllStringSubmatch(string(b), -1) {
		table[m[1]] = m[2]
	}
	code := func(dirs []string) string {
		var s strings.Builder
		for _, d := range dirs {
			s.WriteString(map[string]string{"in": "i", "out": "o", "inout": "x"}[d])
		}
		return s.String()
	}
	want := map[string]string{}
	for _, n := range ops.Names() {
		base, _, _ := strings.Cut(n, ".")
		k, _ := ops.Lookup(n)
		var dirs []string
		for _, a := range k.Info().Args {
			dirs = append(dirs, a.Dir)
		}
		want[base] = code(dirs)
	}
	for n, dirs := range builtinDirs {
		want[n] = code(dirs)
	}
	for n, w := range want {
		if table[n] != w {
			t.Errorf("emu.c: kernel_dirs[%q] = %q, want %q", n, table[n], w)
		}
	}
	for n := range table {
		if _, ok := want[n]; !ok {
			t.Errorf("emu.c: kernel_dirs has %q, which is no kernel", n)
		}
	}
}
