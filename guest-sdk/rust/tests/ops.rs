//! The op helpers (Ops) build launches the host's contracts accept, with
//! the Go SDK's argument order: run on the emulator for the ops it has,
//! and checked record by record for the others.

use stagehost::emu::{Config, Emulator};
use stagehost::{ArgRecord, Buffer, ConvOpts, DType, GemmOpts, Ops, Result, Stream, Tensor};

fn t(b: Buffer, off_values: u32, dims: &[usize]) -> Tensor {
    Tensor::new(b, 4 * off_values, DType::F32, dims)
}

fn stage() -> Result<()> {
    let s0 = Stream::get("s0")?;
    let b = Buffer::alloc(4 * 64)?;
    // a: 2×3 = 1..6 at 0; bm: 3×2 = (1,0),(0,1),(1,1) at 8.
    let mut init = stagehost::f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0]);
    init.extend(stagehost::f32_bytes(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]));
    s0.write(&b, 0, &init)?;
    let (a, bm) = (t(b, 0, &[2, 3]), t(b, 8, &[3, 2]));
    let mut ops = Ops::default();
    ops.gemm(&a, &bm, &t(b, 16, &[2, 2]), GemmOpts::default()) // 16..20: (4,5),(10,11)
        .transpose(&a, &t(b, 20, &[3, 2]), &[1, 0]) // 20..26: 1,4,2,5,3,6
        .add(&a, &t(b, 8, &[3]).reshape(&[1, 3]), &t(b, 26, &[2, 3])) // 26..32: a + (1,0,0) per row
        .reduce_sum(&a, &t(b, 32, &[3]), 0) // 32..35: 5,7,9
        .affine(&a, &t(b, 35, &[2, 3]), 2.0, 1.0) // 35..41: 3,5,...,13
        .rmsnorm(&t(b, 0, &[1, 2]), &t(b, 12, &[2]), &t(b, 41, &[1, 2]), 0.0) // x=(1,2), gamma=(0,1)... (b[12..14] = 1,1)
        .submit(&s0)?;
    let mut out = vec![0u8; 4 * 43];
    s0.read(&b, 0, &mut out)?;
    b.free()?;
    stagehost::output(&out)
}

#[test]
fn helpers_run_on_the_emulator() {
    let e = Emulator::new(Config::new()).stream("s0").programs(&["gemm", "transpose", "add", "reduce_sum", "affine", "rmsnorm"]);
    let v = stagehost::f32s(&e.run(b"", stage).expect("run"));
    assert_eq!(&v[16..20], &[4.0, 5.0, 10.0, 11.0], "gemm");
    assert_eq!(&v[20..26], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0], "transpose");
    assert_eq!(&v[26..32], &[2.0, 2.0, 3.0, 5.0, 5.0, 6.0], "add, broadcast");
    assert_eq!(&v[32..35], &[5.0, 7.0, 9.0], "reduce_sum over axis 0");
    assert_eq!(&v[35..41], &[3.0, 5.0, 7.0, 9.0, 11.0, 13.0], "affine");
    // rmsnorm of (1, 2), gamma (1, 1): x / sqrt(2.5)
    let r = 1.0f32 / (2.5f64.sqrt() as f32);
    assert_eq!(&v[41..43], &[1.0 * r, 2.0 * r], "rmsnorm");
}

fn rec(r: &ArgRecord) -> (u32, u32, u32, u64) {
    (r.kind, r.offset, r.length, r.value)
}

#[test]
fn helpers_build_the_go_sdks_records() {
    fn build() -> Result<()> {
        let b = Buffer::from_raw(0x0200_0001_0000_0001);
        let mut ops = Ops::default();
        let x = Tensor::new(b, 0, DType::F32, &[1, 2, 5, 5]);
        let w = Tensor::new(b, 400, DType::F32, &[4, 2, 3, 3]);
        let y = Tensor::new(b, 800, DType::F32, &[1, 4, 3, 3]);
        ops.conv2d(&x, &w, None, &y, ConvOpts { stride: [2, 0], pad: [1, 1], ..ConvOpts::default() });
        ops.maxpool2d(&x, &y, [2, 2], [0, 0], [0, 0]);
        ops.cast(&x, &Tensor::new(b, 1200, DType::BF16, &[50]));
        ops.gemm(
            &Tensor::new(b, 0, DType::BF16, &[4, 2, 3]),
            &Tensor::new(b, 100, DType::BF16, &[3, 5]),
            &Tensor::new(b, 200, DType::F32, &[4, 2, 5]),
            GemmOpts { fast: true, beta: 1.0, ..GemmOpts::default() },
        );
        let c = ops.commands();
        // conv2d: x, w, empty bias, y, N C H W, K R S, stride (2,1), pad (1,1), dil (1,1), groups 1
        let a = &c[0].args;
        assert_eq!(a.len(), 15);
        assert_eq!(rec(&a[2].0), (1, 400, 0, b.raw()), "no bias: an empty range");
        let scalars: Vec<u64> = a[4..].iter().map(|x| x.0.value).collect();
        assert_eq!(scalars, vec![1, 2, 5, 5, 4, 3, 3, 2 | 1 << 32, 1 | 1 << 32, 1 | 1 << 32, 1]);
        // maxpool2d: x, y, N C H W, R S, stride (1,1), pad (0,0)
        let p: Vec<u64> = c[1].args[2..].iter().map(|x| x.0.value).collect();
        assert_eq!(p, vec![1, 2, 5, 5, 2, 2, 1 | 1 << 32, 0]);
        // cast: x, y, from f32 (0) to bf16 (2); y is 50 bf16 values
        assert_eq!(rec(&c[2].args[1].0), (1, 1200, 100, b.raw()));
        assert_eq!((c[2].args[2].0.value, c[2].args[3].0.value), (0, 2));
        // gemm.bf16.fast with a 2-dim B shared by the batch (stride 0)
        let g: Vec<u64> = c[3].args[3..].iter().map(|x| x.0.value).collect();
        assert_eq!(g, vec![2, 5, 3, 0, 0, 1f32.to_bits() as u64, 1f32.to_bits() as u64, 4, 6, 0, 10]);
        Ok(())
    }
    // Program lookups need a session: declare the programs the helpers name.
    let e = Emulator::new(Config::new())
        .kernel("conv2d", |_| Ok(()))
        .kernel("maxpool2d", |_| Ok(()))
        .kernel("cast", |_| Ok(()))
        .kernel("gemm.bf16.fast", |_| Ok(()));
    e.run(b"", build).expect("run");
}
