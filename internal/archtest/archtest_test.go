package archtest

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/stagehost/stagehost"

// Layers lists the packages of the module from the top down, as
// ARCHITECTURE.md does: a package may import only packages of a layer
// below its own, or of its own subtree (hw/sim imports hw/internal/retire,
// stages imports stages/internal/wasmbin). A path matches the longest
// prefix listed (a directory matches its subdirectories).
var layers = [][]string{
	{"bench", "examples", "internal/archtest", "internal/doccheck", "internal/testutil"}, // programs, examples, repository checks and test helpers, over the whole API
	{"cmd"},
	{"service"},
	{"internal/lattice"},
	{"internal/supervise", "internal/modelctl", "internal/localcall"},
	{"deploy"},
	{"manifest"},
	{"sessions/exchange"},
	{"sessions", "stages"},
	{"host/metrics"},
	{"host"},
	{"abi"},
	{"hw/sim", "hw/cuda"},
	{"hw", "internal/tracing"},
	{"internal/deadline", "internal/requestid"},
	{"internal/monotime", "internal/safetensors", "internal/fileread"},
	{"errdefs"},
	{"guest-sdk"}, // a module of its own, built into stages (and embedded by cmd/stagehost); imports nothing of the host's
}

// layerOf returns the layer (0 the top) and the prefix of a module
// path relative to the module ("" for the root), or -1.
func layerOf(rel string) (int, string) {
	best, bestLen, bestPrefix := -1, -1, ""
	for i, l := range layers {
		for _, p := range l {
			if (rel == p || strings.HasPrefix(rel, p+"/")) && len(p) > bestLen {
				best, bestLen, bestPrefix = i, len(p), p
			}
		}
	}
	return best, bestPrefix
}

// imports lists each package of the module with its direct imports of
// the module's packages (test files excluded: a test may use what it
// tests from above).
func imports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	m := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		pkg := rel(f[0])
		m[pkg] = nil
		for _, imp := range f[1:] {
			if imp == module || strings.HasPrefix(imp, module+"/") {
				m[pkg] = append(m[pkg], rel(imp))
			}
		}
	}
	return m
}

func rel(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, module), "/") }

// violations checks every import against the layers.
func violations(pkgs map[string][]string) []string {
	var bad []string
	for pkg, imps := range pkgs {
		pl, pp := layerOf(pkg)
		if pl < 0 {
			bad = append(bad, fmt.Sprintf("%s: in no layer (add it to ARCHITECTURE.md and to layers)", pkg))
			continue
		}
		for _, imp := range imps {
			il, ip := layerOf(imp)
			switch {
			case strings.HasPrefix(pkg, "internal/") && imp == "manifest":
				bad = append(bad, fmt.Sprintf("%s imports manifest: an internal package takes its own configuration, which its caller translates", pkg))
			case il < 0:
				bad = append(bad, fmt.Sprintf("%s imports %s, which is in no layer", pkg, imp))
			case ip == pp:
				// its own subtree
			case il <= pl:
				bad = append(bad, fmt.Sprintf("%s (layer %v) imports %s (layer %v): not below it", pkg, layers[pl], imp, layers[il]))
			}
		}
	}
	return bad
}

// TestImportsFlowDown: no package of the module imports one of its own
// layer or above (ARCHITECTURE.md), and no internal package imports
// manifest.
func TestImportsFlowDown(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	pkgs := imports(t)
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
}

// TestViolationsAreFound: the check itself sees an upward import, an
// import within a layer, and an internal package reading manifest.
func TestViolationsAreFound(t *testing.T) {
	for _, tc := range []struct {
		pkg, imp string
	}{
		{"sessions", "deploy"},
		{"deploy", "service"},
		{"sessions", "stages"},
		{"internal/lattice", "manifest"},
		{"hw", "hw/sim"},
		{"newpkg", "errdefs"},
	} {
		if v := violations(map[string][]string{tc.pkg: {tc.imp}}); len(v) == 0 {
			t.Errorf("%s importing %s: no violation found", tc.pkg, tc.imp)
		}
	}
	if v := violations(map[string][]string{"hw/sim": {"hw/internal/retire", "hw", "errdefs"}, "service": {"deploy", "internal/lattice"}}); len(v) != 0 {
		t.Errorf("allowed imports refused: %v", v)
	}
}
