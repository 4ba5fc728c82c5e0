package ops

import (
	"math"
	"math/bits"
)

// F32ToF16 rounds f to the nearest IEEE half (ties to even): NaN stays NaN
// (quiet, sign and top payload bits kept), a value over the half range
// becomes ±Inf, a value under half the smallest subnormal becomes ±0.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// A half subnormal: round M·2^(exp-150) to a multiple of 2^-24.
		shift := uint(14 - e)
		if shift > 24 || exp == 0 {
			return sign
		}
		m := man | 0x800000
		r := m >> shift
		rem := m & (1<<shift - 1)
		halfway := uint32(1) << (shift - 1)
		if rem > halfway || (rem == halfway && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	h := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is right, up to Inf
	}
	return sign | uint16(h)
}

// F16ToF32 converts an IEEE half to float32 exactly.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 0x1f
	m := uint32(h & 0x3ff)
	switch {
	case e == 0:
		// Zero or subnormal: m·2^-24, exact in float32.
		v := float32(m) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(v) | sign)
	case e == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	}
	return math.Float32frombits(sign | (e+127-15)<<23 | m<<13)
}

// F32ToBF16 rounds f to the nearest bfloat16 (ties to even); NaN stays
// NaN (quiet).
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BF16ToF32 converts a bfloat16 to float32 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// f32ToI32 truncates toward zero, saturating at the int32 range; NaN
// gives 0.
func f32ToI32(f float32) int32 {
	switch {
	case f != f:
		return 0
	case f >= 2147483648:
		return math.MaxInt32
	case f <= -2147483648:
		return math.MinInt32
	}
	return int32(f)
}

// i32ToBF16 rounds v to the nearest bfloat16 in one step (through float32
// it would round twice).
func i32ToBF16(v int32) uint16 {
	a := uint64(v)
	sign := float32(1)
	if v < 0 {
		a = uint64(-int64(v))
		sign = -1
	}
	n := bits.Len64(a)
	if n <= 8 {
		return F32ToBF16(sign * float32(a))
	}
	shift := uint(n - 8)
	r := a >> shift
	rem := a & (1<<shift - 1)
	halfway := uint64(1) << (shift - 1)
	if rem > halfway || (rem == halfway && r&1 == 1) {
		r++
	}
	// r·2^shift has at most 9 significant bits and is exact in float32;
	// when r carried to 2^8 it has one.
	return F32ToBF16(sign * float32(r<<shift))
}
