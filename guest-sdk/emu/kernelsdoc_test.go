package emu

import (
	"os"
	"regexp"
	"slices"
	"testing"
)

// TestKernelsDocEmuColumn: the emu column of the host's generated kernel
// reference (docs/kernels.md, which the host renders from a list it keeps
// of this package's kernels) names exactly the built-in kernels.
func TestKernelsDocEmuColumn(t *testing.T) {
	doc, err := os.ReadFile("../../docs/kernels.md")
	if err != nil {
		t.Skipf("no kernel reference outside the stagehost repository: %v", err)
	}
	row := regexp.MustCompile(`(?m)^\| \[([a-z0-9_.]+)\]\(#[^)]*\) \| [^|]* \| [^|]* \| (yes|no) \|$`)
	var inDoc []string
	rows := row.FindAllSubmatch(doc, -1)
	for _, m := range rows {
		if string(m[2]) == "yes" {
			inDoc = append(inDoc, string(m[1]))
		}
	}
	if len(rows) == 0 {
		t.Fatal("docs/kernels.md has no kernel table")
	}
	slices.Sort(inDoc)
	if want := Builtins(); !slices.Equal(inDoc, want) {
		t.Errorf("docs/kernels.md says emu has %v; Builtins are %v (update emuKernels in cmd/stagehost/kernels.go and regenerate)", inDoc, want)
	}
}
