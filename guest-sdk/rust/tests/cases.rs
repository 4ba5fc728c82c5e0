//! The shared cases (guest-sdk/testdata/emucases.txt) on the Rust
//! emulator: the same table the Go emulator, the C emulator and the host
//! run.

#[path = "../../testdata/casestage/src/interp.rs"]
mod interp;

use std::cell::RefCell;

use stagehost::emu::{Config, Emulator, RunError};

std::thread_local! {
    static SCRIPT: RefCell<String> = RefCell::new(String::new());
}

fn fence() -> i32 {
    let script = SCRIPT.with(|s| s.borrow().clone());
    interp::fence(&script)
}

fn stage() -> i32 {
    let script = SCRIPT.with(|s| s.borrow().clone());
    match interp::run(&script) {
        Ok(code) => code,
        Err(msg) => {
            stagehost::set_error(&msg);
            99
        }
    }
}

struct Case {
    name: String,
    line: usize,
    body: String,
    streams: Vec<String>,
    buffers: Vec<(String, usize)>,
    /// (name, bytes, safetensors)
    weights: Vec<(String, Vec<u8>, bool)>,
    programs: Vec<String>,
    budget: Option<u64>,
    outlimit: Option<usize>,
    input: Vec<u8>,
    outcome: String,
    output: Option<Vec<u8>>,
    fence: bool,
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn parse(text: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut cur: Option<Case> = None;
    for (n, raw) in text.lines().enumerate() {
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let mut f = l.splitn(2, ' ');
        let (kw, rest) = (f.next().unwrap(), f.next().unwrap_or("").trim());
        if kw == "case" {
            cur = Some(Case {
                name: rest.to_string(),
                line: n + 1,
                body: String::new(),
                streams: vec![],
                buffers: vec![],
                weights: vec![],
                programs: vec![],
                budget: None,
                outlimit: None,
                input: vec![],
                outcome: "ok".into(),
                output: None,
                fence: false,
            });
            continue;
        }
        let c = cur.as_mut().unwrap_or_else(|| panic!("line {}: {:?} outside a case", n + 1, l));
        match kw {
            "end" => cases.push(cur.take().unwrap()),
            "stream" => c.streams.push(rest.into()),
            "buffer" => {
                let mut p = rest.split(' ');
                c.buffers.push((p.next().unwrap().into(), p.next().unwrap().parse().unwrap()));
            }
            "weights" | "safetensors" => {
                let mut p = rest.split(' ');
                c.weights.push((p.next().unwrap().into(), hex(p.next().unwrap()), kw == "safetensors"));
            }
            "program" => c.programs.push(rest.into()),
            "budget" => c.budget = Some(rest.parse().unwrap()),
            "outlimit" => c.outlimit = Some(rest.parse().unwrap()),
            "input" => c.input = hex(rest),
            "outcome" => c.outcome = rest.into(),
            "output" => c.output = Some(hex(rest)),
            "call" | "lasterr" | "return" | "fence" => {
                if kw == "fence" {
                    c.fence = true;
                }
                c.body.push_str(l);
                c.body.push('\n');
            }
            other => panic!("line {}: unknown item {:?}", n + 1, other),
        }
    }
    assert!(cur.is_none(), "a case without end");
    cases
}

#[test]
fn shared_cases() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/emucases.txt")).unwrap();
    let cases = parse(&text);
    assert!(cases.len() >= 19, "only {} cases", cases.len());
    let mut failed = Vec::new();
    for c in &cases {
        let mut cfg = Config::new();
        if let Some(b) = c.budget {
            cfg = cfg.with_budget(b);
        }
        if let Some(o) = c.outlimit {
            cfg = cfg.with_output_limit(o);
        }
        if c.fence {
            cfg = cfg.with_fence(fence);
        }
        let mut e = Emulator::new(cfg);
        for s in &c.streams {
            e = e.stream(s);
        }
        for (b, n) in &c.buffers {
            e = e.buffer(b, *n);
        }
        for (name, data, st) in &c.weights {
            e = if *st { e.safetensors(name, data) } else { e.weights(name, data) };
        }
        let progs: Vec<&str> = c.programs.iter().map(|s| s.as_str()).collect();
        e = e.programs(&progs);
        SCRIPT.with(|s| *s.borrow_mut() = c.body.clone());
        let res = e.run_export(&c.input, stage);
        let ok = match (c.outcome.as_str(), &res) {
            ("ok", Ok(out)) => c.output.as_ref().map_or(true, |w| w == out),
            ("fault", Err(RunError::Fault { .. })) => true,
            ("quarantined", Err(RunError::Quarantined { .. })) => e.quarantined().is_some(),
            (o, Err(RunError::Client { code, .. })) if o.starts_with("client ") => o[7..].parse::<i32>().unwrap() == *code,
            _ => false,
        };
        if !ok {
            failed.push(format!("case {} (line {}): outcome {}, got {:?}", c.name, c.line, c.outcome, res));
        }
    }
    assert!(failed.is_empty(), "\n{}", failed.join("\n"));
}
