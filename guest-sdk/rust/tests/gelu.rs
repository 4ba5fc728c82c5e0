//! The gelu ops (`gelu_tanh`, `gelu_erf` and their `.f16` and `.bf16`
//! variants) on the native emulator against the simulator's values:
//! `../testdata/gelu.txt`, generated from the host's op library
//! (hw/internal/ops, TestGeluValuesAreCurrent keeps it current). Each
//! value must be the simulator's, or the storage type's next value of the
//! same sign (1 ulp: both compute in float64 and round once, and their
//! float64 exp may differ in the last bit), and NaN where it is NaN.

use stagehost::emu::{Config, Emulator};
use stagehost::{Arg, Buffer, Program, Result, Stream};

/// The stage: input is the program name's length (one byte), the name,
/// then the input values; the output is the values the op wrote.
fn stage() -> Result<()> {
    let input = stagehost::input()?;
    let n = input[0] as usize;
    let name = std::str::from_utf8(&input[1..1 + n]).unwrap();
    let x = &input[1 + n..];
    let s = Stream::get("s0")?;
    let (bx, by) = (Buffer::alloc(x.len() as u32)?, Buffer::alloc(x.len() as u32)?);
    s.write(&bx, 0, x)?;
    s.submit(&Program::get(name)?, &[Arg::whole(&bx), Arg::whole(&by)])?;
    let mut y = vec![0u8; x.len()];
    s.read(&by, 0, &mut y)?;
    stagehost::output(&y)
}

/// The program's lines of the table: (input bits, output bits).
fn table(prog: &str) -> Vec<(u32, u32)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/gelu.txt")).unwrap();
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 3, "gelu.txt:{}: {:?}", i + 1, line);
        if f[0] == prog {
            rows.push((u32::from_str_radix(f[1], 16).unwrap(), u32::from_str_radix(f[2], 16).unwrap()));
        }
    }
    rows
}

/// got is want, or the next value of the same sign of a storage type whose
/// exponent is all ones under `inf` (NaN for NaN).
fn within_one_ulp(got: u32, want: u32, sign: u32, inf: u32) -> bool {
    let nan = |v: u32| v & !sign > inf;
    if nan(want) || nan(got) {
        return nan(want) && nan(got);
    }
    got == want || (got & sign == want & sign && (got & !sign).abs_diff(want & !sign) == 1)
}

fn check(prog: &str, size: usize, sign: u32, inf: u32) {
    let rows = table(prog);
    assert!(rows.len() > 300, "{}: {} values in gelu.txt", prog, rows.len());
    let mut input = vec![prog.len() as u8];
    input.extend_from_slice(prog.as_bytes());
    for &(x, _) in &rows {
        input.extend_from_slice(&x.to_le_bytes()[..size]);
    }
    let e = Emulator::new(Config::new()).stream("s0").programs(&[prog]);
    let out = e.run(&input, stage).expect("run");
    let mut exact = 0;
    for (i, &(x, want)) in rows.iter().enumerate() {
        let mut b = [0u8; 4];
        b[..size].copy_from_slice(&out[i * size..(i + 1) * size]);
        let got = u32::from_le_bytes(b);
        assert!(within_one_ulp(got, want, sign, inf), "{}({:#x}) = {:#x}, the simulator gives {:#x}", prog, x, got, want);
        exact += (got == want) as usize;
    }
    // Measured: every value but NaN's sign (gelu_tanh) bit for bit.
    println!("{}: {} of {} values the simulator's bit for bit", prog, exact, rows.len());
}

#[test]
fn gelu_is_the_simulators() {
    for op in ["gelu_tanh", "gelu_erf"] {
        check(op, 4, 0x8000_0000, 0x7f80_0000);
        check(&format!("{}.f16", op), 2, 0x8000, 0x7c00);
        check(&format!("{}.bf16", op), 2, 0x8000, 0x7f80);
    }
}

#[test]
fn one_ulp_is_the_tolerance() {
    // The rule itself: the next value of the same sign passes, two apart,
    // the other zero and a NaN for a number fail.
    assert!(within_one_ulp(0x3f80_0001, 0x3f80_0000, 0x8000_0000, 0x7f80_0000));
    assert!(within_one_ulp(0x0000_0001, 0x0000_0000, 0x8000_0000, 0x7f80_0000));
    assert!(!within_one_ulp(0x3f80_0002, 0x3f80_0000, 0x8000_0000, 0x7f80_0000));
    assert!(!within_one_ulp(0x8000_0000, 0x0000_0000, 0x8000_0000, 0x7f80_0000));
    assert!(!within_one_ulp(0x7fc0_0000, 0x7f80_0000, 0x8000_0000, 0x7f80_0000));
    assert!(within_one_ulp(0xffc0_0000, 0x7fc0_0000, 0x8000_0000, 0x7f80_0000));
    assert!(!within_one_ulp(0x7c01, 0x7c00, 0x8000, 0x7c00));
}

/// Names the programs that need no table: every gelu program is emulated,
/// and the `Ops` helpers launch them.
#[test]
fn gelu_programs_are_emulated() {
    let names = stagehost::emu::builtins();
    for p in ["gelu_tanh", "gelu_erf", "gelu_tanh.f16", "gelu_tanh.bf16", "gelu_erf.f16", "gelu_erf.bf16"] {
        assert!(names.iter().any(|n| n == p), "{} is not emulated", p);
    }
}
