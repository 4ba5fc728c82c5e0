//! Vendor kernels (`stream_launch`, ABI revision 4) on the native
//! emulator: a launch runs the kernel; a built-in program, a vendor
//! kernel given to `stream_submit`, and every launch shape over the sim
//! devices' fixed limits are refused with the Go emulator's statuses and
//! last errors.

use stagehost::emu::{Config, Emulator, RunError};
use stagehost::{Arg, Buffer, Cmd, Code, Program, Result, Stream};

/// Writes the u32 scalar of argument 1 into the first 4 bytes of buffer
/// argument 0.
fn store(args: &mut [stagehost::emu::KArg]) -> std::result::Result<(), String> {
    let v = args[1].value as u32;
    let b = args[0].bytes.as_mut().ok_or("argument 0 is not a buffer")?;
    b[..4].copy_from_slice(&v.to_le_bytes());
    Ok(())
}

fn emu() -> Emulator {
    Emulator::new(Config::new()).stream("s0").buffer("out", 4).programs(&["fill"]).vendor_kernel("store", store)
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
    want_client(emu().run(b"", batch), Code::InvalidArgument, &format!("stagehost: stream_submit_batch: {}", want));
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
