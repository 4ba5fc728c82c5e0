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
