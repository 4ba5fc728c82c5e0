//! The stagehost guest SDK for Rust: the host ABI v1 (abi/ABI.md,
//! revision 4) as safe, typed calls; the device op library's launch
//! helpers ([`Ops`]); the `stage!`, `fence!` and `init!` macros that export
//! a module's entry points; and, on every target but wasm32, a native
//! emulator of the host ([`emu`]) so that `cargo test` runs a stage.
//!
//! ```no_run
//! use stagehost::{Arg, Buffer, Program, Result, Stream};
//!
//! fn run() -> Result<()> {
//!     let s0 = Stream::get("s0")?;
//!     let fill = Program::get("fill")?;
//!     let buf = Buffer::alloc(64)?;
//!     s0.submit(&fill, &[Arg::whole(&buf), Arg::f32(2.5)])?;
//!     let mut out = [0u8; 64];
//!     s0.read(&buf, 0, &mut out)?; // waits for the fill
//!     buf.free()?;
//!     stagehost::output(&out)
//! }
//! stagehost::stage!(run);
//! ```
//!
//! The crate is `no_std` + `alloc` and has no dependencies. Build a stage
//! for `wasm32-unknown-unknown` (no WASI imports, so the manifest grants
//! none) as a `cdylib`. With rustc 1.63 a `no_std` binary cannot use
//! `alloc` (its error handler needs a later rustc), so a stage crate links
//! `std`, which on wasm32-unknown-unknown imports nothing; feature `std`
//! adds `std::error::Error` for [`Status`] and a panic hook that logs the
//! panic's message through the host before the module traps.
#![no_std]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(any(feature = "std", not(target_arch = "wasm32")))]
extern crate std;

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

mod ops;
mod status;
pub mod sys;

#[cfg(not(target_arch = "wasm32"))]
pub mod emu;

#[doc(hidden)]
pub mod rt;

pub use ops::{ConvOpts, DType, GemmOpts, Ops, Tensor};
pub use status::{Code, Result, Status};
use status::check;
pub use sys::{ArgRecord, CmdRecord};

/// The ABI version of the modules this SDK builds (`stagehost_abi_v1`).
pub const ABI_VERSION: u32 = 1;
/// The revision of v1 this SDK declares (ABI.md §1.4): 4. A module needs
/// revision 2, since every error reads `last_error`, revision 3 only
/// if it calls [`lookup_weights`] or [`lookup_tensor`], and revision 4
/// only if it calls [`Stream::launch`] (a module imports only the
/// functions it calls). A host of an earlier revision refuses a module at
/// load, naming the import.
pub const REVISION: u32 = 4;
/// The size of `tensor_get`'s record (ABI.md §3).
pub const TENSOR_RECORD_SIZE: usize = 96;
/// The most dims of a `tensor_get` record.
pub const MAX_TENSOR_RANK: usize = 8;
/// The most arguments of one launch.
pub const MAX_ARGS: usize = 16;
/// The most launches of one batch.
pub const MAX_BATCH: usize = 1024;
/// The most bytes of an error message (error_set, last_error).
pub const MAX_ERROR_MESSAGE: usize = 4096;
/// A buffer argument's length meaning "to the end of the buffer".
pub const TO_END: u32 = 0xFFFF_FFFF;
/// The entry name of a call that names none.
pub const DEFAULT_ENTRY: &str = "main";

/// A log level (ABI.md §3 `log`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(i32)]
pub enum Level {
    /// 0
    Debug = 0,
    /// 1
    Info = 1,
    /// 2
    Warn = 2,
    /// 3
    Error = 3,
}

fn len32(n: usize) -> u32 {
    // A wasm32 slice always fits; natively the emulator bounds it.
    if n > u32::MAX as usize {
        u32::MAX
    } else {
        n as u32
    }
}

/// The length of the call's input.
///
/// # Errors
///
/// Only a host's refusal of the out-parameter (never on a correct host).
pub fn input_size() -> Result<u32> {
    let mut n = 0u32;
    check(unsafe { sys::input_size(&mut n) }, "input_size")?;
    Ok(n)
}

/// Copies input bytes from `offset` into `dst`; returns how many.
///
/// # Errors
///
/// `INVALID_ARGUMENT` for an offset beyond the input.
pub fn input_read(offset: u32, dst: &mut [u8]) -> Result<usize> {
    let mut n = 0u32;
    check(unsafe { sys::input_read(offset, dst.as_mut_ptr(), len32(dst.len()), &mut n) }, "input_read")?;
    Ok(n as usize)
}

/// The whole input.
///
/// # Errors
///
/// As [`input_size`] and [`input_read`].
pub fn input() -> Result<Vec<u8>> {
    let n = input_size()? as usize;
    let mut buf = vec![0u8; n];
    let mut off = 0;
    while off < n {
        let got = input_read(off as u32, &mut buf[off..])?;
        if got == 0 {
            return Err(Status::new(Code::Fault, "stagehost: input shorter than input_size"));
        }
        off += got;
    }
    Ok(buf)
}

/// Appends `data` to the call's output.
///
/// # Errors
///
/// `OUTPUT_TOO_LARGE` beyond the session's output limit; nothing is
/// appended.
pub fn output(data: &[u8]) -> Result<()> {
    check(unsafe { sys::output_write(data.as_ptr(), len32(data.len())) }, "output_write")
}

/// The requested entry name (`main` by default).
///
/// # Errors
///
/// Only a host's refusal (never on a correct host).
pub fn entry_name() -> Result<String> {
    let mut buf = [0u8; 256];
    let mut n = 0u32;
    let st = unsafe { sys::entry_name(buf.as_mut_ptr(), buf.len() as u32, &mut n) };
    if st == Code::OutOfBounds.as_i32() {
        let mut big = vec![0u8; n as usize];
        check(unsafe { sys::entry_name(big.as_mut_ptr(), n, &mut n) }, "entry_name")?;
        return Ok(String::from_utf8_lossy(&big[..n as usize]).into_owned());
    }
    check(st, "entry_name")?;
    Ok(String::from_utf8_lossy(&buf[..n as usize]).into_owned())
}

/// Sets the message the stage's caller sees if the stage fails (cut to
/// 4096 bytes). The `stage!` macro sets it from the stage's error.
pub fn set_error(msg: &str) {
    unsafe { sys::error_set(msg.as_ptr(), len32(msg.len())) };
}

/// The call's last error (revision 2): the host's reason for the most
/// recent non-OK status of this call, or `None` when there is none. Every
/// [`Status`] the SDK returns already carries it.
pub fn last_error() -> Option<String> {
    let mut buf = [0u8; 512];
    let mut n = 0u32;
    let st = unsafe { sys::last_error(buf.as_mut_ptr(), buf.len() as u32, &mut n) };
    let text = if st == Code::OutOfBounds.as_i32() {
        let mut big = vec![0u8; n as usize];
        if unsafe { sys::last_error(big.as_mut_ptr(), n, &mut n) } != 0 {
            return None;
        }
        big.truncate(n as usize);
        big
    } else if st == 0 {
        buf[..n as usize].to_vec()
    } else {
        return None;
    };
    if text.is_empty() {
        None
    } else {
        Some(String::from_utf8_lossy(&text).into_owned())
    }
}

/// Logs `msg` at `level`.
///
/// # Errors
///
/// Only a host's refusal (never on a correct host; a host may drop
/// messages beyond its limits and still return OK).
pub fn log(level: Level, msg: &str) -> Result<()> {
    check(unsafe { sys::log(level as i32, msg.as_ptr(), len32(msg.len())) }, "log")
}

fn lookup(
    f: unsafe fn(*const u8, u32, *mut u64) -> i32,
    name: &str,
    op: &'static str,
) -> Result<u64> {
    let mut h = 0u64;
    check(unsafe { f(name.as_ptr(), len32(name.len()), &mut h) }, op)?;
    Ok(h)
}

// The raw imports are `unsafe extern "C" fn` on wasm32 and `unsafe fn`
// natively; these shims give both one type for lookup.
unsafe fn stream_get_(p: *const u8, n: u32, o: *mut u64) -> i32 {
    sys::stream_get(p, n, o)
}
unsafe fn buffer_get_(p: *const u8, n: u32, o: *mut u64) -> i32 {
    sys::buffer_get(p, n, o)
}
unsafe fn program_get_(p: *const u8, n: u32, o: *mut u64) -> i32 {
    sys::program_get(p, n, o)
}

unsafe fn weights_get_(p: *const u8, n: u32, o: *mut u64) -> i32 {
    sys::weights_get(p, n, o)
}

/// The read-only buffer over the device copy of the weights called `name`
/// (`weights_get`, ABI revision 3): the file's bytes for raw weights, the
/// data section after the header for safetensors. Every session that
/// lists the weights shares that one copy, so the buffer can be read
/// (`Stream::read`, an op argument of direction `in`) but never written:
/// `Stream::write` into it, a launch passing it as an argument the kernel
/// writes (direction `out` or `inout`, or a kernel without a description
/// of its arguments) and `Buffer::free` are refused with
/// `INVALID_ARGUMENT` before anything is enqueued, with a last error
/// naming the argument.
///
/// # Errors
///
/// `NOT_FOUND` when the session lists no weights of that name.
pub fn lookup_weights(name: &str) -> Result<Buffer> {
    lookup(weights_get_, name, "weights_get").map(Buffer)
}

/// One tensor of safetensors weights as `tensor_get` reports it (ABI.md
/// §3), whatever its dtype: see [`lookup_tensor`] for the op library's
/// [`Tensor`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRecord {
    /// The weights' read-only buffer ([`lookup_weights`]).
    pub buf: Buffer,
    /// The byte offset of the tensor's first value in `buf`.
    pub off: u64,
    /// The tensor's size in bytes.
    pub nbytes: u64,
    /// The dtype code: [`DType`]'s values for F32, F16, BF16 and I32, and
    /// 16 up for safetensors' other types (F64 16, I64 17, I16 18, I8 19,
    /// U8 20, BOOL 21, U16 22, U32 23, U64 24, F8_E4M3 25, F8_E5M2 26).
    pub dtype: u32,
    /// The dims (at most [`MAX_TENSOR_RANK`]).
    pub dims: Vec<u64>,
}

/// The record of the tensor called `"<weights>/<tensor>"` of safetensors
/// weights the session lists (`tensor_get`, ABI revision 3).
///
/// # Errors
///
/// `NOT_FOUND` when the session lists no such weights, or they have no
/// such tensor (or the name has no `/`).
pub fn lookup_tensor_record(name: &str) -> Result<TensorRecord> {
    let mut rec = [0u8; TENSOR_RECORD_SIZE];
    check(unsafe { sys::tensor_get(name.as_ptr(), len32(name.len()), rec.as_mut_ptr()) }, "tensor_get")?;
    let le = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&rec[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let rank = core::cmp::min(le(24) >> 32, MAX_TENSOR_RANK as u64) as usize;
    Ok(TensorRecord {
        buf: Buffer(le(0)),
        off: le(8),
        nbytes: le(16),
        dtype: le(24) as u32,
        dims: (0..rank).map(|i| le(32 + 8 * i)).collect(),
    })
}

/// The tensor called `"<weights>/<tensor>"` of safetensors weights the
/// session lists (`tensor_get`, ABI revision 3), as the op library's
/// [`Tensor`]: its `buf` is the weights' read-only buffer (see
/// [`lookup_weights`]), `off` its first byte there, `dtype` and `dims`
/// the file's. Go's `LookupTensor`.
///
/// ```no_run
/// use stagehost::{Buffer, DType, GemmOpts, Ops, Stream, Tensor};
///
/// fn run() -> stagehost::Result<()> {
///     let w = stagehost::lookup_tensor("digits/fc1.weight")?; // [64, 10] F32
///     let x = Tensor::new(Buffer::alloc(64 * 4)?, 0, DType::F32, &[1, 64]);
///     let y = Tensor::new(Buffer::alloc(10 * 4)?, 0, DType::F32, &[1, 10]);
///     let mut ops = Ops::default();
///     ops.gemm(&x, &w, &y, GemmOpts::default()); // w is read only: an input
///     ops.submit(&Stream::get("s0")?)
/// }
/// ```
///
/// # Errors
///
/// `NOT_FOUND` when the session lists no such weights, or they have no
/// such tensor. `INVALID_ARGUMENT` (the guest's own, naming the tensor)
/// for a tensor the op library's [`Tensor`] cannot hold: a dtype other
/// than F32, F16, BF16 and I32, or an offset beyond 32 bits; read such
/// a tensor with [`lookup_tensor_record`].
pub fn lookup_tensor(name: &str) -> Result<Tensor> {
    let r = lookup_tensor_record(name)?;
    let dtype = match r.dtype {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::BF16,
        3 => DType::I32,
        c => {
            return Err(Status::new(
                Code::InvalidArgument,
                alloc::format!("tensor_get: tensor {:?} has dtype code {}, which no op takes: read it with lookup_tensor_record", name, c),
            ))
        }
    };
    if r.off > u32::MAX as u64 {
        return Err(Status::new(
            Code::InvalidArgument,
            alloc::format!("tensor_get: tensor {:?} starts at byte {}, beyond a launch argument's 32-bit offset", name, r.off),
        ));
    }
    let dims: Vec<usize> = r.dims.iter().map(|&d| d as usize).collect();
    Ok(Tensor::new(r.buf, r.off as u32, dtype, &dims))
}

/// A stream of the session, declared by the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream(u64);

/// A device buffer: declared by the operator, or allocated in the
/// session's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buffer(u64);

/// A program (kernel) the session may launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Program(u64);

macro_rules! handle_methods {
    ($t:ident) => {
        impl $t {
            /// The raw handle (ABI.md §2).
            pub const fn raw(self) -> u64 {
                self.0
            }
            /// A handle from its raw value, as the host issued it. The
            /// host checks every handle: a wrong one is a status, never
            /// undefined behaviour.
            pub const fn from_raw(h: u64) -> Self {
                $t(h)
            }
        }
    };
}
handle_methods!(Stream);
handle_methods!(Buffer);
handle_methods!(Program);

impl Stream {
    /// The declared stream called `name`.
    ///
    /// # Errors
    ///
    /// `NOT_FOUND` when the session declares none of that name.
    pub fn get(name: &str) -> Result<Stream> {
        lookup(stream_get_, name, "stream_get").map(Stream)
    }

    /// Enqueues an upload of `data` into `buf` at `offset`; `data` is
    /// captured before it returns.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a range outside the buffer; a bad, stale or
    /// foreign handle.
    pub fn write(&self, buf: &Buffer, offset: u32, data: &[u8]) -> Result<()> {
        check(unsafe { sys::stream_write(self.0, buf.0, offset, data.as_ptr(), len32(data.len())) }, "stream_write")
    }

    /// Downloads `dst.len()` bytes of `buf` from `offset`, after every
    /// earlier command of the stream.
    ///
    /// # Errors
    ///
    /// As [`Stream::write`]; `DEADLINE_EXCEEDED` past the call's deadline.
    pub fn read(&self, buf: &Buffer, offset: u32, dst: &mut [u8]) -> Result<()> {
        check(unsafe { sys::stream_read(self.0, buf.0, offset, dst.as_mut_ptr(), len32(dst.len())) }, "stream_read")
    }

    /// Enqueues one launch of `prog`.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a launch its kernel's contract refuses (the
    /// last error names the op and argument); `BUSY` for a full queue.
    pub fn submit(&self, prog: &Program, args: &[Arg]) -> Result<()> {
        // Arg is a transparent ArgRecord: the slice is the records.
        let recs = args.as_ptr() as *const ArgRecord;
        check(unsafe { sys::stream_submit(self.0, prog.0, recs, len32(args.len())) }, "stream_submit")
    }

    /// Enqueues one launch of the vendor kernel `prog` (a manifest's
    /// `[[kernel]]`; `stream_launch`, ABI revision 4) with its `grid` of
    /// blocks, each block's threads (`block`, x, y, z) and its dynamic
    /// shared memory in bytes. The host checks the shape against the
    /// device's launch limits and `args` against the kernel's declaration
    /// before it enqueues anything; failures of the launch itself are
    /// reported by [`Stream::sync`]. Built-in programs are launched with
    /// [`Stream::submit`]. At most [`MAX_ARGS`] arguments, the same
    /// records as `submit`'s.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a built-in program (launch it with
    /// [`Stream::submit`]), a dimension of 0 or over the device's limit,
    /// more threads per block or shared bytes than the device allows, or
    /// arguments that do not match the kernel's declaration (the last
    /// error names the kernel and the limit or argument); `BUSY` for a
    /// full queue; the handle statuses for a foreign or freed handle.
    pub fn launch(&self, prog: &Program, grid: [u32; 3], block: [u32; 3], shared_bytes: u32, args: &[Arg]) -> Result<()> {
        let recs = args.as_ptr() as *const ArgRecord;
        check(
            unsafe { sys::stream_launch(self.0, prog.0, grid.as_ptr(), block.as_ptr(), shared_bytes, recs, len32(args.len())) },
            "stream_launch",
        )
    }

    /// Enqueues `cmds` in order, validated as a whole before any is
    /// enqueued (one `stream_submit_batch`; at most [`MAX_BATCH`]).
    ///
    /// # Errors
    ///
    /// As [`Stream::submit`], for the first command refused.
    pub fn submit_batch(&self, cmds: &[Cmd]) -> Result<()> {
        let batch: Vec<CmdRecord> = cmds
            .iter()
            .map(|c| CmdRecord { program: c.program.0, args_ptr: sys::args_ptr(Arg::records(&c.args)), args_count: len32(c.args.len()) })
            .collect();
        check(unsafe { sys::stream_submit_batch(self.0, batch.as_ptr(), len32(batch.len())) }, "stream_submit_batch")
    }

    /// Waits until every command of the stream retired.
    ///
    /// # Errors
    ///
    /// `FAULT` for a command that failed on the device (the last error is
    /// the device's report); `DEADLINE_EXCEEDED` past the deadline.
    pub fn sync(&self) -> Result<()> {
        check(unsafe { sys::stream_sync(self.0) }, "stream_sync")
    }

    /// Whether every command of the stream retired; never waits.
    ///
    /// # Errors
    ///
    /// A bad, stale or foreign handle.
    pub fn idle(&self) -> Result<bool> {
        let mut v = 0u32;
        check(unsafe { sys::stream_idle(self.0, &mut v) }, "stream_idle")?;
        Ok(v != 0)
    }
}

impl Buffer {
    /// The declared buffer called `name`.
    ///
    /// # Errors
    ///
    /// `NOT_FOUND` when the session declares none of that name.
    pub fn get(name: &str) -> Result<Buffer> {
        lookup(buffer_get_, name, "buffer_get").map(Buffer)
    }

    /// Allocates `size` bytes on the session's device, in its budget.
    ///
    /// # Errors
    ///
    /// `OUT_OF_BUDGET` when it would not fit; `INVALID_ARGUMENT` for 0.
    pub fn alloc(size: u32) -> Result<Buffer> {
        let mut h = 0u64;
        check(unsafe { sys::buffer_alloc(size, &mut h) }, "buffer_alloc")?;
        Ok(Buffer(h))
    }

    /// The live buffer allocated under `name` if it has `size` bytes, else
    /// a new one named so: a replaced instance finds it again.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a name of 0 or more than 256 bytes or a live
    /// buffer of that name with another size; `OUT_OF_BUDGET`.
    pub fn alloc_named(name: &str, size: u32) -> Result<Buffer> {
        let mut h = 0u64;
        check(unsafe { sys::buffer_alloc_named(name.as_ptr(), len32(name.len()), size, &mut h) }, "buffer_alloc_named")?;
        Ok(Buffer(h))
    }

    /// Frees an allocated buffer; the handle is stale from now on.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a declared buffer; a bad, stale or foreign
    /// handle.
    pub fn free(self) -> Result<()> {
        check(unsafe { sys::buffer_free(self.0) }, "buffer_free")
    }

    /// The buffer's size in bytes.
    ///
    /// # Errors
    ///
    /// A bad, stale or foreign handle.
    pub fn size(&self) -> Result<u32> {
        let mut n = 0u32;
        check(unsafe { sys::buffer_size(self.0, &mut n) }, "buffer_size")?;
        Ok(n)
    }
}

impl Program {
    /// The program called `name`, which the session's manifest lists.
    ///
    /// # Errors
    ///
    /// `NOT_FOUND` when the session may use no program of that name.
    pub fn get(name: &str) -> Result<Program> {
        lookup(program_get_, name, "program_get").map(Program)
    }
}

/// One launch argument: a scalar or a buffer range (ABI.md §3.1). It is
/// its record: a slice of `Arg` is passed to the host as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct Arg(pub ArgRecord);

impl Arg {
    /// The records of `args`, without copying.
    pub fn records(args: &[Arg]) -> &[ArgRecord] {
        // SAFETY: Arg is repr(transparent) over ArgRecord.
        unsafe { core::slice::from_raw_parts(args.as_ptr() as *const ArgRecord, args.len()) }
    }
    /// The range of `len` bytes at `offset` of `buf` ([`TO_END`]: to its
    /// end).
    pub fn buf(buf: &Buffer, offset: u32, len: u32) -> Arg {
        Arg(ArgRecord { kind: 1, offset, length: len, reserved: 0, value: buf.0 })
    }
    /// The whole of `buf`.
    pub fn whole(buf: &Buffer) -> Arg {
        Arg::buf(buf, 0, TO_END)
    }
    /// A 64-bit scalar.
    pub fn u64(v: u64) -> Arg {
        Arg(ArgRecord { kind: 0, offset: 0, length: 0, reserved: 0, value: v })
    }
    /// A 32-bit scalar.
    pub fn u32(v: u32) -> Arg {
        Arg::u64(v as u64)
    }
    /// A float32 scalar (its bits in the low 32).
    pub fn f32(v: f32) -> Arg {
        Arg::u64(v.to_bits() as u64)
    }
}

/// One launch of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cmd {
    /// The program.
    pub program: Program,
    /// Its arguments, at most [`MAX_ARGS`].
    pub args: Vec<Arg>,
}

impl Cmd {
    /// A launch of `program` with `args`.
    pub fn new(program: Program, args: &[Arg]) -> Cmd {
        Cmd { program, args: args.to_vec() }
    }
}

/// Little-endian float32 bytes of `v`, the layout of an F32 tensor.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 * v.len());
    for x in v {
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

/// The little-endian float32 values of `b` (a trailing partial value is
/// ignored).
pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Exports the module's `stagehost_run`, with the ABI marker
/// `stagehost_abi_v1`: `stage!(run)` runs `run` (a
/// `fn() -> stagehost::Result<()>`) for the entry `main`, and
/// `stage!("main" => run, "warmup" => warm)` one function per entry name,
/// as the Go SDK's `Register`. A call of an entry with no function fails
/// with `NOT_FOUND` ("stagehost: no stage registered for entry …"). An
/// `Err` becomes the call's client error: its text goes to `error_set` and
/// its code is the stage's result (1 for a status of code OK). Use once per
/// module. Natively it defines `stagehost_run() -> i32` for
/// [`emu::Emulator::run_export`].
#[macro_export]
macro_rules! stage {
    ($run:path) => {
        $crate::stage!("main" => $run);
    };
    ($($entry:literal => $f:path),+ $(,)?) => {
        #[cfg(target_arch = "wasm32")]
        #[no_mangle]
        pub extern "C" fn stagehost_abi_v1() {}

        #[cfg(target_arch = "wasm32")]
        #[no_mangle]
        pub extern "C" fn stagehost_run() -> i32 {
            $crate::rt::dispatch(&[$(($entry, $f as fn() -> $crate::Result<()>)),+])
        }

        #[cfg(not(target_arch = "wasm32"))]
        #[allow(dead_code)]
        pub fn stagehost_run() -> i32 {
            $crate::rt::dispatch(&[$(($entry, $f as fn() -> $crate::Result<()>)),+])
        }
    };
}

/// Exports `$fence` (a `fn() -> stagehost::Result<()>`) as the module's
/// `stagehost_fence` (ABI.md §4.4): `Ok` means drained; an `Err` of code
/// `FAULT` means drained with failed device work; any other error
/// quarantines the session.
#[macro_export]
macro_rules! fence {
    ($fence:path) => {
        #[cfg(target_arch = "wasm32")]
        #[no_mangle]
        pub extern "C" fn stagehost_fence() -> i32 {
            $crate::rt::call_status($fence)
        }

        #[cfg(not(target_arch = "wasm32"))]
        #[allow(dead_code)]
        pub fn stagehost_fence() -> i32 {
            $crate::rt::call_status($fence)
        }
    };
}

/// Exports `$init` (a `fn() -> stagehost::Result<()>`) as the module's
/// `stagehost_init`, called once per instance (ABI.md §4.3); an `Err`
/// fails the instantiation.
#[macro_export]
macro_rules! init {
    ($init:path) => {
        #[cfg(target_arch = "wasm32")]
        #[no_mangle]
        pub extern "C" fn stagehost_init() -> i32 {
            $crate::rt::call_status($init)
        }

        #[cfg(not(target_arch = "wasm32"))]
        #[allow(dead_code)]
        pub fn stagehost_init() -> i32 {
            $crate::rt::call_status($init)
        }
    };
}

/// Exports `stagehost_no_snapshot`: every instance initialises itself
/// (ABI.md §4.3.1).
#[macro_export]
macro_rules! no_snapshot {
    () => {
        #[cfg(target_arch = "wasm32")]
        #[no_mangle]
        pub extern "C" fn stagehost_no_snapshot() {}
    };
}
