//! casestage: runs one case of guest-sdk/testdata/emucases.txt on the host.
//! A call of entry "load" stores its input (the case's call lines); a call
//! of entry "main" (with the case's own input) runs them through the raw
//! host functions and returns the case's code, or 99 with the first
//! mismatch as its error message. Its stagehost_fence runs the case's
//! fence lines (the host uses it where the case has some; the built-in
//! fence otherwise). Entry "panic" panics, through the SDK's
//! stage wrapper, whose hook logs the message before the module traps.

mod interp;

use std::cell::RefCell;

std::thread_local! {
    static SCRIPT: RefCell<String> = RefCell::new(String::new());
    // Whether this call ran the case ("main"): the fence of a "load" call
    // has nothing to do.
    static RAN: RefCell<bool> = RefCell::new(false);
}

#[no_mangle]
pub extern "C" fn stagehost_abi_v1() {}

#[no_mangle]
pub extern "C" fn stagehost_run() -> i32 {
    let entry = stagehost::entry_name().unwrap_or_default();
    if entry == "panic" {
        return stagehost::rt::call(deliberate_panic);
    }
    if entry == "load" {
        return match stagehost::input() {
            Ok(b) => {
                SCRIPT.with(|s| *s.borrow_mut() = String::from_utf8_lossy(&b).into_owned());
                0
            }
            Err(e) => {
                stagehost::set_error(&e.to_string());
                98
            }
        };
    }
    let script = SCRIPT.with(|s| s.borrow().clone());
    RAN.with(|r| *r.borrow_mut() = true);
    match interp::run(&script) {
        Ok(code) => code,
        Err(msg) => {
            stagehost::set_error(&msg);
            99
        }
    }
}

fn deliberate_panic() -> stagehost::Result<()> {
    panic!("casestage: a deliberate panic")
}

#[no_mangle]
pub extern "C" fn stagehost_fence() -> i32 {
    if !RAN.with(|r| std::mem::replace(&mut *r.borrow_mut(), false)) {
        return 0;
    }
    let script = SCRIPT.with(|s| s.borrow().clone());
    interp::fence(&script)
}
