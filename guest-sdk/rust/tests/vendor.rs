//! Vendor kernels on the native emulator as on the host: each kernel
//! gets copies of its buffers with sim's rules (ABI.md §3.6), argument
//! records are refused in the host's words, a failed command's number
//! counts every command of the stream, and `vendor_kernel` refuses what
//! a manifest refuses of a `[[kernel]]`.

use stagehost::emu::{Config, Dir, Emulator, KArg, RunError, VendorArg};
use stagehost::{f32_bytes, f32s, Arg, Buffer, Cmd, DType, Program, Result, Stream, TO_END};

type K = fn(&mut [KArg]) -> std::result::Result<(), String>;

fn get(a: &KArg, i: usize) -> f32 {
    f32s(a.bytes.as_ref().unwrap())[i]
}

fn put(a: &mut KArg, i: usize, v: f32) {
    a.bytes.as_mut().unwrap()[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
}

/// Launches kernel "k" once over the buffers "a" and "b" (whole: one
/// argument per name in `ARGS`), then syncs.
fn launch_ab() -> Result<()> {
    let s = Stream::get("s0")?;
    let names = ARGS.with(|a| *a.borrow());
    let mut args = Vec::new();
    for n in names {
        args.push(Arg::whole(&Buffer::get(n)?));
    }
    s.launch(&Program::get("k")?, [1, 1, 1], [1, 1, 1], 0, &args)?;
    s.sync()
}

std::thread_local! {
    static ARGS: std::cell::RefCell<&'static [&'static str]> = std::cell::RefCell::new(&[]);
}

/// Runs kernel k declared `decl` over the named buffers, declared with
/// their f32 values; returns the buffers' values afterwards and the run.
fn run(decl: &[VendorArg], k: K, bufs: &[(&'static str, &[f32])], args: &'static [&'static str]) -> (Vec<Vec<f32>>, std::result::Result<Vec<u8>, RunError>) {
    let mut e = Emulator::new(Config::new()).stream("s0").vendor_kernel("k", decl, k);
    for (n, v) in bufs {
        e = e.buffer_data(n, &f32_bytes(v));
    }
    ARGS.with(|a| *a.borrow_mut() = args);
    let r = e.run(b"", launch_ab);
    (bufs.iter().map(|(n, _)| f32s(&e.bytes(n).unwrap())).collect(), r)
}

fn x_in() -> VendorArg {
    VendorArg::buffer("x", DType::F32, Dir::In)
}
fn y_out() -> VendorArg {
    VendorArg::buffer("y", DType::F32, Dir::Out)
}

#[test]
fn an_in_range_is_not_copied_back() {
    let (got, r) = run(&[x_in()], |a| {
        put(&mut a[0], 0, 99.0);
        Ok(())
    }, &[("a", &[1.0, 2.0])], &["a"]);
    r.unwrap();
    assert_eq!(got[0], [1.0, 2.0]);
}

#[test]
fn an_out_range_starts_zeroed_and_is_copied_back_whole() {
    let (got, r) = run(&[y_out()], |a| {
        if f32s(a[0].bytes.as_ref().unwrap()) != [0.0, 0.0] {
            return Err(format!("saw {:?}", f32s(a[0].bytes.as_ref().unwrap())));
        }
        put(&mut a[0], 1, 7.0);
        Ok(())
    }, &[("a", &[5.0, 6.0])], &["a"]);
    r.unwrap();
    assert_eq!(got[0], [0.0, 7.0]);
}

#[test]
fn an_inout_range_is_copied_in_and_back() {
    let (got, r) = run(&[VendorArg::buffer("y", DType::F32, Dir::InOut)], |a| {
        let v = get(&a[0], 0) + get(&a[0], 1);
        put(&mut a[0], 0, v);
        Ok(())
    }, &[("a", &[5.0, 6.0])], &["a"]);
    r.unwrap();
    assert_eq!(got[0], [11.0, 6.0]);
}

#[test]
fn a_failed_kernel_copies_nothing_back() {
    let fails: [K; 2] = [
        |a| {
            put(&mut a[1], 0, 42.0);
            Err("boom".to_string())
        },
        |a| {
            put(&mut a[1], 0, 42.0);
            panic!("boom")
        },
    ];
    for k in fails {
        let (got, r) = run(&[x_in(), VendorArg::buffer("y", DType::F32, Dir::InOut)], k, &[("a", &[1.0]), ("b", &[3.0])], &["a", "b"]);
        assert!(matches!(r, Err(RunError::Client { .. })), "{:?}", r);
        assert_eq!(got[1], [3.0]);
    }
}

#[test]
fn arguments_bound_to_one_buffer_get_separate_copies() {
    // y[i] = x[i] + x[0], x and y the same buffer.
    let (got, r) = run(&[x_in(), y_out()], |a| {
        for i in 0..4 {
            let v = get(&a[0], i) + get(&a[0], 0);
            put(&mut a[1], i, v);
        }
        Ok(())
    }, &[("a", &[1.0, 2.0, 3.0, 4.0])], &["a", "a"]);
    r.unwrap();
    assert_eq!(got[0], [2.0, 3.0, 4.0, 5.0]);
    // Copied back in argument order: the second inout copy, unchanged,
    // lands last.
    let io = |n| VendorArg::buffer(n, DType::F32, Dir::InOut);
    let (got, r) = run(&[io("y"), io("z")], |a| {
        put(&mut a[0], 0, 10.0);
        Ok(())
    }, &[("a", &[1.0])], &["a", "a"]);
    r.unwrap();
    assert_eq!(got[0], [1.0]);
}

fn client_message(r: std::result::Result<Vec<u8>, RunError>) -> String {
    match r {
        Err(RunError::Client { message, .. }) => message,
        other => panic!("want a client error, got {:?}", other),
    }
}

#[test]
fn a_failed_commands_number_counts_reads() {
    fn stage() -> Result<()> {
        let (s, b) = (Stream::get("s0")?, Buffer::get("b")?);
        let mut z = [0u8; 16];
        s.write(&b, 0, &z)?;
        s.read(&b, 0, &mut z)?;
        s.launch(&Program::get("fail")?, [1, 1, 1], [1, 1, 1], 0, &[Arg::whole(&b)])?;
        s.sync()
    }
    let e = Emulator::new(Config::new()).stream("s0").buffer("b", 16).vendor_kernel("fail", &[y_out()], |_| Err("boom".to_string()));
    assert_eq!(
        client_message(e.run(b"", stage)),
        "stagehost: stream_sync: FAULT: stream \"s0\": command 3: kernel \"fail\": boom"
    );
}

#[test]
fn argument_records_are_refused_in_the_hosts_words() {
    let cases: [(fn() -> Result<()>, &str); 9] = [
        (|| Stream::get("s0")?.write(&Buffer::get("b")?, 62, &[0; 4]), "stream_write: INVALID_ARGUMENT: range [62,+4) outside a buffer of 64 bytes"),
        (|| Stream::get("s0")?.read(&Buffer::get("b")?, 64, &mut [0; 1]), "stream_read: INVALID_ARGUMENT: range [64,+1) outside a buffer of 64 bytes"),
        (
            || Stream::get("s0")?.submit(&Program::get("fill")?, &[Arg::buf(&Buffer::get("b")?, 0, 128), Arg::f32(1.0)]),
            "stream_submit: INVALID_ARGUMENT: argument 0: range [0,+128) outside a buffer of 64 bytes",
        ),
        (
            || Stream::get("s0")?.submit(&Program::get("fill")?, &[Arg::f32(1.0), Arg::buf(&Buffer::get("b")?, 8, 64)]),
            "stream_submit: INVALID_ARGUMENT: argument 1: range [8,+64) outside a buffer of 64 bytes",
        ),
        (
            || {
                let (fill, b) = (Program::get("fill")?, Buffer::get("b")?);
                Stream::get("s0")?.submit_batch(&[Cmd { program: fill, args: vec![Arg::buf(&b, 60, 8), Arg::f32(1.0)] }])
            },
            "stream_submit_batch: INVALID_ARGUMENT: argument 0: range [60,+8) outside a buffer of 64 bytes",
        ),
        (
            || Stream::get("s0")?.launch(&Program::get("k")?, [1, 1, 1], [1, 1, 1], 0, &[Arg::buf(&Buffer::get("b")?, 100, 4)]),
            "stream_launch: INVALID_ARGUMENT: argument 0: range [100,+4) outside a buffer of 64 bytes",
        ),
        (
            || Stream::get("s0")?.launch(&Program::get("k")?, [1, 1, 1], [1, 1, 1], 0, &[Arg::buf(&Buffer::get("b")?, 100, TO_END)]),
            "stream_launch: INVALID_ARGUMENT: argument 0: offset 100 beyond a buffer of 64 bytes",
        ),
        (
            || Stream::get("s0")?.submit(&Program::get("fill")?, &[Arg::u32(0); 17]),
            "stream_submit: INVALID_ARGUMENT: 17 arguments, at most 16",
        ),
        (
            || {
                let fill = Program::get("fill")?;
                Stream::get("s0")?.submit_batch(&[Cmd { program: fill, args: vec![Arg::u32(0); 17] }])
            },
            "stream_submit_batch: INVALID_ARGUMENT: 17 arguments, at most 16",
        ),
    ];
    for (f, want) in cases {
        let e = Emulator::new(Config::new()).stream("s0").buffer("b", 64).programs(&["fill"]).vendor_kernel("k", &[y_out()], |_| Ok(()));
        assert_eq!(client_message(e.run(b"", f)), format!("stagehost: {}", want));
    }
}

#[test]
fn vendor_kernel_refuses_what_a_manifest_refuses() {
    let ok = |_: &mut [KArg]| Ok(());
    let many = |n: usize| (0..n).map(|i| VendorArg::u32(Box::leak(format!("a{}", i).into_boxed_str()))).collect::<Vec<_>>();
    let long = "k".repeat(64);
    let longer = "k".repeat(65);
    let cases: Vec<(&str, Vec<VendorArg>, &str)> = vec![
        (&long, vec![x_in()], ""),
        ("a-z_0.9", many(16), ""),
        ("", vec![], "is not a kernel name"),
        (&longer, vec![], "is not a kernel name"),
        ("Double", vec![], "is not a kernel name"),
        ("fill", vec![], "\"fill\" is a built-in program's name"),
        ("softmax.bf16", vec![], "is a built-in program's name"),
        ("spin", vec![], "is a built-in program's name"),
        ("k17", many(17), "17 arguments, more than a launch carries (16)"),
        ("dup", vec![x_in(), x_in()], "argument 1: the name \"x\" is given twice"),
        ("noname", vec![VendorArg::u32("")], "argument 0: an empty name"),
    ];
    for (name, args, want) in cases {
        let r = std::panic::catch_unwind(|| {
            Emulator::new(Config::new()).vendor_kernel(name, &args, ok);
        });
        match r {
            Ok(()) => assert!(want.is_empty(), "{:?}: accepted, want a panic with {:?}", name, want),
            Err(p) => {
                let msg = p.downcast_ref::<String>().cloned().unwrap_or_default();
                assert!(!want.is_empty() && msg.contains(want), "{:?}: panic {:?}, want {:?}", name, msg, want);
            }
        }
    }
}
