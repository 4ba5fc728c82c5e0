package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot returns the repository root: the nearest directory above this
// package that holds go.work.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.work above the test's directory")
		}
		dir = up
	}
}

// knownBadLinks are bad links, as "file: link" (Problem.Key), in files
// that are being rewritten elsewhere and are fixed there. The test fails
// on any bad link not listed here and on any entry that no longer matches
// a bad link, so the list can only shrink: delete an entry once its link
// is fixed or its file is gone.
var knownBadLinks = []string{}

// staleTerms is wording the code no longer supports.
var staleTerms = []Term{{
	RE:   regexp.MustCompile(`\bhw('s)? (error )?class(es)?\b|\bhw/errors\.go\b|\bhw\.Err[A-Z]\w*`),
	Why:  "the error classes are package errdefs's (errdefs/errdefs.go), not hw's",
	Skip: []string{"internal/doccheck"},
}}

// report fails t for every problem outside knownBadLinks and for every
// stale entry of it.
func report(t *testing.T, probs []Problem, kind string) {
	t.Helper()
	rest, stale := Filter(probs, knownBadLinks)
	for _, p := range rest {
		t.Error(p)
	}
	for _, k := range stale {
		if isKind(k, kind) {
			t.Errorf("knownBadLinks: %s no longer matches a bad link: delete the entry", k)
		}
	}
}

// isKind reports whether an allowlist key belongs to a check: "go" (a
// Go doc link), "md" (a Markdown link), "test" (a test name in Markdown),
// "path" (a repository path in Markdown) or "term" (stale wording).
func isKind(key, kind string) bool {
	file, link, _ := strings.Cut(key, ": ")
	switch {
	case strings.HasSuffix(file, ".go") && strings.HasPrefix(link, "["):
		return kind == "go"
	case strings.HasPrefix(link, "`Test") || strings.HasPrefix(link, "`Fuzz") || strings.HasPrefix(link, "`Benchmark") || strings.HasPrefix(link, "`Example"):
		return kind == "test"
	case strings.HasPrefix(link, "`"):
		return kind == "path"
	case !strings.HasPrefix(link, "[") && !strings.HasPrefix(link, "!["):
		return kind == "term"
	default:
		return kind == "md"
	}
}

// TestRepoDocLinks checks every doc link in the Go files of the
// workspace's modules.
func TestRepoDocLinks(t *testing.T) {
	c, err := NewChecker(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	probs, err := c.CheckGo()
	if err != nil {
		t.Fatal(err)
	}
	report(t, probs, "go")
	t.Logf("%+v", c.Stats)
}

// TestRepoMarkdownLinks checks every relative link in the repository's
// Markdown files.
func TestRepoMarkdownLinks(t *testing.T) {
	c, err := NewChecker(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	probs, err := c.CheckMarkdown()
	if err != nil {
		t.Fatal(err)
	}
	report(t, probs, "md")
	t.Logf("%+v", c.Stats)
}

// TestRepoTestNames checks that every test the repository's Markdown
// files name in a code span exists.
func TestRepoTestNames(t *testing.T) {
	c, err := NewChecker(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	probs, err := c.CheckTestNames()
	if err != nil {
		t.Fatal(err)
	}
	report(t, probs, "test")
}

// TestRepoStaleTerms checks that no Go or Markdown file uses wording that
// the code no longer supports (staleTerms).
func TestRepoStaleTerms(t *testing.T) {
	c, err := NewChecker(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	probs, err := c.CheckTerms(staleTerms)
	if err != nil {
		t.Fatal(err)
	}
	report(t, probs, "term")
}

// TestRepoPaths checks that every repository path the Markdown files name
// in a code span exists.
func TestRepoPaths(t *testing.T) {
	c, err := NewChecker(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	probs, err := c.CheckPaths()
	if err != nil {
		t.Fatal(err)
	}
	rest, stale := Filter(probs, notRepoPaths)
	for _, k := range stale {
		t.Errorf("notRepoPaths: %s no longer matches: delete the entry", k)
	}
	report(t, rest, "path")
}

// notRepoPaths are code spans shaped like repository paths that name
// something else, as "file: `span`".
var notRepoPaths = []string{
	"RATIONALE.md: `guest-sdk/v0.x.y`",                                     // a git tag
	"stages/testdata/hostile/README.md: `internal/wasm/binary/decoder.go`", // a file of wazero
	"RATIONALE.md: `internal/fleet`",                                       // a rejected package
}
