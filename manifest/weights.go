package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"

	"github.com/stagehost/stagehost/internal/safetensors"
)

// Weights formats.
const (
	WeightsSafetensors = "safetensors" // a safetensors file: the data section is uploaded, tensor_get finds its tensors (default)
	WeightsRaw         = "raw"         // the file's bytes, uploaded as they are
)

// WeightsFormats lists the weights formats.
var WeightsFormats = []string{WeightsSafetensors, WeightsRaw}

// MaxWeightsName is the longest weights name.
const MaxWeightsName = 64

// Weights is one [[weights]]: a read-only artefact that the sessions
// listing it (session.weights) share, one device copy per device
// (docs/manifest.md). Its file is checked when the manifest is read
// (regular, hashing to SHA256, a valid safetensors header) but not kept
// in memory: the deployment reads it again, streamed, when it uploads
// it, and checks the sha256 once more while it does.
type Weights struct {
	Name   string
	Path   string // as written in the manifest
	File   string // Path resolved against the manifest's directory
	SHA256 string // lower-case hex, equal to the file's when it was read
	Format string // WeightsSafetensors or WeightsRaw
	Size   int64  // the file's size, in bytes
	// DataOffset and DataSize are the bytes uploaded: the whole file for
	// raw weights, the data section after the header for safetensors
	// (so a tensor's offset in the device copy is its data_offsets[0]).
	DataOffset, DataSize int64
	Tensors              []Tensor // safetensors only, in the order of their offsets
}

// Tensor is one tensor of safetensors weights.
type Tensor struct {
	Name  string
	DType string   // the safetensors dtype, such as "F32"
	Code  uint32   // its code in tensor_get's record (abi/ABI.md §3)
	Shape []uint64 // at most 8 dimensions
	// Begin and End are its byte range in the data section.
	Begin, End uint64
}

// WeightsNamed returns the [[weights]] named name, or nil.
func (m *Manifest) WeightsNamed(name string) *Weights {
	for i := range m.Weights {
		if m.Weights[i].Name == name {
			return &m.Weights[i]
		}
	}
	return nil
}

// validWeightsName: 1 to 64 of a-z, 0-9, '_', '.', '-'.
func validWeightsName(s string) bool {
	if len(s) == 0 || len(s) > MaxWeightsName {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// weightsMeta is what the cross-checks need of one [[weights]].
type weightsMeta struct {
	p    keyPath
	name bool
}

// weightsList decodes the [[weights]] tables and checks their files.
func (d *decoder) weightsList(root *table, m *Manifest) []weightsMeta {
	list, _ := root.tables("weights")
	metas := make([]weightsMeta, len(list))
	if len(list) > 0 {
		m.Weights = make([]Weights, len(list))
	}
	first := map[string]keyPath{}
	for i, t := range list {
		if t == nil {
			continue
		}
		w, meta := &m.Weights[i], &metas[i]
		meta.p = t.path
		w.Name, meta.name = t.name("name")
		if meta.name && !validWeightsName(w.Name) {
			d.errorf(t.path.key("name"), "%q is not a weights name: 1 to %d of a-z, 0-9, '_', '.' and '-'", w.Name, MaxWeightsName)
			meta.name = false
		}
		if meta.name {
			d.unique(t.path.key("name"), w.Name, "weights", first)
		}
		path, pathOK := t.name("path")
		sum, sumSet := t.str("sha256", "", false)
		sumSet = sumSet && t.has("sha256")
		var formatOK bool
		if w.Format, formatOK = t.str("format", WeightsSafetensors, false); formatOK && w.Format != WeightsSafetensors && w.Format != WeightsRaw {
			d.errorf(t.path.key("format"), "unknown weights format %q (want %s)", w.Format, strings.Join(WeightsFormats, " or "))
			formatOK = false
		}
		t.finish()
		if !pathOK {
			continue
		}
		w.Path, w.File = path, resolve(d.dir, path)
		d.weightsFile(t, w, sum, sumSet, formatOK)
	}
	return metas
}

// weightsLimit is the limit weights files are read with: none.
var weightsLimit = fileLimit{math.MaxInt64, "the weights size limit", ""}

// weightsFile hashes a weights file and reads its safetensors header,
// reporting what is wrong at the key it concerns.
func (d *decoder) weightsFile(t *table, w *Weights, sum string, sumSet, formatOK bool) {
	size, actual, hdr, err := d.readWeights(w.File, formatOK && w.Format == WeightsSafetensors)
	if err != nil && actual == "" {
		d.fileError(t.path.key("path"), w.File, weightsLimit, err)
		return
	}
	w.Size = size
	switch {
	case !sumSet:
		d.errorf(t.path.key("sha256"), "required key is missing (the file's sha256 is %s)", actual)
		return
	case sum == "":
		d.errorf(t.path.key("sha256"), "must not be empty: the file's sha256 is %s", actual)
		return
	}
	if b, herr := hex.DecodeString(sum); herr != nil || len(b) != 32 {
		d.errorf(t.path.key("sha256"), "must be 64 hexadecimal digits, got %q (the file's sha256 is %s)", sum, actual)
		return
	}
	if sum = strings.ToLower(sum); sum != actual {
		d.errorf(t.path.key("sha256"), "does not match %q: expected %s, the file hashes to %s", w.File, sum, actual)
		return // not the file the operator meant: its checks would mislead
	}
	w.SHA256 = sum
	if err != nil { // the header
		d.errorf(t.path.key("path"), "%q: %s", w.File, escapeUnprintable(err.Error()))
		return
	}
	if !formatOK {
		return
	}
	w.DataOffset, w.DataSize = 0, size
	if hdr != nil {
		w.DataOffset, w.DataSize = hdr.DataOffset, hdr.DataSize
		for _, tn := range hdr.Tensors {
			w.Tensors = append(w.Tensors, Tensor{Name: tn.Name, DType: tn.DType, Code: tn.Code, Shape: tn.Shape, Begin: tn.Begin, End: tn.End})
		}
	}
	if w.DataSize == 0 {
		d.errorf(t.path.key("path"), "%q holds no bytes to upload: weights hold at least one byte", w.File)
	}
}

// readWeights returns a weights file's size, its sha256 and, when
// header is true, its safetensors header. An error with a sum is the
// header's; one without is the file's. Files of the file system are read
// as a stream (weights may be larger than memory); a ReadFunc of a test
// serves them whole.
func (d *decoder) readWeights(path string, header bool) (size int64, sum string, hdr *safetensors.Header, err error) {
	if reflect.ValueOf(d.readFile).Pointer() != reflect.ValueOf(ReadFile).Pointer() {
		data, err := d.readFile(path, math.MaxInt64)
		if err != nil {
			return 0, "", nil, err
		}
		h := sha256.Sum256(data)
		sum = hex.EncodeToString(h[:])
		if header {
			hdr, err = safetensors.ReadHeader(bytes.NewReader(data), int64(len(data)))
		}
		return int64(len(data)), sum, hdr, err
	}
	f, fi, err := OpenFile(path)
	if err != nil {
		return 0, "", nil, err
	}
	defer f.Close()
	h := sha256.New()
	var herr error
	if header {
		hdr, herr = safetensors.ReadHeader(io.TeeReader(f, h), fi.Size())
	}
	// The rest (all of it for raw weights): the tee hashed what the
	// header's reader took.
	if _, err := io.Copy(h, f); err != nil {
		return 0, "", nil, err
	}
	return fi.Size(), hex.EncodeToString(h.Sum(nil)), hdr, herr
}

// checkWeights: every name in a session's weights is a [[weights]].
func (d *decoder) checkWeights(m *Manifest, sess []sessMeta) {
	names := make([]string, 0, len(m.Weights))
	for _, w := range m.Weights {
		names = append(names, w.Name)
	}
	for i, s := range m.Sessions {
		if sess[i].p == nil {
			continue
		}
		for j, name := range s.Weights {
			if name != "" && m.WeightsNamed(name) == nil {
				d.notFound(sess[i].p.key("weights").at(j), "weights", name, names)
			}
		}
	}
}

// weightsUsedOn reports whether a session with an instance on device dev
// lists the weights named name.
func weightsUsedOn(m *Manifest, name, dev string) bool {
	for _, s := range m.Sessions {
		for _, d := range s.Devices {
			if d == dev && slices.Contains(s.Weights, name) {
				return true
			}
		}
	}
	return false
}
