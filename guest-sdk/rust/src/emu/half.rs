//! Half-precision storage (hw/internal/ops/half.go): conversions with the
//! reference's rounding, bit for bit.

/// `f` rounded to the nearest IEEE half (ties to even): NaN stays NaN
/// (quiet, sign and top payload bits kept), a value over the half range
/// becomes ±Inf, a value under half the smallest subnormal ±0.
pub(crate) fn f32_to_f16(f: f32) -> u16 {
    let b = f.to_bits();
    let sign = ((b >> 16) as u16) & 0x8000;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7fffff;
    if exp == 0xff {
        if man != 0 {
            return sign | 0x7e00 | (man >> 13) as u16;
        }
        return sign | 0x7c00;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        let shift = (14 - e) as u32;
        if shift > 24 || exp == 0 {
            return sign;
        }
        let m = man | 0x800000;
        let mut r = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let halfway = 1u32 << (shift - 1);
        if rem > halfway || (rem == halfway && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut h = (e as u32) << 10 | man >> 13;
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && h & 1 == 1) {
        h += 1; // a carry into the exponent is right, up to Inf
    }
    sign | h as u16
}

/// An IEEE half as float32, exactly.
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let e = ((h >> 10) & 0x1f) as u32;
    let m = (h & 0x3ff) as u32;
    if e == 0 {
        let v = m as f32 * (1.0 / (1u32 << 24) as f32);
        return f32::from_bits(v.to_bits() | sign);
    }
    if e == 0x1f {
        return f32::from_bits(sign | 0x7f800000 | m << 13);
    }
    f32::from_bits(sign | (e + 127 - 15) << 23 | m << 13)
}

/// `f` rounded to the nearest bfloat16 (ties to even); NaN stays NaN.
pub(crate) fn f32_to_bf16(f: f32) -> u16 {
    let mut b = f.to_bits();
    if b & 0x7fffffff > 0x7f800000 {
        return (b >> 16) as u16 | 0x40;
    }
    b = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (b >> 16) as u16
}

/// A bfloat16 as float32, exactly.
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Truncates toward zero, saturating at the int32 range; NaN gives 0.
pub(crate) fn f32_to_i32(f: f32) -> i32 {
    if f.is_nan() {
        0
    } else if f >= 2147483648.0 {
        i32::MAX
    } else if f <= -2147483648.0 {
        i32::MIN
    } else {
        f as i32
    }
}

/// `v` rounded to the nearest bfloat16 in one step.
pub(crate) fn i32_to_bf16(v: i32) -> u16 {
    let (a, sign) = if v < 0 { ((-(v as i64)) as u64, -1f32) } else { (v as u64, 1f32) };
    let n = 64 - a.leading_zeros();
    if n <= 8 {
        return f32_to_bf16(sign * a as f32);
    }
    let shift = n - 8;
    let mut r = a >> shift;
    let rem = a & ((1 << shift) - 1);
    let halfway = 1u64 << (shift - 1);
    if rem > halfway || (rem == halfway && r & 1 == 1) {
        r += 1;
    }
    f32_to_bf16(sign * (r << shift) as f32)
}
