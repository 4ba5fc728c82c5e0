package doccheck

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestCheckGoFixture runs the doc-link check over a fixture workspace with
// every kind of good link and one of each kind of bad link.
func TestCheckGoFixture(t *testing.T) {
	c, err := NewChecker("testdata/ws")
	if err != nil {
		t.Fatal(err)
	}
	probs, err := c.CheckGo()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range probs {
		got = append(got, p.String())
	}
	want := []string{
		"a/a.go:26: [Gone]: this package declares no Gone",
		"a/a.go:26: [Local.Gone]: type Local of this package has no method or field Gone",
		"a/a.go:26: [b.Gone]: package example.com/ws/b declares no Gone",
		"a/a.go:27: [b.T.Gone]: type T of package example.com/ws/b has no method or field Gone",
		"a/a.go:27: [errors.Gone]: package errors declares no Gone",
		"a/a.go:27: [nope.Thing]: package nope is not imported here, so the link does not resolve (import it, or write its import path)",
		"a/a.go:28: [example.com/ws/nothere.T]: no package example.com/ws/nothere",
		"a/a.go:28: [Gone.Method]: this package declares no Gone",
		"a/a.go:33: [AlsoGone]: this package declares no AlsoGone",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", lines(got), lines(want))
	}
	if c.Stats.Packages != 3 || c.Stats.GoFiles != 4 {
		t.Errorf("stats %+v: want 3 packages (a, b, c; testdata skipped) and 4 files", c.Stats)
	}
}

// TestCheckMarkdownFixture runs the Markdown check over the fixture.
func TestCheckMarkdownFixture(t *testing.T) {
	c, err := NewChecker("testdata/ws")
	if err != nil {
		t.Fatal(err)
	}
	probs, err := c.CheckMarkdown()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range probs {
		got = append(got, p.String())
	}
	want := []string{
		"README.md:6: ![image](docs/missing.png): docs/missing.png does not exist",
		"README.md:8: [missing file](docs/nope.md): docs/nope.md does not exist",
		"README.md:8: [missing anchor](docs/guide.md#nope): docs/guide.md has no heading with anchor #nope",
		"README.md:9: [bad self anchor](#nowhere): README.md has no heading with anchor #nowhere",
		"README.md:11: [ref]: docs/gone.md: docs/gone.md does not exist",
		"docs/guide.md:13: [up and out](../../../../../go.mod): leaves the repository",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", lines(got), lines(want))
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Model control":                 "model-control",
		"4.3.1 Snapshots and isolation": "431-snapshots-and-isolation",
		"`Code` and *emphasis*: R1–R8!": "code-and-emphasis-r1r8",
		"The [ABI](abi/ABI.md) v1":      "the-abi-v1",
		"snake_case and kebab-case":     "snake_case-and-kebab-case",
		"Ünïcode words":                 "ünïcode-words",
	} {
		if got := Slug(in); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAnchorsDuplicatesAndIDs(t *testing.T) {
	a := Anchors([]byte("# A\n## A\n```\n# Not a heading\n```\n## A\n<a name=\"Here\"></a>\n"))
	for _, want := range []string{"a", "a-1", "a-2", "here"} {
		if !a[want] {
			t.Errorf("no anchor %q in %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a heading in a fenced block made an anchor")
	}
}

func TestFilter(t *testing.T) {
	probs := []Problem{{File: "x.go", Line: 3, Link: "[A]"}, {File: "y.go", Line: 9, Link: "[B]"}}
	rest, stale := Filter(probs, []string{"x.go: [A]", "z.go: [C]"})
	if len(rest) != 1 || rest[0].Link != "[B]" {
		t.Errorf("rest = %v, want only y.go's [B]", rest)
	}
	if !slices.Equal(stale, []string{"z.go: [C]"}) {
		t.Errorf("stale = %v, want [z.go: [C]]", stale)
	}
}

func lines(s []string) string {
	out := ""
	for _, l := range s {
		out += "\t" + l + "\n"
	}
	return out
}

// TestCheckTestNamesFixture checks the test names the fixture's Markdown
// mentions.
func TestCheckTestNamesFixture(t *testing.T) {
	c, err := NewChecker("testdata/ws")
	if err != nil {
		t.Fatal(err)
	}
	probs, err := c.CheckTestNames()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range probs {
		got = append(got, p.String())
	}
	want := []string{
		"README.md:21: `TestGone`: no test function TestGone",
		"README.md:22: `FuzzNothing...`: no test function starts with FuzzNothing",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", lines(got), lines(want))
	}
}

// TestCheckGoResolvesRequiredModulesInTheModuleCache checks links into a
// required module, read from the module cache (with its escaped path),
// and that a module missing from the cache is counted, not reported.
func TestCheckGoResolvesRequiredModulesInTheModuleCache(t *testing.T) {
	root, cache := t.TempDir(), t.TempDir()
	t.Setenv("GOMODCACHE", cache)
	write := func(path, src string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "go.mod"), "module example.com/m\n\nrequire (\n\texample.com/Upper v1.2.3\n\texample.com/absent v0.1.0\n)\n")
	write(filepath.Join(cache, "example.com", "!upper@v1.2.3", "pkg", "pkg.go"), "package up\n\n// Thing is a type.\ntype Thing struct{}\n")
	write(filepath.Join(root, "m.go"), `// Package m links [up.Thing], [up.Missing] and [absent.Gone].
package m

import (
	"example.com/Upper/pkg"
	"example.com/absent"
)

var _ up.Thing
var _ = absent.X
`)
	c, err := NewChecker(root)
	if err != nil {
		t.Fatal(err)
	}
	probs, err := c.CheckGo()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range probs {
		got = append(got, p.String())
	}
	want := []string{"m.go:1: [up.Missing]: package example.com/Upper/pkg declares no Missing"}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", lines(got), lines(want))
	}
	if c.Stats.External != 1 {
		t.Errorf("External = %d, want 1 (the link into the absent module)", c.Stats.External)
	}
}

// TestCheckPathsFixture checks the repository paths the fixture's
// Markdown names in code spans.
func TestCheckPathsFixture(t *testing.T) {
	c, err := NewChecker("testdata/ws")
	if err != nil {
		t.Fatal(err)
	}
	probs, err := c.CheckPaths()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range probs {
		got = append(got, p.String())
	}
	want := []string{"README.md:28: `a/nothere.go`: a/nothere.go does not exist"}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", lines(got), lines(want))
	}
}
