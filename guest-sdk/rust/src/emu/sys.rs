//! The raw host functions, natively: the same names and signatures as the
//! wasm32 imports, acting on the running [`super::Emulator`]. A null
//! pointer with a non-zero length is `OUT_OF_BOUNDS` (native memory has no
//! other bounds to check). Calling one outside a run panics.

use std::cell::RefCell;
use std::vec::Vec;

use super::with_state;
use crate::{ArgRecord, CmdRecord};

const OUT_OF_BOUNDS: i32 = 14;

std::thread_local! {
    static BATCH_ARGS: RefCell<Vec<(*const ArgRecord, usize)>> = RefCell::new(Vec::new());
}

/// A token for a [`CmdRecord`]'s `args_ptr`: natively a 64-bit pointer
/// does not fit, so the emulator keeps `args` and resolves the token at
/// the next `stream_submit_batch` of this thread (which forgets them).
pub fn args_ptr(args: &[ArgRecord]) -> u32 {
    BATCH_ARGS.with(|b| {
        let mut b = b.borrow_mut();
        b.push((args.as_ptr(), args.len()));
        b.len() as u32
    })
}

unsafe fn slice<'a>(p: *const u8, n: u32) -> Option<&'a [u8]> {
    if n == 0 {
        return Some(&[]);
    }
    if p.is_null() {
        return None;
    }
    Some(std::slice::from_raw_parts(p, n as usize))
}

unsafe fn slice_mut<'a>(p: *mut u8, n: u32) -> Option<&'a mut [u8]> {
    if n == 0 {
        return Some(&mut []);
    }
    if p.is_null() {
        return None;
    }
    Some(std::slice::from_raw_parts_mut(p, n as usize))
}

macro_rules! out {
    ($p:expr, $v:expr) => {
        if $p.is_null() {
            OUT_OF_BOUNDS
        } else {
            *$p = $v;
            0
        }
    };
}

/// `input_size`.
pub unsafe fn input_size(out_len: *mut u32) -> i32 {
    with_state("input_size", |s| {
        let (n, st) = s.input_size();
        let st = if st == 0 { out!(out_len, n) } else { st };
        s.note(st)
    })
}

/// `input_read`.
pub unsafe fn input_read(offset: u32, dst: *mut u8, dst_len: u32, out_n: *mut u32) -> i32 {
    with_state("input_read", |s| {
        let st = match slice_mut(dst, dst_len) {
            None => OUT_OF_BOUNDS,
            Some(_) if out_n.is_null() => OUT_OF_BOUNDS,
            Some(d) => {
                let (n, st) = s.input_read(offset, d);
                if st == 0 {
                    *out_n = n;
                }
                st
            }
        };
        s.note(st)
    })
}

/// `output_write`.
pub unsafe fn output_write(src: *const u8, src_len: u32) -> i32 {
    with_state("output_write", |s| {
        let st = match slice(src, src_len) {
            None => OUT_OF_BOUNDS,
            Some(b) => s.output_write(b),
        };
        s.note(st)
    })
}

unsafe fn string_out(
    s: &mut super::State,
    dst: *mut u8,
    cap: u32,
    out_len: *mut u32,
    f: fn(&mut super::State, &mut [u8]) -> (u32, i32),
) -> i32 {
    if out_len.is_null() {
        return OUT_OF_BOUNDS;
    }
    match slice_mut(dst, cap) {
        None => OUT_OF_BOUNDS,
        Some(d) => {
            let (n, st) = f(s, d);
            if st == 0 || st == OUT_OF_BOUNDS {
                *out_len = n;
            }
            st
        }
    }
}

/// `entry_name`.
pub unsafe fn entry_name(dst: *mut u8, dst_cap: u32, out_len: *mut u32) -> i32 {
    with_state("entry_name", |s| {
        let st = string_out(s, dst, dst_cap, out_len, super::State::entry_name);
        s.note(st)
    })
}

/// `error_set`.
pub unsafe fn error_set(src: *const u8, src_len: u32) -> i32 {
    with_state("error_set", |s| {
        let st = match slice(src, src_len) {
            None => OUT_OF_BOUNDS,
            Some(b) => s.error_set(b),
        };
        s.note(st)
    })
}

/// `last_error` (revision 2): its own status never changes the last error.
pub unsafe fn last_error(dst: *mut u8, dst_cap: u32, out_len: *mut u32) -> i32 {
    with_state("last_error", |s| string_out(s, dst, dst_cap, out_len, super::State::last_error))
}

/// `log`.
pub unsafe fn log(level: i32, src: *const u8, src_len: u32) -> i32 {
    with_state("log", |s| {
        let st = match slice(src, src_len) {
            None => OUT_OF_BOUNDS,
            Some(b) => s.log_call(level, b),
        };
        s.note(st)
    })
}

unsafe fn lookup(op: &str, kind: u8, name: *const u8, len: u32, out: *mut u64) -> i32 {
    with_state(op, |s| {
        let st = match slice(name, len) {
            None => OUT_OF_BOUNDS,
            Some(_) if out.is_null() => OUT_OF_BOUNDS,
            Some(n) => {
                let (h, st) = s.lookup(kind, n);
                if st == 0 {
                    *out = h;
                }
                st
            }
        };
        s.note(st)
    })
}

/// `stream_get`.
pub unsafe fn stream_get(name: *const u8, name_len: u32, out: *mut u64) -> i32 {
    lookup("stream_get", 1, name, name_len, out)
}
/// `buffer_get`.
pub unsafe fn buffer_get(name: *const u8, name_len: u32, out: *mut u64) -> i32 {
    lookup("buffer_get", 2, name, name_len, out)
}
/// `program_get`.
pub unsafe fn program_get(name: *const u8, name_len: u32, out: *mut u64) -> i32 {
    lookup("program_get", 3, name, name_len, out)
}

/// `weights_get` (revision 3).
pub unsafe fn weights_get(name: *const u8, name_len: u32, out: *mut u64) -> i32 {
    with_state("weights_get", |s| {
        let st = match slice(name, name_len) {
            None => OUT_OF_BOUNDS,
            Some(_) if out.is_null() => OUT_OF_BOUNDS,
            Some(n) => {
                let (h, st) = s.weights_get(n);
                if st == 0 {
                    *out = h;
                }
                st
            }
        };
        s.note(st)
    })
}

/// `tensor_get` (revision 3): `out` is the 96-byte record.
pub unsafe fn tensor_get(name: *const u8, name_len: u32, out: *mut u8) -> i32 {
    with_state("tensor_get", |s| {
        let st = match (slice(name, name_len), slice_mut(out, crate::TENSOR_RECORD_SIZE as u32)) {
            (Some(n), Some(rec)) => s.tensor_get(n, rec),
            _ => OUT_OF_BOUNDS,
        };
        s.note(st)
    })
}

/// `buffer_alloc`.
pub unsafe fn buffer_alloc(size: u32, out: *mut u64) -> i32 {
    with_state("buffer_alloc", |s| {
        let st = if out.is_null() {
            OUT_OF_BOUNDS
        } else {
            let (h, st) = s.buffer_alloc(size);
            if st == 0 {
                *out = h;
            }
            st
        };
        s.note(st)
    })
}

/// `buffer_alloc_named`.
pub unsafe fn buffer_alloc_named(name: *const u8, name_len: u32, size: u32, out: *mut u64) -> i32 {
    with_state("buffer_alloc_named", |s| {
        let st = match slice(name, name_len) {
            None => OUT_OF_BOUNDS,
            Some(_) if out.is_null() => OUT_OF_BOUNDS,
            Some(n) => {
                let (h, st) = s.buffer_alloc_named(n, size);
                if st == 0 {
                    *out = h;
                }
                st
            }
        };
        s.note(st)
    })
}

/// `buffer_free`.
pub unsafe fn buffer_free(buffer: u64) -> i32 {
    with_state("buffer_free", |s| {
        let st = s.buffer_free(buffer);
        s.note(st)
    })
}

/// `buffer_size`.
pub unsafe fn buffer_size(buffer: u64, out: *mut u32) -> i32 {
    with_state("buffer_size", |s| {
        let st = if out.is_null() {
            OUT_OF_BOUNDS
        } else {
            let (n, st) = s.buffer_size(buffer);
            if st == 0 {
                *out = n;
            }
            st
        };
        s.note(st)
    })
}

/// `stream_write`.
pub unsafe fn stream_write(stream: u64, buffer: u64, offset: u32, src: *const u8, src_len: u32) -> i32 {
    with_state("stream_write", |s| {
        let st = match slice(src, src_len) {
            None => OUT_OF_BOUNDS,
            Some(b) => s.stream_write(stream, buffer, offset, b),
        };
        s.note(st)
    })
}

/// `stream_read`.
pub unsafe fn stream_read(stream: u64, buffer: u64, offset: u32, dst: *mut u8, dst_len: u32) -> i32 {
    with_state("stream_read", |s| {
        let st = match slice_mut(dst, dst_len) {
            None => OUT_OF_BOUNDS,
            Some(d) => s.stream_read(stream, buffer, offset, d),
        };
        s.note(st)
    })
}

/// `stream_submit`.
pub unsafe fn stream_submit(stream: u64, program: u64, args: *const ArgRecord, count: u32) -> i32 {
    with_state("stream_submit", |s| {
        let st = if count > 16 {
            // Checked before the records are read, as the host does.
            s.stream_submit(stream, program, &[ArgRecord::default(); 17])
        } else if count > 0 && args.is_null() {
            OUT_OF_BOUNDS
        } else {
            let recs: &[ArgRecord] = if count == 0 { &[] } else { std::slice::from_raw_parts(args, count as usize) };
            s.stream_submit(stream, program, recs)
        };
        s.note(st)
    })
}

/// `stream_launch` (revision 4): `grid` and `block` point at 3 u32 each.
pub unsafe fn stream_launch(
    stream: u64,
    program: u64,
    grid: *const u32,
    block: *const u32,
    shared_bytes: u32,
    args: *const ArgRecord,
    count: u32,
) -> i32 {
    with_state("stream_launch", |s| {
        let st = if grid.is_null() || block.is_null() {
            OUT_OF_BOUNDS
        } else {
            let g = [*grid, *grid.add(1), *grid.add(2)];
            let b = [*block, *block.add(1), *block.add(2)];
            if count > 16 {
                // Checked before the records are read, as the host does.
                s.stream_launch(stream, program, g, b, shared_bytes, &[ArgRecord::default(); 17])
            } else if count > 0 && args.is_null() {
                OUT_OF_BOUNDS
            } else {
                let recs: &[ArgRecord] = if count == 0 { &[] } else { std::slice::from_raw_parts(args, count as usize) };
                s.stream_launch(stream, program, g, b, shared_bytes, recs)
            }
        };
        s.note(st)
    })
}

/// `stream_submit_batch`: `args_ptr` values are [`args_ptr`] tokens.
pub unsafe fn stream_submit_batch(stream: u64, cmds: *const CmdRecord, count: u32) -> i32 {
    let regs = BATCH_ARGS.with(|b| std::mem::take(&mut *b.borrow_mut()));
    with_state("stream_submit_batch", |s| {
        let st = if count > 0 && cmds.is_null() {
            OUT_OF_BOUNDS
        } else if count > 1024 {
            s.stream_submit_batch(stream, &std::vec![CmdRecord::default(); count as usize], &|_, _| None)
        } else {
            let recs: &[CmdRecord] = if count == 0 { &[] } else { std::slice::from_raw_parts(cmds, count as usize) };
            let resolve = |tok: u32, n: u32| -> Option<Vec<ArgRecord>> {
                if n == 0 {
                    return Some(Vec::new());
                }
                let (p, len) = *regs.get((tok as usize).checked_sub(1)?)?;
                if (n as usize) > len {
                    return None;
                }
                Some(std::slice::from_raw_parts(p, n as usize).to_vec())
            };
            s.stream_submit_batch(stream, recs, &resolve)
        };
        s.note(st)
    })
}

/// `stream_sync`.
pub unsafe fn stream_sync(stream: u64) -> i32 {
    with_state("stream_sync", |s| {
        let st = s.stream_sync(stream);
        s.note(st)
    })
}

/// `stream_idle`.
pub unsafe fn stream_idle(stream: u64, out: *mut u32) -> i32 {
    with_state("stream_idle", |s| {
        let st = if out.is_null() {
            OUT_OF_BOUNDS
        } else {
            let (v, st) = s.stream_idle(stream);
            if st == 0 {
                *out = v;
            }
            st
        };
        s.note(st)
    })
}
