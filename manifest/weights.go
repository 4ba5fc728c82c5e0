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
// it, and checks the sha256 once more while it does. Loaded with
// [LoadConfig.WithWeightsHashAtUpload], the file is not hashed when the
// manifest is read (HashedAtLoad is false): the upload's check is then
// the only one.
type Weights struct {
	Name   string
	Path   string // as written in the manifest
	File   string // Path resolved against the manifest's directory
	SHA256 string // lower-case hex: the file's when it was read, or the declared one when HashedAtLoad is false
	Format string // WeightsSafetensors or WeightsRaw
	Size   int64  // the file's size, in bytes
	// DataOffset and DataSize are the bytes uploaded: the whole file for
	// raw weights, the data section after the header for safetensors
	// (so a tensor's offset in the device copy is its data_offsets[0]).
	DataOffset, DataSize int64
	Tensors              []Tensor // safetensors only, in the order of their offsets
	// HashedAtLoad reports whether the file was hashed, and found equal
	// to SHA256, when the manifest was read.
	HashedAtLoad bool
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

// weightsFile hashes a weights file (unless the load leaves that to the
// upload: [LoadConfig.WithWeightsHashAtUpload]) and reads its
// safetensors header, reporting what is wrong at the key it concerns.
func (d *decoder) weightsFile(t *table, w *Weights, sum string, sumSet, formatOK bool) {
	// Loaded for an upload that hashes the file, a well-formed sha256 is
	// taken as declared; any other is reported with the file's actual
	// sha256, as ever.
	hash := true
	if b, herr := hex.DecodeString(sum); d.weightsAtUpload && sumSet && herr == nil && len(b) == 32 {
		hash = false
	}
	size, actual, hdr, herr, err := d.readWeights(w.File, formatOK && w.Format == WeightsSafetensors, hash)
	if err != nil {
		d.fileError(t.path.key("path"), w.File, weightsLimit, err)
		return
	}
	if !hash {
		actual = strings.ToLower(sum) // not compared here: the upload checks it
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
	w.SHA256, w.HashedAtLoad = sum, hash
	if herr != nil {
		d.errorf(t.path.key("path"), "%q: %s", w.File, escapeUnprintable(herr.Error()))
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

// readWeights returns a weights file's size, its sha256 (when hash is
// true; "" otherwise) and, when header is true, its safetensors header
// or the header's error herr; err is the file's error (nothing else is
// then set). Files of the file system are read as a stream (weights may
// be larger than memory), and without hash only up to the end of the
// header; a ReadFunc of a test serves them whole.
func (d *decoder) readWeights(path string, header, hash bool) (size int64, sum string, hdr *safetensors.Header, herr, err error) {
	if reflect.ValueOf(d.readFile).Pointer() != reflect.ValueOf(ReadFile).Pointer() {
		data, err := d.readFile(path, math.MaxInt64)
		if err != nil {
			return 0, "", nil, nil, err
		}
		if hash {
			h := sha256.Sum256(data)
			sum = hex.EncodeToString(h[:])
		}
		if header {
			hdr, herr = safetensors.ReadHeader(bytes.NewReader(data), int64(len(data)))
		}
		return int64(len(data)), sum, hdr, herr, nil
	}
	f, fi, err := OpenFile(path)
	if err != nil {
		return 0, "", nil, nil, err
	}
	defer f.Close()
	if !hash {
		if header {
			hdr, herr = safetensors.ReadHeader(f, fi.Size())
		}
		return fi.Size(), "", hdr, herr, nil
	}
	h := sha256.New()
	if header {
		hdr, herr = safetensors.ReadHeader(io.TeeReader(f, h), fi.Size())
	}
	// The rest (all of it for raw weights): the tee hashed what the
	// header's reader took.
	if _, err := io.Copy(h, f); err != nil {
		return 0, "", nil, nil, err
	}
	return fi.Size(), hex.EncodeToString(h.Sum(nil)), hdr, herr, nil
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
