//! The host functions of ABI v1 on the emulator's state, on slices; the
//! pointer-taking functions of `sys` wrap them. Each non-OK status becomes
//! the run's last error: the detail the function gave (`why`), else the
//! status's own text, as the host does.

use std::string::{String, ToString};
use std::vec::Vec;

use super::kernels::KArg;
use super::{Command, Obj, Object, ProgramDef, State, QUEUE_DEPTH};
use crate::{ArgRecord, CmdRecord, Level};

pub(crate) const OK: i32 = 0;
const INVALID_ARGUMENT: i32 = 4;
const NOT_FOUND: i32 = 5;
const OUT_OF_BUDGET: i32 = 6;
const FAULT: i32 = 9;
const BAD_HANDLE: i32 = 11;
const STALE_HANDLE: i32 = 12;
const FOREIGN_HANDLE: i32 = 13;
const OUT_OF_BOUNDS: i32 = 14;
const OUTPUT_TOO_LARGE: i32 = 15;

const MAX_ARGS: u32 = 16;
const MAX_BATCH: u32 = 1024;
/// The sim devices' fixed launch limits (abi/ABI.md §3.5), as the Go
/// emulator's `LaunchLimits`.
const MAX_THREADS_PER_BLOCK: u64 = 1024;
const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
const MAX_GRID: [u32; 3] = [(1 << 31) - 1, 65535, 65535];
const MAX_SHARED_BYTES: u32 = 48 << 10;
const TO_END: u32 = 0xFFFF_FFFF;
/// A dimension as Go's %v prints a [3]uint32: `[x y z]`.
fn dim3(d: [u32; 3]) -> String {
    std::format!("[{} {} {}]", d[0], d[1], d[2])
}

const MAX_ERROR_MESSAGE: usize = 4096;
const MAX_TAG: u32 = (1 << 24) - 1;

/// A launch argument as enqueued: a buffer range or a scalar.
#[derive(Clone, Debug)]
pub(crate) struct LArg {
    pub buf: Option<usize>,
    pub off: usize,
    pub len: usize,
    pub value: u64,
}

pub(crate) fn kind_name(k: u8) -> &'static str {
    match k {
        1 => "stream",
        2 => "buffer",
        3 => "program",
        _ => "kind",
    }
}

fn status_text(st: i32) -> String {
    match st {
        BAD_HANDLE => "bad handle".into(),
        STALE_HANDLE => "stale handle".into(),
        FOREIGN_HANDLE => "handle of another session".into(),
        OUT_OF_BOUNDS => "pointer or length outside guest memory".into(),
        OUTPUT_TOO_LARGE => "output larger than its limit".into(),
        INVALID_ARGUMENT => "invalid argument".into(),
        NOT_FOUND => "not found".into(),
        OUT_OF_BUDGET => "out of budget".into(),
        FAULT => "device fault".into(),
        c => crate::Code::from_i32(c).name().to_string(),
    }
}

fn cut_message(mut msg: String) -> String {
    if msg.len() > MAX_ERROR_MESSAGE {
        let mut cut = MAX_ERROR_MESSAGE;
        while cut > 0 && !msg.is_char_boundary(cut) {
            cut -= 1;
        }
        msg.truncate(cut);
    }
    msg
}

impl State {
    /// Makes a non-OK st the run's last error.
    pub(crate) fn note(&mut self, st: i32) -> i32 {
        if st != OK {
            let msg = if self.why.is_empty() { status_text(st) } else { std::mem::take(&mut self.why) };
            self.last_err = cut_message(msg);
        }
        self.why.clear();
        st
    }

    fn fail(&mut self, st: i32, why: String) -> i32 {
        self.why = why;
        st
    }

    pub(crate) fn input_size(&mut self) -> (u32, i32) {
        (self.input.len() as u32, OK)
    }

    pub(crate) fn input_read(&mut self, offset: u32, dst: &mut [u8]) -> (u32, i32) {
        if offset as usize > self.input.len() {
            let n = self.input.len();
            return (0, self.fail(INVALID_ARGUMENT, std::format!("offset {} is beyond the input's {} bytes", offset, n)));
        }
        let src = &self.input[offset as usize..];
        let n = src.len().min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
        (n as u32, OK)
    }

    pub(crate) fn output_write(&mut self, src: &[u8]) -> i32 {
        if self.output.len() + src.len() > self.out_limit {
            let why = std::format!(
                "{} more bytes would take the output past its limit of {} bytes: output larger than its limit",
                src.len(),
                self.out_limit
            );
            return self.fail(OUTPUT_TOO_LARGE, why);
        }
        self.output.extend_from_slice(src);
        OK
    }

    pub(crate) fn entry_name(&mut self, dst: &mut [u8]) -> (u32, i32) {
        let n = self.entry.len() as u32;
        if dst.len() < self.entry.len() {
            return (n, OUT_OF_BOUNDS);
        }
        dst[..self.entry.len()].copy_from_slice(self.entry.as_bytes());
        (n, OK)
    }

    pub(crate) fn error_set(&mut self, msg: &[u8]) -> i32 {
        let m = &msg[..msg.len().min(MAX_ERROR_MESSAGE)];
        self.err_msg = String::from_utf8_lossy(m).into_owned();
        OK
    }

    /// last_error: its own status never changes the last error.
    pub(crate) fn last_error(&mut self, dst: &mut [u8]) -> (u32, i32) {
        let n = self.last_err.len() as u32;
        if dst.len() < self.last_err.len() {
            return (n, OUT_OF_BOUNDS);
        }
        dst[..self.last_err.len()].copy_from_slice(self.last_err.as_bytes());
        (n, OK)
    }

    pub(crate) fn log_call(&mut self, level: i32, msg: &[u8]) -> i32 {
        let lv = match level {
            0 => Level::Debug,
            1 => Level::Info,
            2 => Level::Warn,
            3 => Level::Error,
            _ => return self.fail(INVALID_ARGUMENT, std::format!("log level {} is not one of 0 to 3", level)),
        };
        let m = String::from_utf8_lossy(msg).into_owned();
        self.log(lv, m);
        OK
    }

    fn issue(&mut self, idx: usize) {
        self.serial = self.serial.checked_add(1).expect("emu: handle serials exhausted");
        let o = &mut self.objects[idx];
        o.handle = (o.kind as u64) << 56 | (self.tag as u64) << 32 | self.serial as u64;
        self.handles.insert(self.serial, idx);
    }

    pub(crate) fn lookup(&mut self, kind: u8, name: &[u8]) -> (u64, i32) {
        let key = (kind, String::from_utf8_lossy(name).into_owned());
        let idx = match self.by_name.get(&key) {
            Some(&i) => i,
            None => {
                let why = match kind {
                    1 => "declares no stream of that name",
                    2 => "declares no buffer of that name",
                    _ => "may use no program of that name",
                };
                let msg = std::format!("{} {:?} not found: the session {}", kind_name(kind), key.1, why);
                return (0, self.fail(NOT_FOUND, msg));
            }
        };
        if self.objects[idx].handle == 0 {
            self.issue(idx);
        }
        (self.objects[idx].handle, OK)
    }

    /// The object of handle h of kind, or the status of a bad, foreign or
    /// stale handle.
    fn resolve(&self, h: u64, kind: u8) -> Result<usize, i32> {
        if h == 0 {
            return Err(BAD_HANDLE);
        }
        if ((h >> 32) as u32) & MAX_TAG != self.tag {
            return Err(FOREIGN_HANDLE);
        }
        let idx = match self.handles.get(&(h as u32)) {
            Some(&i) => i,
            None => return Err(BAD_HANDLE),
        };
        let o = &self.objects[idx];
        if o.handle != h || o.kind != kind {
            return Err(BAD_HANDLE);
        }
        if let Obj::Buffer(b) = o.obj {
            if self.buffers[b].freed {
                return Err(STALE_HANDLE);
            }
        }
        Ok(idx)
    }

    fn buffer_of(&self, h: u64) -> Result<usize, i32> {
        let idx = self.resolve(h, 2)?;
        match self.objects[idx].obj {
            Obj::Buffer(b) => Ok(b),
            _ => Err(BAD_HANDLE),
        }
    }

    fn stream_of(&self, h: u64) -> Result<usize, i32> {
        let idx = self.resolve(h, 1)?;
        match self.objects[idx].obj {
            Obj::Stream(s) => Ok(s),
            _ => Err(BAD_HANDLE),
        }
    }

    fn program_of(&self, h: u64) -> Result<ProgramDef, i32> {
        let idx = self.resolve(h, 3)?;
        match &self.objects[idx].obj {
            Obj::Program(p) => Ok(p.clone()),
            _ => Err(BAD_HANDLE),
        }
    }

    pub(crate) fn buffer_alloc(&mut self, size: u32) -> (u64, i32) {
        if size == 0 {
            return (0, self.fail(INVALID_ARGUMENT, "buffer size 0".to_string()));
        }
        if self.budget > 0 && self.used + size as u64 > self.budget {
            // The host's words (hw.Budget), the emulator as the session.
            let why = std::format!("budget \"emu\": {} bytes requested, {} of {} in use", size, self.used, self.budget);
            return (0, self.fail(OUT_OF_BUDGET, why));
        }
        self.used += size as u64;
        self.buffers.push(super::BufferMem { mem: std::vec![0u8; size as usize], allocated: true, freed: false, weights: None });
        let b = self.buffers.len() - 1;
        self.objects.push(Object { kind: 2, handle: 0, obj: Obj::Buffer(b) });
        let idx = self.objects.len() - 1;
        self.issue(idx);
        (self.objects[idx].handle, OK)
    }

    pub(crate) fn buffer_alloc_named(&mut self, name: &[u8], size: u32) -> (u64, i32) {
        if name.is_empty() || name.len() > 256 {
            return (0, self.fail(INVALID_ARGUMENT, std::format!("a buffer name of {} bytes: 1 to 256", name.len())));
        }
        let key = String::from_utf8_lossy(name).into_owned();
        if let Some(&idx) = self.named.get(&key) {
            if let Obj::Buffer(b) = self.objects[idx].obj {
                if !self.buffers[b].freed {
                    let have = self.buffers[b].mem.len();
                    if have != size as usize {
                        let msg = std::format!("buffer {:?} has {} bytes, not {}", key, have, size);
                        return (0, self.fail(INVALID_ARGUMENT, msg));
                    }
                    return (self.objects[idx].handle, OK);
                }
            }
        }
        let (h, st) = self.buffer_alloc(size);
        if st != OK {
            return (0, st);
        }
        let idx = self.handles[&(h as u32)];
        self.named.insert(key, idx);
        (h, OK)
    }

    pub(crate) fn buffer_free(&mut self, h: u64) -> i32 {
        let b = match self.buffer_of(h) {
            Ok(b) => b,
            Err(st) => return st,
        };
        if let Some(w) = &self.buffers[b].weights {
            let msg = std::format!("buffer_free: buffer is the read-only weights {:?}, which cannot be freed", w);
            return self.fail(INVALID_ARGUMENT, msg);
        }
        if !self.buffers[b].allocated {
            return self.fail(INVALID_ARGUMENT, "a declared buffer cannot be freed".into());
        }
        // Queued commands keep the memory; the handle is stale from now on.
        // The memory stays charged until the run's fence proves the drain.
        self.buffers[b].freed = true;
        self.freeing += self.buffers[b].mem.len() as u64;
        OK
    }

    /// `weights_get`.
    pub(crate) fn weights_get(&mut self, name: &[u8]) -> (u64, i32) {
        let key = String::from_utf8_lossy(name).into_owned();
        let obj = match self.weights.get(&key) {
            Some(w) => w.obj,
            None => {
                let msg = std::format!("weights {:?} not found: the session lists no weights of that name", key);
                return (0, self.fail(NOT_FOUND, msg));
            }
        };
        if self.objects[obj].handle == 0 {
            self.issue(obj);
        }
        (self.objects[obj].handle, OK)
    }

    /// `tensor_get`: the 96-byte record of "<weights>/<tensor>".
    pub(crate) fn tensor_get(&mut self, name: &[u8], rec: &mut [u8]) -> i32 {
        let full = String::from_utf8_lossy(name).into_owned();
        let (wname, tname) = match full.find('/') {
            Some(i) => (&full[..i], &full[i + 1..]),
            None => {
                let msg = std::format!("tensor {:?} not found: a tensor is named \"<weights>/<tensor>\"", full);
                return self.fail(NOT_FOUND, msg);
            }
        };
        let (obj, t) = match self.weights.get(wname) {
            None => {
                let msg = std::format!("tensor {:?} not found: the session lists no weights {:?}", full, wname);
                return self.fail(NOT_FOUND, msg);
            }
            Some(w) => match w.tensors.get(tname) {
                None => {
                    let msg = std::format!("tensor {:?} not found: the weights {:?} have no tensor {:?}", full, wname, tname);
                    return self.fail(NOT_FOUND, msg);
                }
                Some(t) => (w.obj, t.clone()),
            },
        };
        if self.objects[obj].handle == 0 {
            self.issue(obj);
        }
        for b in rec.iter_mut() {
            *b = 0;
        }
        rec[0..8].copy_from_slice(&self.objects[obj].handle.to_le_bytes());
        rec[8..16].copy_from_slice(&t.begin.to_le_bytes());
        rec[16..24].copy_from_slice(&(t.end - t.begin).to_le_bytes());
        rec[24..28].copy_from_slice(&t.code.to_le_bytes());
        rec[28..32].copy_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for (i, d) in t.shape.iter().enumerate() {
            rec[32 + 8 * i..40 + 8 * i].copy_from_slice(&d.to_le_bytes());
        }
        OK
    }

    pub(crate) fn buffer_size(&mut self, h: u64) -> (u32, i32) {
        match self.buffer_of(h) {
            Ok(b) => (self.buffers[b].mem.len() as u32, OK),
            Err(st) => (0, st),
        }
    }

    fn transfer(&mut self, sh: u64, bh: u64, offset: u32, n: usize) -> Result<(usize, usize), i32> {
        let s = self.stream_of(sh)?;
        let b = self.buffer_of(bh)?;
        if offset as u64 + n as u64 > self.buffers[b].mem.len() as u64 {
            return Err(self.outside(offset, n as u64, b));
        }
        Ok((s, b))
    }

    /// The host's refusal of a stream_write or stream_read range
    /// [off, off+n) outside buffer b (stages, checkRange). An argument
    /// record's range is refused with its number where records are read.
    fn outside(&mut self, off: u32, n: u64, b: usize) -> i32 {
        let size = self.buffers[b].mem.len();
        self.fail(INVALID_ARGUMENT, std::format!("range [{},+{}) outside a buffer of {} bytes", off, n, size))
    }

    /// The host's refusal of more than MAX_ARGS argument records (stages,
    /// decodeArgs; in a batch too, without the command's number).
    fn too_many_args(&mut self, n: u32) -> i32 {
        self.fail(INVALID_ARGUMENT, std::format!("{} arguments, at most {}", n, MAX_ARGS))
    }

    pub(crate) fn stream_write(&mut self, sh: u64, bh: u64, offset: u32, src: &[u8]) -> i32 {
        if let (Ok(_), Ok(b)) = (self.stream_of(sh), self.buffer_of(bh)) {
            if let Some(w) = &self.buffers[b].weights {
                let msg = std::format!("stream_write: buffer is the read-only weights {:?}, which cannot be written", w);
                return self.fail(INVALID_ARGUMENT, msg);
            }
        }
        match self.transfer(sh, bh, offset, src.len()) {
            Ok((s, b)) => {
                self.enqueue(s, Command::Write { buf: b, off: offset as usize, data: src.to_vec() });
                OK
            }
            Err(st) => st,
        }
    }

    pub(crate) fn stream_read(&mut self, sh: u64, bh: u64, offset: u32, dst: &mut [u8]) -> i32 {
        match self.transfer(sh, bh, offset, dst.len()) {
            Ok((s, b)) => {
                // A download waits for every earlier command; their
                // failures are left for stream_sync. It is a command of
                // the stream, as on the host: it takes the next number.
                self.drain(s);
                self.streams[s].seq += 1;
                let o = offset as usize;
                dst.copy_from_slice(&self.buffers[b].mem[o..o + dst.len()]);
                OK
            }
            Err(st) => st,
        }
    }

    fn parse_args(&mut self, prog: &ProgramDef, recs: &[ArgRecord]) -> Result<Vec<LArg>, i32> {
        if recs.len() as u32 > MAX_ARGS {
            return Err(self.too_many_args(recs.len() as u32));
        }
        let mut out = Vec::with_capacity(recs.len());
        for (i, r) in recs.iter().enumerate() {
            if r.reserved != 0 {
                return Err(self.fail(INVALID_ARGUMENT, std::format!("argument {}: reserved field is not zero", i)));
            }
            match r.kind {
                0 => out.push(LArg { buf: None, off: 0, len: 0, value: r.value }),
                1 => {
                    let b = self.buffer_of(r.value)?;
                    if let Some(w) = self.buffers[b].weights.clone() {
                        let dir = arg_dir(prog, i);
                        if dir != "in" {
                            let dir = if dir.is_empty() {
                                "not described as read only".to_string()
                            } else {
                                std::format!("written (direction {})", dir)
                            };
                            let msg = std::format!(
                                "{}: argument {} is the read-only weights {:?}, but the kernel's argument {} is {}",
                                prog.name, i, w, i, dir
                            );
                            return Err(self.fail(INVALID_ARGUMENT, msg));
                        }
                    }
                    let size = self.buffers[b].mem.len() as u64;
                    let mut n = r.length as u64;
                    if r.length == TO_END {
                        if r.offset as u64 > size {
                            let msg = std::format!("argument {}: offset {} beyond a buffer of {} bytes", i, r.offset, size);
                            return Err(self.fail(INVALID_ARGUMENT, msg));
                        }
                        n = size - r.offset as u64;
                    }
                    if r.offset as u64 + n > size {
                        let msg = std::format!("argument {}: range [{},+{}) outside a buffer of {} bytes", i, r.offset, n, size);
                        return Err(self.fail(INVALID_ARGUMENT, msg));
                    }
                    out.push(LArg { buf: Some(b), off: r.offset as usize, len: n as usize, value: 0 });
                }
                k => return Err(self.fail(INVALID_ARGUMENT, std::format!("argument {}: unknown kind {}", i, k))),
            }
        }
        Ok(out)
    }

    pub(crate) fn stream_submit(&mut self, sh: u64, ph: u64, recs: &[ArgRecord]) -> i32 {
        let s = match self.stream_of(sh) {
            Ok(s) => s,
            Err(st) => return st,
        };
        let p = match self.program_of(ph) {
            Ok(p) => p,
            Err(st) => return st,
        };
        if p.vendor.is_some() {
            return self.needs_launch("", &p);
        }
        let args = match self.parse_args(&p, recs) {
            Ok(a) => a,
            Err(st) => return st,
        };
        if let Some(op) = p.op {
            if let Err(why) = super::kernels::validate(op, p.dtype, &args) {
                return self.fail(INVALID_ARGUMENT, why);
            }
        }
        self.enqueue(s, Command::Launch { prog: p, args });
        OK
    }

    /// The refusal of a vendor kernel given to stream_submit, or as
    /// `prefix` ("command N: ", as the host says) to stream_submit_batch.
    fn needs_launch(&mut self, prefix: &str, p: &ProgramDef) -> i32 {
        self.fail(
            INVALID_ARGUMENT,
            std::format!(
                "{}program {:?} is a vendor kernel: launch it with stream_launch, which gives its grid, block and shared memory (ABI.md §3.5)",
                prefix,
                p.name
            ),
        )
    }

    /// The launch shape against the fixed limits, as the Go emulator's
    /// checkShapeLocked (the same order and texts).
    fn check_shape(&mut self, name: &str, grid: [u32; 3], block: [u32; 3], shared: u32) -> i32 {
        let mut threads: u64 = 1;
        for (i, axis) in ['x', 'y', 'z'].iter().enumerate() {
            if grid[i] == 0 || block[i] == 0 {
                return self.fail(
                    INVALID_ARGUMENT,
                    std::format!(
                        "kernel {:?}: launch shape: grid {}, block {}: every dimension is at least 1",
                        name,
                        dim3(grid),
                        dim3(block)
                    ),
                );
            }
            if block[i] > MAX_BLOCK[i] {
                return self.fail(
                    INVALID_ARGUMENT,
                    std::format!(
                        "kernel {:?}: launch shape: block.{} = {}, over the device's limit of {}",
                        name, axis, block[i], MAX_BLOCK[i]
                    ),
                );
            }
            if grid[i] > MAX_GRID[i] {
                return self.fail(
                    INVALID_ARGUMENT,
                    std::format!(
                        "kernel {:?}: launch shape: grid.{} = {}, over the device's limit of {}",
                        name, axis, grid[i], MAX_GRID[i]
                    ),
                );
            }
            threads *= block[i] as u64;
        }
        if threads > MAX_THREADS_PER_BLOCK {
            return self.fail(
                INVALID_ARGUMENT,
                std::format!(
                    "kernel {:?}: launch shape: block {} is {} threads, over the device's limit of {} per block",
                    name,
                    dim3(block),
                    threads,
                    MAX_THREADS_PER_BLOCK
                ),
            );
        }
        if shared > MAX_SHARED_BYTES {
            return self.fail(
                INVALID_ARGUMENT,
                std::format!(
                    "kernel {:?}: launch shape: {} bytes of shared memory, over the device's limit of {}",
                    name, shared, MAX_SHARED_BYTES
                ),
            );
        }
        OK
    }

    /// stream_launch: the host's order (stream, program, a built-in
    /// program refused, the shape, the argument records, the arguments
    /// against the kernel's declaration).
    pub(crate) fn stream_launch(
        &mut self,
        sh: u64,
        ph: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        recs: &[ArgRecord],
    ) -> i32 {
        let s = match self.stream_of(sh) {
            Ok(s) => s,
            Err(st) => return st,
        };
        let p = match self.program_of(ph) {
            Ok(p) => p,
            Err(st) => return st,
        };
        let decl = match &p.vendor {
            Some(d) => d.clone(),
            None => return self.fail(
                INVALID_ARGUMENT,
                std::format!("program {:?} is built in: stream_launch launches vendor kernels; use stream_submit", p.name),
            ),
        };
        let st = self.check_shape(&p.name, grid, block, shared);
        if st != OK {
            return st;
        }
        let args = match self.parse_args(&p, recs) {
            Ok(a) => a,
            Err(st) => return st,
        };
        if let Err(why) = super::vendor::check(&p.name, &decl, &args) {
            return self.fail(INVALID_ARGUMENT, why);
        }
        self.enqueue(s, Command::Launch { prog: p, args });
        OK
    }

    /// stream_submit_batch; `args_of` resolves a record's args_ptr to its
    /// records, or None when they lie outside memory.
    pub(crate) fn stream_submit_batch(
        &mut self,
        sh: u64,
        cmds: &[CmdRecord],
        args_of: &dyn Fn(u32, u32) -> Option<Vec<ArgRecord>>,
    ) -> i32 {
        let s = match self.stream_of(sh) {
            Ok(s) => s,
            Err(st) => return st,
        };
        if cmds.len() as u32 > MAX_BATCH {
            return self.fail(INVALID_ARGUMENT, std::format!("a batch of {} commands, at most {}", cmds.len(), MAX_BATCH));
        }
        let mut launches = Vec::with_capacity(cmds.len());
        for (i, c) in cmds.iter().enumerate() {
            let p = match self.program_of(c.program) {
                Ok(p) => p,
                Err(st) => return st,
            };
            if p.vendor.is_some() {
                return self.needs_launch(&std::format!("command {}: ", i), &p);
            }
            if c.args_count > MAX_ARGS {
                return self.too_many_args(c.args_count);
            }
            let recs = match args_of(c.args_ptr, c.args_count) {
                Some(r) => r,
                None => return OUT_OF_BOUNDS,
            };
            let args = match self.parse_args(&p, &recs) {
                Ok(a) => a,
                Err(st) => return st,
            };
            if let Some(op) = p.op {
                if let Err(why) = super::kernels::validate(op, p.dtype, &args) {
                    return self.fail(INVALID_ARGUMENT, std::format!("command {}: {}", i, why));
                }
            }
            launches.push(Command::Launch { prog: p, args });
        }
        for c in launches {
            self.enqueue(s, c);
        }
        OK
    }

    pub(crate) fn stream_sync(&mut self, sh: u64) -> i32 {
        let s = match self.stream_of(sh) {
            Ok(s) => s,
            Err(st) => return st,
        };
        self.drain(s);
        if !self.streams[s].failures.is_empty() {
            // Recorded: the run fails even if the guest ignores it.
            let why = self.streams[s].failures.remove(0);
            self.failures.push(why.clone());
            return self.fail(FAULT, why);
        }
        OK
    }

    pub(crate) fn stream_idle(&mut self, sh: u64) -> (u32, i32) {
        let s = match self.stream_of(sh) {
            Ok(s) => s,
            Err(st) => return (0, st),
        };
        if self.streams[s].queue.is_empty() {
            return (1, OK);
        }
        self.retire(s); // the device makes progress meanwhile
        (0, OK)
    }

    fn enqueue(&mut self, s: usize, c: Command) {
        if self.streams[s].queue.len() >= QUEUE_DEPTH {
            self.retire(s); // the device keeps up rather than reporting BUSY
        }
        let st = &mut self.streams[s];
        st.seq += 1;
        let seq = st.seq;
        st.queue.push_back((seq, c));
    }

    pub(crate) fn drain(&mut self, s: usize) {
        while !self.streams[s].queue.is_empty() {
            self.retire(s);
        }
    }

    fn retire(&mut self, s: usize) {
        let (seq, c) = match self.streams[s].queue.pop_front() {
            Some(x) => x,
            None => return,
        };
        let err = match c {
            Command::Write { buf, off, data } => {
                self.buffers[buf].mem[off..off + data.len()].copy_from_slice(&data);
                None
            }
            Command::Launch { prog, args } => self.run_kernel(&prog, &args).err(),
        };
        if let Some(e) = err {
            let msg = std::format!("stream {:?}: command {}: {}", self.streams[s].name, seq, e);
            self.streams[s].failures.push(msg.clone());
            self.log(Level::Error, std::format!("emu: {}", msg));
        }
    }

    fn run_kernel(&mut self, p: &ProgramDef, args: &[LArg]) -> Result<(), String> {
        if let Some(decl) = p.vendor.clone() {
            return self.run_vendor(p, &decl, args);
        }
        let mut kargs: Vec<KArg> = args
            .iter()
            .enumerate()
            .map(|(i, a)| match a.buf {
                Some(b) => KArg {
                    bytes: Some(self.buffers[b].mem[a.off..a.off + a.len].to_vec()),
                    offset: a.off,
                    value: 0,
                    addr: address(b, a.off),
                    dtype: match p.op {
                        Some(op) if i < op.nargs() => super::kernels::arg_dtype(op, p.dtype, i),
                        _ => 0,
                    },
                },
                None => KArg { bytes: None, offset: 0, value: a.value, addr: 0, dtype: 0 },
            })
            .collect();
        let before: Vec<Option<Vec<u8>>> = kargs.iter().map(|k| k.bytes.clone()).collect();
        let kernel = p.kernel;
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kernel(&mut kargs)));
        match res {
            Err(_) => return Err(std::format!("kernel {:?} panicked", p.name)),
            Ok(Err(e)) => return Err(std::format!("kernel {:?}: {}", p.name, e)),
            Ok(Ok(())) => {}
        }
        // Write back the ranges the kernel changed, in argument order.
        for (i, a) in args.iter().enumerate() {
            if let (Some(b), Some(after)) = (a.buf, &kargs[i].bytes) {
                if before[i].as_ref() != Some(after) {
                    self.buffers[b].mem[a.off..a.off + a.len].copy_from_slice(after);
                }
            }
        }
        Ok(())
    }

    /// Runs a vendor kernel as the host runs one on sim (ABI.md §3.6): it
    /// gets a copy of its own of each buffer range, an `in` or `inout`
    /// range's bytes, an `out` range zeroed (two arguments bound to one
    /// buffer get two copies); if it returns `Ok`, every `out` and `inout`
    /// copy is copied back into the device buffer, in argument order; if
    /// it fails, nothing is.
    fn run_vendor(&mut self, p: &ProgramDef, decl: &[super::VendorArg], args: &[LArg]) -> Result<(), String> {
        let mut kargs: Vec<KArg> = args
            .iter()
            .enumerate()
            .map(|(i, a)| match a.buf {
                Some(b) => KArg {
                    bytes: Some(if decl[i].dir() == "out" {
                        std::vec![0u8; a.len]
                    } else {
                        self.buffers[b].mem[a.off..a.off + a.len].to_vec()
                    }),
                    offset: a.off,
                    value: 0,
                    addr: 0,
                    dtype: 0,
                },
                None => KArg { bytes: None, offset: 0, value: a.value, addr: 0, dtype: 0 },
            })
            .collect();
        let kernel = p.kernel;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kernel(&mut kargs))) {
            Err(_) => return Err(std::format!("kernel {:?} panicked", p.name)),
            Ok(Err(e)) => return Err(std::format!("kernel {:?}: {}", p.name, e)),
            Ok(Ok(())) => {}
        }
        for (i, a) in args.iter().enumerate() {
            if let (Some(b), Some(after)) = (a.buf, &kargs[i].bytes) {
                if decl[i].dir() != "in" {
                    // (A kernel that resized its copy gives back what
                    // fits the range.)
                    let n = a.len.min(after.len());
                    self.buffers[b].mem[a.off..a.off + n].copy_from_slice(&after[..n]);
                }
            }
        }
        Ok(())
    }
}

/// The emulated device address of byte `off` of buffer `b`: buffers lie
/// apart, so overlaps are overlaps within one buffer.
/// The argument directions of the kernels, as hw/sim and the op library
/// (hw/internal/ops) describe them: i in, o out, x inout, one an
/// argument; OP.f16, OP.bf16 and OP.fast are OP's. noop, variadic, has
/// none (so it takes no weights, as on the host). The C emulator's
/// kernel_dirs, which the Go emulator's tests check against the op
/// library's descriptions; a unit test keeps the two equal.
const KERNEL_DIRS: &[(&str, &str)] = &[
    ("fill", "oi"),
    ("copy", "oi"),
    ("saxpy", "iix"),
    ("matmul", "iioiii"),
    ("bias", "xiii"),
    ("relu", "x"),
    ("argmax", "io"),
    ("mlp_forward", "iiiiiooiii"),
    ("exp", "io"),
    ("log", "io"),
    ("tanh", "io"),
    ("sigmoid", "io"),
    ("silu", "io"),
    ("sqrt", "io"),
    ("rsqrt", "io"),
    ("neg", "io"),
    ("abs", "io"),
    ("gelu_tanh", "io"),
    ("gelu_erf", "io"),
    ("affine", "ioii"),
    ("add", "iioiiiiiiii"),
    ("sub", "iioiiiiiiii"),
    ("mul", "iioiiiiiiii"),
    ("div", "iioiiiiiiii"),
    ("max", "iioiiiiiiii"),
    ("min", "iioiiiiiiii"),
    ("reduce_sum", "ioiii"),
    ("reduce_mean", "ioiii"),
    ("reduce_max", "ioiii"),
    ("reduce_argmax", "ioiii"),
    ("softmax", "ioiii"),
    ("log_softmax", "ioiii"),
    ("layernorm", "iiioiii"),
    ("rmsnorm", "iioiii"),
    ("transpose", "ioiiiiiiii"),
    ("gemm", "iixiiiiiiiiiii"),
    ("gather", "iioii"),
    ("conv2d", "iiioiiiiiiiiiii"),
    ("maxpool2d", "ioiiiiiiii"),
    ("avgpool2d", "ioiiiiiiii"),
    ("cast", "ioii"),
];

/// The direction of argument i of prog ("" when its kernel has no
/// description of it: a kernel added with [`super::Emulator::kernel`],
/// noop, an argument past the described ones); a vendor kernel's is its
/// declaration's ("in" for a scalar, as the host's).
fn arg_dir(prog: &ProgramDef, i: usize) -> &'static str {
    if let Some(v) = &prog.vendor {
        return v.get(i).map_or("", |a| a.dir());
    }
    // A kernel of the session's own (Emulator::kernel) under a built-in
    // name describes nothing.
    let builtin = super::kernels::lookup(&prog.name).map_or(false, |k| k.kernel as usize == prog.kernel as usize);
    let base = prog.name.split('.').next().unwrap_or("");
    match KERNEL_DIRS.iter().find(|(n, _)| *n == base) {
        Some((_, d)) if builtin => match d.as_bytes().get(i) {
            Some(b'i') => "in",
            Some(b'o') => "out",
            Some(_) => "inout",
            None => "",
        },
        _ => "",
    }
}

pub(crate) fn address(b: usize, off: usize) -> u64 {
    ((b as u64 + 1) << 40) + off as u64
}

/// The built-in fence: drain every stream, attempting all of them, and
/// record every failure it finds.
pub(crate) fn builtin_fence(s: &mut State) {
    for i in 0..s.streams.len() {
        s.drain(i);
        let f = std::mem::take(&mut s.streams[i].failures);
        s.failures.extend(f);
    }
}

#[cfg(test)]
mod tests {
    use std::string::{String, ToString};
    use std::vec::Vec;

    /// The argument directions by which the emulator refuses a launch
    /// that would write weights are the C emulator's table (emu.c,
    /// kernel_dirs), which the Go emulator's tests check against the op
    /// library's descriptions.
    #[test]
    fn arg_dirs_are_the_c_emulators() {
        let c = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../c/emu.c")).unwrap();
        let start = c.find("kernel_dirs[] = {").expect("emu.c: no kernel_dirs");
        let body = &c[start..start + c[start..].find("};").unwrap()];
        let table: Vec<(String, String)> = body
            .split("{\"")
            .skip(1)
            .map(|e| {
                let p: Vec<&str> = e.split('"').collect();
                (p[0].into(), p[2].into())
            })
            .collect();
        let ours: Vec<(String, String)> = super::KERNEL_DIRS.iter().map(|(n, d)| (n.to_string(), d.to_string())).collect();
        assert_eq!(ours, table, "KERNEL_DIRS differs from emu.c's kernel_dirs");
        // Every emulated kernel but noop is described.
        for k in super::super::kernels::builtins() {
            let p = super::super::kernels::lookup(&k).unwrap();
            let first = super::arg_dir(&p, 0);
            if k == "noop" {
                assert_eq!(first, "", "noop");
            } else {
                assert!(first == "in" || first == "out" || first == "inout", "{}: argument 0 is {:?}", k, first);
            }
            assert_eq!(super::arg_dir(&p, 15), "", "{} argument 15", k);
        }
    }
}
