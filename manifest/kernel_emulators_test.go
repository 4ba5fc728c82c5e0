package manifest

import (
	"os"
	"regexp"
	"slices"
	"testing"
)

// TestEmulatorsRefuseBuiltInProgramNames: the guest SDK's three
// emulators refuse a vendor kernel named after a built-in program, as a
// manifest does, from a list of their own (guest-sdk/emu/vendor.go,
// guest-sdk/rust/src/emu/vendor.rs, guest-sdk/c/emu.c). Each list must be
// exactly the names builtinPrograms gives.
func TestEmulatorsRefuseBuiltInProgramNames(t *testing.T) {
	want := slices.Clone(builtinPrograms())
	slices.Sort(want)
	want = slices.Compact(want)
	for _, src := range []struct{ file, list string }{
		{"../guest-sdk/emu/vendor.go", `(?s)var hostPrograms = \[\]string\{(.*?)\n\}`},
		{"../guest-sdk/rust/src/emu/vendor.rs", `(?s)const HOST_PROGRAMS: &\[&str\] = &\[(.*?)\];`},
		{"../guest-sdk/c/emu.c", `(?s)static const char \*const host_programs\[\] = \{(.*?)NULL\};`},
	} {
		data, err := os.ReadFile(src.file)
		if err != nil {
			t.Fatal(err)
		}
		block := regexp.MustCompile(src.list).FindSubmatch(data)
		if block == nil {
			t.Errorf("%s: the list of built-in program names is not found", src.file)
			continue
		}
		var got []string
		for _, m := range regexp.MustCompile(`"([^"]+)"`).FindAllSubmatch(block[1], -1) {
			got = append(got, string(m[1]))
		}
		if !slices.Equal(got, want) {
			for _, n := range want {
				if !slices.Contains(got, n) {
					t.Errorf("%s lacks %q", src.file, n)
				}
			}
			for _, n := range got {
				if !slices.Contains(want, n) {
					t.Errorf("%s lists %q, which no backend has built in", src.file, n)
				}
			}
			if !t.Failed() {
				t.Errorf("%s: the names are not sorted, or one is listed twice", src.file)
			}
		}
	}
}
