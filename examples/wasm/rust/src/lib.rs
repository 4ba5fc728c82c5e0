//! softmax: a Rust stage that classifies rows on the device with the op
//! library. Its input is rows and cols (two little-endian u32) and then
//! rows×cols float32 scores; on stream "s0" it uploads them into a
//! buffer, submits one batch of two ops, softmax (probabilities) and
//! reduce_argmax (each row's class), and reads both back with one wait.
//! Its output is the rows×cols probabilities (float32) and then the rows
//! classes (i32), all little-endian. No arithmetic runs in the guest.
//!
//! The session: stream s0, programs softmax and reduce_argmax, and a
//! budget for (2·rows·cols + rows)·4 bytes (examples/wasm: TestRustSoftmax).

use stagehost::{Buffer, Code, DType, Level, Ops, Result, Status, Stream, Tensor};

fn run() -> Result<()> {
    let input = stagehost::input()?;
    if input.len() < 8 {
        return Err(Status::new(Code::InvalidArgument, "softmax: the input starts with rows and cols (u32)"));
    }
    let rows = u32::from_le_bytes([input[0], input[1], input[2], input[3]]) as usize;
    let cols = u32::from_le_bytes([input[4], input[5], input[6], input[7]]) as usize;
    let n = rows.checked_mul(cols).filter(|&n| n > 0 && n <= 1 << 20);
    let n = match n {
        Some(n) if input.len() == 8 + 4 * n => n,
        _ => {
            return Err(Status::new(
                Code::InvalidArgument,
                format!("softmax: {} bytes of scores for rows={} cols={}", input.len() - 8, rows, cols),
            ))
        }
    };
    let s0 = Stream::get("s0")?;
    // One buffer: scores, probabilities, classes.
    let bytes = (2 * n + rows) * 4;
    let buf = Buffer::alloc(bytes as u32)?;
    let result = classify(&s0, &buf, &input[8..], rows, cols);
    buf.free()?;
    let out = result?;
    stagehost::log(Level::Debug, &format!("softmax: {} rows of {} classified", rows, cols))?;
    stagehost::output(&out)
}

fn classify(s0: &Stream, buf: &Buffer, scores: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>> {
    let n = rows * cols;
    let x = Tensor::new(*buf, 0, DType::F32, &[rows, cols]);
    let p = Tensor::new(*buf, (4 * n) as u32, DType::F32, &[rows, cols]);
    let class = Tensor::new(*buf, (8 * n) as u32, DType::I32, &[rows]);
    s0.write(buf, 0, scores)?;
    let mut ops = Ops::default();
    ops.softmax(&x, &p, 0).reduce_argmax(&x, &class, 1);
    ops.submit(s0)?; // one stream_submit_batch
    let mut out = vec![0u8; 4 * (n + rows)];
    s0.read(buf, (4 * n) as u32, &mut out)?; // waits for both
    Ok(out)
}

stagehost::stage!(run);

#[cfg(test)]
mod tests {
    use stagehost::emu::{Config, Emulator};

    #[test]
    fn classifies_on_the_emulator() {
        let e = Emulator::new(Config::new()).stream("s0").programs(&["softmax", "reduce_argmax"]);
        let mut input = Vec::new();
        input.extend_from_slice(&2u32.to_le_bytes());
        input.extend_from_slice(&4u32.to_le_bytes());
        input.extend_from_slice(&stagehost::f32_bytes(&[1.0, 2.0, 3.0, 4.0, 0.5, 9.0, -1.0, 0.0]));
        let out = e.run_export(&input, super::stagehost_run).expect("run");
        let p = stagehost::f32s(&out[..32]);
        // The simulator's bytes (the Go emulator's reference).
        assert_eq!(&p[..4], &[0.032058604, 0.087144315, 0.23688282, 0.6439143]);
        let classes: Vec<u32> = out[32..].chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(classes, vec![3, 1]);
        assert_eq!(e.budget_used(), 0);
    }
}
