//! The emulator's kernels: the simulator's built-in kernels (hw/sim) and a
//! float32 subset of the op library (hw/internal/ops), written again from
//! the Go reference so that results are the simulator's bit for bit
//! (float32 arithmetic in the same order, never fused; the bounded ops
//! compute in float64 and round once, as the simulator does).

use std::string::{String, ToString};
use std::vec::Vec;

use super::host::LArg;
use super::{Kernel, ProgramDef};

/// One argument of a launch, as a kernel sees it.
#[derive(Clone, Debug)]
pub struct KArg {
    /// The bytes of a buffer range (a copy the kernel may modify: the
    /// emulator writes back what changed; a vendor kernel's copies follow
    /// the host's rules instead, see [`super::Emulator::vendor_kernel`]),
    /// or `None` for a scalar.
    pub bytes: Option<Vec<u8>>,
    /// The range's byte offset in its buffer.
    pub offset: usize,
    /// The scalar (0 for a buffer).
    pub value: u64,
    /// The range's emulated device address (0 for a scalar): ranges of
    /// one buffer overlap when their addresses do.
    pub(crate) addr: u64,
    /// The storage type of a buffer argument's values: 0 f32, 1 f16, 2
    /// bf16, 3 i32, 4 bytes (cast's, which decodes them itself).
    pub(crate) dtype: u8,
}

impl KArg {
    /// The scalar's low 32 bits as a float32.
    pub fn f32(&self) -> f32 {
        f32::from_bits(self.value as u32)
    }
}

/// The names of the natively emulated kernels, sorted.
pub fn builtins() -> Vec<String> {
    let mut v: Vec<String> = BUILTINS.iter().map(|(n, _)| n.to_string()).chain(OPS.iter().map(|o| o.name.to_string())).collect();
    for o in OPS.iter().filter(|o| o.half) {
        for t in [".f16", ".bf16"] {
            v.push(match o.name.strip_suffix(".fast") {
                Some(b) => std::format!("{}{}.fast", b, t),
                None => std::format!("{}{}", o.name, t),
            });
        }
    }
    v.sort_unstable();
    v
}

pub(crate) fn lookup(name: &str) -> Option<ProgramDef> {
    if let Some((n, k)) = BUILTINS.iter().find(|(n, _)| *n == name) {
        return Some(ProgramDef { name: n.to_string(), kernel: *k, op: None, dtype: 0, vendor: None });
    }
    // OP, OP.f16 or OP.bf16 (then .fast for the ops that have it).
    let (base, dtype) = if let Some(i) = name.find(".f16") {
        (std::format!("{}{}", &name[..i], &name[i + 4..]), 1)
    } else if let Some(i) = name.find(".bf16") {
        (std::format!("{}{}", &name[..i], &name[i + 5..]), 2)
    } else {
        (name.to_string(), 0)
    };
    let op = OPS.iter().find(|o| o.name == base && (dtype == 0 || o.half))?;
    Some(ProgramDef { name: name.to_string(), kernel: op.run, op: Some(op), dtype, vendor: None })
}

const BUILTINS: &[(&str, Kernel)] = &[
    ("noop", |_| Ok(())),
    ("fill", k_fill),
    ("copy", k_copy),
    ("saxpy", k_saxpy),
    ("matmul", k_matmul),
    ("bias", k_bias),
    ("relu", k_relu),
    ("argmax", k_argmax),
    ("mlp_forward", k_mlp_forward),
];

fn want(name: &str, a: &[KArg], n: usize) -> Result<(), String> {
    if a.len() != n {
        return Err(std::format!("kernel {:?} takes {} arguments, got {}", name, n, a.len()));
    }
    Ok(())
}

fn scalar(name: &str, a: &[KArg], i: usize) -> Result<u64, String> {
    if a[i].bytes.is_some() {
        return Err(std::format!("kernel {:?}: argument {} is a buffer, not a scalar", name, i));
    }
    Ok(a[i].value)
}

fn floats(name: &str, a: &[KArg], i: usize) -> Result<Vec<f32>, String> {
    let b = match &a[i].bytes {
        Some(b) => b,
        None => return Err(std::format!("kernel {:?}: argument {} is a scalar, not a buffer", name, i)),
    };
    if b.len() % 4 != 0 {
        return Err(std::format!("kernel {:?}: argument {}: {} bytes is not a whole number of float32", name, i, b.len()));
    }
    if !b.is_empty() && a[i].offset % 4 != 0 {
        return Err(std::format!("kernel {:?}: argument {}: offset {} is not 4-byte aligned", name, i, a[i].offset));
    }
    Ok(crate::f32s(b))
}

/// Stores `v` into buffer argument i in its storage type.
fn store(a: &mut [KArg], i: usize, v: &[f32]) {
    let b = match a[i].dtype {
        1 => v.iter().flat_map(|&x| super::half::f32_to_f16(x).to_le_bytes()).collect(),
        2 => v.iter().flat_map(|&x| super::half::f32_to_bf16(x).to_le_bytes()).collect(),
        _ => crate::f32_bytes(v),
    };
    a[i].bytes = Some(b);
}

fn k_fill(a: &mut [KArg]) -> Result<(), String> {
    want("fill", a, 2)?;
    let x = floats("fill", a, 0)?;
    let v = f32::from_bits(scalar("fill", a, 1)? as u32);
    store(a, 0, &std::vec![v; x.len()]);
    Ok(())
}

fn k_copy(a: &mut [KArg]) -> Result<(), String> {
    want("copy", a, 2)?;
    let (d, s) = match (&a[0].bytes, &a[1].bytes) {
        (Some(d), Some(s)) => (d.len(), s.clone()),
        (None, _) => return Err("kernel \"copy\": argument 0 is a scalar, not a buffer".into()),
        _ => return Err("kernel \"copy\": argument 1 is a scalar, not a buffer".into()),
    };
    if d != s.len() {
        return Err(std::format!("copy: dst has {} bytes, src {}", d, s.len()));
    }
    a[0].bytes = Some(s);
    Ok(())
}

fn k_saxpy(a: &mut [KArg]) -> Result<(), String> {
    want("saxpy", a, 3)?;
    let k = f32::from_bits(scalar("saxpy", a, 0)? as u32);
    let x = floats("saxpy", a, 1)?;
    let mut y = floats("saxpy", a, 2)?;
    if x.len() != y.len() {
        return Err(std::format!("saxpy: x has {} values, y {}", x.len(), y.len()));
    }
    for i in 0..y.len() {
        y[i] += k * x[i]; // Rust never fuses: the product is rounded first
    }
    store(a, 2, &y);
    Ok(())
}

fn product(a: u64, b: u64) -> Option<usize> {
    let p = (a as u128) * (b as u128);
    if p > i32::MAX as u128 {
        None
    } else {
        Some(p as usize)
    }
}

fn k_matmul(a: &mut [KArg]) -> Result<(), String> {
    want("matmul", a, 6)?;
    let m = scalar("matmul", a, 3)?;
    let n = scalar("matmul", a, 4)?;
    let k = scalar("matmul", a, 5)?;
    let x = floats("matmul", a, 0)?;
    let y = floats("matmul", a, 1)?;
    let mut c = floats("matmul", a, 2)?;
    let (mk, kn, mn) = match (product(m, k), product(k, n), product(m, n)) {
        (Some(a), Some(b), Some(c)) => (a, b, c),
        _ => return Err(std::format!("matmul: dimensions M={} N={} K={} too large", m, n, k)),
    };
    if x.len() != mk || y.len() != kn || c.len() != mn {
        return Err(std::format!(
            "matmul: M={} N={} K={} want A, B, C of {}, {}, {} values; got {}, {}, {}",
            m,
            n,
            k,
            mk,
            kn,
            mn,
            x.len(),
            y.len(),
            c.len()
        ));
    }
    let (m, n, k) = (m as usize, n as usize, k as usize);
    for i in 0..m {
        for j in 0..n {
            let mut sum = 0f32;
            for p in 0..k {
                sum += x[i * k + p] * y[p * n + j];
            }
            c[i * n + j] = sum;
        }
    }
    store(a, 2, &c);
    Ok(())
}

fn k_bias(a: &mut [KArg]) -> Result<(), String> {
    want("bias", a, 4)?;
    let m = scalar("bias", a, 2)?;
    let n = scalar("bias", a, 3)?;
    let mut x = floats("bias", a, 0)?;
    let b = floats("bias", a, 1)?;
    match product(m, n) {
        Some(mn) if x.len() == mn && b.len() as u64 == n => {}
        _ => {
            return Err(std::format!(
                "bias: M={} N={} want x of M*N and b of N values; got {} and {}",
                m,
                n,
                x.len(),
                b.len()
            ))
        }
    }
    let n = n as usize;
    for i in 0..x.len() {
        x[i] += b[i % n];
    }
    store(a, 0, &x);
    Ok(())
}

fn k_relu(a: &mut [KArg]) -> Result<(), String> {
    want("relu", a, 1)?;
    let mut x = floats("relu", a, 0)?;
    for v in x.iter_mut() {
        if *v < 0.0 {
            *v = 0.0;
        }
    }
    store(a, 0, &x);
    Ok(())
}

fn k_argmax(a: &mut [KArg]) -> Result<(), String> {
    want("argmax", a, 2)?;
    let x = floats("argmax", a, 0)?;
    let out = match &a[1].bytes {
        Some(b) => b.clone(),
        None => return Err("kernel \"argmax\": argument 1 is a scalar, not a buffer".into()),
    };
    if x.is_empty() {
        return Err("argmax: x is empty".into());
    }
    if out.len() < 8 {
        return Err(std::format!("argmax: out has {} bytes, want at least 8", out.len()));
    }
    let (mut best, mut best_v) = (0usize, x[0]);
    for (i, &v) in x.iter().enumerate().skip(1) {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    let mut o = out;
    o[0..4].copy_from_slice(&(best as u32).to_le_bytes());
    o[4..8].copy_from_slice(&best_v.to_bits().to_le_bytes());
    a[1].bytes = Some(o);
    Ok(())
}

/// The most hidden units and classes mlp_forward takes.
const MLP_MAX_WIDTH: u64 = 1024;

/// mlp_forward(x, W1, b1, W2, b2, scores, out, I, H, C): a two-layer
/// perceptron on one input row, bit for bit what matmul, bias, relu,
/// matmul, bias and argmax write (the simulator's kernel).
fn k_mlp_forward(a: &mut [KArg]) -> Result<(), String> {
    let name = "mlp_forward";
    want(name, a, 10)?;
    let (i_, h_, c_) = (scalar(name, a, 7)?, scalar(name, a, 8)?, scalar(name, a, 9)?);
    if i_ == 0 || i_ > i32::MAX as u64 || h_ == 0 || h_ > MLP_MAX_WIDTH || c_ == 0 || c_ > MLP_MAX_WIDTH {
        return Err(std::format!(
            "mlp_forward: I={} H={} C={}: want I ≥ 1 and 1 ≤ H, C ≤ {}",
            i_, h_, c_, MLP_MAX_WIDTH
        ));
    }
    let want_len = [i_, i_ * h_, h_, h_ * c_, c_, c_];
    let mut v: Vec<Vec<f32>> = Vec::with_capacity(6);
    for (i, &w) in want_len.iter().enumerate() {
        let f = floats(name, a, i)?;
        if f.len() as u64 != w {
            return Err(std::format!(
                "mlp_forward: I={} H={} C={}: argument {} has {} values, want {}",
                i_,
                h_,
                c_,
                i,
                f.len(),
                w
            ));
        }
        v.push(f);
    }
    let out_len = match &a[6].bytes {
        Some(b) => b.len(),
        None => return Err("kernel \"mlp_forward\": argument 6 is a scalar, not a buffer".into()),
    };
    if out_len < 8 {
        return Err(std::format!("mlp_forward: argument 6 has {} bytes, want at least 8 (index, max)", out_len));
    }
    let len = |k: &KArg| k.bytes.as_ref().map_or(0, |b| b.len() as u64);
    for o in [5usize, 6] {
        for i in 0..7 {
            let (x, y) = (&a[o], &a[i]);
            if i != o && len(x) > 0 && len(y) > 0 && x.addr < y.addr + len(y) && y.addr < x.addr + len(x) {
                return Err(std::format!("mlp_forward: argument {} (an output) overlaps argument {}", o, i));
            }
        }
    }
    let (nh, nc) = (h_ as usize, c_ as usize);
    let (x, w1, b1, w2, b2) = (&v[0], &v[1], &v[2], &v[3], &v[4]);
    let mut h = std::vec![0f32; nh];
    for (j, hj) in h.iter_mut().enumerate() {
        let mut sum = 0f32;
        for (k, xv) in x.iter().enumerate() {
            sum += xv * w1[k * nh + j];
        }
        sum += b1[j];
        *hj = if sum < 0.0 { 0.0 } else { sum };
    }
    let mut scores = std::vec![0f32; nc];
    for (j, sj) in scores.iter_mut().enumerate() {
        let mut sum = 0f32;
        for (k, hv) in h.iter().enumerate() {
            sum += hv * w2[k * nc + j];
        }
        *sj = sum + b2[j];
    }
    let (mut best, mut best_v) = (0usize, scores[0]);
    for (i, &s) in scores.iter().enumerate().skip(1) {
        if s > best_v {
            best = i;
            best_v = s;
        }
    }
    store(a, 5, &scores);
    let out = a[6].bytes.as_mut().expect("checked above");
    out[0..4].copy_from_slice(&(best as u32).to_le_bytes());
    out[4..8].copy_from_slice(&best_v.to_bits().to_le_bytes());
    Ok(())
}

// The op library (float32 storage).

const MAX_ELEMS: u64 = i32::MAX as u64;
const LANES: usize = 256;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    Unary,
    Binary,
    Reduce,
    Softmax,
    Norm,
    Transpose,
    Gemm,
    Gather,
    Conv,
    Pool,
    Cast,
}

/// One op: its arguments (name, 'b' buffer of type, or 's' scalar of
/// type), its check and its reference.
pub(crate) struct OpDef {
    pub name: &'static str,
    args: &'static [(&'static str, char, &'static str)],
    check: Check,
    pub run: Kernel,
    /// The op has .f16 and .bf16 variants: its "f32" buffer arguments are
    /// then of the variant's storage type.
    half: bool,
}

const UNARY_ARGS: &[(&str, char, &str)] = &[("x", 'b', "f32"), ("y", 'b', "f32")];
const BINARY_ARGS: &[(&str, char, &str)] = &[
    ("a", 'b', "f32"),
    ("b", 'b', "f32"),
    ("c", 'b', "f32"),
    ("a0", 's', "u32"),
    ("a1", 's', "u32"),
    ("a2", 's', "u32"),
    ("a3", 's', "u32"),
    ("b0", 's', "u32"),
    ("b1", 's', "u32"),
    ("b2", 's', "u32"),
    ("b3", 's', "u32"),
];
const REDUCE_ARGS: &[(&str, char, &str)] =
    &[("x", 'b', "f32"), ("y", 'b', "f32"), ("outer", 's', "u32"), ("n", 's', "u32"), ("inner", 's', "u32")];
const ARGMAX_ARGS: &[(&str, char, &str)] =
    &[("x", 'b', "f32"), ("y", 'b', "i32"), ("outer", 's', "u32"), ("n", 's', "u32"), ("inner", 's', "u32")];
const SOFTMAX_ARGS: &[(&str, char, &str)] =
    &[("x", 'b', "f32"), ("y", 'b', "f32"), ("rows", 's', "u32"), ("cols", 's', "u32"), ("causal", 's', "u32")];
const AFFINE_ARGS: &[(&str, char, &str)] = &[("x", 'b', "f32"), ("y", 'b', "f32"), ("a", 's', "f32"), ("b", 's', "f32")];
const LAYERNORM_ARGS: &[(&str, char, &str)] = &[
    ("x", 'b', "f32"),
    ("gamma", 'b', "f32"),
    ("beta", 'b', "f32"),
    ("y", 'b', "f32"),
    ("rows", 's', "u32"),
    ("cols", 's', "u32"),
    ("eps", 's', "f32"),
];
const RMSNORM_ARGS: &[(&str, char, &str)] =
    &[("x", 'b', "f32"), ("gamma", 'b', "f32"), ("y", 'b', "f32"), ("rows", 's', "u32"), ("cols", 's', "u32"), ("eps", 's', "f32")];
const TRANSPOSE_ARGS: &[(&str, char, &str)] = &[
    ("x", 'b', "f32"),
    ("y", 'b', "f32"),
    ("d0", 's', "u32"),
    ("d1", 's', "u32"),
    ("d2", 's', "u32"),
    ("d3", 's', "u32"),
    ("p0", 's', "u32"),
    ("p1", 's', "u32"),
    ("p2", 's', "u32"),
    ("p3", 's', "u32"),
];
const GEMM_ARGS: &[(&str, char, &str)] = &[
    ("A", 'b', "f32"),
    ("B", 'b', "f32"),
    ("C", 'b', "f32"),
    ("M", 's', "u32"),
    ("N", 's', "u32"),
    ("K", 's', "u32"),
    ("transA", 's', "u32"),
    ("transB", 's', "u32"),
    ("alpha", 's', "f32"),
    ("beta", 's', "f32"),
    ("batch", 's', "u32"),
    ("strideA", 's', "u32"),
    ("strideB", 's', "u32"),
    ("strideC", 's', "u32"),
];
const CONV_ARGS: &[(&str, char, &str)] = &[
    ("x", 'b', "f32"),
    ("w", 'b', "f32"),
    ("bias", 'b', "f32"),
    ("y", 'b', "f32"),
    ("N", 's', "u32"),
    ("C", 's', "u32"),
    ("H", 's', "u32"),
    ("W", 's', "u32"),
    ("K", 's', "u32"),
    ("R", 's', "u32"),
    ("S", 's', "u32"),
    ("stride", 's', "u64"),
    ("pad", 's', "u64"),
    ("dil", 's', "u64"),
    ("groups", 's', "u32"),
];
const POOL_ARGS: &[(&str, char, &str)] = &[
    ("x", 'b', "f32"),
    ("y", 'b', "f32"),
    ("N", 's', "u32"),
    ("C", 's', "u32"),
    ("H", 's', "u32"),
    ("W", 's', "u32"),
    ("R", 's', "u32"),
    ("S", 's', "u32"),
    ("stride", 's', "u64"),
    ("pad", 's', "u64"),
];
const CAST_ARGS: &[(&str, char, &str)] = &[("x", 'b', "bytes"), ("y", 'b', "bytes"), ("from", 's', "u32"), ("to", 's', "u32")];
const GATHER_ARGS: &[(&str, char, &str)] =
    &[("table", 'b', "f32"), ("idx", 'b', "i32"), ("out", 'b', "f32"), ("rows", 's', "u32"), ("cols", 's', "u32")];

macro_rules! unary {
    ($name:expr, $f:expr) => {
        OpDef {
            name: $name,
            args: UNARY_ARGS,
            check: Check::Unary,
            half: true,
            run: |a| {
                let f: fn(f32) -> f32 = $f;
                let x = loadv(a, 0);
                let y: Vec<f32> = x.iter().map(|&v| f(v)).collect();
                store(a, 1, &y);
                Ok(())
            },
        }
    };
}

macro_rules! binary {
    ($name:expr, $f:expr) => {
        OpDef {
            name: $name,
            args: BINARY_ARGS,
            check: Check::Binary,
            half: true,
            run: |a| {
                let f: fn(f32, f32) -> f32 = $f;
                run_binary(a, f);
                Ok(())
            },
        }
    };
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// gelu_tanh as the op library computes it: x·sigmoid(2u) with
/// u = √(2/π)(x + 0.044715x³), in float64 rounded once; -Inf gives -0.
fn gelu_tanh(x: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        return -0.0;
    }
    let v = x as f64;
    let u = (2.0 / core::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
    (v * sigmoid64(2.0 * u)) as f32
}

/// gelu_erf as the op library computes it: 0.5x·erfc(-x/√2), in float64
/// rounded once; -Inf gives -0.
fn gelu_erf(x: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        return -0.0;
    }
    let v = x as f64;
    (0.5 * v * super::erf::erfc(-v / core::f64::consts::SQRT_2)) as f32
}

fn fmax(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a > b {
        a
    } else if b > a {
        b
    } else if a.is_sign_negative() {
        b
    } else {
        a
    }
}

fn fmin(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a < b {
        a
    } else if b < a {
        b
    } else if a.is_sign_negative() {
        a
    } else {
        b
    }
}

fn fsqrt(x: f32) -> f32 {
    (x as f64).sqrt() as f32
}

static OPS: &[OpDef] = &[
    unary!("exp", |x| (x as f64).exp() as f32),
    unary!("log", |x| (x as f64).ln() as f32),
    unary!("tanh", |x| (x as f64).tanh() as f32),
    unary!("sigmoid", |x| sigmoid64(x as f64) as f32),
    unary!("silu", |x| {
        if x == f32::NEG_INFINITY {
            -0.0
        } else {
            let v = x as f64;
            (v * sigmoid64(v)) as f32
        }
    }),
    unary!("gelu_tanh", gelu_tanh),
    unary!("gelu_erf", gelu_erf),
    unary!("sqrt", fsqrt),
    unary!("rsqrt", |x| 1.0 / fsqrt(x)),
    unary!("neg", |x| f32::from_bits(x.to_bits() ^ 0x8000_0000)),
    unary!("abs", |x| f32::from_bits(x.to_bits() & !0x8000_0000)),
    OpDef {
        name: "affine",
        args: AFFINE_ARGS,
        check: Check::Unary,
        half: true,
        run: |a| {
            let (k, b) = (a[2].f32(), a[3].f32());
            let x = loadv(a, 0);
            let y: Vec<f32> = x.iter().map(|&v| k * v + b).collect();
            store(a, 1, &y);
            Ok(())
        },
    },
    binary!("add", |a, b| a + b),
    binary!("sub", |a, b| a - b),
    binary!("mul", |a, b| a * b),
    binary!("div", |a, b| a / b),
    binary!("max", fmax),
    binary!("min", fmin),
    OpDef { name: "reduce_sum", args: REDUCE_ARGS, check: Check::Reduce, run: |a| run_reduce(a, 0), half: true },
    OpDef { name: "reduce_mean", args: REDUCE_ARGS, check: Check::Reduce, run: |a| run_reduce(a, 1), half: true },
    OpDef { name: "reduce_max", args: REDUCE_ARGS, check: Check::Reduce, run: |a| run_reduce(a, 2), half: true },
    OpDef { name: "reduce_argmax", args: ARGMAX_ARGS, check: Check::Reduce, run: run_argmax, half: true },
    OpDef { name: "softmax", args: SOFTMAX_ARGS, check: Check::Softmax, run: |a| run_softmax(a, false), half: true },
    OpDef { name: "log_softmax", args: SOFTMAX_ARGS, check: Check::Softmax, run: |a| run_softmax(a, true), half: true },
    OpDef { name: "layernorm", args: LAYERNORM_ARGS, check: Check::Norm, run: run_layernorm, half: true },
    OpDef { name: "rmsnorm", args: RMSNORM_ARGS, check: Check::Norm, run: run_rmsnorm, half: true },
    OpDef { name: "transpose", args: TRANSPOSE_ARGS, check: Check::Transpose, run: run_transpose, half: true },
    OpDef { name: "gemm", args: GEMM_ARGS, check: Check::Gemm, run: run_gemm, half: true },
    OpDef { name: "gemm.fast", args: GEMM_ARGS, check: Check::Gemm, run: run_gemm, half: true },
    OpDef { name: "gather", args: GATHER_ARGS, check: Check::Gather, run: run_gather, half: false },
    OpDef { name: "conv2d", args: CONV_ARGS, check: Check::Conv, run: run_conv, half: false },
    OpDef { name: "conv2d.fast", args: CONV_ARGS, check: Check::Conv, run: run_conv, half: false },
    OpDef { name: "maxpool2d", args: POOL_ARGS, check: Check::Pool, run: |a| run_pool(a, true), half: false },
    OpDef { name: "avgpool2d", args: POOL_ARGS, check: Check::Pool, run: |a| run_pool(a, false), half: false },
    OpDef { name: "cast", args: CAST_ARGS, check: Check::Cast, run: run_cast, half: false },
];

fn dsize(t: u64) -> usize {
    if t == 1 || t == 2 {
        2
    } else {
        4
    }
}

fn run_cast(a: &mut [KArg]) -> Result<(), String> {
    use super::half::*;
    let (from, to) = (a[2].value, a[3].value);
    let x = a[0].bytes.clone().unwrap_or_default();
    let mut out = std::vec![0u8; a[1].bytes.as_ref().map_or(0, |b| b.len())];
    let n = x.len() / dsize(from);
    for i in 0..n {
        if from == 3 {
            let v = i32::from_le_bytes([x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]]);
            match to {
                3 => out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
                2 => out[2 * i..2 * i + 2].copy_from_slice(&i32_to_bf16(v).to_le_bytes()),
                _ => put_float(&mut out, to, i, v as f32),
            }
            continue;
        }
        let f = match from {
            1 => f16_to_f32(u16::from_le_bytes([x[2 * i], x[2 * i + 1]])),
            2 => bf16_to_f32(u16::from_le_bytes([x[2 * i], x[2 * i + 1]])),
            _ => f32::from_le_bytes([x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]]),
        };
        if to == 3 {
            out[4 * i..4 * i + 4].copy_from_slice(&f32_to_i32(f).to_le_bytes());
            continue;
        }
        put_float(&mut out, to, i, f);
    }
    a[1].bytes = Some(out);
    Ok(())
}

fn put_float(b: &mut [u8], t: u64, i: usize, f: f32) {
    use super::half::*;
    match t {
        1 => b[2 * i..2 * i + 2].copy_from_slice(&f32_to_f16(f).to_le_bytes()),
        2 => b[2 * i..2 * i + 2].copy_from_slice(&f32_to_bf16(f).to_le_bytes()),
        _ => b[4 * i..4 * i + 4].copy_from_slice(&f.to_bits().to_le_bytes()),
    }
}

fn halves(v: u64) -> (u64, u64) {
    (v & 0xFFFF_FFFF, v >> 32)
}

fn run_conv(a: &mut [KArg]) -> Result<(), String> {
    let g = |i: usize| a[i].value as usize;
    let (nn, c, h, w, k, r, s, groups) = (g(4), g(5), g(6), g(7), g(8), g(9), g(10), g(14));
    let (sh, sw) = halves(a[11].value);
    let (ph, pw) = halves(a[12].value);
    let (dh, dw) = halves(a[13].value);
    let (sh, sw, ph, pw, dh, dw) = (sh as i64, sw as i64, ph as i64, pw as i64, dh as i64, dw as i64);
    let p = ((h as i64 + 2 * ph - dh * (r as i64 - 1) - 1) / sh + 1) as usize;
    let q = ((w as i64 + 2 * pw - dw * (s as i64 - 1) - 1) / sw + 1) as usize;
    let (x, wt, bias) = (loadv(a, 0), loadv(a, 1), loadv(a, 2));
    let mut y = std::vec![0f32; nn * k * p * q];
    let (cg, kg) = (c / groups, k / groups);
    for ni in 0..nn {
        for ki in 0..k {
            let c0 = (ki / kg) * cg;
            for pi in 0..p {
                for qi in 0..q {
                    let mut sum = 0f32;
                    for ci in 0..cg {
                        for ri in 0..r {
                            let hi = pi as i64 * sh - ph + ri as i64 * dh;
                            if hi < 0 || hi >= h as i64 {
                                continue;
                            }
                            for si in 0..s {
                                let wi = qi as i64 * sw - pw + si as i64 * dw;
                                if wi < 0 || wi >= w as i64 {
                                    continue;
                                }
                                let xv = x[((ni * c + c0 + ci) * h + hi as usize) * w + wi as usize];
                                let wv = wt[((ki * cg + ci) * r + ri) * s + si];
                                sum += xv * wv;
                            }
                        }
                    }
                    if !bias.is_empty() {
                        sum += bias[ki];
                    }
                    y[((ni * k + ki) * p + pi) * q + qi] = sum;
                }
            }
        }
    }
    store(a, 3, &y);
    Ok(())
}

fn run_pool(a: &mut [KArg], is_max: bool) -> Result<(), String> {
    let g = |i: usize| a[i].value as usize;
    let (nn, c, h, w, r, s) = (g(2), g(3), g(4), g(5), g(6), g(7));
    let (sh, sw) = halves(a[8].value);
    let (ph, pw) = halves(a[9].value);
    let (sh, sw, ph, pw) = (sh as i64, sw as i64, ph as i64, pw as i64);
    let p = ((h as i64 + 2 * ph - r as i64) / sh + 1) as usize;
    let q = ((w as i64 + 2 * pw - s as i64) / sw + 1) as usize;
    let x = loadv(a, 0);
    let mut y = std::vec![0f32; nn * c * p * q];
    for nc in 0..nn * c {
        let plane = &x[nc * h * w..(nc + 1) * h * w];
        for pi in 0..p {
            for qi in 0..q {
                let mut acc = if is_max { f32::NEG_INFINITY } else { 0.0 };
                let mut count = 0;
                for ri in 0..r {
                    let hi = pi as i64 * sh - ph + ri as i64;
                    if hi < 0 || hi >= h as i64 {
                        continue;
                    }
                    for si in 0..s {
                        let wi = qi as i64 * sw - pw + si as i64;
                        if wi < 0 || wi >= w as i64 {
                            continue;
                        }
                        let v = plane[hi as usize * w + wi as usize];
                        acc = if is_max { fmax(acc, v) } else { acc + v };
                        count += 1;
                    }
                }
                if !is_max && count > 0 {
                    acc /= count as f32;
                }
                y[(nc * p + pi) * q + qi] = acc;
            }
        }
    }
    store(a, 1, &y);
    Ok(())
}

fn rsqrt32(v: f32) -> f32 {
    1.0 / fsqrt(v)
}

fn run_layernorm(a: &mut [KArg]) -> Result<(), String> {
    let (rows, cols, eps) = (a[4].value as usize, a[5].value as usize, a[6].f32());
    let (mut x, g, b) = (loadv(a, 0), loadv(a, 1), loadv(a, 2));
    let n = cols as f32;
    let mut d = std::vec![0f32; cols];
    for r in 0..rows {
        let row = &mut x[r * cols..(r + 1) * cols];
        let mean = tree_sum(cols, |j| row[j]) / n;
        for j in 0..cols {
            d[j] = row[j] - mean;
        }
        let variance = tree_sum(cols, |j| d[j] * d[j]) / n;
        let inv = rsqrt32(variance + eps);
        for j in 0..cols {
            row[j] = (d[j] * inv) * g[j] + b[j];
        }
    }
    store(a, 3, &x);
    Ok(())
}

fn run_rmsnorm(a: &mut [KArg]) -> Result<(), String> {
    let (rows, cols, eps) = (a[3].value as usize, a[4].value as usize, a[5].f32());
    let (mut x, g) = (loadv(a, 0), loadv(a, 1));
    let n = cols as f32;
    for r in 0..rows {
        let row = &mut x[r * cols..(r + 1) * cols];
        let ms = tree_sum(cols, |j| row[j] * row[j]) / n;
        let inv = rsqrt32(ms + eps);
        for j in 0..cols {
            row[j] = (row[j] * inv) * g[j];
        }
    }
    store(a, 2, &x);
    Ok(())
}

fn run_transpose(a: &mut [KArg]) -> Result<(), String> {
    let mut d = [0usize; 4];
    let mut p = [0usize; 4];
    for i in 0..4 {
        d[i] = a[2 + i].value as usize;
        p[i] = a[6 + i].value as usize;
    }
    let mut xs = [0usize; 4];
    let mut s = 1;
    for i in (0..4).rev() {
        xs[i] = s;
        s *= d[i];
    }
    let (mut e, mut es) = ([0usize; 4], [0usize; 4]);
    for i in 0..4 {
        e[i] = d[p[i]];
        es[i] = xs[p[i]];
    }
    let x = loadv(a, 0);
    let mut y = Vec::with_capacity(x.len());
    for i0 in 0..e[0] {
        for i1 in 0..e[1] {
            for i2 in 0..e[2] {
                for i3 in 0..e[3] {
                    y.push(x[i0 * es[0] + i1 * es[1] + i2 * es[2] + i3 * es[3]]);
                }
            }
        }
    }
    store(a, 1, &y);
    Ok(())
}

fn run_gemm(a: &mut [KArg]) -> Result<(), String> {
    let v = |i: usize| a[i].value as usize;
    let (m, n, k) = (v(3), v(4), v(5));
    let (ta, tb) = (a[6].value == 1, a[7].value == 1);
    let (alpha, beta) = (a[8].f32(), a[9].f32());
    let (batch, sa, sb, sc) = (v(10), v(11), v(12), v(13));
    let (x, y, mut c) = (loadv(a, 0), loadv(a, 1), loadv(a, 2));
    for bi in 0..batch {
        let (ab, bb) = (&x[bi * sa..], &y[bi * sb..]);
        let cb = &mut c[bi * sc..];
        for i in 0..m {
            for j in 0..n {
                let mut sum = 0f32;
                for p in 0..k {
                    let av = if ta { ab[p * m + i] } else { ab[i * k + p] };
                    let bv = if tb { bb[j * k + p] } else { bb[p * n + j] };
                    sum += av * bv;
                }
                let mut out = alpha * sum;
                if beta != 0.0 {
                    out += beta * cb[i * n + j];
                }
                cb[i * n + j] = out;
            }
        }
    }
    store(a, 2, &c);
    Ok(())
}

fn run_gather(a: &mut [KArg]) -> Result<(), String> {
    let (rows, cols) = (a[3].value as usize, a[4].value as usize);
    let table = a[0].bytes.clone().unwrap_or_default();
    let idx = a[1].bytes.clone().unwrap_or_default();
    let out = a[2].bytes.as_mut().expect("a buffer");
    let w = 4 * cols;
    for i in 0..idx.len() / 4 {
        let r = i32::from_le_bytes([idx[4 * i], idx[4 * i + 1], idx[4 * i + 2], idx[4 * i + 3]]);
        let dst = &mut out[i * w..(i + 1) * w];
        if r < 0 || r as usize >= rows {
            dst.iter_mut().for_each(|b| *b = 0);
            continue;
        }
        let r = r as usize;
        dst.copy_from_slice(&table[r * w..(r + 1) * w]);
    }
    Ok(())
}

/// The values of buffer argument i, from its storage type.
fn loadv(a: &[KArg], i: usize) -> Vec<f32> {
    let b = a[i].bytes.as_deref().unwrap_or(&[]);
    match a[i].dtype {
        1 => b.chunks_exact(2).map(|c| super::half::f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
        2 => b.chunks_exact(2).map(|c| super::half::bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
        _ => crate::f32s(b),
    }
}

impl OpDef {
    pub(crate) fn nargs(&self) -> usize {
        self.args.len()
    }
}

/// The storage type of argument i of op at program storage dtype: 0 f32,
/// 1 f16, 2 bf16, 3 i32, 4 bytes.
pub(crate) fn arg_dtype(op: &OpDef, dtype: u8, i: usize) -> u8 {
    match op.args[i].2 {
        "f32" if op.half => dtype,
        "i32" => 3,
        "bytes" => 4,
        _ => 0,
    }
}

/// The sum of at(0..n) in the fixed reduction order: lane t adds t, t+256,
/// … from 0; then the lanes combine by the tree p[t] += p[t+s].
pub(crate) fn tree_sum(n: usize, at: impl Fn(usize) -> f32) -> f32 {
    let mut p = [0f32; LANES];
    for (t, slot) in p.iter_mut().enumerate().take(n.min(LANES)) {
        let mut s = 0f32;
        let mut j = t;
        while j < n {
            s += at(j);
            j += LANES;
        }
        *slot = s;
    }
    let mut s = LANES / 2;
    while s >= 1 {
        for t in 0..s {
            p[t] += p[t + s];
        }
        s /= 2;
    }
    p[0]
}

/// The largest of at(0..n) in the fixed reduction order; NaN propagates.
pub(crate) fn tree_max(n: usize, at: impl Fn(usize) -> f32) -> f32 {
    let mut p = [f32::NEG_INFINITY; LANES];
    for (t, slot) in p.iter_mut().enumerate() {
        let mut j = t;
        while j < n {
            *slot = fmax(*slot, at(j));
            j += LANES;
        }
    }
    let mut s = LANES / 2;
    while s >= 1 {
        for t in 0..s {
            p[t] = fmax(p[t], p[t + s]);
        }
        s /= 2;
    }
    p[0]
}

fn run_binary(a: &mut [KArg], f: fn(f32, f32) -> f32) {
    let mut as_ = [0usize; 4];
    let mut bs = [0usize; 4];
    let mut cs = [0usize; 4];
    for i in 0..4 {
        as_[i] = a[3 + i].value as usize;
        bs[i] = a[7 + i].value as usize;
        cs[i] = as_[i].max(bs[i]);
    }
    let (mut sa, mut sb) = ([0usize; 4], [0usize; 4]);
    let (mut pa, mut pb) = (1, 1);
    for i in (0..4).rev() {
        if as_[i] != 1 {
            sa[i] = pa;
        }
        if bs[i] != 1 {
            sb[i] = pb;
        }
        pa *= as_[i];
        pb *= bs[i];
    }
    let (x, y) = (loadv(a, 0), loadv(a, 1));
    let mut c = Vec::with_capacity(cs.iter().product());
    for i0 in 0..cs[0] {
        for i1 in 0..cs[1] {
            for i2 in 0..cs[2] {
                for i3 in 0..cs[3] {
                    let ia = i0 * sa[0] + i1 * sa[1] + i2 * sa[2] + i3 * sa[3];
                    let ib = i0 * sb[0] + i1 * sb[1] + i2 * sb[2] + i3 * sb[3];
                    c.push(f(x[ia], y[ib]));
                }
            }
        }
    }
    store(a, 2, &c);
}

fn run_reduce(a: &mut [KArg], mode: u8) -> Result<(), String> {
    let (outer, n, inner) = (a[2].value as usize, a[3].value as usize, a[4].value as usize);
    let x = loadv(a, 0);
    let mut y = std::vec![0f32; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| x[(o * n + j) * inner + i];
            y[o * inner + i] = match mode {
                2 => tree_max(n, at),
                1 => tree_sum(n, at) / n as f32,
                _ => tree_sum(n, at),
            };
        }
    }
    store(a, 1, &y);
    Ok(())
}

fn run_argmax(a: &mut [KArg]) -> Result<(), String> {
    let (outer, n, inner) = (a[2].value as usize, a[3].value as usize, a[4].value as usize);
    let x = loadv(a, 0);
    let mut y = a[1].bytes.clone().unwrap_or_default();
    for o in 0..outer {
        for i in 0..inner {
            let (mut best, mut best_v) = (-1i64, 0f32);
            for j in 0..n {
                let v = x[(o * n + j) * inner + i];
                if v.is_nan() {
                    continue;
                }
                if best < 0 || v > best_v {
                    best = j as i64;
                    best_v = v;
                }
            }
            let k = 4 * (o * inner + i);
            y[k..k + 4].copy_from_slice(&(best.max(0) as u32).to_le_bytes());
        }
    }
    a[1].bytes = Some(y);
    Ok(())
}

fn run_softmax(a: &mut [KArg], logs: bool) -> Result<(), String> {
    let (rows, cols, sq) = (a[2].value as usize, a[3].value as usize, a[4].value as usize);
    let x = loadv(a, 0);
    let mut y = std::vec![0f32; x.len()];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let out = &mut y[r * cols..(r + 1) * cols];
        let live = if sq > 0 { r % sq + (cols - sq) + 1 } else { cols };
        let m = tree_max(live, |j| row[j]) as f64;
        let mut s = 0f64;
        for &v in &row[..live] {
            s += (v as f64 - m).exp();
        }
        for j in 0..live {
            let v = row[j] as f64;
            out[j] = if logs { ((v - m) - s.ln()) as f32 } else { ((v - m).exp() / s) as f32 };
        }
        for o in out.iter_mut().skip(live) {
            *o = if logs { f32::NEG_INFINITY } else { 0.0 };
        }
    }
    store(a, 1, &y);
    Ok(())
}

// Validation, as hw/internal/ops checks a launch: the message is
// "PROGRAM: reason", the reason in the Go reference's words.

/// `v` with thousands separators: 4,096.
fn num(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    let lead = s.len() % 3;
    if lead > 0 {
        out.push_str(&s[..lead]);
    }
    let mut i = lead;
    while i < s.len() {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&s[i..i + 3]);
        i += 3;
    }
    out
}

struct L<'a> {
    op: &'a OpDef,
    dtype: u8,
    args: &'a [LArg],
    addrs: Vec<u64>,
}

impl<'a> L<'a> {
    fn err(&self, msg: String) -> String {
        std::format!("{}: {}", self.name(), msg)
    }
    /// The program's name: the op's, with its storage type.
    fn name(&self) -> String {
        let t = match self.dtype {
            1 => ".f16",
            2 => ".bf16",
            _ => "",
        };
        match self.op.name.strip_suffix(".fast") {
            Some(b) if !t.is_empty() => std::format!("{}{}.fast", b, t),
            _ => std::format!("{}{}", self.op.name, t),
        }
    }
    /// The size of argument i's values and their type's name.
    fn value_type(&self, i: usize) -> (u64, &'static str) {
        match arg_dtype(self.op, self.dtype, i) {
            1 => (2, "f16"),
            2 => (2, "bf16"),
            3 => (4, "i32"),
            4 => (1, "bytes"),
            _ => (4, "f32"),
        }
    }
    fn index(&self, name: &str) -> usize {
        self.op.args.iter().position(|a| a.0 == name).expect("emu: op argument")
    }
    fn count(&self, name: &str) -> u64 {
        let i = self.index(name);
        self.args[i].len as u64 / self.value_type(i).0
    }
    fn scalar(&self, name: &str) -> u64 {
        self.args[self.index(name)].value
    }
    fn dim(&self, name: &str) -> Result<u64, String> {
        let v = self.scalar(name);
        if v == 0 {
            return Err(self.err(std::format!("{} = 0: dimensions must be at least 1", name)));
        }
        if v > MAX_ELEMS {
            return Err(self.err(std::format!("{} = {} exceeds the limit {}", name, num(v), num(MAX_ELEMS))));
        }
        Ok(v)
    }
    fn product(&self, expr: &str, vs: &[u64]) -> Result<u64, String> {
        let mut p = 1u64;
        for &v in vs {
            match p.checked_mul(v) {
                Some(x) if x <= MAX_ELEMS => p = x,
                _ => return Err(self.err(std::format!("{} exceeds the limit {}", expr, num(MAX_ELEMS)))),
            }
        }
        Ok(p)
    }
    fn want_count(&self, name: &str, want: u64, expr: &str) -> Result<(), String> {
        let got = self.count(name);
        if got != want {
            return Err(self.err(std::format!("{} has {} values, {} = {}", name, num(got), expr, num(want))));
        }
        Ok(())
    }
    fn range(&self, name: &str) -> (u64, u64) {
        let i = self.index(name);
        (self.addrs[i], self.args[i].len as u64)
    }
    fn overlap(&self, a: &str, b: &str) -> bool {
        let (x, xl) = self.range(a);
        let (y, yl) = self.range(b);
        xl != 0 && yl != 0 && x < y + yl && y < x + xl
    }
    fn same(&self, a: &str, b: &str) -> bool {
        self.range(a) == self.range(b)
    }
    fn in_place(&self, out: &str, inp: &str) -> Result<(), String> {
        if self.overlap(out, inp) && !self.same(out, inp) {
            return Err(self.err(std::format!(
                "{} partially overlaps {} (it may be exactly {}, or apart)",
                out, inp, inp
            )));
        }
        Ok(())
    }
    /// rows and cols checked, x and y of rows*cols values, y exactly x or
    /// apart; returns cols.
    fn rows_cols(&self) -> Result<u64, String> {
        let d = [self.dim("rows")?, self.dim("cols")?];
        let n = self.product("rows*cols", &d)?;
        self.want_count("x", n, "rows*cols")?;
        self.want_count("y", n, "rows*cols")?;
        self.in_place("y", "x")?;
        Ok(d[1])
    }
    fn window(&self, axis: &str, inp: u64, r: u64, stride: u64, pad: u64, dil: u64) -> Result<u64, String> {
        let span = dil * (r - 1) + 1;
        if inp + 2 * pad < span {
            return Err(self.err(std::format!(
                "the {} window spans {} values, more than the padded input's {}: the output would be empty",
                axis,
                num(span),
                num(inp + 2 * pad)
            )));
        }
        Ok((inp + 2 * pad - span) / stride + 1)
    }
    fn geometry(&self, h: u64, w: u64, r: u64, s: u64, with_dil: bool) -> Result<(u64, u64), String> {
        let (sh, sw) = halves(self.scalar("stride"));
        let (ph, pw) = halves(self.scalar("pad"));
        let (dh, dw) = if with_dil { halves(self.scalar("dil")) } else { (1, 1) };
        if sh == 0 || sw == 0 {
            return Err(self.err(std::format!("stride = ({}, {}): both halves must be at least 1", sh, sw)));
        }
        if dh == 0 || dw == 0 {
            return Err(self.err(std::format!("dil = ({}, {}): both halves must be at least 1", dh, dw)));
        }
        let p = self.window("height", h, r, sh, ph, dh)?;
        let q = self.window("width", w, s, sw, pw, dw)?;
        Ok((p, q))
    }
    fn disjoint(&self, out: &str, inp: &str) -> Result<(), String> {
        if self.overlap(out, inp) {
            return Err(self.err(std::format!("{} overlaps {}", out, inp)));
        }
        Ok(())
    }
}

/// Checks a launch of op against its contract, before anything is
/// enqueued.
pub(crate) fn validate(op: &OpDef, dtype: u8, args: &[LArg]) -> Result<(), String> {
    let addrs: Vec<u64> = args.iter().map(|a| a.buf.map_or(0, |b| super::host::address(b, a.off))).collect();
    let l = L { op, dtype, args, addrs };
    if args.len() != op.args.len() {
        return Err(l.err(std::format!("takes {} arguments, got {}", op.args.len(), args.len())));
    }
    for (i, (name, kind, typ)) in op.args.iter().enumerate() {
        let a = &args[i];
        let (es, tname) = l.value_type(i);
        if *kind == 'b' {
            if a.buf.is_none() {
                return Err(l.err(std::format!("{} (argument {}) is a scalar, want a buffer range", name, i)));
            }
            let len = a.len as u64;
            if len > MAX_ELEMS * 4 {
                return Err(l.err(std::format!("{} has {} bytes, more than {} values", name, num(len), num(MAX_ELEMS))));
            }
            if len % es != 0 {
                return Err(l.err(std::format!("{} has {} bytes, not a whole number of {} values", name, num(len), tname)));
            }
            if len > 0 && l.addrs[i] % es != 0 {
                return Err(l.err(std::format!("{} is not {}-byte aligned", name, es)));
            }
        } else {
            if a.buf.is_some() {
                return Err(l.err(std::format!("{} (argument {}) is a buffer range, want a scalar", name, i)));
            }
            if (*typ == "u32" || *typ == "f32") && a.value > u32::MAX as u64 {
                return Err(l.err(std::format!("{} = {} does not fit 32 bits", name, num(a.value))));
            }
        }
    }
    match op.check {
        Check::Unary => {
            let n = l.count("x");
            if n == 0 {
                return Err(l.err("x has 0 values: zero-size launches are refused".into()));
            }
            l.want_count("y", n, "len(x)")?;
            l.in_place("y", "x")
        }
        Check::Binary => {
            let mut a = [0u64; 4];
            let mut b = [0u64; 4];
            for i in 0..4 {
                a[i] = l.dim(["a0", "a1", "a2", "a3"][i])?;
            }
            for i in 0..4 {
                b[i] = l.dim(["b0", "b1", "b2", "b3"][i])?;
            }
            let mut c = [0u64; 4];
            for i in 0..4 {
                c[i] = if a[i] == b[i] || b[i] == 1 {
                    a[i]
                } else if a[i] == 1 {
                    b[i]
                } else {
                    return Err(l.err(std::format!(
                        "dim {}: a{} = {} and b{} = {} do not broadcast",
                        i,
                        i,
                        num(a[i]),
                        i,
                        num(b[i])
                    )));
                };
            }
            let na = l.product("a0*a1*a2*a3", &a)?;
            let nb = l.product("b0*b1*b2*b3", &b)?;
            let nc = l.product("the broadcast shape", &c)?;
            l.want_count("a", na, "a0*a1*a2*a3")?;
            l.want_count("b", nb, "b0*b1*b2*b3")?;
            l.want_count("c", nc, "the broadcast shape's product")?;
            for (name, n) in [("a", na), ("b", nb)] {
                if l.same("c", name) && n == nc {
                    continue;
                }
                if l.overlap("c", name) {
                    if n != nc {
                        return Err(l.err(std::format!(
                            "c overlaps {}, which is broadcast (only an operand of c's shape may be c)",
                            name
                        )));
                    }
                    return Err(l.err(std::format!("c partially overlaps {} (it may be exactly {}, or apart)", name, name)));
                }
            }
            Ok(())
        }
        Check::Reduce => {
            let d = [l.dim("outer")?, l.dim("n")?, l.dim("inner")?];
            let nx = l.product("outer*n*inner", &d)?;
            let ny = l.product("outer*inner", &[d[0], d[2]])?;
            l.want_count("x", nx, "outer*n*inner")?;
            l.want_count("y", ny, "outer*inner")?;
            l.disjoint("y", "x")
        }
        Check::Norm => {
            let cols = l.rows_cols()?;
            let params: &[&str] = if op.name == "layernorm" { &["gamma", "beta"] } else { &["gamma"] };
            for p in params {
                l.want_count(p, cols, "cols")?;
            }
            for p in params {
                l.disjoint("y", p)?;
            }
            Ok(())
        }
        Check::Transpose => {
            let mut d = [0u64; 4];
            for (i, name) in ["d0", "d1", "d2", "d3"].iter().enumerate() {
                d[i] = l.dim(name)?;
            }
            let mut seen = [false; 4];
            for name in ["p0", "p1", "p2", "p3"] {
                let p = l.scalar(name);
                if p > 3 || seen[p as usize] {
                    return Err(l.err(std::format!(
                        "p0..p3 = {} {} {} {} is not a permutation of 0..3",
                        l.scalar("p0"),
                        l.scalar("p1"),
                        l.scalar("p2"),
                        l.scalar("p3")
                    )));
                }
                seen[p as usize] = true;
            }
            let n = l.product("d0*d1*d2*d3", &d)?;
            l.want_count("x", n, "d0*d1*d2*d3")?;
            l.want_count("y", n, "d0*d1*d2*d3")?;
            l.disjoint("y", "x")
        }
        Check::Gemm => {
            let (m, n, k, batch) = (l.dim("M")?, l.dim("N")?, l.dim("K")?, l.dim("batch")?);
            for t in ["transA", "transB"] {
                let v = l.scalar(t);
                if v > 1 {
                    return Err(l.err(std::format!("{} = {}, want 0 or 1", t, num(v))));
                }
            }
            for (buf, stride, expr, x, y) in [
                ("A", "strideA", "(batch-1)*strideA + M*K", m, k),
                ("B", "strideB", "(batch-1)*strideB + K*N", k, n),
                ("C", "strideC", "(batch-1)*strideC + M*N", m, n),
            ] {
                let size = l.product(expr, &[x, y])?;
                let st = l.scalar(stride);
                if buf == "C" && batch > 1 && st < size {
                    return Err(l.err(std::format!(
                        "strideC = {} is less than M*N = {}: the batch's C matrices would overlap",
                        num(st),
                        num(size)
                    )));
                }
                let off = l.product(expr, &[batch - 1, st])?;
                if off + size > MAX_ELEMS {
                    return Err(l.err(std::format!("{} exceeds the limit {}", expr, num(MAX_ELEMS))));
                }
                l.want_count(buf, off + size, expr)?;
            }
            l.disjoint("C", "A")?;
            l.disjoint("C", "B")
        }
        Check::Gather => {
            let d = [l.dim("rows")?, l.dim("cols")?];
            let n = l.product("rows*cols", &d)?;
            l.want_count("table", n, "rows*cols")?;
            let ni = l.count("idx");
            if ni == 0 {
                return Err(l.err("idx has 0 values: zero-size launches are refused".into()));
            }
            let no = l.product("len(idx)*cols", &[ni, d[1]])?;
            l.want_count("out", no, "len(idx)*cols")?;
            l.disjoint("out", "table")?;
            l.disjoint("out", "idx")
        }
        Check::Conv => {
            let mut d = [0u64; 8];
            for (i, n) in ["N", "C", "H", "W", "K", "R", "S", "groups"].iter().enumerate() {
                d[i] = l.dim(n)?;
            }
            let (n, c, h, w, k, r, s, g) = (d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
            if c % g != 0 || k % g != 0 {
                return Err(l.err(std::format!(
                    "groups = {} divides neither C = {} nor K = {} evenly",
                    num(g),
                    num(c),
                    num(k)
                )));
            }
            let (p, q) = l.geometry(h, w, r, s, true)?;
            let nx = l.product("N*C*H*W", &[n, c, h, w])?;
            let nw = l.product("K*(C/groups)*R*S", &[k, c / g, r, s])?;
            let ny = l.product("N*K*P*Q", &[n, k, p, q])?;
            l.want_count("x", nx, "N*C*H*W")?;
            l.want_count("w", nw, "K*(C/groups)*R*S")?;
            let nb = l.count("bias");
            if nb != 0 && nb != k {
                return Err(l.err(std::format!("bias has {} values, want K = {} or none", num(nb), num(k))));
            }
            l.want_count("y", ny, "N*K*P*Q")?;
            l.disjoint("y", "x")?;
            l.disjoint("y", "w")?;
            l.disjoint("y", "bias")
        }
        Check::Pool => {
            let mut d = [0u64; 6];
            for (i, n) in ["N", "C", "H", "W", "R", "S"].iter().enumerate() {
                d[i] = l.dim(n)?;
            }
            let (p, q) = l.geometry(d[2], d[3], d[4], d[5], false)?;
            let nx = l.product("N*C*H*W", &d[..4])?;
            let ny = l.product("N*C*P*Q", &[d[0], d[1], p, q])?;
            l.want_count("x", nx, "N*C*H*W")?;
            l.want_count("y", ny, "N*C*P*Q")?;
            l.disjoint("y", "x")
        }
        Check::Cast => {
            let (from, to) = (l.scalar("from"), l.scalar("to"));
            for (name, v) in [("from", from), ("to", to)] {
                if v > 3 {
                    return Err(l.err(std::format!("{} = {} is not a dtype code (0 f32, 1 f16, 2 bf16, 3 i32)", name, num(v))));
                }
            }
            let tn = |t: u64| ["f32", "f16", "bf16", "i32"][t as usize];
            let (fs, ts) = (dsize(from) as u64, dsize(to) as u64);
            let (xl, yl) = (args[0].len as u64, args[1].len as u64);
            if xl % fs != 0 || (xl > 0 && l.addrs[0] % fs != 0) {
                return Err(l.err(std::format!("x ({} bytes) is not whole, aligned {} values", num(xl), tn(from))));
            }
            if yl % ts != 0 || (yl > 0 && l.addrs[1] % ts != 0) {
                return Err(l.err(std::format!("y ({} bytes) is not whole, aligned {} values", num(yl), tn(to))));
            }
            let n = xl / fs;
            if n == 0 {
                return Err(l.err("x has 0 values: zero-size launches are refused".into()));
            }
            if yl / ts != n {
                return Err(l.err(std::format!("y has {} {} values, len(x) = {}", num(yl / ts), tn(to), num(n))));
            }
            if fs == ts {
                l.in_place("y", "x")
            } else {
                l.disjoint("y", "x")
            }
        }
        Check::Softmax => {
            let cols = l.rows_cols()?;
            let sq = l.scalar("causal");
            if sq > cols {
                return Err(l.err(std::format!("causal = {} exceeds cols = {}", num(sq), num(cols))));
            }
            Ok(())
        }
    }
}
