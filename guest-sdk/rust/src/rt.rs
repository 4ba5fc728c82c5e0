//! What the export macros call. Not part of the API.

use crate::{Code, Result};

/// Runs a stage: an error becomes error_set and the result code.
pub fn call(f: fn() -> Result<()>) -> i32 {
    install_panic_hook();
    match f() {
        Ok(()) => 0,
        Err(e) => {
            let msg = alloc::string::ToString::to_string(&e);
            crate::set_error(&msg);
            match e.code() {
                Code::Ok => 1,
                c => c.as_i32(),
            }
        }
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
