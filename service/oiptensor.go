package service

import (
	"encoding/binary"
	"math"
	"strconv"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
)

// Tensors of the Open Inference Protocol: the JSON data of a request's
// inputs to little-endian bytes, and a stage's output bytes to the JSON
// data of the answer (docs/service.md, "The Open Inference Protocol").

// shapeString writes a shape as the protocol does: [2, 2].
func shapeString(shape []int64) string {
	b := []byte{'['}
	for i, d := range shape {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, d, 10)
	}
	return string(append(b, ']'))
}

// elements returns the product of shape, or false when a dimension is
// negative or the product passes limit.
func elements(shape []int64, limit int64) (int64, bool) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 || d > abi.MaxDim {
			return 0, false
		}
		if d != 0 && n > limit/d {
			return 0, false
		}
		n *= d
	}
	return n, n <= limit
}

// checkShape checks a request's shape against a declared one: the same
// rank, and every fixed dimension equal.
func checkShape(what inputName, got, declared []int64) error {
	if len(got) != len(declared) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: shape %s has rank %d, the model declares %s (rank %d)",
			what, shapeString(got), len(got), shapeString(declared), len(declared))
	}
	for i, d := range got {
		if d < 0 {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: shape %s: dimension %d is negative", what, shapeString(got), i)
		}
		if declared[i] >= 0 && d != declared[i] {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: shape %s: dimension %d is %d, the model declares %s", what, shapeString(got), i, d, shapeString(declared))
		}
	}
	return nil
}

// appendJSONData appends the elements of data, a JSON array (flat or
// nested, row-major) that encoding/json has already found valid, as
// datatype dt's little-endian bytes. It returns the bytes and the count
// of elements; an element that is not a number of dt (a string, null, an
// object, a fraction for an integer type, a value out of range, a
// number for BOOL) is an error naming its index.
func appendJSONData(dst []byte, what inputName, data []byte, dt string) ([]byte, int, error) {
	bad := func(i int, tok []byte, why string) ([]byte, int, error) {
		if len(tok) > 32 {
			tok = append(tok[:32:32], "…"...)
		}
		return nil, 0, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: data[%d]: %s %s", what, i, tok, why)
	}
	i, n := 0, 0
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	if i == len(data) || data[i] != '[' {
		return nil, 0, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: data is not a JSON array", what)
	}
	for i < len(data) {
		c := data[i]
		switch c {
		case '[', ']', ',', ' ', '\t', '\n', '\r':
			i++
			continue
		case '"', '{', 'n':
			j := i + 1
			for j < len(data) && data[j] != ',' && data[j] != ']' {
				j++
			}
			return bad(n, data[i:j], "is not a number")
		}
		j := i
		for j < len(data) && data[j] != ',' && data[j] != ']' && data[j] != ' ' && data[j] != '\n' && data[j] != '\t' && data[j] != '\r' {
			j++
		}
		tok := data[i:j]
		i = j
		s := string(tok)
		switch dt {
		case "BOOL":
			switch s {
			case "true":
				dst = append(dst, 1)
			case "false":
				dst = append(dst, 0)
			default:
				return bad(n, tok, "is not a boolean (true or false)")
			}
		case "FP32", "FP64", "FP16", "BF16":
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				if s == "true" || s == "false" {
					return bad(n, tok, "is not a number")
				}
				return bad(n, tok, "is out of range")
			}
			switch dt {
			case "FP64":
				dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(v))
			case "FP32":
				if math.Abs(v) > math.MaxFloat32 {
					return bad(n, tok, "is out of range for FP32")
				}
				dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(float32(v)))
			case "FP16":
				if math.Abs(v) > 65504 {
					return bad(n, tok, "is out of range for FP16")
				}
				dst = binary.LittleEndian.AppendUint16(dst, f32ToF16(float32(v)))
			default:
				if math.Abs(v) > math.MaxFloat32 {
					return bad(n, tok, "is out of range for BF16")
				}
				dst = binary.LittleEndian.AppendUint16(dst, f32ToBF16(float32(v)))
			}
		default:
			size := abi.DatatypeSize(dt)
			if dt[0] == 'U' {
				v, err := strconv.ParseUint(s, 10, size*8)
				if err != nil {
					return bad(n, tok, "is not an integer of "+dt)
				}
				dst = appendUint(dst, v, size)
			} else {
				v, err := strconv.ParseInt(s, 10, size*8)
				if err != nil {
					return bad(n, tok, "is not an integer of "+dt)
				}
				dst = appendUint(dst, uint64(v), size)
			}
		}
		n++
	}
	return dst, n, nil
}

func appendUint(dst []byte, v uint64, size int) []byte {
	switch size {
	case 1:
		return append(dst, byte(v))
	case 2:
		return binary.LittleEndian.AppendUint16(dst, uint16(v))
	case 4:
		return binary.LittleEndian.AppendUint32(dst, uint32(v))
	}
	return binary.LittleEndian.AppendUint64(dst, v)
}

// appendJSONValues appends the elements of b, little-endian values of
// datatype dt, as a flat JSON array. A value JSON cannot hold (NaN, an
// infinity) is written null.
func appendJSONValues(dst, b []byte, dt string) []byte {
	size := abi.DatatypeSize(dt)
	dst = append(dst, '[')
	for i := 0; i+size <= len(b); i += size {
		if i > 0 {
			dst = append(dst, ',')
		}
		e := b[i : i+size]
		switch dt {
		case "BOOL":
			dst = strconv.AppendBool(dst, e[0] != 0)
		case "FP32":
			dst = appendFloat(dst, float64(math.Float32frombits(binary.LittleEndian.Uint32(e))), 32)
		case "FP64":
			dst = appendFloat(dst, math.Float64frombits(binary.LittleEndian.Uint64(e)), 64)
		case "FP16":
			dst = appendFloat(dst, float64(f16ToF32(binary.LittleEndian.Uint16(e))), 32)
		case "BF16":
			dst = appendFloat(dst, float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(e))<<16)), 32)
		case "UINT8":
			dst = strconv.AppendUint(dst, uint64(e[0]), 10)
		case "UINT16":
			dst = strconv.AppendUint(dst, uint64(binary.LittleEndian.Uint16(e)), 10)
		case "UINT32":
			dst = strconv.AppendUint(dst, uint64(binary.LittleEndian.Uint32(e)), 10)
		case "UINT64":
			dst = strconv.AppendUint(dst, binary.LittleEndian.Uint64(e), 10)
		case "INT8":
			dst = strconv.AppendInt(dst, int64(int8(e[0])), 10)
		case "INT16":
			dst = strconv.AppendInt(dst, int64(int16(binary.LittleEndian.Uint16(e))), 10)
		case "INT32":
			dst = strconv.AppendInt(dst, int64(int32(binary.LittleEndian.Uint32(e))), 10)
		case "INT64":
			dst = strconv.AppendInt(dst, int64(binary.LittleEndian.Uint64(e)), 10)
		}
	}
	return append(dst, ']')
}

func appendFloat(dst []byte, v float64, bits int) []byte {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return append(dst, "null"...)
	}
	return strconv.AppendFloat(dst, v, 'g', -1, bits)
}

// f32ToF16 rounds f to the nearest IEEE 754 half (ties to even).
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	mant := b & 0x7fffff
	if (b>>23)&0xff == 0xff {
		if mant != 0 {
			return sign | 0x7e00 // NaN
		}
		return sign | 0x7c00
	}
	exp := int((b>>23)&0xff) - 127 + 15
	if exp >= 0x1f {
		return sign | 0x7c00
	}
	if exp <= 0 { // a subnormal half, or zero
		if exp < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint(14 - exp)
		r := mant >> shift
		rem, half := mant&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || rem == half && r&1 == 1 {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(exp)<<10 | mant>>13
	if rem := mant & 0x1fff; rem > 0x1000 || rem == 0x1000 && r&1 == 1 {
		r++ // a carry into the exponent is right, up to infinity
	}
	return sign | uint16(r)
}

// f16ToF32 widens an IEEE 754 half.
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case 0:
		f := float32(mant) / (1 << 24)
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// f32ToBF16 rounds f to the nearest bfloat16 (ties to even).
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40 // NaN stays NaN
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// tensorBytes is the size of a tensor of datatype dt and shape, with
// limit as in elements.
func tensorBytes(dt string, shape []int64, limit int64) (int64, bool) {
	size := int64(abi.DatatypeSize(dt))
	n, ok := elements(shape, limit/max(size, 1))
	return n * size, ok
}

// splitOutputs cuts a stage's output into the declared outputs, in
// order: a fixed output takes its size, and the one output with a free
// dimension, if any, the rest (the dimension is what the rest divides
// into). It returns each output's shape, offset and size.
func splitOutputs(out []byte, decl []abi.TensorSpec) ([][]int64, []int, error) {
	fail := func(format string, args ...any) ([][]int64, []int, error) {
		return nil, nil, errdefs.Errorf(errdefs.ErrFault, format, args...)
	}
	shapes := make([][]int64, len(decl))
	offs := make([]int, len(decl)+1)
	free, fixed := -1, int64(0)
	for i, t := range decl {
		frees := 0
		for _, d := range t.Shape {
			if d < 0 {
				frees++
			}
		}
		switch {
		case frees > 1 || frees == 1 && free >= 0:
			return fail("output %q: the declared outputs have more than one free dimension: the stage's output of %d bytes cannot be split", t.Name, len(out))
		case frees == 1:
			free = i
		default:
			n, _ := tensorBytes(t.Datatype, t.Shape, math.MaxInt64)
			fixed += n
		}
	}
	rest := int64(len(out)) - fixed
	off := 0
	for i, t := range decl {
		shapes[i] = t.Shape
		n, _ := tensorBytes(t.Datatype, t.Shape, math.MaxInt64)
		if i == free {
			unit := int64(abi.DatatypeSize(t.Datatype))
			for _, d := range t.Shape {
				if d >= 0 {
					unit *= d
				}
			}
			if rest < 0 || unit == 0 || rest%unit != 0 {
				return fail("output %q: the stage's output of %d bytes leaves %d bytes for it, not a multiple of %d (its shape %s without the free dimension)",
					t.Name, len(out), max(rest, 0), unit, shapeString(t.Shape))
			}
			shape := append([]int64(nil), t.Shape...)
			for j, d := range shape {
				if d < 0 {
					shape[j] = rest / unit
				}
			}
			shapes[i], n = shape, rest
		}
		if int64(len(out)-off) < n {
			return fail("output %q: the stage's output of %d bytes has %d left for it, which needs %d (%s %s)", t.Name, len(out), len(out)-off, n, t.Datatype, shapeString(t.Shape))
		}
		off += int(n)
		offs[i+1] = off
	}
	if off != len(out) {
		return fail("output %q: the stage's output of %d bytes has %d bytes after it, the last declared output", decl[len(decl)-1].Name, len(out), len(out)-off)
	}
	return shapes, offs, nil
}

// oipErrorf is a 400 of the protocol's validation.
func oipErrorf(format string, args ...any) error {
	return errdefs.Errorf(errdefs.ErrInvalidArgument, format, args...)
}
