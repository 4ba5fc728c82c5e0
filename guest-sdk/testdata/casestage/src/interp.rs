//! Interprets the call lines of one case of guest-sdk/testdata/emucases.txt
//! (call, lasterr, return) through the raw host functions: natively on the
//! Rust emulator, and compiled to wasm32 (casestage.wasm) on the host.

use std::collections::BTreeMap;
use std::string::{String, ToString};
use std::vec::Vec;

use stagehost::sys::{self, ArgRecord, CmdRecord};
use stagehost::Code;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    Contains(String),
}

fn tokens(line: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let cs: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let contains = c == '~' && i + 1 < cs.len() && cs[i + 1] == '"';
        if c == '"' || contains {
            i += if contains { 2 } else { 1 };
            let mut s = String::new();
            loop {
                if i >= cs.len() {
                    return Err(std::format!("unterminated string in {:?}", line));
                }
                match cs[i] {
                    '"' => break,
                    '\\' if i + 1 < cs.len() => {
                        s.push(cs[i + 1]);
                        i += 2;
                    }
                    ch => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            i += 1;
            out.push(if contains { Tok::Contains(s) } else { Tok::Str(s) });
            continue;
        }
        let mut w = String::new();
        while i < cs.len() && !cs[i].is_whitespace() {
            w.push(cs[i]);
            i += 1;
        }
        out.push(Tok::Word(w));
    }
    Ok(out)
}

fn hex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 != 0 {
        return Err(std::format!("odd hex {:?}", s));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| std::format!("bad hex {:?}", s)))
        .collect()
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| std::format!("{:02x}", x)).collect()
}

fn num(s: &str) -> Result<u64, String> {
    s.parse::<u64>().map_err(|_| std::format!("not a number: {:?}", s))
}

struct Interp {
    vars: BTreeMap<String, u64>,
    code: i32,
}

impl Interp {
    fn handle(&self, s: &str) -> Result<u64, String> {
        if s == "0" {
            return Ok(0);
        }
        let s = s.strip_prefix('$').ok_or_else(|| std::format!("not a handle: {:?}", s))?;
        let (name, op) = match s.find(|c| c == '^' || c == '!' || c == '+') {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        };
        let h = *self.vars.get(name).ok_or_else(|| std::format!("no handle ${}", name))?;
        Ok(if op == "^tag" {
            h ^ (1 << 32)
        } else if let Some(k) = op.strip_prefix("!kind=") {
            (h & !(0xff << 56)) | (num(k)? << 56)
        } else if let Some(n) = op.strip_prefix('+') {
            h + num(n)?
        } else if op.is_empty() {
            h
        } else {
            return Err(std::format!("bad handle expression ${}", s));
        })
    }

    fn word<'a>(&self, t: Option<&'a Tok>) -> Result<&'a str, String> {
        match t {
            Some(Tok::Word(w)) => Ok(w),
            other => Err(std::format!("want a word, got {:?}", other)),
        }
    }

    fn string<'a>(&self, t: Option<&'a Tok>) -> Result<&'a str, String> {
        match t {
            Some(Tok::Str(s)) => Ok(s),
            other => Err(std::format!("want a string, got {:?}", other)),
        }
    }

    fn launch_arg(&self, w: &str) -> Result<ArgRecord, String> {
        let inner = |p: &str| -> Option<Vec<String>> {
            let rest = w.strip_prefix(p)?.strip_suffix(')')?;
            Some(rest.split(',').map(|x| x.to_string()).collect())
        };
        if let Some(a) = inner("buf(") {
            if a.len() != 3 {
                return Err(std::format!("bad {}", w));
            }
            let len = if a[2] == "end" { 0xFFFF_FFFF } else { num(&a[2])? as u32 };
            return Ok(ArgRecord { kind: 1, offset: num(&a[1])? as u32, length: len, reserved: 0, value: self.handle(&a[0])? });
        }
        if let Some(a) = inner("f32(") {
            let v: f32 = a[0].parse().map_err(|_| std::format!("bad {}", w))?;
            return Ok(ArgRecord { value: v.to_bits() as u64, ..Default::default() });
        }
        if let Some(a) = inner("u64(") {
            return Ok(ArgRecord { value: num(&a[0])?, ..Default::default() });
        }
        if let Some(a) = inner("rec(") {
            if a.len() != 5 {
                return Err(std::format!("bad {}", w));
            }
            let value = if a[4].starts_with('$') { self.handle(&a[4])? } else { num(&a[4])? };
            return Ok(ArgRecord {
                kind: num(&a[0])? as u32,
                offset: num(&a[1])? as u32,
                length: num(&a[2])? as u32,
                reserved: num(&a[3])? as u32,
                value,
            });
        }
        Ok(ArgRecord { value: num(w)?, ..Default::default() })
    }

    fn call(&mut self, args: &[Tok], want: &[Tok]) -> Result<(), String> {
        let f = self.word(args.first())?;
        let a = &args[1..];
        let want_status = Code::from_name(self.word(want.first())?).ok_or_else(|| std::format!("unknown status {:?}", want[0]))?;
        let mut u32out: Option<u32> = None;
        let mut bytes: Option<Vec<u8>> = None;
        let mut handle: Option<u64> = None;
        let mut text: Option<String> = None;
        let st = unsafe {
            match f {
                "input_size" => {
                    let mut n = 0u32;
                    let st = sys::input_size(&mut n);
                    u32out = Some(n);
                    st
                }
                "input_read" => {
                    let off = num(self.word(a.first())?)? as u32;
                    let mut buf = std::vec![0u8; num(self.word(a.get(1))?)? as usize];
                    let mut n = 0u32;
                    let st = sys::input_read(off, buf.as_mut_ptr(), buf.len() as u32, &mut n);
                    buf.truncate(n as usize);
                    bytes = Some(buf);
                    st
                }
                "output_write" => {
                    let b = hex(self.word(a.first())?.trim_start_matches("hex:"))?;
                    sys::output_write(b.as_ptr(), b.len() as u32)
                }
                "entry_name" => {
                    let mut buf = std::vec![0u8; num(self.word(a.first())?)? as usize];
                    let mut n = 0u32;
                    let st = sys::entry_name(buf.as_mut_ptr(), buf.len() as u32, &mut n);
                    if st == 0 {
                        text = Some(String::from_utf8_lossy(&buf[..n as usize]).into_owned());
                    }
                    st
                }
                "error_set" => {
                    let s = self.string(a.first())?;
                    sys::error_set(s.as_ptr(), s.len() as u32)
                }
                "log" => {
                    let level = num(self.word(a.first())?)? as i32;
                    let s = self.string(a.get(1))?;
                    sys::log(level, s.as_ptr(), s.len() as u32)
                }
                "stream_get" | "buffer_get" | "program_get" => {
                    let s = self.string(a.first())?;
                    let mut h = 0u64;
                    let st = match f {
                        "stream_get" => sys::stream_get(s.as_ptr(), s.len() as u32, &mut h),
                        "buffer_get" => sys::buffer_get(s.as_ptr(), s.len() as u32, &mut h),
                        _ => sys::program_get(s.as_ptr(), s.len() as u32, &mut h),
                    };
                    handle = Some(h);
                    st
                }
                "weights_get" => {
                    let s = self.string(a.first())?;
                    let mut h = 0u64;
                    let st = sys::weights_get(s.as_ptr(), s.len() as u32, &mut h);
                    handle = Some(h);
                    st
                }
                "tensor_get" => {
                    let s = self.string(a.first())?;
                    let mut rec = [0u8; stagehost::TENSOR_RECORD_SIZE];
                    let st = sys::tensor_get(s.as_ptr(), s.len() as u32, rec.as_mut_ptr());
                    let mut h = [0u8; 8];
                    h.copy_from_slice(&rec[..8]);
                    handle = Some(u64::from_le_bytes(h));
                    bytes = Some(rec[8..].to_vec());
                    st
                }
                "buffer_alloc" => {
                    let mut h = 0u64;
                    let st = sys::buffer_alloc(num(self.word(a.first())?)? as u32, &mut h);
                    handle = Some(h);
                    st
                }
                "buffer_alloc_named" => {
                    let s = self.string(a.first())?;
                    let mut h = 0u64;
                    let st = sys::buffer_alloc_named(s.as_ptr(), s.len() as u32, num(self.word(a.get(1))?)? as u32, &mut h);
                    handle = Some(h);
                    st
                }
                "buffer_free" => sys::buffer_free(self.handle(self.word(a.first())?)?),
                "buffer_size" => {
                    let mut n = 0u32;
                    let st = sys::buffer_size(self.handle(self.word(a.first())?)?, &mut n);
                    u32out = Some(n);
                    st
                }
                "stream_write" => {
                    let s = self.handle(self.word(a.first())?)?;
                    let b = self.handle(self.word(a.get(1))?)?;
                    let off = num(self.word(a.get(2))?)? as u32;
                    let d = hex(self.word(a.get(3))?.trim_start_matches("hex:"))?;
                    sys::stream_write(s, b, off, d.as_ptr(), d.len() as u32)
                }
                "stream_read" => {
                    let s = self.handle(self.word(a.first())?)?;
                    let b = self.handle(self.word(a.get(1))?)?;
                    let off = num(self.word(a.get(2))?)? as u32;
                    let mut d = std::vec![0u8; num(self.word(a.get(3))?)? as usize];
                    let st = sys::stream_read(s, b, off, d.as_mut_ptr(), d.len() as u32);
                    bytes = Some(d);
                    st
                }
                "stream_submit" => {
                    let s = self.handle(self.word(a.first())?)?;
                    let p = self.handle(self.word(a.get(1))?)?;
                    let recs = a[2..].iter().map(|t| self.launch_arg(self.word(Some(t))?)).collect::<Result<Vec<_>, _>>()?;
                    sys::stream_submit(s, p, recs.as_ptr(), recs.len() as u32)
                }
                "stream_submit_batch" => {
                    let s = self.handle(self.word(a.first())?)?;
                    let mut groups: Vec<(u64, Vec<ArgRecord>)> = Vec::new();
                    let mut i = 1;
                    while i < a.len() {
                        if self.word(a.get(i))? != "{" {
                            return Err("want { in a batch".into());
                        }
                        let p = self.handle(self.word(a.get(i + 1))?)?;
                        let mut recs = Vec::new();
                        i += 2;
                        while self.word(a.get(i))? != "}" {
                            recs.push(self.launch_arg(self.word(a.get(i))?)?);
                            i += 1;
                        }
                        i += 1;
                        groups.push((p, recs));
                    }
                    let cmds: Vec<CmdRecord> = groups
                        .iter()
                        .map(|(p, r)| CmdRecord { program: *p, args_ptr: sys::args_ptr(r), args_count: r.len() as u32 })
                        .collect();
                    sys::stream_submit_batch(s, cmds.as_ptr(), cmds.len() as u32)
                }
                "stream_sync" => sys::stream_sync(self.handle(self.word(a.first())?)?),
                "stream_idle" => {
                    let mut v = 0u32;
                    let st = sys::stream_idle(self.handle(self.word(a.first())?)?, &mut v);
                    u32out = Some(v);
                    st
                }
                other => return Err(std::format!("unknown function {:?}", other)),
            }
        };
        let got = Code::from_i32(st);
        if got != want_status {
            return Err(std::format!("status {}, want {} (last error {:?})", got, want_status, stagehost::last_error()));
        }
        for result in want.iter().skip(1).map(Some) {
        match result {
            None => {}
            Some(Tok::Word(w)) if w.starts_with('$') => {
                let h = handle.ok_or("a $handle result for a call that makes none")?;
                self.vars.insert(w[1..].to_string(), h);
            }
            Some(Tok::Word(w)) if w.starts_with("hex:") => {
                let want = hex(&w[4..])?;
                let got = bytes.clone().ok_or("a hex: result for a call that reads none")?;
                if got != want {
                    return Err(std::format!("read {}, want {}", to_hex(&got), to_hex(&want)));
                }
            }
            Some(Tok::Word(w)) => {
                let want = num(w)? as u32;
                let got = u32out.ok_or("a number result for a call that writes none")?;
                if got != want {
                    return Err(std::format!("wrote {}, want {}", got, want));
                }
            }
            Some(Tok::Str(s)) => {
                if text.as_deref() != Some(s.as_str()) {
                    return Err(std::format!("wrote {:?}, want {:?}", text, s));
                }
            }
            Some(t) => return Err(std::format!("bad result {:?}", t)),
        }
        }
        Ok(())
    }

    fn line(&mut self, line: &str) -> Result<(), String> {
        let toks = tokens(line)?;
        match toks.first() {
            Some(Tok::Word(w)) if w == "call" => {
                let arrow = toks.iter().position(|t| *t == Tok::Word("=>".into())).ok_or("call without =>")?;
                self.call(&toks[1..arrow], &toks[arrow + 1..])
            }
            Some(Tok::Word(w)) if w == "lasterr" => {
                let got = stagehost::last_error().unwrap_or_default();
                match toks.get(1) {
                    Some(Tok::Str(s)) if got == *s => Ok(()),
                    Some(Tok::Contains(s)) if got.contains(s.as_str()) => Ok(()),
                    Some(t) => Err(std::format!("last error {:?}, want {:?}", got, t)),
                    None => Err("lasterr without text".into()),
                }
            }
            Some(Tok::Word(w)) if w == "return" => {
                self.code = num(self.word(toks.get(1))?)? as i32;
                Ok(())
            }
            _ => Ok(()), // fence lines, declarations and outcomes are the harness's
        }
    }
}

/// Runs the call lines of `script` (one case's lines); returns the code
/// the stage returns, or the first mismatch, naming its line.
pub fn run(script: &str) -> Result<i32, String> {
    let mut it = Interp { vars: BTreeMap::new(), code: 0 };
    for line in script.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        it.line(l).map_err(|e| std::format!("{}: {}", l, e))?;
    }
    Ok(it.code)
}

/// Runs the case's fence lines as its stagehost_fence: `fence ok` returns
/// 0 at once (whatever is pending), `fence code N` returns N, `fence sync
/// NAME` syncs the stream NAME and returns 0, or the sync's FAULT (or the
/// lookup's status). Later lines run only after a 0.
pub fn fence(script: &str) -> i32 {
    for line in script.lines() {
        let mut f = line.split_whitespace();
        if f.next() != Some("fence") {
            continue;
        }
        let st = match (f.next(), f.next()) {
            (Some("ok"), _) => 0,
            (Some("code"), Some(n)) => n.parse().unwrap_or(1),
            (Some("sync"), Some(name)) => {
                let mut h = 0u64;
                let st = unsafe { sys::stream_get(name.as_ptr(), name.len() as u32, &mut h) };
                if st != 0 {
                    st
                } else {
                    unsafe { sys::stream_sync(h) }
                }
            }
            _ => 1,
        };
        if st != 0 {
            return st;
        }
    }
    0
}
