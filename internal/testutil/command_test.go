package testutil

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// testCommand is the README's test command: its line that starts with
// "go test -race".
func testCommand(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(readme)) {
		if cmd := strings.TrimSpace(line); strings.HasPrefix(cmd, "go test -race") {
			return cmd
		}
	}
	t.Fatal("README.md has no line starting with go test -race")
	return ""
}

// TestCIRunsTheREADMEsTestCommand: .ci/run runs the README's test command
// as it is written there.
func TestCIRunsTheREADMEsTestCommand(t *testing.T) {
	cmd := testCommand(t)
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(ci), "\n")
	i := slices.Index(lines, cmd)
	if i < 0 {
		t.Fatalf(".ci/run has no line that is the README's test command:\n%s", cmd)
	}
	// Under set -e a failure of the command before && does not stop the
	// script, so the next command line must check the status.
	for _, l := range lines[i+1:] {
		if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if !strings.HasPrefix(l, `rc=$?; [ "$rc" -eq 0 ] ||`) {
			t.Fatalf(".ci/run does not check the test command's status on the next line; it has %q", l)
		}
		return
	}
	t.Fatal(".ci/run ends after the test command without checking its status")
}

// TestEveryGoGuestTestRunsInTheSecondStep: every test that calls
// GoGuests (and so skips under -race) has GoGuest in its name and is in a
// package that the second step of the README's test command lists, so
// that the command runs it once.
func TestEveryGoGuestTestRunsInTheSecondStep(t *testing.T) {
	cmd := testCommand(t)
	m := regexp.MustCompile(`&& go test -count=1 -run GoGuest ((?:\./\S+/ ?)+)$`).FindStringSubmatch(cmd)
	if m == nil {
		t.Fatalf("the README's test command has no second step `&& go test -count=1 -run GoGuest PACKAGES`:\n%s", cmd)
	}
	second := map[string]bool{}
	for _, p := range strings.Fields(m[1]) {
		second[strings.TrimSuffix(strings.TrimPrefix(p, "./"), "/")] = true
	}
	found := 0
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil || !callsGoGuests(fn.Body) {
				continue
			}
			found++
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			if !strings.Contains(fn.Name.Name, "GoGuest") || !strings.HasPrefix(fn.Name.Name, "Test") {
				t.Errorf("%s: %s calls testutil.GoGuests but is not a test with GoGuest in its name: the second step (-run GoGuest) would not run it", path, fn.Name.Name)
			}
			if !second[filepath.ToSlash(rel)] {
				t.Errorf("%s: %s calls testutil.GoGuests, but the second step of the README's test command does not list ./%s/", path, fn.Name.Name, filepath.ToSlash(rel))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 5 {
		t.Fatalf("found %d tests that call testutil.GoGuests, want at least 5", found)
	}
}

func callsGoGuests(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "GoGuests" {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "testutil" {
				found = true
			}
		}
		return !found
	})
	return found
}
