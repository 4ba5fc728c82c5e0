// Code copied from the host's internal/safetensors/safetensors.go by
// TestSDKCopyIsCurrent (go test ./internal/safetensors -update); DO NOT
// EDIT. The SDK is a module of its own and imports nothing of the
// host's; its errors.go is its own.

// Package safetensors reads the header of a safetensors file
// (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON, then the data section that the
// tensors' data_offsets index.
//
// The reader is strict and refuses hostile headers before any large
// allocation: a header length above [MaxHeader] or beyond the file is
// refused from its 8 bytes alone; everything else is checked after the
// header (at most [MaxHeader] bytes, and never more than the file holds)
// is read.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"sort"
	"strconv"
	"unicode/utf8"
)

// MaxHeader is the largest JSON header the reader accepts, in bytes.
const MaxHeader = 100 << 20

// MaxRank is the most dimensions a tensor may have.
const MaxRank = 8

// MetadataKey is the header's optional free-form entry (string values).
const MetadataKey = "__metadata__"

// DType codes: the guest SDK's DType values for the four types the op
// library takes, and codes from 16 up for the other safetensors types
// (abi/ABI.md §3, tensor_get).
const (
	F32    uint32 = 0
	F16    uint32 = 1
	BF16   uint32 = 2
	I32    uint32 = 3
	F64    uint32 = 16
	I64    uint32 = 17
	I16    uint32 = 18
	I8     uint32 = 19
	U8     uint32 = 20
	Bool   uint32 = 21
	U16    uint32 = 22
	U32    uint32 = 23
	U64    uint32 = 24
	F8E4M3 uint32 = 25
	F8E5M2 uint32 = 26
)

// dtypes maps a safetensors dtype name to its code and element size.
var dtypes = map[string]struct {
	code uint32
	size uint64
}{
	"F32": {F32, 4}, "F16": {F16, 2}, "BF16": {BF16, 2}, "I32": {I32, 4},
	"F64": {F64, 8}, "I64": {I64, 8}, "I16": {I16, 2}, "I8": {I8, 1},
	"U8": {U8, 1}, "BOOL": {Bool, 1}, "U16": {U16, 2}, "U32": {U32, 4},
	"U64": {U64, 8}, "F8_E4M3": {F8E4M3, 1}, "F8_E5M2": {F8E5M2, 1},
}

// DTypeNames lists the dtype names the reader knows, with their codes.
func DTypeNames() map[string]uint32 {
	out := make(map[string]uint32, len(dtypes))
	for k, v := range dtypes {
		out[k] = v.code
	}
	return out
}

// Tensor is one tensor of a header.
type Tensor struct {
	Name  string
	DType string // the safetensors name, such as "F32"
	Code  uint32 // the DType code
	Shape []uint64
	// Begin and End are the tensor's byte range in the data section
	// (data_offsets).
	Begin, End uint64
}

// Header is a parsed and checked header.
type Header struct {
	// DataOffset is where the data section starts in the file: 8 plus
	// the JSON's length.
	DataOffset int64
	// DataSize is the data section's length: the file's size less
	// DataOffset.
	DataSize int64
	// Tensors in the order of their data offsets.
	Tensors  []Tensor
	Metadata map[string]string
}

// Tensor returns the tensor named name, or false.
func (h *Header) Tensor(name string) (Tensor, bool) {
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// ReadHeader reads and checks the header of a safetensors file of
// fileSize bytes from r, which must be at the file's start; it reads
// exactly the header (8 bytes and the JSON), so r is then at the data
// section.
//
// # Errors
//
// An error of class invalid_argument (errorf), saying what is wrong: a file shorter than
// 8 bytes; a header length above [MaxHeader] or beyond the file; JSON
// that is not one object; an entry that is not a tensor of exactly
// dtype, shape and data_offsets; an unknown dtype; a rank above
// [MaxRank]; a shape whose product (times the element size) overflows or
// differs from the data_offsets range; offsets reversed, beyond the data
// section or overlapping another tensor's; a name given twice; a
// __metadata__ that is not an object of strings. A read error of r is
// returned wrapped.
func ReadHeader(r io.Reader, fileSize int64) (*Header, error) {
	var lenBuf [8]byte
	if fileSize < 8 {
		return nil, errorf("a file of %d bytes is too short for a safetensors header (8 bytes of length first)", fileSize)
	}
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("safetensors: reading the header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeader {
		return nil, errorf("header length %d is above the limit of %d bytes", n, MaxHeader)
	}
	if n > uint64(fileSize-8) {
		return nil, errorf("header length %d is beyond the file's %d bytes", n, fileSize)
	}
	js := make([]byte, n)
	if _, err := io.ReadFull(r, js); err != nil {
		return nil, fmt.Errorf("safetensors: reading the %d-byte header: %w", n, err)
	}
	return ParseHeader(js, fileSize)
}

// ParseHeader checks the JSON header js of a safetensors file of fileSize
// bytes (so the data section holds fileSize-8-len(js) bytes). Errors are
// [ReadHeader]'s.
func ParseHeader(js []byte, fileSize int64) (*Header, error) {
	if uint64(len(js)) > MaxHeader {
		return nil, errorf("header length %d is above the limit of %d bytes", len(js), MaxHeader)
	}
	if fileSize < 8+int64(len(js)) {
		return nil, errorf("header length %d is beyond the file's %d bytes", len(js), fileSize)
	}
	h := &Header{DataOffset: 8 + int64(len(js)), DataSize: fileSize - 8 - int64(len(js))}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errorf("the header is not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, errorf("bad JSON: %v", err)
		}
		name, _ := tok.(string)
		if seen[name] {
			return nil, errorf("%s is given twice", quote(name))
		}
		seen[name] = true
		if name == MetadataKey {
			if err := dec.Decode(&h.Metadata); err != nil {
				return nil, errorf("%s must be an object of strings: %v", MetadataKey, err)
			}
			continue
		}
		t, err := decodeTensor(dec, name, uint64(h.DataSize))
		if err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, errorf("bad JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errorf("bad JSON: data after the header's object")
	}
	sort.SliceStable(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		return a.Begin < b.Begin || a.Begin == b.Begin && a.End < b.End
	})
	// Sorted by begin, a non-empty tensor overlaps an earlier one exactly
	// when it begins before the furthest end of the non-empty ones
	// before it.
	last := -1
	for i, t := range h.Tensors {
		if t.End == t.Begin {
			continue
		}
		if last >= 0 && t.Begin < h.Tensors[last].End {
			prev := h.Tensors[last]
			return nil, errorf("tensor %s [%d,%d) overlaps tensor %s [%d,%d)", quote(t.Name), t.Begin, t.End, quote(prev.Name), prev.Begin, prev.End)
		}
		if last < 0 || t.End > h.Tensors[last].End {
			last = i
		}
	}
	return h, nil
}

// entry is one tensor as the JSON gives it.
type entry struct {
	DType       *string   `json:"dtype"`
	Shape       *[]uint64 `json:"shape"`
	DataOffsets *[]uint64 `json:"data_offsets"`
}

func decodeTensor(dec *json.Decoder, name string, dataSize uint64) (Tensor, error) {
	var e entry
	// Strict: only the three keys. A Decoder's DisallowUnknownFields
	// applies to every Decode call, so a sub-decoder reads the value.
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return Tensor{}, errorf("tensor %s: bad JSON: %v", quote(name), err)
	}
	sub := json.NewDecoder(bytes.NewReader(raw))
	sub.DisallowUnknownFields()
	if err := sub.Decode(&e); err != nil {
		return Tensor{}, errorf("tensor %s: want an object of dtype, shape and data_offsets: %v", quote(name), err)
	}
	if e.DType == nil || e.Shape == nil || e.DataOffsets == nil {
		return Tensor{}, errorf("tensor %s: want dtype, shape and data_offsets", quote(name))
	}
	if name == "" || !utf8.ValidString(name) {
		return Tensor{}, errorf("tensor name %s: want a non-empty UTF-8 name", quote(name))
	}
	dt, ok := dtypes[*e.DType]
	if !ok {
		return Tensor{}, errorf("tensor %s: unknown dtype %s", quote(name), quote(*e.DType))
	}
	shape := *e.Shape
	if len(shape) > MaxRank {
		return Tensor{}, errorf("tensor %s: rank %d is above %d", quote(name), len(shape), MaxRank)
	}
	n := dt.size
	for _, d := range shape {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 {
			return Tensor{}, errorf("tensor %s: the shape %v of %s overflows", quote(name), shape, *e.DType)
		}
		n = lo
	}
	offs := *e.DataOffsets
	if len(offs) != 2 {
		return Tensor{}, errorf("tensor %s: data_offsets must be [begin, end], got %d values", quote(name), len(offs))
	}
	begin, end := offs[0], offs[1]
	switch {
	case begin > end:
		return Tensor{}, errorf("tensor %s: data_offsets [%d, %d] are reversed", quote(name), begin, end)
	case end > dataSize:
		return Tensor{}, errorf("tensor %s: data_offsets [%d, %d] end beyond the data section's %d bytes", quote(name), begin, end, dataSize)
	case end-begin != n:
		return Tensor{}, errorf("tensor %s: the shape %v of %s needs %d bytes, data_offsets [%d, %d] hold %d", quote(name), shape, *e.DType, n, begin, end, end-begin)
	}
	return Tensor{Name: name, DType: *e.DType, Code: dt.code, Shape: shape, Begin: begin, End: end}, nil
}

// quote quotes a string of the file, cut to 64 bytes.
func quote(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "..."
	}
	return strconv.Quote(s)
}
