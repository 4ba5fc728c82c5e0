//! A stage run natively on the emulator: examples/wasm/cstage in Rust.

use stagehost::emu::{Config, Emulator, RunError};
use stagehost::{Arg, Buffer, Code, Level, Program, Result, Status, Stream};

fn cstage() -> Result<()> {
    let input = stagehost::input()?;
    if input.len() > 256 {
        return Err(Status::new(Code::InvalidArgument, "input longer than 256 bytes"));
    }
    let s0 = Stream::get("s0")?;
    let fill = Program::get("fill")?;
    let buf = Buffer::alloc(64)?;
    s0.submit(&fill, &[Arg::whole(&buf), Arg::f32(2.5)])?;
    s0.sync()?;
    let mut values = [0u8; 64];
    s0.read(&buf, 0, &mut values)?;
    buf.free()?;
    let sum: f32 = stagehost::f32s(&values).iter().sum();
    stagehost::log(Level::Info, "cstage: filled and summed 16 floats")?;
    stagehost::output(&sum.to_le_bytes())
}

stagehost::stage!(cstage);

#[test]
fn cstage_sums_sixteen_fills() {
    let e = Emulator::new(Config::new().with_budget(4096)).stream("s0").programs(&["fill"]);
    let out = e.run_export(b"hello", stagehost_run).expect("run");
    assert_eq!(out, 40f32.to_le_bytes());
    assert_eq!(e.budget_used(), 0);
    assert!(e.logs().iter().any(|l| l.message == "cstage: filled and summed 16 floats"));
}

#[test]
fn missing_program_is_a_client_error_with_the_hosts_reason() {
    let e = Emulator::new(Config::new()).stream("s0");
    match e.run(b"", cstage) {
        Err(RunError::Client { code, message, .. }) => {
            assert_eq!(code, 5);
            assert_eq!(
                message,
                "stagehost: program_get: NOT_FOUND: program \"fill\" not found: the session may use no program of that name"
            );
        }
        other => panic!("want a client error, got {:?}", other),
    }
}

#[test]
fn out_of_budget() {
    let e = Emulator::new(Config::new().with_budget(32)).stream("s0").programs(&["fill"]);
    match e.run(b"", cstage) {
        Err(RunError::Client { code, .. }) => assert_eq!(code, Code::OutOfBudget.as_i32()),
        other => panic!("want OUT_OF_BUDGET, got {:?}", other),
    }
}

fn leaves_work() -> Result<()> {
    let s0 = Stream::get("s0")?;
    let fill = Program::get("fill")?;
    let buf = Buffer::alloc(64)?;
    s0.submit(&fill, &[Arg::whole(&buf), Arg::f32(1.0)])
}

fn lying_fence() -> Result<()> {
    Ok(())
}
stagehost::fence!(lying_fence);

#[test]
fn a_fence_that_lies_quarantines() {
    let e = Emulator::new(Config::new().with_fence(stagehost_fence)).stream("s0").programs(&["fill"]);
    match e.run(b"", leaves_work) {
        Err(RunError::Quarantined { reason }) => assert!(reason.contains("still has 1 commands"), "{}", reason),
        other => panic!("want quarantine, got {:?}", other),
    }
    assert!(matches!(e.run(b"", cstage), Err(RunError::Quarantined { .. })));
}

#[test]
fn the_builtin_fence_drains_and_records_failures() {
    fn bad_fill() -> Result<()> {
        let s0 = Stream::get("s0")?;
        let fill = Program::get("fill")?;
        let buf = Buffer::alloc(64)?;
        s0.submit(&fill, &[Arg::whole(&buf)]) // fill takes 2 arguments: fails on the device
    }
    let e = Emulator::new(Config::new()).stream("s0").programs(&["fill"]);
    match e.run(b"", bad_fill) {
        Err(RunError::Fault { failures, .. }) => {
            assert_eq!(failures, vec!["stream \"s0\": command 1: kernel \"fill\": kernel \"fill\" takes 2 arguments, got 1"])
        }
        other => panic!("want a fault, got {:?}", other),
    }
    assert_eq!(e.pending("s0"), 0);
    assert!(e.quarantined().is_none());
}

#[test]
fn softmax_through_ops() {
    fn stage() -> Result<()> {
        let s0 = Stream::get("s0")?;
        let buf = Buffer::alloc(2 * 2 * 4 * 4)?;
        let x = stagehost::Tensor::new(buf, 0, stagehost::DType::F32, &[2, 4]);
        let y = stagehost::Tensor::new(buf, 32, stagehost::DType::F32, &[2, 4]);
        s0.write(&buf, 0, &stagehost::f32_bytes(&[1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]))?;
        let mut ops = stagehost::Ops::default();
        ops.softmax(&x, &y, 0);
        ops.submit(&s0)?;
        let mut out = [0u8; 32];
        s0.read(&buf, 32, &mut out)?;
        stagehost::output(&out)
    }
    let e = Emulator::new(Config::new()).stream("s0").programs(&["softmax"]);
    let out = stagehost::f32s(&e.run(b"", stage).expect("run"));
    // The Go emulator's (and so the simulator's) bytes.
    let want = [0.032058604f32, 0.087144315, 0.23688282, 0.6439143, 0.25, 0.25, 0.25, 0.25];
    assert_eq!(out, want);
}

#[test]
fn an_op_launch_that_does_not_fit_is_refused_at_submit() {
    fn stage() -> Result<()> {
        let s0 = Stream::get("s0")?;
        let buf = Buffer::alloc(64)?;
        let x = stagehost::Tensor::new(buf, 0, stagehost::DType::F32, &[2, 4]);
        let y = stagehost::Tensor::new(buf, 4, stagehost::DType::F32, &[2, 4]);
        let mut ops = stagehost::Ops::default();
        ops.softmax(&x, &y, 0);
        ops.submit(&s0)
    }
    let e = Emulator::new(Config::new()).stream("s0").programs(&["softmax"]);
    match e.run(b"", stage) {
        Err(RunError::Client { code, message, .. }) => {
            assert_eq!(code, 4);
            assert!(message.ends_with("command 0: softmax: y partially overlaps x (it may be exactly x, or apart)"), "{}", message);
        }
        other => panic!("want INVALID_ARGUMENT, got {:?}", other),
    }
}

#[test]
fn a_panicking_stage_is_a_trap() {
    fn stage() -> Result<()> {
        panic!("boom")
    }
    let e = Emulator::new(Config::new());
    match e.run(b"", stage) {
        Err(RunError::Trap { place, message }) => {
            assert_eq!(place, "stage");
            assert_eq!(message, "boom");
        }
        other => panic!("want a trap, got {:?}", other),
    }
}

mod entries {
    use stagehost::emu::{Config, Emulator, RunError};
    use stagehost::Result;

    fn main_stage() -> Result<()> {
        stagehost::output(b"main")
    }
    fn warm() -> Result<()> {
        stagehost::output(b"warm")
    }
    stagehost::stage!("main" => main_stage, "warmup" => warm);

    #[test]
    fn one_function_per_entry() {
        let e = Emulator::new(Config::new());
        assert_eq!(e.run_export(b"", stagehost_run).unwrap(), b"main");
        assert_eq!(e.run_entry("warmup", b"", stagehost_run).unwrap(), b"warm");
        match e.run_entry("nope", b"", stagehost_run) {
            Err(RunError::Client { code, message, .. }) => {
                assert_eq!(code, 5);
                assert_eq!(message, "stagehost: no stage registered for entry \"nope\"");
            }
            other => panic!("want NOT_FOUND, got {:?}", other),
        }
    }
}
