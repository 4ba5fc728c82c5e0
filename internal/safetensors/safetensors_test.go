package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
)

func header(js string, data int) []byte {
	out := make([]byte, 8, 8+len(js)+data)
	binary.LittleEndian.PutUint64(out, uint64(len(js)))
	out = append(out, js...)
	return append(out, make([]byte, data)...)
}

func read(file []byte) (*Header, error) {
	return ReadHeader(bytes.NewReader(file), int64(len(file)))
}

func TestReadHeader(t *testing.T) {
	f32 := make([]byte, 24)
	file := Encode([]Data{
		{Name: "w", DType: "F32", Shape: []uint64{2, 3}, Bytes: f32},
		{Name: "b", DType: "BF16", Shape: []uint64{4}, Bytes: make([]byte, 8)},
		{Name: "ids", DType: "I64", Shape: []uint64{1}, Bytes: make([]byte, 8)},
		{Name: "empty", DType: "F16", Shape: []uint64{0, 5}, Bytes: nil},
	}, map[string]string{"format": "pt"})
	h, err := read(file)
	if err != nil {
		t.Fatal(err)
	}
	if h.DataSize != 40 || h.DataOffset != int64(len(file))-40 || h.Metadata["format"] != "pt" {
		t.Fatalf("header %+v", h)
	}
	w, ok := h.Tensor("w")
	if !ok || w.Code != F32 || w.Begin != 0 || w.End != 24 || len(w.Shape) != 2 {
		t.Fatalf("w = %+v", w)
	}
	if b, _ := h.Tensor("b"); b.Code != BF16 || b.Begin != 24 {
		t.Fatalf("b = %+v", b)
	}
	if ids, _ := h.Tensor("ids"); ids.Code != I64 {
		t.Fatalf("ids = %+v", ids)
	}
}

// TestHostileHeaders: every hostile header is refused, as
// InvalidArgument, with a message that says why, and none makes the
// reader allocate more than the file holds.
func TestHostileHeaders(t *testing.T) {
	huge := make([]byte, 16)
	binary.LittleEndian.PutUint64(huge, 1<<62)
	overLimit := make([]byte, 16)
	binary.LittleEndian.PutUint64(overLimit, MaxHeader+1)
	beyond := make([]byte, 16)
	binary.LittleEndian.PutUint64(beyond, 9)
	deep := `{"t":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}`
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"short", []byte{1, 2, 3}, "too short"},
		{"huge length", huge, "above the limit"},
		{"over the limit", overLimit, "above the limit"},
		{"beyond the file", beyond, "beyond the file"},
		{"not json", header("{nope", 0), "bad JSON"},
		{"array", header("[1,2]", 0), "not a JSON object"},
		{"truncated", header(`{"a":{"dtype":"F32"`, 0), "bad JSON"},
		{"trailing data", header(`{} {}`, 0), "data after"},
		{"unknown dtype", header(`{"t":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}`, 16), "unknown dtype"},
		{"missing key", header(`{"t":{"dtype":"F32","shape":[1]}}`, 4), "want dtype, shape and data_offsets"},
		{"extra key", header(`{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}`, 4), "unknown field"},
		{"rank 9", header(deep, 1), "rank 9"},
		{"overflow", header(`{"t":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, 8), "overflows"},
		{"overflow by size", header(`{"t":{"dtype":"F64","shape":[2305843009213693952,8],"data_offsets":[0,8]}}`, 8), "overflows"},
		{"negative dim", header(`{"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4), "want an object"},
		{"shape mismatch", header(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 8), "needs 8 bytes"},
		{"reversed", header(`{"t":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, 4), "reversed"},
		{"out of file", header(`{"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}`, 4), "beyond the data section"},
		{"offsets arity", header(`{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`, 4), "[begin, end]"},
		{"overlap", header(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}`, 8), "overlaps"},
		{"overlap past an empty one", header(`{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[5,7]}}`, 8), "overlaps"},
		{"duplicate", header(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), "given twice"},
		{"bad metadata", header(`{"__metadata__":{"a":1}}`, 0), "object of strings"},
		{"empty name", header(`{"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1), "non-empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := read(c.file)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want InvalidArgument with %q", err, c.want)
			}
		})
	}
}

// TestNoLargeAllocation: a header that claims 100 MiB in a file of a few
// bytes is refused before the reader allocates anything of that size.
func TestNoLargeAllocation(t *testing.T) {
	file := make([]byte, 16)
	binary.LittleEndian.PutUint64(file, MaxHeader)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		if _, err := read(file); err == nil {
			t.Fatal("accepted")
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("10 refused headers allocated %d bytes", grew)
	}
}

func FuzzSafetensorsHeader(f *testing.F) {
	f.Add(Encode([]Data{{Name: "w", DType: "F32", Shape: []uint64{2}, Bytes: make([]byte, 8)}}, nil))
	f.Add(header(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}`, 8))
	f.Add(header(`{"__metadata__":{"k":"v"}}`, 0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, file []byte) {
		h, err := read(file)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error of another class: %v", err)
			}
			return
		}
		// What is accepted is consistent: in the data section, disjoint,
		// and sized by its shape.
		var end uint64
		for _, tn := range h.Tensors {
			if tn.End > uint64(h.DataSize) || tn.Begin > tn.End || len(tn.Shape) > MaxRank {
				t.Fatalf("accepted %+v in %d data bytes", tn, h.DataSize)
			}
			if tn.End > tn.Begin {
				if tn.Begin < end {
					t.Fatalf("accepted an overlap at %+v", tn)
				}
				end = tn.End
			}
		}
	})
}
