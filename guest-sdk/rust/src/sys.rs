//! The raw host functions of module `stagehost_v1` (ABI.md §3): the
//! imports on wasm32, and the same functions backed by the native
//! emulator ([`crate::emu`]) elsewhere. Every function returns a status
//! (0 is OK) and writes its out-parameters only on success. Prefer the
//! safe API of the crate root; these are for callers that must see every
//! status as the host returns it.
//!
//! A batch record's `args_ptr` is a 32-bit address of guest memory. Fill
//! it with [`args_ptr`], which is that address on wasm32 and a token the
//! emulator resolves natively (a native pointer does not fit 32 bits).
//!
//! # Revisions
//!
//! Revision 1: every function but `last_error`. Revision 2: `last_error`.
//! Revision 3: `weights_get` and `tensor_get`. Revision 4: `stream_launch`.
//! Functions of a later revision are added here, marked with the revision
//! that added it (see [`crate::REVISION`]): a module that does not call
//! them does not import them, and runs on older hosts.

/// One argument record (ABI.md §3.1), 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArgRecord {
    /// 0 scalar, 1 buffer range.
    pub kind: u32,
    /// Byte offset into the buffer (buffer kind).
    pub offset: u32,
    /// Byte length; `0xFFFF_FFFF` is "to the end of the buffer".
    pub length: u32,
    /// Must be 0.
    pub reserved: u32,
    /// The scalar, or the buffer handle.
    pub value: u64,
}

/// One batch record (ABI.md §3.2), 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdRecord {
    /// The program handle.
    pub program: u64,
    /// The address of `args_count` argument records: [`args_ptr`].
    pub args_ptr: u32,
    /// At most 16.
    pub args_count: u32,
}

const _: () = assert!(core::mem::size_of::<ArgRecord>() == 24);
const _: () = assert!(core::mem::size_of::<CmdRecord>() == 16);

/// The imports: each is ABI.md §3's function of the same name.
#[cfg(target_arch = "wasm32")]
#[allow(missing_docs)]
mod imports {
    #[link(wasm_import_module = "stagehost_v1")]
    extern "C" {
        pub fn input_size(out_len: *mut u32) -> i32;
        pub fn input_read(offset: u32, dst: *mut u8, dst_len: u32, out_n: *mut u32) -> i32;
        pub fn output_write(src: *const u8, src_len: u32) -> i32;
        pub fn entry_name(dst: *mut u8, dst_cap: u32, out_len: *mut u32) -> i32;
        pub fn error_set(src: *const u8, src_len: u32) -> i32;
        /// Revision 2.
        pub fn last_error(dst: *mut u8, dst_cap: u32, out_len: *mut u32) -> i32;
        pub fn log(level: i32, src: *const u8, src_len: u32) -> i32;
        pub fn stream_get(name: *const u8, name_len: u32, out: *mut u64) -> i32;
        pub fn buffer_get(name: *const u8, name_len: u32, out: *mut u64) -> i32;
        pub fn program_get(name: *const u8, name_len: u32, out: *mut u64) -> i32;
        pub fn buffer_alloc(size: u32, out: *mut u64) -> i32;
        pub fn buffer_alloc_named(name: *const u8, name_len: u32, size: u32, out: *mut u64) -> i32;
        pub fn buffer_free(buffer: u64) -> i32;
        pub fn buffer_size(buffer: u64, out: *mut u32) -> i32;
        pub fn stream_write(stream: u64, buffer: u64, offset: u32, src: *const u8, src_len: u32) -> i32;
        pub fn stream_read(stream: u64, buffer: u64, offset: u32, dst: *mut u8, dst_len: u32) -> i32;
        pub fn stream_submit(stream: u64, program: u64, args: *const super::ArgRecord, count: u32) -> i32;
        pub fn stream_submit_batch(stream: u64, cmds: *const super::CmdRecord, count: u32) -> i32;
        pub fn stream_sync(stream: u64) -> i32;
        pub fn stream_idle(stream: u64, out: *mut u32) -> i32;
        /// Revision 3.
        pub fn weights_get(name: *const u8, name_len: u32, out: *mut u64) -> i32;
        /// Revision 3: `out` is the 96-byte record.
        pub fn tensor_get(name: *const u8, name_len: u32, out: *mut u8) -> i32;
        /// Revision 4: `grid` and `block` are 3 u32 each (x, y, z).
        pub fn stream_launch(stream: u64, program: u64, grid: *const u32, block: *const u32, shared_bytes: u32, args: *const super::ArgRecord, count: u32) -> i32;
    }
}

#[cfg(target_arch = "wasm32")]
pub use imports::*;

/// The 32-bit address of `args` for a [`CmdRecord`].
#[cfg(target_arch = "wasm32")]
pub fn args_ptr(args: &[ArgRecord]) -> u32 {
    args.as_ptr() as u32
}

#[cfg(not(target_arch = "wasm32"))]
pub use crate::emu::sys::*;
