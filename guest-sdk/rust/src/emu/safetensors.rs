//! A strict reader of a safetensors file's header, written again from the
//! Go SDK's `guest-sdk/internal/safetensors` (keep the two in step): an
//! 8-byte little-endian header length N, N bytes of JSON, then the data
//! section that the tensors' `data_offsets` index. It refuses what the Go
//! reader refuses (a short file, a header length above [`MAX_HEADER`] or
//! beyond the file, JSON that is not one object, an entry that is not
//! exactly `dtype`, `shape` and `data_offsets`, an unknown dtype, a rank
//! above [`MAX_RANK`], a shape whose size overflows or differs from its
//! range, offsets reversed, beyond the data section or overlapping, a
//! name given twice, a `__metadata__` that is not an object of strings),
//! and also a key given twice inside a tensor's object.

use std::string::{String, ToString};
use std::vec::Vec;

/// The largest JSON header the reader accepts, in bytes.
pub const MAX_HEADER: u64 = 100 << 20;
/// The most dimensions a tensor may have.
pub const MAX_RANK: usize = 8;

/// One tensor of a header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// The dtype code (ABI.md §3, tensor_get).
    pub code: u32,
    /// The dims.
    pub shape: Vec<u64>,
    /// The byte range in the data section.
    pub begin: u64,
    /// The end of the range.
    pub end: u64,
}

/// A parsed and checked header.
#[derive(Clone, Debug)]
pub struct Header {
    /// Where the data section starts in the file.
    pub data_offset: usize,
    /// The tensors, in the order of their data offsets.
    pub tensors: Vec<TensorInfo>,
}

/// The dtype code and element size of a safetensors dtype name.
pub fn dtype(name: &str) -> Option<(u32, u64)> {
    Some(match name {
        "F32" => (0, 4),
        "F16" => (1, 2),
        "BF16" => (2, 2),
        "I32" => (3, 4),
        "F64" => (16, 8),
        "I64" => (17, 8),
        "I16" => (18, 2),
        "I8" => (19, 1),
        "U8" => (20, 1),
        "BOOL" => (21, 1),
        "U16" => (22, 2),
        "U32" => (23, 4),
        "U64" => (24, 8),
        "F8_E4M3" => (25, 1),
        "F8_E5M2" => (26, 1),
        _ => return None,
    })
}

fn err(msg: String) -> String {
    std::format!("safetensors: {}", msg)
}

fn quote(s: &str) -> String {
    if s.len() > 64 {
        let mut i = 64;
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        std::format!("{:?}...", &s[..i])
    } else {
        std::format!("{:?}", s)
    }
}

/// Reads and checks the header of the safetensors file `file`.
///
/// # Errors
///
/// A message (starting "safetensors: ") saying what is wrong; see the
/// module doc.
pub fn read_header(file: &[u8]) -> Result<Header, String> {
    if file.len() < 8 {
        return Err(err(std::format!(
            "a file of {} bytes is too short for a safetensors header (8 bytes of length first)",
            file.len()
        )));
    }
    let mut lb = [0u8; 8];
    lb.copy_from_slice(&file[..8]);
    let n = u64::from_le_bytes(lb);
    if n > MAX_HEADER {
        return Err(err(std::format!("header length {} is above the limit of {} bytes", n, MAX_HEADER)));
    }
    if n > (file.len() - 8) as u64 {
        return Err(err(std::format!("header length {} is beyond the file's {} bytes", n, file.len())));
    }
    let js = &file[8..8 + n as usize];
    let data_size = (file.len() - 8 - n as usize) as u64;
    let mut p = Parser { s: js, i: 0 };
    let mut tensors = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    p.ws();
    if !p.eat(b'{') {
        return Err(err("the header is not a JSON object".to_string()));
    }
    p.ws();
    if !p.eat(b'}') {
        loop {
            p.ws();
            let name = p.string().map_err(err)?;
            if seen.contains(&name) {
                return Err(err(std::format!("{} is given twice", quote(&name))));
            }
            seen.push(name.clone());
            p.ws();
            p.expect(b':').map_err(err)?;
            p.ws();
            if name == "__metadata__" {
                p.metadata().map_err(|e| err(std::format!("__metadata__ must be an object of strings: {}", e)))?;
            } else {
                tensors.push(p.tensor(&name, data_size)?);
            }
            p.ws();
            if p.eat(b',') {
                continue;
            }
            p.expect(b'}').map_err(|e| err(std::format!("bad JSON: {}", e)))?;
            break;
        }
    }
    p.ws();
    if p.i != js.len() {
        return Err(err("bad JSON: data after the header's object".to_string()));
    }
    tensors.sort_by(|a: &TensorInfo, b: &TensorInfo| (a.begin, a.end).cmp(&(b.begin, b.end)));
    let mut last: Option<usize> = None;
    for i in 0..tensors.len() {
        let t = &tensors[i];
        if t.end == t.begin {
            continue;
        }
        if let Some(l) = last {
            let prev = &tensors[l];
            if t.begin < prev.end {
                return Err(err(std::format!(
                    "tensor {} [{},{}) overlaps tensor {} [{},{})",
                    quote(&t.name),
                    t.begin,
                    t.end,
                    quote(&prev.name),
                    prev.begin,
                    prev.end
                )));
            }
        }
        if last.map_or(true, |l| t.end > tensors[l].end) {
            last = Some(i);
        }
    }
    Ok(Header { data_offset: 8 + n as usize, tensors })
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        if self.i < self.s.len() && self.s[self.i] == c {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(std::format!("bad JSON: want {:?} at byte {}", c as char, self.i))
        }
    }
    fn hex4(&mut self) -> Result<u32, String> {
        if self.i + 4 > self.s.len() {
            return Err("bad JSON: a short \\u escape".to_string());
        }
        let h = std::str::from_utf8(&self.s[self.i..self.i + 4]).map_err(|_| "bad JSON: a bad \\u escape".to_string())?;
        let v = u32::from_str_radix(h, 16).map_err(|_| "bad JSON: a bad \\u escape".to_string())?;
        self.i += 4;
        Ok(v)
    }
    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            if self.i >= self.s.len() {
                return Err("bad JSON: an unterminated string".to_string());
            }
            let c = self.s[self.i];
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    if self.i >= self.s.len() {
                        return Err("bad JSON: an unterminated string".to_string());
                    }
                    let e = self.s[self.i];
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let mut v = self.hex4()?;
                            if (0xD800..0xDC00).contains(&v) && self.s[self.i..].starts_with(b"\\u") {
                                let save = self.i;
                                self.i += 2;
                                let lo = self.hex4()?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                                } else {
                                    self.i = save;
                                }
                            }
                            char::from_u32(v).unwrap_or('\u{FFFD}')
                        }
                        _ => return Err("bad JSON: a bad escape".to_string()),
                    };
                    let mut b = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                }
                c if c < 0x20 => return Err("bad JSON: a control character in a string".to_string()),
                c => out.push(c),
            }
        }
        // Go's decoder replaces invalid UTF-8 with U+FFFD.
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
    fn uint(&mut self) -> Result<u64, String> {
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
            self.i += 1;
        }
        let digits = &self.s[start..self.i];
        if digits.is_empty() || (digits.len() > 1 && digits[0] == b'0') {
            return Err(std::format!("want a non-negative integer at byte {}", start));
        }
        if self.i < self.s.len() && matches!(self.s[self.i], b'.' | b'e' | b'E') {
            return Err(std::format!("want a non-negative integer at byte {}", start));
        }
        std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse::<u64>().ok())
            .ok_or_else(|| std::format!("the number at byte {} overflows 64 bits", start))
    }
    fn uints(&mut self) -> Result<Vec<u64>, String> {
        self.expect(b'[')?;
        let mut v = Vec::new();
        self.ws();
        if self.eat(b']') {
            return Ok(v);
        }
        loop {
            self.ws();
            v.push(self.uint()?);
            self.ws();
            if self.eat(b',') {
                continue;
            }
            self.expect(b']')?;
            return Ok(v);
        }
    }
    fn metadata(&mut self) -> Result<(), String> {
        if self.s[self.i..].starts_with(b"null") {
            self.i += 4;
            return Ok(());
        }
        self.expect(b'{')?;
        self.ws();
        if self.eat(b'}') {
            return Ok(());
        }
        loop {
            self.ws();
            self.string()?;
            self.ws();
            self.expect(b':')?;
            self.ws();
            self.string()?;
            self.ws();
            if self.eat(b',') {
                continue;
            }
            return self.expect(b'}');
        }
    }
    fn tensor(&mut self, name: &str, data_size: u64) -> Result<TensorInfo, String> {
        let q = quote(name);
        let bad = |e: String| err(std::format!("tensor {}: want an object of dtype, shape and data_offsets: {}", q, e));
        self.expect(b'{').map_err(bad)?;
        let (mut dt, mut shape, mut offs): (Option<String>, Option<Vec<u64>>, Option<Vec<u64>>) = (None, None, None);
        self.ws();
        if !self.eat(b'}') {
            loop {
                self.ws();
                let key = self.string().map_err(bad)?;
                self.ws();
                self.expect(b':').map_err(bad)?;
                self.ws();
                let dup = match key.as_str() {
                    "dtype" => dt.replace(self.string().map_err(bad)?).is_some(),
                    "shape" => shape.replace(self.uints().map_err(bad)?).is_some(),
                    "data_offsets" => offs.replace(self.uints().map_err(bad)?).is_some(),
                    _ => return Err(bad(std::format!("unknown field {:?}", key))),
                };
                if dup {
                    return Err(bad(std::format!("{:?} given twice", key)));
                }
                self.ws();
                if self.eat(b',') {
                    continue;
                }
                self.expect(b'}').map_err(bad)?;
                break;
            }
        }
        let (dt, shape, offs) = match (dt, shape, offs) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => return Err(err(std::format!("tensor {}: want dtype, shape and data_offsets", q))),
        };
        if name.is_empty() {
            return Err(err(std::format!("tensor name {}: want a non-empty UTF-8 name", q)));
        }
        let (code, size) = dtype(&dt).ok_or_else(|| err(std::format!("tensor {}: unknown dtype {}", q, quote(&dt))))?;
        if shape.len() > MAX_RANK {
            return Err(err(std::format!("tensor {}: rank {} is above {}", q, shape.len(), MAX_RANK)));
        }
        let mut n = size;
        for &d in &shape {
            n = n.checked_mul(d).ok_or_else(|| err(std::format!("tensor {}: the shape {:?} of {} overflows", q, shape, dt)))?;
        }
        if offs.len() != 2 {
            return Err(err(std::format!("tensor {}: data_offsets must be [begin, end], got {} values", q, offs.len())));
        }
        let (begin, end) = (offs[0], offs[1]);
        if begin > end {
            return Err(err(std::format!("tensor {}: data_offsets [{}, {}] are reversed", q, begin, end)));
        }
        if end > data_size {
            return Err(err(std::format!(
                "tensor {}: data_offsets [{}, {}] end beyond the data section's {} bytes",
                q, begin, end, data_size
            )));
        }
        if end - begin != n {
            return Err(err(std::format!(
                "tensor {}: the shape {:?} of {} needs {} bytes, data_offsets [{}, {}] hold {}",
                q,
                shape,
                dt,
                n,
                begin,
                end,
                end - begin
            )));
        }
        Ok(TensorInfo { name: name.to_string(), code, shape, begin, end })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(js: &str, data: usize) -> Vec<u8> {
        let mut f = (js.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(js.as_bytes());
        f.extend(std::iter::repeat(0u8).take(data));
        f
    }

    #[test]
    fn accepts_a_good_header() {
        let h = read_header(&file(
            r#"{"__metadata__":{"k":"v"},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"a":{"dtype":"U8","shape":[2,4],"data_offsets":[0,8]}}"#,
            16,
        ))
        .unwrap();
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.tensors[0].name, "a");
        assert_eq!(h.tensors[0].code, 20);
        assert_eq!(h.tensors[1].shape, [2]);
    }

    #[test]
    fn refuses_hostile_headers() {
        let cases: &[(Vec<u8>, &str)] = &[
            (std::vec![1, 2, 3], "too short"),
            ((MAX_HEADER + 1).to_le_bytes().to_vec(), "above the limit"),
            (100u64.to_le_bytes().to_vec(), "beyond the file"),
            (file("[]", 0), "not a JSON object"),
            (file(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#, 2), "end beyond the data section"),
            (file(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#, 8), "needs 8 bytes"),
            (file(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#, 8), "reversed"),
            (file(r#"{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#, 8), "unknown dtype"),
            (file(r#"{"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}"#, 8), "rank 9"),
            (file(r#"{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,1]}}"#, 8), "overflows"),
            (
                file(
                    r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                    8,
                ),
                "overlaps",
            ),
            (
                file(r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#, 8),
                "given twice",
            ),
            (file(r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}"#, 8), "unknown field"),
            (file(r#"{"a":{"dtype":"U8","shape":[1]}}"#, 8), "want dtype, shape and data_offsets"),
            (file(r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#, 8), "non-negative"),
            (file(r#"{"__metadata__":{"k":1}}"#, 8), "object of strings"),
            (file(r#"{} x"#, 8), "data after"),
        ];
        for (f, want) in cases {
            match read_header(f) {
                Ok(_) => panic!("accepted a header that wants {:?}", want),
                Err(e) => assert!(e.contains(want), "error {:?} does not say {:?}", e, want),
            }
        }
    }
}
