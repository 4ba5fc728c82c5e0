//! Status codes (ABI.md §5) and the SDK's error type.

use alloc::string::String;
use core::fmt;

/// A status code of a host function (ABI.md §5). Unknown non-zero codes
/// are failures: [`Code::Unknown`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    /// 0
    Ok,
    /// 1
    Busy,
    /// 2
    DeviceLost,
    /// 3
    Unsupported,
    /// 4
    InvalidArgument,
    /// 5
    NotFound,
    /// 6
    OutOfBudget,
    /// 7
    DeadlineExceeded,
    /// 8
    Rejected,
    /// 9
    Fault,
    /// 10
    Closed,
    /// 11
    BadHandle,
    /// 12
    StaleHandle,
    /// 13
    ForeignHandle,
    /// 14
    OutOfBounds,
    /// 15
    OutputTooLarge,
    /// A code outside the table (a host MUST NOT return one).
    Unknown(i32),
}

impl Code {
    /// The code of the wire value `v`.
    pub const fn from_i32(v: i32) -> Code {
        match v {
            0 => Code::Ok,
            1 => Code::Busy,
            2 => Code::DeviceLost,
            3 => Code::Unsupported,
            4 => Code::InvalidArgument,
            5 => Code::NotFound,
            6 => Code::OutOfBudget,
            7 => Code::DeadlineExceeded,
            8 => Code::Rejected,
            9 => Code::Fault,
            10 => Code::Closed,
            11 => Code::BadHandle,
            12 => Code::StaleHandle,
            13 => Code::ForeignHandle,
            14 => Code::OutOfBounds,
            15 => Code::OutputTooLarge,
            v => Code::Unknown(v),
        }
    }

    /// The wire value.
    pub const fn as_i32(self) -> i32 {
        match self {
            Code::Ok => 0,
            Code::Busy => 1,
            Code::DeviceLost => 2,
            Code::Unsupported => 3,
            Code::InvalidArgument => 4,
            Code::NotFound => 5,
            Code::OutOfBudget => 6,
            Code::DeadlineExceeded => 7,
            Code::Rejected => 8,
            Code::Fault => 9,
            Code::Closed => 10,
            Code::BadHandle => 11,
            Code::StaleHandle => 12,
            Code::ForeignHandle => 13,
            Code::OutOfBounds => 14,
            Code::OutputTooLarge => 15,
            Code::Unknown(v) => v,
        }
    }

    /// The ABI's name of the code: `NOT_FOUND`.
    pub const fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Busy => "BUSY",
            Code::DeviceLost => "DEVICE_LOST",
            Code::Unsupported => "UNSUPPORTED",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::NotFound => "NOT_FOUND",
            Code::OutOfBudget => "OUT_OF_BUDGET",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::Rejected => "REJECTED",
            Code::Fault => "FAULT",
            Code::Closed => "CLOSED",
            Code::BadHandle => "BAD_HANDLE",
            Code::StaleHandle => "STALE_HANDLE",
            Code::ForeignHandle => "FOREIGN_HANDLE",
            Code::OutOfBounds => "OUT_OF_BOUNDS",
            Code::OutputTooLarge => "OUTPUT_TOO_LARGE",
            Code::Unknown(_) => "UNKNOWN",
        }
    }

    /// The code called `name` (`"NOT_FOUND"`), if any.
    pub fn from_name(name: &str) -> Option<Code> {
        (0..16).map(Code::from_i32).find(|c| c.name() == name)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Code::Unknown(v) => write!(f, "status {}", v),
            c => f.write_str(c.name()),
        }
    }
}

/// The error of every SDK call: the host function that failed (`op`),
/// its status code, and the host's reason, read with `last_error` right
/// after the failure (empty on a host of revision 1, or when the host gave
/// none). Guests decide by [`Status::code`], never by the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    code: Code,
    op: &'static str,
    message: String,
}

impl Status {
    /// A status made by the guest itself (a stage's own failure), with a
    /// message the caller will see.
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status { code, op: "", message: message.into() }
    }

    pub(crate) fn from_host(code: i32, op: &'static str) -> Status {
        Status { code: Code::from_i32(code), op, message: crate::last_error().unwrap_or_default() }
    }

    /// The status code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The host function that failed (`"program_get"`), or `""` for a
    /// status the guest made.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// The host's reason (`last_error`), or the guest's message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.op.is_empty() {
            write!(f, "stagehost: {}: {}", self.op, self.code)?;
        } else {
            write!(f, "stagehost: {}", self.code)?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Status {}

/// The SDK's result type.
pub type Result<T> = core::result::Result<T, Status>;

/// Turns a wire status into a result.
pub(crate) fn check(code: i32, op: &'static str) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Status::from_host(code, op))
    }
}
