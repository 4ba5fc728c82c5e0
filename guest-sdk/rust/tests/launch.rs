//! Vendor kernels (`stream_launch`, ABI revision 4) on the native
//! emulator: a launch runs the kernel; a built-in program, a vendor
//! kernel given to `stream_submit`, every launch shape over the sim
//! devices' fixed limits, and every launch whose arguments do not match
//! the kernel's declaration (count, kind, a buffer's length against its
//! dtype, a 32-bit scalar's value, read-only weights where the kernel
//! writes) are refused with the host's statuses and last errors.

use stagehost::emu::{Config, Dir, Emulator, RunError, VendorArg};
use stagehost::{Arg, Buffer, Cmd, Code, DType, Program, Result, Stream};

/// Writes the u32 scalar of argument 1 into the first 4 bytes of buffer
/// argument 0.
fn store(args: &mut [stagehost::emu::KArg]) -> std::result::Result<(), String> {
    let v = args[1].value as u32;
    let b = args[0].bytes.as_mut().ok_or("argument 0 is not a buffer")?;
    b[..4].copy_from_slice(&v.to_le_bytes());
    Ok(())
}

/// Copies buffer argument 0 into buffer argument 1.
fn copy(args: &mut [stagehost::emu::KArg]) -> std::result::Result<(), String> {
    let x = args[0].bytes.clone().ok_or("argument 0 is not a buffer")?;
    let y = args[1].bytes.as_mut().ok_or("argument 1 is not a buffer")?;
    let n = y.len();
    y.copy_from_slice(&x[..n]);
    Ok(())
}

/// store's declaration: (out: f32 buffer, out; v: u32).
fn store_args() -> Vec<VendorArg> {
    vec![VendorArg::buffer("out", DType::F32, Dir::Out), VendorArg::u32("v")]
}

fn emu() -> Emulator {
    Emulator::new(Config::new())
        .stream("s0")
        .buffer("out", 4)
        .weights("w", &[1, 2, 3, 4])
        .programs(&["fill"])
        .vendor_kernel("store", &store_args(), store)
        .vendor_kernel("copyk", &[VendorArg::buffer("x", DType::F32, Dir::In), VendorArg::bytes("y", Dir::InOut)], copy)
        .vendor_kernel(
            "scalars",
            &[VendorArg::u64("a"), VendorArg::i32("b"), VendorArg::f32("c"), VendorArg::bytes("d", Dir::Out)],
            |_| Ok(()),
        )
}

fn want_client(r: std::result::Result<Vec<u8>, RunError>, code: Code, message: &str) {
    match r {
        Err(RunError::Client { code: c, message: m, .. }) => {
            assert_eq!(c, code.as_i32(), "message {:?}", m);
            assert_eq!(m, message);
        }
        other => panic!("want {:?} {:?}, got {:?}", code, message, other),
    }
}

fn launch(grid: [u32; 3], block: [u32; 3], shared: u32) -> Result<()> {
    let out = Buffer::get("out")?;
    let s = Stream::get("s0")?;
    s.launch(&Program::get("store")?, grid, block, shared, &[Arg::whole(&out), Arg::u32(42)])?;
    s.sync()
}

#[test]
fn launch_runs_the_vendor_kernel() {
    let e = emu();
    e.run(b"", || launch([65535, 1, 1], [256, 4, 1], 48 << 10)).unwrap();
    assert_eq!(e.bytes("out").unwrap(), 42u32.to_le_bytes());
}

#[test]
fn launch_of_a_built_in_program() {
    fn f() -> Result<()> {
        let out = Buffer::get("out")?;
        Stream::get("s0")?.launch(&Program::get("fill")?, [1, 1, 1], [1, 1, 1], 0, &[Arg::whole(&out), Arg::f32(1.0)])
    }
    want_client(
        emu().run(b"", f),
        Code::InvalidArgument,
        "stagehost: stream_launch: INVALID_ARGUMENT: program \"fill\" is built in: stream_launch launches vendor kernels; use stream_submit",
    );
}

#[test]
fn submit_of_a_vendor_kernel() {
    let want = "INVALID_ARGUMENT: program \"store\" is a vendor kernel: launch it with stream_launch, which gives its grid, block and shared memory (ABI.md §3.5)";
    fn one() -> Result<()> {
        let out = Buffer::get("out")?;
        Stream::get("s0")?.submit(&Program::get("store")?, &[Arg::whole(&out), Arg::u32(1)])
    }
    want_client(emu().run(b"", one), Code::InvalidArgument, &format!("stagehost: stream_submit: {}", want));
    fn batch() -> Result<()> {
        let out = Buffer::get("out")?;
        Stream::get("s0")?.submit_batch(&[Cmd { program: Program::get("store")?, args: vec![Arg::whole(&out), Arg::u32(1)] }])
    }
    // In a batch the host names the command.
    want_client(emu().run(b"", batch), Code::InvalidArgument, &format!("stagehost: stream_submit_batch: INVALID_ARGUMENT: command 0: {}", want.trim_start_matches("INVALID_ARGUMENT: ")));
}

#[test]
fn launch_shape_limits() {
    let cases: [(fn() -> Result<()>, &str); 7] = [
        (|| launch([1, 0, 1], [1, 1, 1], 0), "grid [1 0 1], block [1 1 1]: every dimension is at least 1"),
        (|| launch([1, 1, 1], [1, 1, 0], 0), "grid [1 1 1], block [1 1 0]: every dimension is at least 1"),
        (|| launch([1, 1, 1], [1025, 1, 1], 0), "block.x = 1025, over the device's limit of 1024"),
        (|| launch([1, 1, 1], [1, 1, 65], 0), "block.z = 65, over the device's limit of 64"),
        (|| launch([1, 65536, 1], [1, 1, 1], 0), "grid.y = 65536, over the device's limit of 65535"),
        (|| launch([1, 1, 1], [512, 4, 1], 0), "block [512 4 1] is 2048 threads, over the device's limit of 1024 per block"),
        (|| launch([1, 1, 1], [1, 1, 1], (48 << 10) + 1), "49153 bytes of shared memory, over the device's limit of 49152"),
    ];
    for (f, why) in cases {
        want_client(
            emu().run(b"", f),
            Code::InvalidArgument,
            &format!("stagehost: stream_launch: INVALID_ARGUMENT: kernel \"store\": launch shape: {}", why),
        );
    }
}

/// Launches program `prog` on s0 with the arguments `args` builds, then
/// syncs.
fn launch_args(prog: &str, args: fn() -> Result<Vec<Arg>>) -> Result<()> {
    let s = Stream::get("s0")?;
    s.launch(&Program::get(prog)?, [1, 1, 1], [1, 1, 1], 0, &args()?)?;
    s.sync()
}

#[test]
fn launch_arguments_against_the_declaration() {
    fn out() -> Result<Buffer> {
        Buffer::get("out")
    }
    fn w() -> Result<Buffer> {
        stagehost::lookup_weights("w")
    }
    let cases: [(&str, fn() -> Result<Vec<Arg>>, &str); 9] = [
        ("store", || Ok(vec![Arg::whole(&out()?)]), "kernel \"store\" takes 2 arguments, got 1"),
        (
            "store",
            || Ok(vec![Arg::whole(&out()?), Arg::u32(1), Arg::u32(2)]),
            "kernel \"store\" takes 2 arguments, got 3",
        ),
        (
            "store",
            || Ok(vec![Arg::u32(0), Arg::u32(42)]),
            "kernel \"store\": argument 0 (out) is a buffer (f32, out), got a scalar",
        ),
        (
            "store",
            || Ok(vec![Arg::whole(&out()?), Arg::whole(&out()?)]),
            "kernel \"store\": argument 1 (v) is a u32 scalar, got a buffer",
        ),
        (
            "store",
            || Ok(vec![Arg::buf(&out()?, 0, 3), Arg::u32(42)]),
            "kernel \"store\": argument 0 (out): 3 bytes is not a whole number of f32 values",
        ),
        (
            "store",
            || Ok(vec![Arg::whole(&out()?), Arg::u64(1 << 32)]),
            "kernel \"store\": argument 1 (v): 0x100000000 does not fit a u32",
        ),
        (
            "scalars",
            || Ok(vec![Arg::u64(u64::MAX), Arg::u64(1 << 32), Arg::f32(1.0), Arg::whole(&out()?)]),
            "kernel \"scalars\": argument 1 (b): 0x100000000 does not fit an i32",
        ),
        // Weights bound where the kernel writes: refused as the record is
        // read, before the declaration's checks (the host's order).
        (
            "store",
            || Ok(vec![Arg::whole(&w()?), Arg::u32(42)]),
            "store: argument 0 is the read-only weights \"w\", but the kernel's argument 0 is written (direction out)",
        ),
        (
            "copyk",
            || Ok(vec![Arg::whole(&w()?), Arg::whole(&w()?)]),
            "copyk: argument 1 is the read-only weights \"w\", but the kernel's argument 1 is written (direction inout)",
        ),
    ];
    for (prog, args, why) in cases {
        // One stage function per case: a closure that captures cannot
        // be a stage, so the case's pieces pass through thread-locals.
        CASE.with(|c| *c.borrow_mut() = Some((prog, args)));
        want_client(
            emu().run(b"", || CASE.with(|c| {
                let (p, a) = c.borrow().unwrap();
                launch_args(p, a)
            })),
            Code::InvalidArgument,
            &format!("stagehost: stream_launch: INVALID_ARGUMENT: {}", why),
        );
    }
}

type Case = (&'static str, fn() -> Result<Vec<Arg>>);

std::thread_local! {
    static CASE: std::cell::RefCell<Option<Case>> = std::cell::RefCell::new(None);
}

#[test]
fn weights_past_the_declaration_or_for_a_scalar() {
    fn past() -> Result<Vec<Arg>> {
        Ok(vec![Arg::whole(&Buffer::get("out")?), Arg::u32(1), Arg::whole(&stagehost::lookup_weights("w")?)])
    }
    want_client(
        emu().run(b"", || launch_args("store", past)),
        Code::InvalidArgument,
        "stagehost: stream_launch: INVALID_ARGUMENT: store: argument 2 is the read-only weights \"w\", but the kernel's argument 2 is not described as read only",
    );
    // A scalar's direction is "in" (as on the host): the weights pass the
    // read-only check and the declaration refuses a buffer for a scalar.
    fn scalar() -> Result<Vec<Arg>> {
        Ok(vec![Arg::whole(&Buffer::get("out")?), Arg::whole(&stagehost::lookup_weights("w")?)])
    }
    want_client(
        emu().run(b"", || launch_args("store", scalar)),
        Code::InvalidArgument,
        "stagehost: stream_launch: INVALID_ARGUMENT: kernel \"store\": argument 1 (v) is a u32 scalar, got a buffer",
    );
}

#[test]
fn launch_arguments_the_declaration_accepts() {
    // Weights for an argument declared in; bytes of any length; a u64 of
    // 64 bits; an i32 and an f32 of 32.
    fn weights_in() -> Result<Vec<Arg>> {
        Ok(vec![Arg::whole(&stagehost::lookup_weights("w")?), Arg::whole(&Buffer::get("out")?)])
    }
    let e = emu();
    e.run(b"", || launch_args("copyk", weights_in)).unwrap();
    assert_eq!(e.bytes("out").unwrap(), [1, 2, 3, 4]);
    fn scalars() -> Result<Vec<Arg>> {
        Ok(vec![Arg::u64(u64::MAX), Arg::u32(u32::MAX), Arg::f32(-1.5), Arg::buf(&Buffer::get("out")?, 1, 3)])
    }
    emu().run(b"", || launch_args("scalars", scalars)).unwrap();
}

#[test]
fn launch_shape_is_checked_before_the_arguments() {
    fn f() -> Result<()> {
        Stream::get("s0")?.launch(&Program::get("store")?, [1, 1, 1], [2048, 1, 1], 0, &[Arg::u32(1)])
    }
    want_client(
        emu().run(b"", f),
        Code::InvalidArgument,
        "stagehost: stream_launch: INVALID_ARGUMENT: kernel \"store\": launch shape: block.x = 2048, over the device's limit of 1024",
    );
}

#[test]
#[should_panic(expected = "emu: vendor_kernel: \"\" is not a kernel name")]
fn vendor_kernel_needs_a_name() {
    Emulator::new(Config::new()).vendor_kernel("", &[], store);
}

#[test]
#[should_panic(expected = "emu: vendor_kernel: kernel \"wide\": 17 arguments, more than a launch carries (16)")]
fn vendor_kernel_of_more_arguments_than_a_launch_binds() {
    let args: Vec<VendorArg> = (0..17).map(|i| VendorArg::u32(&format!("a{}", i))).collect();
    Emulator::new(Config::new()).vendor_kernel("wide", &args, store);
}
