//! Weights (ABI revision 3) on the native emulator: lookups, tensor
//! records and the refusals of every write to a read-only weights buffer.

use stagehost::emu::{Config, Emulator, RunError};
use stagehost::{Arg, Buffer, Code, DType, Ops, Program, Result, Stream, Tensor};

/// A safetensors file of "w" (F32 [2,2]) and "ids" (I64 [1]).
fn file() -> Vec<u8> {
    let js = r#"{"__metadata__":{"format":"pt"},"ids":{"dtype":"I64","shape":[1],"data_offsets":[16,24]},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
    let mut f = (js.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(js.as_bytes());
    for v in [1f32, -2.0, 3.0, -4.0] {
        f.extend_from_slice(&v.to_le_bytes());
    }
    f.extend_from_slice(&7u64.to_le_bytes());
    f
}

fn emu() -> Emulator {
    Emulator::new(Config::new())
        .stream("s0")
        .programs(&["neg", "fill", "copy"])
        .weights("raw", &[1, 2, 3, 4])
        .safetensors("st", &file())
}

fn run(stage: fn() -> Result<()>) -> std::result::Result<Vec<u8>, RunError> {
    emu().run(b"", stage)
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

#[test]
fn raw_weights_read() {
    fn stage() -> Result<()> {
        let w = stagehost::lookup_weights("raw")?;
        assert_eq!(w.size()?, 4);
        let mut b = [0u8; 4];
        Stream::get("s0")?.read(&w, 0, &mut b)?;
        stagehost::output(&b)
    }
    assert_eq!(run(stage).unwrap(), [1, 2, 3, 4]);
}

#[test]
fn tensor_records() {
    fn stage() -> Result<()> {
        let t = stagehost::lookup_tensor("st/w")?;
        let w = stagehost::lookup_weights("st")?;
        assert_eq!(t, Tensor::new(w, 0, DType::F32, &[2, 2]));
        let r = stagehost::lookup_tensor_record("st/ids")?;
        assert_eq!((r.buf, r.off, r.nbytes, r.dtype, r.dims.clone()), (w, 16, 8, 17, vec![1]));
        let e = stagehost::lookup_tensor("st/ids").unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        // The op reads the weights (x is "in") into a buffer of its own.
        let y = Buffer::alloc(16)?;
        let s0 = Stream::get("s0")?;
        Ops::default().neg(&t, &Tensor::new(y, 0, DType::F32, &[2, 2])).submit(&s0)?;
        let mut out = [0u8; 16];
        s0.read(&y, 0, &mut out)?;
        stagehost::output(&out)
    }
    let out = run(stage).unwrap();
    assert_eq!(stagehost::f32s(&out), [-1f32, 2.0, -3.0, 4.0]);
}

#[test]
fn not_found() {
    fn weights() -> Result<()> {
        stagehost::lookup_weights("nope").map(|_| ())
    }
    want_client(
        run(weights),
        Code::NotFound,
        "stagehost: weights_get: NOT_FOUND: weights \"nope\" not found: the session lists no weights of that name",
    );
    fn no_slash() -> Result<()> {
        stagehost::lookup_tensor("w").map(|_| ())
    }
    want_client(
        run(no_slash),
        Code::NotFound,
        "stagehost: tensor_get: NOT_FOUND: tensor \"w\" not found: a tensor is named \"<weights>/<tensor>\"",
    );
    fn no_weights() -> Result<()> {
        stagehost::lookup_tensor("x/w").map(|_| ())
    }
    want_client(
        run(no_weights),
        Code::NotFound,
        "stagehost: tensor_get: NOT_FOUND: tensor \"x/w\" not found: the session lists no weights \"x\"",
    );
    fn no_tensor() -> Result<()> {
        stagehost::lookup_tensor("raw/w").map(|_| ())
    }
    want_client(
        run(no_tensor),
        Code::NotFound,
        "stagehost: tensor_get: NOT_FOUND: tensor \"raw/w\" not found: the weights \"raw\" have no tensor \"w\"",
    );
}

#[test]
fn writes_refused() {
    fn write() -> Result<()> {
        let w = stagehost::lookup_weights("raw")?;
        Stream::get("s0")?.write(&w, 0, &[9])
    }
    want_client(
        run(write),
        Code::InvalidArgument,
        "stagehost: stream_write: INVALID_ARGUMENT: stream_write: buffer is the read-only weights \"raw\", which cannot be written",
    );
    fn free() -> Result<()> {
        stagehost::lookup_weights("raw")?.free()
    }
    want_client(
        run(free),
        Code::InvalidArgument,
        "stagehost: buffer_free: INVALID_ARGUMENT: buffer_free: buffer is the read-only weights \"raw\", which cannot be freed",
    );
    fn op_out() -> Result<()> {
        let t = stagehost::lookup_tensor("st/w")?;
        Ops::default().neg(&t, &t).submit(&Stream::get("s0")?)
    }
    want_client(
        run(op_out),
        Code::InvalidArgument,
        "stagehost: stream_submit_batch: INVALID_ARGUMENT: neg: argument 1 is the read-only weights \"st\", but the kernel's argument 1 is written (direction out)",
    );
    fn fill() -> Result<()> {
        let w = stagehost::lookup_weights("raw")?;
        Stream::get("s0")?.submit(&Program::get("fill")?, &[Arg::whole(&w), Arg::f32(1.0)])
    }
    want_client(
        run(fill),
        Code::InvalidArgument,
        "stagehost: stream_submit: INVALID_ARGUMENT: fill: argument 0 is the read-only weights \"raw\", but the kernel's argument 0 is written (direction out)",
    );
    // copy's source is "in": the weights may be read.
    fn copy() -> Result<()> {
        let w = stagehost::lookup_weights("raw")?;
        let b = Buffer::alloc(4)?;
        let s0 = Stream::get("s0")?;
        s0.submit(&Program::get("copy")?, &[Arg::whole(&b), Arg::whole(&w)])?;
        let mut out = [0u8; 4];
        s0.read(&b, 0, &mut out)?;
        stagehost::output(&out)
    }
    assert_eq!(run(copy).unwrap(), [1, 2, 3, 4]);
}

#[test]
#[should_panic(expected = "overlaps")]
fn hostile_safetensors_refused() {
    let js = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let mut f = (js.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(js.as_bytes());
    f.extend_from_slice(&[0u8; 8]);
    let _ = Emulator::new(Config::new()).safetensors("bad", &f);
}
