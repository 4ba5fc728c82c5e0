//! The device op library (docs/kernels.md): typed helpers that build its
//! launches, with the Go SDK's names (`Ops.Softmax` is [`Ops::softmax`]).
//! A [`Tensor`] is a buffer range with a storage type and dims; an [`Ops`]
//! collects launches, looking each program up once by the name the op and
//! the storage type make (`softmax`, `gemm.bf16`, `conv2d.fast`), and
//! submits them as batches. The host checks every launch against its op's
//! contract at submit; the helpers only derive the scalar arguments.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{Arg, Buffer, Cmd, Code, Program, Result, Status, Stream, MAX_BATCH};

/// A storage type; the values are the cast op's dtype codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum DType {
    /// float32
    F32 = 0,
    /// IEEE half
    F16 = 1,
    /// bfloat16
    BF16 = 2,
    /// int32
    I32 = 3,
}

impl DType {
    /// The size of one value in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            _ => 4,
        }
    }
    fn suffix(self) -> &'static str {
        match self {
            DType::F16 => ".f16",
            DType::BF16 => ".bf16",
            _ => "",
        }
    }
}

/// A typed, row-major view of a buffer range: the values start at byte
/// `off` of `buf`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// The buffer.
    pub buf: Buffer,
    /// The byte offset of the first value.
    pub off: u32,
    /// The storage type.
    pub dtype: DType,
    /// The dims (at most 4 for most ops).
    pub dims: Vec<usize>,
}

impl Tensor {
    /// The tensor of `dims` values of type `dtype` at byte `off` of `buf`.
    pub fn new(buf: Buffer, off: u32, dtype: DType, dims: &[usize]) -> Tensor {
        Tensor { buf, off, dtype, dims: dims.to_vec() }
    }
    /// The number of values: the product of the dims (1 for none).
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }
    /// Whether the tensor has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The size of the range in bytes.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype.size()
    }
    /// The range as a launch argument.
    pub fn arg(&self) -> Arg {
        Arg::buf(&self.buf, self.off, self.bytes() as u32)
    }
    /// The same range with other dims.
    pub fn reshape(&self, dims: &[usize]) -> Tensor {
        Tensor { dims: dims.to_vec(), ..self.clone() }
    }
}

/// gemm's options; the default is C = A·B.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GemmOpts {
    /// A is stored K×M.
    pub trans_a: bool,
    /// B is stored N×K.
    pub trans_b: bool,
    /// Scales A·B; 0 means 1 unless `alpha_set`.
    pub alpha: f32,
    /// Beta scales C (0: C is not read).
    pub beta: f32,
    /// `alpha` is meant even if 0.
    pub alpha_set: bool,
    /// The fast tier (cuBLAS on CUDA).
    pub fast: bool,
}

/// conv2d's geometry; zero strides and dilations mean 1, zero groups 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConvOpts {
    /// (vertical, horizontal)
    pub stride: [u32; 2],
    /// (vertical, horizontal)
    pub pad: [u32; 2],
    /// (vertical, horizontal)
    pub dil: [u32; 2],
    /// Groups.
    pub groups: u32,
    /// The fast tier.
    pub fast: bool,
}

/// Builds launches of the op library. `Ops::default()` is ready; keep one
/// per instance (its program handles stay valid). The first error
/// (a program the session may not use, dims a helper cannot map) is kept
/// and returned by [`Ops::submit`]; later launches are dropped.
#[derive(Default, Debug)]
pub struct Ops {
    progs: BTreeMap<String, Program>,
    cmds: Vec<Cmd>,
    err: Option<Status>,
}

fn u(v: usize) -> Arg {
    Arg::u64(v as u64)
}

fn dims4(d: &[usize]) -> Option<[usize; 4]> {
    if d.len() > 4 {
        return None;
    }
    let mut s = [1usize; 4];
    s[4 - d.len()..].copy_from_slice(d);
    Some(s)
}

fn axis_split(dims: &[usize], axis: usize) -> Option<(usize, usize, usize)> {
    if axis >= dims.len() {
        return None;
    }
    Some((dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product()))
}

fn rows_cols(dims: &[usize]) -> Option<(usize, usize)> {
    let (last, rest) = dims.split_last()?;
    Some((rest.iter().product(), *last))
}

fn pair(v: [u32; 2], def: u32) -> u64 {
    let a = if v[0] == 0 { def } else { v[0] };
    let b = if v[1] == 0 { def } else { v[1] };
    a as u64 | (b as u64) << 32
}

impl Ops {
    /// The first error of the launches built since the last submit.
    pub fn err(&self) -> Option<&Status> {
        self.err.as_ref()
    }

    /// The launches built since the last submit.
    pub fn commands(&self) -> &[Cmd] {
        &self.cmds
    }

    /// Enqueues the launches built so far on `s`, as batches of at most
    /// [`MAX_BATCH`], and forgets them.
    ///
    /// # Errors
    ///
    /// The first error of building them (nothing is enqueued), or of
    /// enqueuing.
    pub fn submit(&mut self, s: &Stream) -> Result<()> {
        let cmds = core::mem::take(&mut self.cmds);
        if let Some(e) = self.err.take() {
            return Err(e);
        }
        for chunk in cmds.chunks(MAX_BATCH) {
            s.submit_batch(chunk)?;
        }
        Ok(())
    }

    /// Adds a launch of the program called `name` (any program).
    pub fn launch(&mut self, name: &str, args: &[Arg]) -> &mut Ops {
        if self.err.is_some() {
            return self;
        }
        let p = match self.progs.get(name) {
            Some(p) => *p,
            None => match Program::get(name) {
                Ok(p) => {
                    self.progs.insert(String::from(name), p);
                    p
                }
                Err(e) => {
                    self.err = Some(e);
                    return self;
                }
            },
        };
        self.cmds.push(Cmd::new(p, args));
        self
    }

    fn fail(&mut self, op: &str) -> &mut Ops {
        if self.err.is_none() {
            self.err = Some(Status::new(Code::InvalidArgument, alloc::format!("{}: dims the helper cannot map", op)));
        }
        self
    }

    fn unary(&mut self, op: &str, x: &Tensor, y: &Tensor) -> &mut Ops {
        let name = alloc::format!("{}{}", op, x.dtype.suffix());
        self.launch(&name, &[x.arg(), y.arg()])
    }

    /// y = e^x. y may be x.
    pub fn exp(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("exp", x, y)
    }
    /// y = ln x.
    pub fn log(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("log", x, y)
    }
    /// y = tanh x.
    pub fn tanh(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("tanh", x, y)
    }
    /// y = 1/(1+e^-x).
    pub fn sigmoid(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("sigmoid", x, y)
    }
    /// The tanh approximation of GELU.
    pub fn gelu_tanh(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("gelu_tanh", x, y)
    }
    /// GELU with erf.
    pub fn gelu_erf(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("gelu_erf", x, y)
    }
    /// y = x·sigmoid(x).
    pub fn silu(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("silu", x, y)
    }
    /// y = 1/sqrt(x).
    pub fn rsqrt(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("rsqrt", x, y)
    }
    /// y = sqrt(x).
    pub fn sqrt(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("sqrt", x, y)
    }
    /// y = -x.
    pub fn neg(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("neg", x, y)
    }
    /// y = |x|.
    pub fn abs(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.unary("abs", x, y)
    }
    /// y = a·x + b.
    pub fn affine(&mut self, x: &Tensor, y: &Tensor, a: f32, b: f32) -> &mut Ops {
        let name = alloc::format!("affine{}", x.dtype.suffix());
        self.launch(&name, &[x.arg(), y.arg(), Arg::f32(a), Arg::f32(b)])
    }

    fn binary(&mut self, op: &str, a: &Tensor, b: &Tensor, c: &Tensor) -> &mut Ops {
        let (sa, sb) = match (dims4(&a.dims), dims4(&b.dims)) {
            (Some(x), Some(y)) => (x, y),
            _ => return self.fail(op),
        };
        let mut args = alloc::vec![a.arg(), b.arg(), c.arg()];
        args.extend(sa.iter().map(|&d| u(d)));
        args.extend(sb.iter().map(|&d| u(d)));
        let name = alloc::format!("{}{}", op, a.dtype.suffix());
        self.launch(&name, &args)
    }
    /// c = a + b, NumPy broadcasting over up to 4 dims.
    pub fn add(&mut self, a: &Tensor, b: &Tensor, c: &Tensor) -> &mut Ops {
        self.binary("add", a, b, c)
    }
    /// c = a - b, broadcast.
    pub fn sub(&mut self, a: &Tensor, b: &Tensor, c: &Tensor) -> &mut Ops {
        self.binary("sub", a, b, c)
    }
    /// c = a·b, broadcast.
    pub fn mul(&mut self, a: &Tensor, b: &Tensor, c: &Tensor) -> &mut Ops {
        self.binary("mul", a, b, c)
    }
    /// c = a/b, broadcast.
    pub fn div(&mut self, a: &Tensor, b: &Tensor, c: &Tensor) -> &mut Ops {
        self.binary("div", a, b, c)
    }
    /// c = max(a, b), broadcast; NaN propagates.
    pub fn max(&mut self, a: &Tensor, b: &Tensor, c: &Tensor) -> &mut Ops {
        self.binary("max", a, b, c)
    }
    /// c = min(a, b), broadcast; NaN propagates.
    pub fn min(&mut self, a: &Tensor, b: &Tensor, c: &Tensor) -> &mut Ops {
        self.binary("min", a, b, c)
    }

    fn reduce(&mut self, op: &str, x: &Tensor, y: &Tensor, axis: usize) -> &mut Ops {
        match axis_split(&x.dims, axis) {
            Some((o, n, i)) => {
                let name = alloc::format!("{}{}", op, x.dtype.suffix());
                self.launch(&name, &[x.arg(), y.arg(), u(o), u(n), u(i)])
            }
            None => self.fail(op),
        }
    }
    /// y = the sum of x along axis (the fixed reduction order).
    pub fn reduce_sum(&mut self, x: &Tensor, y: &Tensor, axis: usize) -> &mut Ops {
        self.reduce("reduce_sum", x, y, axis)
    }
    /// y = the mean of x along axis.
    pub fn reduce_mean(&mut self, x: &Tensor, y: &Tensor, axis: usize) -> &mut Ops {
        self.reduce("reduce_mean", x, y, axis)
    }
    /// y = the largest value of x along axis.
    pub fn reduce_max(&mut self, x: &Tensor, y: &Tensor, axis: usize) -> &mut Ops {
        self.reduce("reduce_max", x, y, axis)
    }
    /// y (i32) = the first index of the largest value along axis.
    pub fn reduce_argmax(&mut self, x: &Tensor, y: &Tensor, axis: usize) -> &mut Ops {
        self.reduce("reduce_argmax", x, y, axis)
    }

    fn softmax_(&mut self, op: &str, x: &Tensor, y: &Tensor, causal: usize) -> &mut Ops {
        match rows_cols(&x.dims) {
            Some((r, c)) => {
                let name = alloc::format!("{}{}", op, x.dtype.suffix());
                self.launch(&name, &[x.arg(), y.arg(), u(r), u(c), u(causal)])
            }
            None => self.fail(op),
        }
    }
    /// Softmax along the last dim. causal = 0: no mask; causal = Sq: row r
    /// is query r mod Sq, and columns after its position are 0.
    pub fn softmax(&mut self, x: &Tensor, y: &Tensor, causal: usize) -> &mut Ops {
        self.softmax_("softmax", x, y, causal)
    }
    /// LogSoftmax along the last dim (masked columns -Inf).
    pub fn log_softmax(&mut self, x: &Tensor, y: &Tensor, causal: usize) -> &mut Ops {
        self.softmax_("log_softmax", x, y, causal)
    }
    /// Layernorm along the last dim.
    pub fn layernorm(&mut self, x: &Tensor, gamma: &Tensor, beta: &Tensor, y: &Tensor, eps: f32) -> &mut Ops {
        match rows_cols(&x.dims) {
            Some((r, c)) => {
                let name = alloc::format!("layernorm{}", x.dtype.suffix());
                self.launch(&name, &[x.arg(), gamma.arg(), beta.arg(), y.arg(), u(r), u(c), Arg::f32(eps)])
            }
            None => self.fail("layernorm"),
        }
    }
    /// Rmsnorm along the last dim.
    pub fn rmsnorm(&mut self, x: &Tensor, gamma: &Tensor, y: &Tensor, eps: f32) -> &mut Ops {
        match rows_cols(&x.dims) {
            Some((r, c)) => {
                let name = alloc::format!("rmsnorm{}", x.dtype.suffix());
                self.launch(&name, &[x.arg(), gamma.arg(), y.arg(), u(r), u(c), Arg::f32(eps)])
            }
            None => self.fail("rmsnorm"),
        }
    }
    /// y = x with its dims permuted by perm: y's dim i is x's dim perm[i].
    pub fn transpose(&mut self, x: &Tensor, y: &Tensor, perm: &[usize]) -> &mut Ops {
        let d = match dims4(&x.dims) {
            Some(d) if perm.len() == x.dims.len() => d,
            _ => return self.fail("transpose"),
        };
        let k = 4 - perm.len();
        let mut p = [0usize, 1, 2, 3];
        for (i, v) in perm.iter().enumerate() {
            p[k + i] = v + k;
        }
        let name = alloc::format!("transpose{}", x.dtype.suffix());
        self.launch(&name, &[x.arg(), y.arg(), u(d[0]), u(d[1]), u(d[2]), u(d[3]), u(p[0]), u(p[1]), u(p[2]), u(p[3])])
    }
    /// C_b = alpha·op(A_b)·op(B_b) + beta·C_b, for 2-dim or 3-dim (batched)
    /// tensors; a 2-dim A or B serves every matrix of a batched C.
    pub fn gemm(&mut self, a: &Tensor, b: &Tensor, c: &Tensor, opt: GemmOpts) -> &mut Ops {
        fn mat(t: &Tensor) -> Option<(usize, usize, usize)> {
            match t.dims.len() {
                2 => Some((1, t.dims[0], t.dims[1])),
                3 => Some((t.dims[0], t.dims[1], t.dims[2])),
                _ => None,
            }
        }
        let ((ba, ar, ac), (bb, _, _), (bc, m, n)) = match (mat(a), mat(b), mat(c)) {
            (Some(x), Some(y), Some(z)) => (x, y, z),
            _ => return self.fail("gemm"),
        };
        if (ba != bc && ba != 1) || (bb != bc && bb != 1) {
            return self.fail("gemm");
        }
        let k = if opt.trans_a { ar } else { ac };
        let stride = |t: &Tensor, batch: usize| -> usize {
            if t.dims.len() == 2 || (batch == 1 && bc > 1) {
                0
            } else {
                t.dims[1] * t.dims[2]
            }
        };
        let alpha = if opt.alpha == 0.0 && !opt.alpha_set { 1.0 } else { opt.alpha };
        let mut name = alloc::format!("gemm{}", a.dtype.suffix());
        if opt.fast {
            name.push_str(".fast");
        }
        let args = [
            a.arg(),
            b.arg(),
            c.arg(),
            u(m),
            u(n),
            u(k),
            u(opt.trans_a as usize),
            u(opt.trans_b as usize),
            Arg::f32(alpha),
            Arg::f32(opt.beta),
            u(bc),
            u(stride(a, ba)),
            u(stride(b, bb)),
            u(stride(c, bc)),
        ];
        self.launch(&name, &args)
    }
    /// out row i = table row idx[i] (zeros for an index outside the table);
    /// table rows×cols f32, idx i32.
    pub fn gather(&mut self, table: &Tensor, idx: &Tensor, out: &Tensor) -> &mut Ops {
        if table.dims.len() != 2 {
            return self.fail("gather");
        }
        self.launch("gather", &[table.arg(), idx.arg(), out.arg(), u(table.dims[0]), u(table.dims[1])])
    }
    /// NCHW convolution: x N×C×H×W, w K×(C/groups)×R×S, bias K values or
    /// `None`, y N×K×P×Q.
    pub fn conv2d(&mut self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, y: &Tensor, opt: ConvOpts) -> &mut Ops {
        if x.dims.len() != 4 || w.dims.len() != 4 {
            return self.fail("conv2d");
        }
        let g = if opt.groups == 0 { 1 } else { opt.groups };
        let b = match bias {
            Some(t) => t.arg(),
            None => Arg::buf(&w.buf, w.off, 0),
        };
        let name = if opt.fast { "conv2d.fast" } else { "conv2d" };
        let args = [
            x.arg(),
            w.arg(),
            b,
            y.arg(),
            u(x.dims[0]),
            u(x.dims[1]),
            u(x.dims[2]),
            u(x.dims[3]),
            u(w.dims[0]),
            u(w.dims[2]),
            u(w.dims[3]),
            Arg::u64(pair(opt.stride, 1)),
            Arg::u64(pair(opt.pad, 0)),
            Arg::u64(pair(opt.dil, 1)),
            Arg::u32(g),
        ];
        self.launch(name, &args)
    }
    fn pool(&mut self, op: &str, x: &Tensor, y: &Tensor, window: [u32; 2], stride: [u32; 2], pad: [u32; 2]) -> &mut Ops {
        if x.dims.len() != 4 {
            return self.fail(op);
        }
        let args = [
            x.arg(),
            y.arg(),
            u(x.dims[0]),
            u(x.dims[1]),
            u(x.dims[2]),
            u(x.dims[3]),
            Arg::u32(window[0]),
            Arg::u32(window[1]),
            Arg::u64(pair(stride, 1)),
            Arg::u64(pair(pad, 0)),
        ];
        self.launch(op, &args)
    }
    /// NCHW max pooling over window (R, S); zero strides mean 1.
    pub fn maxpool2d(&mut self, x: &Tensor, y: &Tensor, window: [u32; 2], stride: [u32; 2], pad: [u32; 2]) -> &mut Ops {
        self.pool("maxpool2d", x, y, window, stride, pad)
    }
    /// NCHW average pooling (padding not counted).
    pub fn avgpool2d(&mut self, x: &Tensor, y: &Tensor, window: [u32; 2], stride: [u32; 2], pad: [u32; 2]) -> &mut Ops {
        self.pool("avgpool2d", x, y, window, stride, pad)
    }
    /// y = x converted from x's type to y's.
    pub fn cast(&mut self, x: &Tensor, y: &Tensor) -> &mut Ops {
        self.launch("cast", &[x.arg(), y.arg(), Arg::u32(x.dtype as u32), Arg::u32(y.dtype as u32)])
    }
}
