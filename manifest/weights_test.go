package manifest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const weightsManifest = `version = 1

[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
%MEMORY%

[[module]]
name = "good"
path = "modules/good_stage.wasm"
sha256 = "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b"

[[weights]]
name = "digits"
path = "weights/tiny.safetensors"
sha256 = "f6b869dc7189a64b15672fe534ce31573ba9fe8a12e218b99215c921dca39a7a"

[[weights]]
name = "table.v1"
path = "weights/raw.bin"
sha256 = "7ac7bad5e5852575dcf06d96f039d683abf7da85b92805f17ffde2ffd9c17769"
format = "raw"

[[session]]
name = "classify"
stage = "good"
device = "gpu0"
budget = "64KiB"
instances = 4
weights = [%WEIGHTS%]

[[session]]
name = "other"
stage = "good"
device = "gpu0"
budget = "64KiB"
weights = ["digits"]
`

func weightsToml(memory, weights string) []byte {
	s := strings.ReplaceAll(weightsManifest, "%MEMORY%", memory)
	return []byte(strings.ReplaceAll(s, "%WEIGHTS%", weights))
}

// memFiles reads testdata's files from memory, as a test's ReadFunc
// does, so weights take Decode's in-memory path.
func memFiles(path string, limit int64) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fs.ErrNotExist}
	}
	return b, nil
}

func TestWeights(t *testing.T) {
	for _, rf := range []struct {
		name string
		fn   ReadFunc
	}{{"file system", nil}, {"memory", memFiles}} {
		t.Run(rf.name, func(t *testing.T) {
			m, err := Decode(filepath.Join("testdata", "host.toml"), weightsToml("", `"digits", "table.v1"`), rf.fn)
			if err != nil {
				t.Fatal(err)
			}
			w := m.WeightsNamed("digits")
			if w == nil || w.Format != WeightsSafetensors || w.Size != 24+w.DataOffset || w.DataSize != 24 || len(w.Tensors) != 2 {
				t.Fatalf("digits = %+v", w)
			}
			if tn := w.Tensors[0]; tn.Name != "w" || tn.DType != "F32" || tn.Code != 0 || tn.Begin != 0 || tn.End != 16 || len(tn.Shape) != 2 {
				t.Fatalf("tensor 0 = %+v", tn)
			}
			raw := m.WeightsNamed("table.v1")
			if raw == nil || raw.Format != WeightsRaw || raw.DataOffset != 0 || raw.DataSize != 18 || raw.Tensors != nil {
				t.Fatalf("table.v1 = %+v", raw)
			}
			if got := m.Session("classify").Weights; len(got) != 2 || got[0] != "digits" {
				t.Fatalf("session weights %v", got)
			}
			if got := m.Session("other").Weights; len(got) != 1 {
				t.Fatalf("session weights %v", got)
			}
		})
	}
}

func TestWeightsErrors(t *testing.T) {
	_, err := Decode(filepath.Join("testdata", "host.toml"), weightsToml("", `"digits", "digit"`), nil)
	var errs *Errors
	if !errors.As(err, &errs) || len(errs.List) != 1 ||
		errs.List[0].Error() != `testdata/host.toml:31: session[0].weights[1]: no weights is named "digit" (did you mean "digits"?)` {
		t.Fatalf("err = %v", err)
	}
}

// TestWeightsDeviceMemory: weights count once per device against its
// memory, however many sessions and instances list them: two sessions
// of 64KiB, one of them with 4 instances, and 42 bytes of weights fit
// in 128KiB+42 bytes, and not in one byte less.
func TestWeightsDeviceMemory(t *testing.T) {
	if _, err := Decode(filepath.Join("testdata", "host.toml"), weightsToml("memory = 131114", `"digits", "table.v1"`), nil); err != nil {
		t.Fatalf("fits: %v", err)
	}
	_, err := Decode(filepath.Join("testdata", "host.toml"), weightsToml("memory = 131113", `"digits", "table.v1"`), nil)
	if err == nil || !strings.Contains(err.Error(), `weights "digits" 24B`) || !strings.Contains(err.Error(), `weights "table.v1" 18B`) {
		t.Fatalf("one byte short: %v", err)
	}
}

// TestWeightsHashAtUpload: with WithWeightsHashAtUpload a well-formed
// sha256 is taken as declared (the upload checks it), the file is read
// only for its size and header, and everything else is as with Load: a
// missing sha256 still names the file's, a bad header is still refused.
// Without it, the same wrong sha256 is refused at load.
func TestWeightsHashAtUpload(t *testing.T) {
	const wrong = "F6B869DC7189A64B15672FE534CE31573BA9FE8A12E218B99215C921DCA39A7B" // the last digit changed
	toml := []byte(strings.Replace(string(weightsToml("", `"digits", "table.v1"`)), strings.ToLower(wrong[:63])+"a", wrong, 1))
	for _, rf := range []struct {
		name string
		fn   ReadFunc
	}{{"file system", nil}, {"memory", memFiles}} {
		t.Run(rf.name, func(t *testing.T) {
			name := filepath.Join("testdata", "host.toml")
			if _, err := decode(name, toml, rf.fn, NewLoadConfig()); err == nil || !strings.Contains(err.Error(), "weights[0].sha256: does not match") {
				t.Fatalf("Load: %v", err)
			}
			m, err := decode(name, toml, rf.fn, NewLoadConfig().WithWeightsHashAtUpload(true))
			if err != nil {
				t.Fatal(err)
			}
			w := m.WeightsNamed("digits")
			if w.SHA256 != strings.ToLower(wrong) || w.HashedAtLoad || w.DataSize != 24 || len(w.Tensors) != 2 || w.Size != 24+w.DataOffset {
				t.Fatalf("digits = %+v", w)
			}
			if raw := m.WeightsNamed("table.v1"); raw.HashedAtLoad || raw.DataSize != 18 {
				t.Fatalf("table.v1 = %+v", raw)
			}
			missing := []byte(strings.Replace(string(toml), `sha256 = "`+wrong+`"`, "", 1))
			if _, err := decode(name, missing, rf.fn, NewLoadConfig().WithWeightsHashAtUpload(true)); err == nil ||
				!strings.Contains(err.Error(), "weights[0].sha256: required key is missing (the file's sha256 is f6b869dc7189a64b15672fe534ce31573ba9fe8a12e218b99215c921dca39a7a)") {
				t.Fatalf("missing sha256: %v", err)
			}
		})
	}
	// A file whose header is not safetensors, read from the file system.
	dir := t.TempDir()
	for _, d := range []string{"modules", "weights"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	good, err := os.ReadFile(filepath.Join("testdata", "modules", "good_stage.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "modules", "good_stage.wasm"), good, 0o644); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "weights", "raw.bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tiny.safetensors", "raw.bin"} {
		if err := os.WriteFile(filepath.Join(dir, "weights", f), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err = decode(filepath.Join(dir, "host.toml"), toml, nil, NewLoadConfig().WithWeightsHashAtUpload(true))
	if err == nil || !strings.Contains(err.Error(), "weights[0].path: ") || !strings.Contains(err.Error(), "tiny.safetensors") {
		t.Fatalf("a bad header: %v", err)
	}
}
