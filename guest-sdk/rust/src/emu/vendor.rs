//! Vendor kernels' argument declarations (a manifest's `[[kernel]]` args)
//! and the host's check of a launch against one (`stream_launch`, ABI.md
//! §3.6), in the host's words.

use std::string::{String, ToString};

use super::host::LArg;
use crate::DType;

/// The direction of a vendor kernel's buffer argument, as a manifest's
/// `dir` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// `in`: the kernel only reads the buffer (it may be weights).
    In,
    /// `out`: the kernel writes it.
    Out,
    /// `inout`: the kernel reads and writes it.
    InOut,
}

impl Dir {
    /// The manifest's word: `in`, `out` or `inout`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dir::In => "in",
            Dir::Out => "out",
            Dir::InOut => "inout",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A buffer of values of the dtype (None: `bytes`, any length).
    Buffer(Option<DType>, Dir),
    /// A scalar of the type: `u32`, `u64`, `i32` or `f32`.
    Scalar(&'static str),
}

/// One declared argument of a vendor kernel, as a manifest's
/// `[[kernel]]` `args` give it: a buffer with a dtype and a direction,
/// or a scalar of a type. Build one with [`VendorArg::buffer`],
/// [`VendorArg::bytes`] or a scalar constructor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VendorArg {
    name: String,
    kind: Kind,
}

impl VendorArg {
    /// A buffer of `dtype` values (`dtype = "f32"` and so on in a
    /// manifest): a launch must bind a range whose length is a whole
    /// number of them.
    pub fn buffer(name: &str, dtype: DType, dir: Dir) -> VendorArg {
        VendorArg { name: name.to_string(), kind: Kind::Buffer(Some(dtype), dir) }
    }
    /// A buffer of bytes (`dtype = "bytes"`, a manifest's default): any
    /// length.
    pub fn bytes(name: &str, dir: Dir) -> VendorArg {
        VendorArg { name: name.to_string(), kind: Kind::Buffer(None, dir) }
    }
    /// A `u32` scalar: a launch's value must fit 32 bits.
    pub fn u32(name: &str) -> VendorArg {
        VendorArg { name: name.to_string(), kind: Kind::Scalar("u32") }
    }
    /// An `i32` scalar: a launch's value must fit 32 bits.
    pub fn i32(name: &str) -> VendorArg {
        VendorArg { name: name.to_string(), kind: Kind::Scalar("i32") }
    }
    /// An `f32` scalar (its bits): a launch's value must fit 32 bits.
    pub fn f32(name: &str) -> VendorArg {
        VendorArg { name: name.to_string(), kind: Kind::Scalar("f32") }
    }
    /// A `u64` scalar: any value.
    pub fn u64(name: &str) -> VendorArg {
        VendorArg { name: name.to_string(), kind: Kind::Scalar("u64") }
    }

    /// The argument's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The direction the host gives the argument: the buffer's, `in` for
    /// a scalar (a weights buffer bound to a scalar is then refused as a
    /// buffer where a scalar is declared, as on the host).
    pub(crate) fn dir(&self) -> &'static str {
        match self.kind {
            Kind::Buffer(_, d) => d.as_str(),
            Kind::Scalar(_) => "in",
        }
    }
}

/// A scalar kind after its indefinite article, as the host's messages
/// say it: "an i32", "an f32", "a u32".
fn with_article(t: &str) -> String {
    if t.starts_with('i') || t.starts_with('f') {
        std::format!("an {}", t)
    } else {
        std::format!("a {}", t)
    }
}

fn dtype_name(t: Option<DType>) -> &'static str {
    match t {
        None => "bytes",
        Some(DType::F32) => "f32",
        Some(DType::F16) => "f16",
        Some(DType::BF16) => "bf16",
        Some(DType::I32) => "i32",
    }
}

/// Checks a launch's arguments against kernel `name`'s declaration, as
/// the host's `checkSignature` (stages) and the Go emulator's
/// `checkVendorArgsLocked` do, with their texts: the count, each one's
/// kind, a buffer's length against its dtype, a 32-bit scalar's value.
pub(crate) fn check(name: &str, decl: &[VendorArg], args: &[LArg]) -> Result<(), String> {
    if args.len() != decl.len() {
        return Err(std::format!("kernel {:?} takes {} arguments, got {}", name, decl.len(), args.len()));
    }
    for (i, (a, l)) in decl.iter().zip(args).enumerate() {
        match (a.kind, l.buf.is_some()) {
            (Kind::Buffer(t, d), false) => {
                return Err(std::format!(
                    "kernel {:?}: argument {} ({}) is a buffer ({}, {}), got a scalar",
                    name,
                    i,
                    a.name,
                    dtype_name(t),
                    d.as_str()
                ))
            }
            (Kind::Scalar(t), true) => {
                return Err(std::format!("kernel {:?}: argument {} ({}) is {} scalar, got a buffer", name, i, a.name, with_article(t)))
            }
            (Kind::Buffer(t, _), true) => {
                let size = t.map_or(1, |d| d.size());
                if l.len % size != 0 {
                    return Err(std::format!(
                        "kernel {:?}: argument {} ({}): {} bytes is not a whole number of {} values",
                        name,
                        i,
                        a.name,
                        l.len,
                        dtype_name(t)
                    ));
                }
            }
            (Kind::Scalar(t), false) => {
                if t != "u64" && l.value >> 32 != 0 {
                    return Err(std::format!(
                        "kernel {:?}: argument {} ({}): {:#x} does not fit {}",
                        name,
                        i,
                        a.name,
                        l.value,
                        with_article(t)
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The longest vendor kernel name a manifest takes.
const MAX_KERNEL_NAME: usize = 64;

/// The program names a backend of the host has built in (sim's kernels
/// and op library, cuda's kernels and host programs), which a manifest
/// refuses as a vendor kernel's name. The host's tests (package
/// manifest) keep the list equal to the host's.
pub(crate) const HOST_PROGRAMS: &[&str] = &[
    "abs", "abs.bf16", "abs.f16", "add", "add.bf16", "add.f16", "affine", "affine.bf16",
    "affine.f16", "argmax", "avgpool2d", "bias", "cast", "conv2d", "conv2d.fast", "copy", "div",
    "div.bf16", "div.f16", "exp", "exp.bf16", "exp.f16", "fault", "fill", "gather", "gelu_erf",
    "gelu_erf.bf16", "gelu_erf.f16", "gelu_tanh", "gelu_tanh.bf16", "gelu_tanh.f16", "gemm",
    "gemm.bf16", "gemm.bf16.fast", "gemm.f16", "gemm.f16.fast", "gemm.fast", "layernorm",
    "layernorm.bf16", "layernorm.f16", "log", "log.bf16", "log.f16", "log_softmax",
    "log_softmax.bf16", "log_softmax.f16", "matmul", "max", "max.bf16", "max.f16", "maxpool2d",
    "min", "min.bf16", "min.f16", "mlp_forward", "mul", "mul.bf16", "mul.f16", "neg", "neg.bf16",
    "neg.f16", "noop", "reduce_argmax", "reduce_argmax.bf16", "reduce_argmax.f16", "reduce_max",
    "reduce_max.bf16", "reduce_max.f16", "reduce_mean", "reduce_mean.bf16", "reduce_mean.f16",
    "reduce_sum", "reduce_sum.bf16", "reduce_sum.f16", "relu", "resident_gpu_exchange",
    "resident_npu_exchange", "rmsnorm", "rmsnorm.bf16", "rmsnorm.f16", "rsqrt", "rsqrt.bf16",
    "rsqrt.f16", "saxpy", "sigmoid", "sigmoid.bf16", "sigmoid.f16", "silu", "silu.bf16",
    "silu.f16", "softmax", "softmax.bf16", "softmax.f16", "spin", "sqrt", "sqrt.bf16", "sqrt.f16",
    "sub", "sub.bf16", "sub.f16", "tanh", "tanh.bf16", "tanh.f16", "transpose", "transpose.bf16",
    "transpose.f16",
];

/// Checks a vendor kernel's name and declared arguments as a manifest's
/// `[[kernel]]` is checked when it is read (docs/manifest.md): a name of
/// 1 to 64 of `a-z`, `0-9`, `_`, `.` and `-` that no backend of the host
/// has built in; at most 16 arguments, each with a name of its own (not
/// empty). (A [`VendorArg`] always has a known kind, dtype and
/// direction, and a scalar neither of the last two.)
pub(crate) fn check_declaration(name: &str, args: &[VendorArg]) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= MAX_KERNEL_NAME
        && name.bytes().all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-'));
    if !valid {
        return Err(std::format!(
            "{:?} is not a kernel name: 1 to {} of a-z, 0-9, '_', '.' and '-'",
            name, MAX_KERNEL_NAME
        ));
    }
    if HOST_PROGRAMS.contains(&name) {
        return Err(std::format!("{:?} is a built-in program's name: a vendor kernel needs a name of its own", name));
    }
    if args.len() > crate::MAX_ARGS {
        return Err(std::format!(
            "kernel {:?}: {} arguments, more than a launch carries ({})",
            name,
            args.len(),
            crate::MAX_ARGS
        ));
    }
    for (i, a) in args.iter().enumerate() {
        if a.name.is_empty() {
            return Err(std::format!("kernel {:?}: argument {}: an empty name", name, i));
        }
        if args[..i].iter().any(|b| b.name == a.name) {
            return Err(std::format!("kernel {:?}: argument {}: the name {:?} is given twice", name, i, a.name));
        }
    }
    Ok(())
}
