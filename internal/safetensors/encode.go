package safetensors

import (
	"encoding/binary"
	"encoding/json"
)

// Data is one tensor to [Encode]: its name, dtype, shape and bytes.
type Data struct {
	Name  string
	DType string
	Shape []uint64
	Bytes []byte
}

// EncodeHeader returns the first bytes of a safetensors file holding
// tensors at the byte ranges they give (Begin, End), with metadata (nil
// for none): the 8-byte length and the JSON, padded with spaces to a
// multiple of 8 bytes as the reference writer does. It checks nothing:
// tests use it to write hostile files too.
func EncodeHeader(tensors []Tensor, metadata map[string]string) []byte {
	obj := map[string]any{}
	if metadata != nil {
		obj[MetadataKey] = metadata
	}
	for _, t := range tensors {
		shape := t.Shape
		if shape == nil {
			shape = []uint64{}
		}
		obj[t.Name] = map[string]any{"dtype": t.DType, "shape": shape, "data_offsets": []uint64{t.Begin, t.End}}
	}
	js, _ := json.Marshal(obj)
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	out := make([]byte, 8, 8+len(js))
	binary.LittleEndian.PutUint64(out, uint64(len(js)))
	return append(out, js...)
}

// Encode returns a whole safetensors file of the tensors, their bytes
// laid out one after another in the order given.
func Encode(list []Data, metadata map[string]string) []byte {
	tensors := make([]Tensor, len(list))
	var off uint64
	for i, d := range list {
		tensors[i] = Tensor{Name: d.Name, DType: d.DType, Shape: d.Shape, Begin: off, End: off + uint64(len(d.Bytes))}
		off += uint64(len(d.Bytes))
	}
	out := EncodeHeader(tensors, metadata)
	for _, d := range list {
		out = append(out, d.Bytes...)
	}
	return out
}
