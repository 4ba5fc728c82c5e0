//! What the export macros call. Not part of the API.

use crate::{Code, Result};

/// Runs the stage registered for the call's entry name: NOT_FOUND, with
/// the Go SDK's message, when there is none.
pub fn dispatch(stages: &[(&str, fn() -> Result<()>)]) -> i32 {
    install_panic_hook();
    // The entry name into a stack buffer: no allocation on the hot path.
    let mut buf = [0u8; 64];
    let mut n = 0u32;
    let st = unsafe { crate::sys::entry_name(buf.as_mut_ptr(), buf.len() as u32, &mut n) };
    let found = if st == 0 {
        stages.iter().find(|(name, _)| name.as_bytes() == &buf[..n as usize])
    } else {
        None // longer than any registered name, or a failure
    };
    if let Some((_, f)) = found {
        return call(*f);
    }
    let entry = match crate::entry_name() {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    match stages.iter().find(|(name, _)| *name == entry) {
        Some((_, f)) => call(*f),
        None => {
            crate::set_error(&alloc::format!("stagehost: no stage registered for entry {:?}", entry));
            Code::NotFound.as_i32()
        }
    }
}

fn fail(e: crate::Status) -> i32 {
    let msg = alloc::string::ToString::to_string(&e);
    crate::set_error(&msg);
    match e.code() {
        Code::Ok => 1,
        c => c.as_i32(),
    }
}

/// Runs a stage: an error becomes error_set and the result code.
pub fn call(f: fn() -> Result<()>) -> i32 {
    install_panic_hook();
    match f() {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// Runs a fence or init: the result is the status, nothing is set.
pub fn call_status(f: fn() -> Result<()>) -> i32 {
    install_panic_hook();
    match f() {
        Ok(()) => 0,
        Err(e) => match e.code() {
            Code::Ok => 1,
            c => c.as_i32(),
        },
    }
}

/// Logs a panic's message at level error, through the host.
pub fn log_panic(info: &core::panic::PanicInfo<'_>) {
    use core::fmt::Write;
    let mut s = alloc::string::String::new();
    let _ = write!(s, "panic: {}", info);
    let _ = crate::log(crate::Level::Error, &s);
}

#[cfg(all(feature = "std", target_arch = "wasm32"))]
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(std::boxed::Box::new(|info| log_panic(info)));
    });
}

#[cfg(not(all(feature = "std", target_arch = "wasm32")))]
fn install_panic_hook() {}

/// The panic handler of a no_std module: log the message, then trap.
#[cfg(all(target_arch = "wasm32", not(feature = "std"), feature = "panic-handler"))]
#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    log_panic(info);
    core::arch::wasm32::unreachable()
}
