package manifest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func TestLineIndex(t *testing.T) {
	for _, c := range []struct {
		name string
		src  string
		want map[string]int // path → line; every one must be present
		not  []string       // paths that must be absent
	}{
		{
			name: "keys and comments",
			src:  "# c\na = 1 # trailing\n\n  b=\"x\"#c\nc = 2024-01-01 07:00:00\n",
			want: map[string]int{"a": 2, "b": 4, "c": 5},
		},
		{
			name: "tables",
			src:  "[runtime]\ncapacity = 1\n[ x . \"y z\" ]  # c\nk = 1\n",
			want: map[string]int{"runtime": 1, "runtime.capacity": 2, "x": 3, `x."y z"`: 3, `x."y z".k`: 4},
		},
		{
			name: "arrays of tables count per parent element",
			src: "[[a]]\nn = 0\n[[a.b]]\nn = 1\n[[a.b]]\nn = 2\n[[a]]\n[[a.b]]\nn = 3\n" +
				"[a.c]\nn = 4\n[[a.c.d]]\nn = 5\n",
			want: map[string]int{
				"a": 1, "a[0]": 1, "a[0].n": 2, "a[0].b[0]": 3, "a[0].b[0].n": 4, "a[0].b[1].n": 6,
				"a[1]": 7, "a[1].b[0]": 8, "a[1].b[0].n": 9, "a[1].c": 10, "a[1].c.n": 11,
				"a[1].c.d[0]": 12, "a[1].c.d[0].n": 13,
			},
			not: []string{"a[0].b[2]", "a[1].b[1]", "a[2]"},
		},
		{
			name: "dotted and quoted keys",
			src:  "a . b.c = 1\n\"d.e\" = 2\n'f g'.h = 3\n\"\\u0041\\x42\\e\" = 4\n\"\" = 5\n",
			want: map[string]int{"a": 1, "a.b": 1, "a.b.c": 1, `"d.e"`: 2, `"f g"`: 3, `"f g".h`: 3, `"AB\x1b"`: 4, `""`: 5},
		},
		{
			name: "multi-line strings hide their contents",
			src: "s = \"\"\"\n[[fake]]\nk = 1 \\\"\"\" still inside\n\"\"\"\nt = '''\n[x]\n'''''\n" +
				"u = \"\"\"a\"\"\"\"\"\nv = 1\n",
			want: map[string]int{"s": 1, "t": 5, "u": 8, "v": 9},
			not:  []string{"fake", "fake[0]", "k", "x"},
		},
		{
			name: "multi-line arrays and inline tables",
			src: "xs = [\n  \"a\", # one\n  [1, [2]],\n  'b',\n]\n" +
				"t = { a = 1, b = { c = [\n  { d = 2 },\n  { e = 3 },\n] } }\n" +
				"[[dev]]\nsim = { fault = [{ kind = \"hang\" }, { kind = \"lose\" }] }\nafter = 1\n",
			want: map[string]int{
				"xs": 1, "xs[0]": 2, "xs[1]": 3, "xs[1][1]": 3, "xs[1][1][0]": 3, "xs[2]": 4,
				"t": 6, "t.a": 6, "t.b.c": 6, "t.b.c[0]": 7, "t.b.c[0].d": 7, "t.b.c[1].e": 8,
				"dev[0].sim.fault[0].kind": 11, "dev[0].sim.fault[1].kind": 11, "dev[0].after": 12,
			},
		},
		{
			name: "CRLF",
			src:  "a = 1\r\n[t]\r\nb = \"\"\"x\r\ny\"\"\"\r\nc = 2\r\n",
			want: map[string]int{"a": 1, "t": 2, "t.b": 3, "t.c": 5},
		},
		{
			name: "recovers from bad lines",
			src:  "a = \"unterminated\nb = 1\n= 2\n[bad\n[[ok]]\nc = [1,\nd = 3\n",
			want: map[string]int{"a": 1, "b": 2, "ok[0]": 5, "ok[0].c": 6},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			ix := indexLines([]byte(c.src))
			for p, line := range c.want {
				if got, ok := ix.lines[p]; !ok || got != line {
					t.Errorf("%s: line %d (present %v), want %d", p, got, ok, line)
				}
			}
			for _, p := range c.not {
				if _, ok := ix.lines[p]; ok {
					t.Errorf("%s: present, want absent", p)
				}
			}
			if t.Failed() {
				t.Logf("index: %v", ix.lines)
			}
		})
	}
}

func TestLineIndexQuotedSpelling(t *testing.T) {
	ix := indexLines([]byte("\"\\u0041\\x42\" = 1\n\"a\\tb\" = 2\n"))
	if _, ok := ix.lines["AB"]; !ok {
		t.Errorf("escaped key not decoded: %v", ix.lines)
	}
	if _, ok := ix.lines[`"a\tb"`]; !ok {
		t.Errorf("key with a tab not quoted: %v", ix.lines)
	}
}

func TestLineIndexLookups(t *testing.T) {
	ix := indexLines([]byte("x = 1\n[[s]]\nname = \"a\"\n[[s]]\nname = \"b\"\nbudget = oops\n"))
	s1 := keyPath{}.key("s").at(1)
	if got := ix.line(s1.key("stage")); got != 4 {
		t.Errorf("missing key falls back to its table: line %d, want 4", got)
	}
	if got := ix.line(keyPath{}.key("nope")); got != 0 {
		t.Errorf("unknown top-level key: line %d, want 0", got)
	}
	if got := ix.keyAt(6); got != "s[1].budget" {
		t.Errorf("keyAt(6) = %q", got)
	}
	if got := ix.keyAt(7); got != "" {
		t.Errorf("keyAt(7) = %q, want none", got)
	}
}

// TestLineIndexAgreesWithParser checks, on every manifest in testdata
// that parses, that each key the TOML parser saw is in the index.
func TestLineIndexAgreesWithParser(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.toml")
	more, _ := filepath.Glob("testdata/bad/*.toml")
	for _, f := range append(files, more...) {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if msg := checkIndexAgainstParser(src); msg != "" {
			t.Errorf("%s: %s", f, msg)
		}
	}
}

// checkIndexAgainstParser returns "" when src does not parse, or when
// every key BurntSushi/toml reports is in the index (compared without
// array indices) and every indexed key's line mentions it; else a
// description of the first disagreement.
func checkIndexAgainstParser(src []byte) string {
	ix := indexLines(src)
	if ix.deep > 0 {
		return "" // never parsed
	}
	var v map[string]any
	md, err := toml.Decode(string(src), &v)
	if err != nil {
		return ""
	}
	stripped := map[string]bool{}
	lines := strings.Split(string(src), "\n")
	for _, e := range ix.entries {
		var names []string
		for _, el := range e.path {
			if !el.isIndex {
				names = append(names, el.name)
			}
		}
		stripped[strings.Join(names, "\x00")] = true
		if e.line < 1 || e.line > len(lines) {
			return "line out of range for " + e.path.String()
		}
		last := e.path[len(e.path)-1]
		if !last.isIndex && last.name != "" && formatKey(last.name) == last.name &&
			!mentions(lines[e.line-1], last.name) {
			return "line of " + e.path.String() + " does not mention it: " + lines[e.line-1]
		}
	}
	for _, k := range md.Keys() {
		if !stripped[strings.Join(k, "\x00")] {
			return "parser key " + k.String() + " is not in the index"
		}
	}
	return ""
}

// basicStrings matches the one-line basic strings of a TOML line.
var basicStrings = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// mentions reports whether line names key: literally, or inside one of
// its basic strings once the TOML parser has decoded that string's
// escapes (a key written "\x41" is the key A).
func mentions(line, key string) bool {
	if strings.Contains(line, key) {
		return true
	}
	for _, q := range basicStrings.FindAllString(line, -1) {
		var v struct{ S string }
		if _, err := toml.Decode("S = "+q, &v); err == nil && strings.Contains(v.S, key) {
			return true
		}
	}
	return false
}
