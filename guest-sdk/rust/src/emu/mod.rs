//! A native emulator of the stagehost host, for unit-testing stage logic
//! with `cargo test` (every target but wasm32), as the Go SDK's
//! `guest-sdk/emu` does for Go stages.
//!
//! An [`Emulator`] is one session: declared streams, buffers and programs,
//! a handle table with the real layout (kind, session tag, never-reused
//! serial), a memory budget, an output limit and a log. While
//! [`Emulator::run`] runs a stage, the SDK's host functions
//! ([`crate::sys`]) act on it and return the host's statuses and last
//! error texts for every misuse. Device work is deferred as on a device: a
//! command runs when something waits for it (`stream_sync`,
//! `stream_read`, the fence), and each `stream_idle` that finds work
//! retires one command. After the stage, the fence runs (the built-in one,
//! which drains every stream, unless [`Config::with_fence`] gives one) and
//! every stream must be idle, else the session is quarantined and every
//! later run fails.
//!
//! Kernels: the built-in ones of the simulator (`noop`, `fill`, `copy`,
//! `saxpy`, `matmul`, `bias`, `relu`, `argmax`, `mlp_forward`) and the op
//! library, checked at submit against each op's contract as the host does:
//! `exp`, `log`, `tanh`, `sigmoid`, `silu`, `gelu_tanh`, `gelu_erf`,
//! `sqrt`, `rsqrt`, `neg`, `abs`, `affine`, `add`, `sub`, `mul`, `div`,
//! `max`, `min`, `reduce_sum`, `reduce_mean`, `reduce_max`,
//! `reduce_argmax`, `softmax`, `log_softmax`, `layernorm`, `rmsnorm`,
//! `transpose`, `gemm`, `gemm.fast`, `gather`, `conv2d`, `conv2d.fast`,
//! `maxpool2d`, `avgpool2d` and `cast`, each with its `.f16` and `.bf16`
//! variants where the op has them. The bounded ops (`exp`, `log`, `tanh`,
//! `sigmoid`, `silu`, `gelu_tanh`, `gelu_erf`, `softmax`, `log_softmax`)
//! compute in float64 and round once, as the simulator does, with the
//! platform's `exp`, `ln` and `tanh` and a port of Go's `math.Erfc`: a
//! value is the simulator's or, where the two float64 results straddle a
//! rounding boundary, the storage type's next value (1 ulp;
//! `tests/gelu.rs` checks the gelu ops against the simulator's values).
//! Deadlines are not emulated.
//!
//! Vendor kernels (ABI revision 4): [`Emulator::vendor_kernel`] declares
//! one with its arguments ([`VendorArg`]); `stream_launch` gives the
//! host's statuses and last errors for a built-in program, a launch shape
//! over the fixed limits of the sim devices, read-only weights bound
//! where the kernel writes, and arguments that do not match the
//! declaration (count, kind, a buffer's length against its dtype, a
//! 32-bit scalar's value).
//!
//! Weights (ABI revision 3): [`Emulator::weights`] and
//! [`Emulator::safetensors`] list them; `weights_get`, `tensor_get` and
//! every refused write to them (`stream_write`, a launch whose kernel
//! writes the argument or does not describe it, `buffer_free`) give the
//! Go emulator's statuses and last errors.

mod erf;
mod half;
mod host;
mod kernels;
pub mod safetensors;
pub mod sys;
mod vendor;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::rc::Rc;
use std::string::{String, ToString};
use std::vec::Vec;

pub use kernels::{builtins, KArg};
pub use vendor::{Dir, VendorArg};

use crate::Level;

/// The default budget of [`Config::new`]: bytes of allocated buffers (as
/// the Go emulator's `DefaultBudget`).
pub const DEFAULT_BUDGET: u64 = 256 << 20;
/// The default output limit of [`Config::new`].
pub const DEFAULT_OUTPUT_LIMIT: usize = 1 << 20;
/// Commands a stream holds before the emulated device retires the oldest.
pub const QUEUE_DEPTH: usize = 1024;

const MAX_TAG: u32 = (1 << 24) - 1;

std::thread_local! {
    static CURRENT: RefCell<Option<Rc<RefCell<State>>>> = RefCell::new(None);
}

static NEXT_TAG: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn next_tag() -> u32 {
    loop {
        let t = NEXT_TAG.fetch_add(1, std::sync::atomic::Ordering::Relaxed).wrapping_add(1) & MAX_TAG;
        if t != 0 {
            return t;
        }
    }
}

/// Configures [`Emulator::new`]. Immutable: every `with_` method returns
/// a modified copy.
#[derive(Clone, Debug)]
pub struct Config {
    budget: u64,
    output_limit: usize,
    fence: Option<fn() -> i32>,
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

impl Config {
    /// The defaults: budget [`DEFAULT_BUDGET`], output limit
    /// [`DEFAULT_OUTPUT_LIMIT`], the built-in fence.
    pub fn new() -> Config {
        Config { budget: DEFAULT_BUDGET, output_limit: DEFAULT_OUTPUT_LIMIT, fence: None }
    }
    /// The bytes `buffer_alloc` may hold at once (declared buffers are not
    /// charged); 0 is unlimited.
    pub fn with_budget(&self, bytes: u64) -> Config {
        Config { budget: bytes, ..self.clone() }
    }
    /// The most output bytes of one run.
    pub fn with_output_limit(&self, n: usize) -> Config {
        Config { output_limit: n, ..self.clone() }
    }
    /// The session's fence: a `stagehost_fence` export (the `fence!`
    /// macro's function), read as the host reads its status: 0 or FAULT
    /// with every stream idle proves the drain; anything else, a panic or
    /// a busy stream quarantines the session.
    pub fn with_fence(&self, fence: fn() -> i32) -> Config {
        Config { fence: Some(fence), ..self.clone() }
    }
}

/// One log entry: the guest's `log` calls and the emulator's own notes
/// (prefixed `emu: `).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// The level.
    pub level: Level,
    /// The message.
    pub message: String,
}

/// A run that did not succeed (ABI.md §4.1's outcomes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunError {
    /// The stage returned non-zero: its code and `error_set` message, and
    /// the device failures of the run, if any.
    Client {
        /// The stage's result.
        code: i32,
        /// The `error_set` message.
        message: String,
        /// Device work of the run that failed, if any.
        failed: Vec<String>,
    },
    /// The stage returned 0 but device work of the run failed (the fence
    /// proved the drain; the session is not quarantined).
    Fault {
        /// The failed commands, in order.
        failures: Vec<String>,
        /// The fence's own status, if it returned FAULT.
        fence_fault: bool,
    },
    /// The stage or the fence panicked: a trap on the host.
    Trap {
        /// `"stage"` or `"fence"`.
        place: &'static str,
        /// The panic's message.
        message: String,
    },
    /// The fence failed: the session is quarantined, now and for every
    /// later run (the host's `DeviceLost`).
    Quarantined {
        /// Why the fence could not be proven.
        reason: String,
    },
    /// A run while this emulator is running one (the host's `BUSY`).
    Busy,
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Client { code, message, failed } => {
                write!(f, "emu: stage failed with code {}: {}", code, message)?;
                if !failed.is_empty() {
                    write!(f, " (device work of the run also failed: {})", failed.join("; "))?;
                }
                Ok(())
            }
            RunError::Fault { failures, .. } => {
                if failures.is_empty() {
                    write!(f, "emu: device work failed: the fence reported FAULT")
                } else {
                    write!(f, "emu: device work failed: {}", failures.join("; "))
                }
            }
            RunError::Trap { place, message } => write!(f, "emu: {} trapped: panic: {}", place, message),
            RunError::Quarantined { reason } => {
                write!(f, "emu: session quarantined: fence could not be proven: {}", reason)
            }
            RunError::Busy => write!(f, "emu: run called while this emulator is running a stage: BUSY"),
        }
    }
}

impl std::error::Error for RunError {}

pub(crate) type Kernel = fn(&mut [kernels::KArg]) -> Result<(), String>;

#[derive(Clone)]
pub(crate) struct ProgramDef {
    pub name: String,
    pub kernel: Kernel,
    pub op: Option<&'static kernels::OpDef>,
    /// The storage type of the op's T arguments: 0 f32, 1 f16, 2 bf16.
    pub dtype: u8,
    /// A vendor kernel's declared arguments: launched only with
    /// `stream_launch`, checked against them.
    pub vendor: Option<Rc<Vec<VendorArg>>>,
}

pub(crate) enum Obj {
    Stream(usize),
    Buffer(usize),
    Program(ProgramDef),
}

pub(crate) struct Object {
    pub kind: u8,
    pub handle: u64,
    pub obj: Obj,
}

pub(crate) struct BufferMem {
    pub mem: Vec<u8>,
    pub allocated: bool,
    pub freed: bool,
    /// The weights' name: a read-only buffer; `None` for any other.
    pub weights: Option<String>,
}

/// Weights of the session: the object of their read-only buffer and,
/// from a safetensors file, their tensors by name.
pub(crate) struct WeightsDef {
    pub obj: usize,
    pub tensors: BTreeMap<String, safetensors::TensorInfo>,
}

pub(crate) enum Command {
    Write { buf: usize, off: usize, data: Vec<u8> },
    Launch { prog: ProgramDef, args: Vec<host::LArg> },
}

pub(crate) struct StreamState {
    pub name: String,
    pub queue: std::collections::VecDeque<(u64, Command)>,
    pub seq: u64,
    pub failures: Vec<String>,
}

pub(crate) struct State {
    pub tag: u32,
    pub serial: u32,
    pub handles: BTreeMap<u32, usize>, // serial -> object
    pub objects: Vec<Object>,
    pub by_name: BTreeMap<(u8, String), usize>,
    pub named: BTreeMap<String, usize>,
    pub weights: BTreeMap<String, WeightsDef>,
    pub streams: Vec<StreamState>,
    pub buffers: Vec<BufferMem>,
    pub budget: u64,
    pub used: u64,
    /// Bytes freed during the run, charged until its fence proves the drain.
    pub freeing: u64,
    pub out_limit: usize,
    pub logs: Vec<LogEntry>,
    pub fence: Option<fn() -> i32>,
    pub running: bool,
    pub lost: Option<RunError>,
    pub failures: Vec<String>,
    pub entry: String,
    pub input: Vec<u8>,
    pub output: Vec<u8>,
    pub err_msg: String,
    pub last_err: String,
    pub why: String,
}

/// One emulated session. Configure it, then [`Emulator::run`] stages.
pub struct Emulator {
    st: Rc<RefCell<State>>,
}

impl Emulator {
    /// An emulator with no resources, configured by `cfg`.
    pub fn new(cfg: Config) -> Emulator {
        Emulator {
            st: Rc::new(RefCell::new(State {
                tag: next_tag(),
                serial: 0,
                handles: BTreeMap::new(),
                objects: Vec::new(),
                by_name: BTreeMap::new(),
                named: BTreeMap::new(),
                weights: BTreeMap::new(),
                streams: Vec::new(),
                buffers: Vec::new(),
                budget: cfg.budget,
                used: 0,
                freeing: 0,
                out_limit: cfg.output_limit,
                logs: Vec::new(),
                fence: cfg.fence,
                running: false,
                lost: None,
                failures: Vec::new(),
                entry: String::new(),
                input: Vec::new(),
                output: Vec::new(),
                err_msg: String::new(),
                last_err: String::new(),
                why: String::new(),
            })),
        }
    }

    fn declare(self, kind: u8, name: &str, obj: Obj) -> Emulator {
        {
            let mut s = self.st.borrow_mut();
            let key = (kind, name.to_string());
            if s.by_name.contains_key(&key) {
                panic!("emu: {} {:?} declared twice", host::kind_name(kind), name);
            }
            let idx = s.objects.len();
            s.objects.push(Object { kind, handle: 0, obj });
            s.by_name.insert(key, idx);
        }
        self
    }

    /// Declares a stream called `name`, as the operator does.
    pub fn stream(self, name: &str) -> Emulator {
        let idx = {
            let mut s = self.st.borrow_mut();
            s.streams.push(StreamState { name: name.to_string(), queue: Default::default(), seq: 0, failures: Vec::new() });
            s.streams.len() - 1
        };
        self.declare(1, name, Obj::Stream(idx))
    }

    /// Declares a zeroed buffer of `size` bytes called `name`.
    pub fn buffer(self, name: &str, size: usize) -> Emulator {
        assert!(size > 0, "emu: buffer: size must be positive");
        self.buffer_data(name, &std::vec![0u8; size])
    }

    /// Declares a buffer called `name` holding a copy of `data`.
    pub fn buffer_data(self, name: &str, data: &[u8]) -> Emulator {
        assert!(!data.is_empty(), "emu: buffer_data: empty buffer");
        let idx = {
            let mut s = self.st.borrow_mut();
            s.buffers.push(BufferMem { mem: data.to_vec(), allocated: false, freed: false, weights: None });
            s.buffers.len() - 1
        };
        self.declare(2, name, Obj::Buffer(idx))
    }

    /// Adds raw weights called `name` holding a copy of `data`, as a
    /// manifest's `[[weights]]` with format "raw" that the session lists:
    /// the stage finds them with [`crate::lookup_weights`], as a read-only
    /// buffer (ABI.md §3, `weights_get`), with the host's statuses and last
    /// errors for what it may not do to them (write, launch an op that
    /// writes them, free). Weights are not charged to the budget. Panics
    /// on an empty name, a name given twice, or no bytes. Go's
    /// `Config.WithWeights`.
    pub fn weights(self, name: &str, data: &[u8]) -> Emulator {
        self.add_weights(name, data.to_vec(), BTreeMap::new())
    }

    /// Adds weights called `name` from a safetensors file's bytes, as
    /// [`Emulator::weights`] does: the buffer holds the file's data
    /// section, and [`crate::lookup_tensor`] finds each tensor as
    /// `"<name>/<tensor>"`. Panics, with the reader's message, on a file
    /// that [`safetensors::read_header`] refuses (a hostile header: bounds,
    /// overlap, dtype, rank, ...) or one with an empty data section. Go's
    /// `Config.WithSafetensors`.
    pub fn safetensors(self, name: &str, file: &[u8]) -> Emulator {
        let h = match safetensors::read_header(file) {
            Ok(h) => h,
            Err(e) => panic!("emu: weights {:?}: {}", name, e),
        };
        let tensors = h.tensors.into_iter().map(|t| (t.name.clone(), t)).collect();
        self.add_weights(name, file[h.data_offset..].to_vec(), tensors)
    }

    fn add_weights(self, name: &str, mem: Vec<u8>, tensors: BTreeMap<String, safetensors::TensorInfo>) -> Emulator {
        {
            let mut s = self.st.borrow_mut();
            if name.is_empty() || s.weights.contains_key(name) {
                panic!("emu: weights {:?}: an empty name, or given twice", name);
            }
            if mem.is_empty() {
                panic!("emu: weights {:?} hold no bytes", name);
            }
            s.buffers.push(BufferMem { mem, allocated: false, freed: false, weights: Some(name.to_string()) });
            let b = s.buffers.len() - 1;
            s.objects.push(Object { kind: 2, handle: 0, obj: Obj::Buffer(b) });
            let obj = s.objects.len() - 1;
            s.weights.insert(name.to_string(), WeightsDef { obj, tensors });
        }
        self
    }

    /// Allows the session the named built-in kernels (see the module doc:
    /// every kernel of the simulator and program of the op library).
    /// Panics on a name that is not emulated, naming it and listing those
    /// that are.
    pub fn programs(mut self, names: &[&str]) -> Emulator {
        for n in names {
            let p = match kernels::lookup(n) {
                Some(p) => p,
                None => panic!(
                    "emu: programs: no natively emulated kernel {:?} (emulated: {})",
                    n,
                    builtins().join(", ")
                ),
            };
            self = self.declare(3, n, Obj::Program(p));
        }
        self
    }

    /// Allows a program called `name` that runs `kernel`.
    pub fn kernel(self, name: &str, kernel: fn(&mut [kernels::KArg]) -> Result<(), String>) -> Emulator {
        self.declare(3, name, Obj::Program(ProgramDef { name: name.to_string(), kernel, op: None, dtype: 0, vendor: None }))
    }

    /// Allows a vendor kernel called `name` (a manifest's `[[kernel]]`)
    /// with the declared `args`, run by `kernel`, the native stand-in for
    /// its PTX or Wasm module. As on the host it is launched only with
    /// `stream_launch` ([`crate::Stream::launch`]); `stream_submit` and
    /// `stream_submit_batch` refuse it with `INVALID_ARGUMENT`. A launch is
    /// checked, in the host's order and words, before anything is
    /// enqueued: its shape against the sim devices' fixed limits (as the
    /// Go emulator's `LaunchLimits`; then ignored), each argument record
    /// (a read-only weights buffer only where `args` declares a buffer
    /// [`Dir::In`]), and the arguments against `args`: their count, each
    /// one's kind (buffer or scalar), a buffer's length against its dtype,
    /// a 32-bit scalar's value. Each refusal is `INVALID_ARGUMENT` with
    /// the host's last error (see the crate's README).
    ///
    /// ```
    /// use stagehost::emu::{Config, Dir, Emulator, KArg, VendorArg};
    /// use stagehost::{Arg, Buffer, DType, Program, Stream};
    ///
    /// // y = 2x over n values: the native stand-in for the kernel.
    /// fn double(a: &mut [KArg]) -> Result<(), String> {
    ///     let n = a[2].value as usize;
    ///     let x = stagehost::f32s(a[0].bytes.as_ref().unwrap());
    ///     let y: Vec<f32> = x[..n].iter().map(|v| 2.0 * v).collect();
    ///     a[1].bytes.as_mut().unwrap()[..4 * n].copy_from_slice(&stagehost::f32_bytes(&y));
    ///     Ok(())
    /// }
    ///
    /// let e = Emulator::new(Config::new()).stream("s0").buffer("x", 8).buffer("y", 8).vendor_kernel(
    ///     "double",
    ///     &[VendorArg::buffer("x", DType::F32, Dir::In), VendorArg::buffer("y", DType::F32, Dir::Out), VendorArg::u32("n")],
    ///     double,
    /// );
    /// let out = e.run(b"", || {
    ///     let (s, x, y) = (Stream::get("s0")?, Buffer::get("x")?, Buffer::get("y")?);
    ///     s.write(&x, 0, &stagehost::f32_bytes(&[1.5, -2.0]))?;
    ///     let k = Program::get("double")?;
    ///     s.launch(&k, [1, 1, 1], [2, 1, 1], 0, &[Arg::whole(&x), Arg::whole(&y), Arg::u32(2)])?;
    ///     // A scalar where the declaration has a buffer: refused.
    ///     assert!(s.launch(&k, [1, 1, 1], [2, 1, 1], 0, &[Arg::u32(0), Arg::whole(&y), Arg::u32(2)]).is_err());
    ///     let mut b = [0u8; 8];
    ///     s.read(&y, 0, &mut b)?;
    ///     stagehost::output(&b)
    /// });
    /// assert_eq!(stagehost::f32s(&out.unwrap()), [3.0, -4.0]);
    /// ```
    ///
    /// The kernel gets its buffers as the host gives a kernel on sim
    /// (ABI.md §3.6): each buffer argument's [`KArg::bytes`] is a copy of
    /// its own, an `In` or `InOut` range's bytes, an `Out` range zeroed
    /// (two arguments bound to the same buffer get two copies). If the
    /// kernel returns `Ok`, every `Out` and `InOut` copy is copied back
    /// into its buffer, in argument order; an `In` copy never is. If it
    /// fails (an `Err` or a panic), nothing is copied back.
    ///
    /// # Panics
    ///
    /// On what a manifest refuses of a `[[kernel]]` (docs/manifest.md): a
    /// name that is not 1 to 64 of `a-z`, `0-9`, `_`, `.` and `-`, or that
    /// is a program a backend of the host has built in (`fill`,
    /// `softmax`, `spin`, …); more than [`crate::MAX_ARGS`] arguments; an
    /// argument with an empty name or a name given twice. On a name
    /// declared twice too.
    pub fn vendor_kernel(self, name: &str, args: &[VendorArg], kernel: fn(&mut [kernels::KArg]) -> Result<(), String>) -> Emulator {
        if let Err(why) = vendor::check_declaration(name, args) {
            panic!("emu: vendor_kernel: {}", why);
        }
        let vendor = Some(Rc::new(args.to_vec()));
        self.declare(3, name, Obj::Program(ProgramDef { name: name.to_string(), kernel, op: None, dtype: 0, vendor }))
    }

    /// The declared buffer `name`'s contents as the device holds them now.
    pub fn bytes(&self, name: &str) -> Option<Vec<u8>> {
        let s = self.st.borrow();
        let i = *s.by_name.get(&(2, name.to_string()))?;
        match s.objects[i].obj {
            Obj::Buffer(b) => Some(s.buffers[b].mem.clone()),
            _ => None,
        }
    }

    /// Commands of the stream `name` not yet retired.
    pub fn pending(&self, name: &str) -> usize {
        let s = self.st.borrow();
        s.streams.iter().find(|x| x.name == name).map_or(0, |x| x.queue.len())
    }

    /// Bytes charged to the budget: allocated buffers not freed, and those
    /// freed during a run until its fence has proven the drain (as on the
    /// host; a quarantined session keeps them charged).
    pub fn budget_used(&self) -> u64 {
        self.st.borrow().used
    }

    /// The log so far.
    pub fn logs(&self) -> Vec<LogEntry> {
        self.st.borrow().logs.clone()
    }

    /// The error that quarantined the session, if any.
    pub fn quarantined(&self) -> Option<RunError> {
        self.st.borrow().lost.clone()
    }

    /// Runs a `stagehost_run` export (the `stage!` macro's function) with
    /// `input` on entry `main`; see [`Emulator::run_entry`].
    pub fn run_export(&self, input: &[u8], stage: fn() -> i32) -> Result<Vec<u8>, RunError> {
        self.run_entry("", input, stage)
    }

    /// Runs a stage function with `input` on entry `main`: an `Err` is the
    /// stage's client error, as the `stage!` macro makes it.
    pub fn run(&self, input: &[u8], stage: fn() -> crate::Result<()>) -> Result<Vec<u8>, RunError> {
        self.run_with("", input, move || crate::rt::call(stage))
    }

    /// Runs `stage` as the host runs `stagehost_run` for `entry` (`""`
    /// means `main`), then the fence and the idle check. Returns the output,
    /// or the outcome as a [`RunError`].
    pub fn run_entry(&self, entry: &str, input: &[u8], stage: fn() -> i32) -> Result<Vec<u8>, RunError> {
        self.run_with(entry, input, stage)
    }

    /// Runs only the fence and the idle check, as the host does after a
    /// stage.
    pub fn run_fence(&self) -> Result<(), RunError> {
        self.run_with("", &[], || 0).map(|_| ())
    }

    fn run_with(&self, entry: &str, input: &[u8], stage: impl FnOnce() -> i32) -> Result<Vec<u8>, RunError> {
        {
            let mut s = self.st.borrow_mut();
            if s.running {
                return Err(RunError::Busy);
            }
            if let Some(l) = &s.lost {
                return Err(l.clone());
            }
            s.running = true;
            s.entry = if entry.is_empty() { crate::DEFAULT_ENTRY.to_string() } else { entry.to_string() };
            s.input = input.to_vec();
            s.output.clear();
            s.err_msg.clear();
            s.last_err.clear();
            s.why.clear();
            s.failures.clear();
        }
        let prev = CURRENT.with(|c| c.replace(Some(self.st.clone())));
        if prev.is_some() {
            CURRENT.with(|c| c.replace(prev));
            self.st.borrow_mut().running = false;
            return Err(RunError::Busy);
        }
        let res = self.run_attached(stage);
        CURRENT.with(|c| c.replace(None));
        let mut s = self.st.borrow_mut();
        s.running = false;
        s.input.clear();
        s.entry.clear();
        res
    }

    fn run_attached(&self, stage: impl FnOnce() -> i32) -> Result<Vec<u8>, RunError> {
        let stage_res = protect(stage);
        let stage_err = match stage_res {
            Err(msg) => Some(RunError::Trap { place: "stage", message: msg }),
            Ok(0) => None,
            Ok(code) => {
                let s = self.st.borrow();
                Some(RunError::Client { code, message: s.err_msg.clone(), failed: Vec::new() })
            }
        };
        // The fence, then the idle check (ABI.md §4.4).
        let fence = self.st.borrow().fence;
        let (reason, fence_fault) = match fence {
            None => {
                host::builtin_fence(&mut self.st.borrow_mut());
                (None, false)
            }
            Some(f) => match protect(f) {
                Err(msg) => (Some(std::format!("fence trapped: panic: {}", msg)), false),
                Ok(0) => (None, false),
                Ok(9) => (None, true),
                Ok(code) => (Some(std::format!("fence returned {}", crate::Code::from_i32(code))), false),
            },
        };
        let mut s = self.st.borrow_mut();
        let reason = reason.or_else(|| {
            s.streams.iter().find(|x| !x.queue.is_empty()).map(|x| {
                std::format!("stream {:?} still has {} commands after the fence", x.name, x.queue.len())
            })
        });
        if let Some(reason) = reason {
            let q = RunError::Quarantined { reason };
            s.lost = Some(q.clone());
            let note = q.to_string();
            s.log(Level::Error, std::format!("emu: {}", note));
            return Err(q);
        }
        // The drain is proven: what the run freed is released.
        s.used -= s.freeing;
        s.freeing = 0;
        let failures = std::mem::take(&mut s.failures);
        match stage_err {
            Some(RunError::Client { code, message, .. }) => Err(RunError::Client { code, message, failed: failures }),
            Some(e) => Err(e),
            None if !failures.is_empty() || fence_fault => Err(RunError::Fault { failures, fence_fault }),
            None => Ok(std::mem::take(&mut s.output)),
        }
    }
}

/// Calls f, turning a panic into its message.
fn protect(f: impl FnOnce() -> i32) -> Result<i32, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        if let Some(s) = p.downcast_ref::<&str>() {
            s.to_string()
        } else if let Some(s) = p.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic".to_string()
        }
    })
}

impl State {
    pub(crate) fn log(&mut self, level: Level, msg: String) {
        self.logs.push(LogEntry { level, message: msg });
    }
}

/// Calls `f` on the running emulator's state; a host function called
/// outside [`Emulator::run`] panics, naming itself.
pub(crate) fn with_state<R>(op: &str, f: impl FnOnce(&mut State) -> R) -> R {
    let st = CURRENT.with(|c| c.borrow().clone());
    match st {
        Some(st) => {
            let mut s = st.borrow_mut();
            f(&mut s)
        }
        None => panic!("stagehost: {} called outside an emulator run (natively, run stages with stagehost::emu::Emulator)", op),
    }
}
