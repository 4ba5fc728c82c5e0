package manifest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzFiles serves the test modules, weights and inputs by base name, from memory,
// so that fuzzing never touches the file system.
func fuzzFiles(f *testing.F) ReadFunc {
	files := map[string][]byte{}
	paths, _ := filepath.Glob("testdata/modules/*.wasm")
	weights, _ := filepath.Glob("testdata/weights/*.*")
	kernels, _ := filepath.Glob("testdata/kernels/*.*")
	paths = append(append(append(paths, weights...), kernels...), "testdata/inputs/sample.bin")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		files[filepath.Base(p)] = b
	}
	return func(p string, _ int64) ([]byte, error) {
		if b, ok := files[filepath.Base(p)]; ok {
			return b, nil
		}
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
}

// FuzzDecode: Decode never panics, fails only with a non-empty *Errors
// whose errors all name the file, one line each with nothing unprintable
// in it (whatever strings the manifest holds), sorted by line, and
// succeeds only with a manifest whose references all resolve.
func FuzzDecode(f *testing.F) {
	readFile := fuzzFiles(f)
	const name = "testdata/fuzz/host.toml"
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(name, data, readFile)
		if err != nil {
			if m != nil {
				t.Fatal("a manifest returned with errors")
			}
			var errs *Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error %T is not *Errors: %v", err, err)
			}
			if len(errs.List) == 0 {
				t.Fatal("empty *Errors")
			}
			for i, e := range errs.List {
				if e.File != name || !strings.HasPrefix(e.Error(), name+":") {
					t.Fatalf("error does not carry the file name: %q", e)
				}
				if strings.Contains(e.Error(), "\n") {
					t.Fatalf("error spans lines: %q", e)
				}
				if msg := unprintable(e.Error()); msg != "" {
					t.Fatalf("error holds %s: %q", msg, e)
				}
				if i > 0 && e.Line < errs.List[i-1].Line {
					t.Fatalf("errors not sorted: %v", err)
				}
			}
			if n := strings.Count(err.Error(), "\n") + 1; n != len(errs.List) {
				t.Fatalf("%d errors on %d lines: %q", len(errs.List), n, err)
			}
			return
		}
		checkManifest(t, m)
	})
}

// unprintable describes the first thing in an error message that could
// make it two lines or forge a log line: invalid UTF-8, a control
// character (a newline, a carriage return, an escape that starts a
// terminal sequence), or another rune strconv.IsPrint refuses (a
// right-to-left override, a zero-width or non-ASCII space). "" when there
// is none: every value from the manifest is quoted with %q, which
// escapes them all.
func unprintable(s string) string {
	if !utf8.ValidString(s) {
		return "invalid UTF-8"
	}
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return fmt.Sprintf("the unprintable %U", r)
		}
	}
	return ""
}

// checkManifest checks what a successful Decode promises.
func checkManifest(t *testing.T, m *Manifest) {
	t.Helper()
	if m.Version != Version || len(m.Devices) == 0 {
		t.Fatalf("version %d, %d devices", m.Version, len(m.Devices))
	}
	for _, d := range m.Devices {
		if (d.Backend == BackendSim) != (d.Sim != nil) {
			t.Fatalf("device %s: backend %s with sim %v", d.Name, d.Backend, d.Sim)
		}
	}
	for _, mod := range m.Modules {
		if len(mod.Bytes) == 0 || len(mod.SHA256) != 64 || int64(len(mod.Bytes)) > mod.MaxSize {
			t.Fatalf("module %s: %d bytes, sha256 %q", mod.Name, len(mod.Bytes), mod.SHA256)
		}
	}
	for i := range m.Sessions {
		checkSession(t, m, &m.Sessions[i])
	}
	for _, r := range m.Residents {
		if m.Device(r.GPU) == nil || m.Device(r.NPU) == nil || StartupLineSize+r.Payload > r.Budget {
			t.Fatalf("resident %+v", r)
		}
	}
}

// checkSession checks what a successful Decode promises of a session:
// its modules and device resolve, its timers are set, its buffers fit
// its budget.
func checkSession(t *testing.T, m *Manifest, s *Session) {
	t.Helper()
	if mod := m.Module(s.Stage); mod == nil || mod.Kind.String() != "stage" {
		t.Fatalf("session %s: stage %q", s.Name, s.Stage)
	}
	if s.Fence != FenceBuiltin && s.Fence != FenceDrain {
		if mod := m.Module(s.Fence); mod == nil || mod.Kind.String() != "fence" {
			t.Fatalf("session %s: fence %q", s.Name, s.Fence)
		}
	}
	if m.Device(s.Device) == nil || s.Deadline <= 0 || s.FenceTimeout <= 0 || s.InitTimeout <= 0 {
		t.Fatalf("session %s: %+v", s.Name, s)
	}
	var sum int64
	for _, b := range s.Buffers {
		sum += b.Size
	}
	if sum > s.Budget {
		t.Fatalf("session %s: buffers %d over budget %d", s.Name, sum, s.Budget)
	}
}

// FuzzLineIndex: the line index never panics or hangs, its lines lie in
// the file, and on input that parses it agrees with the TOML parser: every
// key the parser saw is indexed, on a line that mentions it.
func FuzzLineIndex(f *testing.F) {
	f.Fuzz(func(t *testing.T, src []byte) {
		ix := indexLines(src)
		n := strings.Count(string(src), "\n") + 1
		for _, e := range ix.entries {
			if e.line < 1 || e.line > n {
				t.Fatalf("%s: line %d outside 1..%d", e.path, e.line, n)
			}
			if ix.line(e.path) == 0 {
				t.Fatalf("%s: indexed but not found", e.path)
			}
		}
		if msg := checkIndexAgainstParser(src); msg != "" {
			t.Fatal(msg)
		}
	})
}
