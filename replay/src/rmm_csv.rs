//! Reads the CSV log that RAPIDS RMM's `logging_resource_adaptor` writes.
//!
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 140573312345856,08:54:51:215806,allocate,0x7f8a40000000,1024,0x7f8a38001020
//! 140573312345856,08:54:51:215900,allocate failure,0x0,1099511627776,0x0
//! 140573312345856,08:54:51:216012,free,0x7f8a40000000,1024,0x7f8a38001020
//! ```
//!
//! * The column order comes from the header (the first non-blank line); names are matched without
//!   regard to case, extra columns are ignored. `Action`, `Pointer` and `Size` are required;
//!   `Stream` is optional (every allocation is on stream 0 without it). `Thread` and `Time` are
//!   not used: RMM writes the log in the order the events happened.
//! * Actions: `allocate`; `allocate failure` (the upstream resource threw: skipped, counted in
//!   [`RmmLog::allocate_failures`] and [`Trace::skipped`]); `free` (`deallocate` is accepted too).
//!   Any other action is refused, naming the line.
//! * `Pointer` is hexadecimal, with or without `0x` (`(nil)` is 0). `Size` is decimal, at most
//!   2^60. `Stream` is hexadecimal with `0x`, decimal without.
//! * An allocation of 0 bytes (RMM logs the request as made) is skipped with its free and counted
//!   in [`Trace::skipped`]: no allocator replayed here serves an empty request.
//! * A free names the pointer it frees. A free of a pointer that no live allocation holds is
//!   skipped and counted in [`Trace::skipped_frees`] (the allocation happened before logging began),
//!   and the trace then starts [`StartState::Warm`]; a second free of a pointer with no allocate
//!   there in between is refused (a double free: the log is corrupt). A free whose size differs
//!   from its allocation's frees the allocation (RMM's replay benchmark does the same), counted in
//!   [`RmmLog::free_size_mismatches`]. Two live allocations at one pointer (zero-byte ones may
//!   both be null) are freed last-allocated first.
//! * An empty file, or one with the header and no other line, is refused: it records nothing.
//! * Allocation ids are dense, in log order: the n-th allocation is id n - 1.
//!
//! Bad input is an error naming the line (`line 17: size "-5" is not a non-negative integer`),
//! never a panic.

use std::collections::HashMap;
use std::path::Path;

use crate::{shown, Event, StartState, Trace, TraceError};

/// The header `logging_resource_adaptor` writes, for error messages.
const EXPECTED_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// The largest size accepted: anything larger is not a real allocation.
pub const MAX_SIZE: u64 = 1 << 60;

/// An RMM log, read: the trace and what the reader dropped on the way.
#[derive(Clone, PartialEq, Debug)]
pub struct RmmLog {
    /// The trace.
    pub trace: Trace,
    /// `allocate failure` lines (ignored: the allocation never existed).
    pub allocate_failures: u64,
    /// Frees whose size differs from their allocation's (the allocation's was used).
    pub free_size_mismatches: u64,
}

/// Reads an RMM log from `text`; `name` names the trace and labels errors.
pub fn read_rmm_csv(text: &str, name: &str) -> Result<Trace, TraceError> {
    parse_rmm_csv(text, name).map(|log| log.trace)
}

/// Reads an RMM log file; the trace is named after the file's stem.
pub fn read_rmm_csv_file(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    let path = path.as_ref();
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| TraceError {
        file: file.clone(),
        message: format!("cannot read: {e}"),
    })?;
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("trace");
    parse_rmm_csv(&text, name)
        .map(|log| log.trace)
        .map_err(|e| TraceError {
            file,
            message: e.message,
        })
}

/// Reads an RMM log from `text` with the counts of what was dropped; `name` names the trace and
/// labels errors.
pub fn parse_rmm_csv(text: &str, name: &str) -> Result<RmmLog, TraceError> {
    let fail = |message: String| TraceError {
        file: name.to_string(),
        message,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
    let (header_line, header) = lines.by_ref().find(|(_, l)| !l.is_empty()).ok_or_else(|| {
        fail(format!(
            "the file is {}: expected an RMM log, starting with its CSV header \
                 ({EXPECTED_HEADER})",
            if text.is_empty() { "empty" } else { "blank" }
        ))
    })?;
    let cols =
        Columns::from_header(header).map_err(|m| fail(format!("line {header_line}: {m}")))?;

    let mut events = Vec::new();
    // Pointer -> live allocations there (id, size), last allocated on top; zero-byte ones,
    // skipped, have no id.
    let mut live: HashMap<u64, Vec<(Option<u64>, u64)>> = HashMap::new();
    // Pointers freed and not allocated since, with the line that freed them (double frees).
    let mut freed_at: HashMap<u64, usize> = HashMap::new();
    let mut zero_byte = 0u64;
    let mut lines_read = 0u64;
    let mut next_id: u64 = 0;
    let mut skipped_frees = 0;
    let mut allocate_failures = 0;
    let mut free_size_mismatches = 0;
    for (line, text) in lines {
        if text.is_empty() {
            continue;
        }
        let at = |m: String| fail(format!("line {line}: {m}"));
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.len() < cols.needed {
            return Err(at(format!(
                "expected at least {} fields, found {}",
                cols.needed,
                fields.len()
            )));
        }
        let field = |i: usize| fields.get(i).copied().unwrap_or("");
        let action = field(cols.action);
        lines_read += 1;
        match action {
            "allocate" => {
                let ptr = parse_pointer(field(cols.pointer)).map_err(at)?;
                let size = parse_size(field(cols.size)).map_err(at)?;
                let stream = match cols.stream {
                    Some(i) => parse_stream(field(i)).map_err(at)?,
                    None => 0,
                };
                freed_at.remove(&ptr);
                // RMM passes an empty request to its resource and logs it; no allocator replayed
                // here serves one (nor needs memory for it).
                if size == 0 {
                    zero_byte += 1;
                    live.entry(ptr).or_default().push((None, 0));
                    continue;
                }
                let id = next_id;
                next_id += 1;
                live.entry(ptr).or_default().push((Some(id), size));
                events.push(Event::Alloc { id, size, stream });
            }
            "allocate failure" => allocate_failures += 1,
            "free" | "deallocate" => {
                let ptr = parse_pointer(field(cols.pointer)).map_err(at)?;
                let size = parse_size(field(cols.size)).map_err(at)?;
                if let Some(s) = cols.stream {
                    parse_stream(field(s)).map_err(at)?;
                }
                let popped = live.get_mut(&ptr).and_then(Vec::pop);
                match popped {
                    Some((id, alloc_size)) => {
                        if alloc_size != size {
                            free_size_mismatches += 1;
                        }
                        if let Some(id) = id {
                            events.push(Event::Free { id });
                        }
                    }
                    None => {
                        if let Some(earlier) = freed_at.get(&ptr) {
                            return Err(at(format!(
                                "free of pointer {ptr:#x}, which line {earlier} already freed \
                                 with no allocate there in between (a double free)"
                            )));
                        }
                        skipped_frees += 1;
                    }
                }
                if live.get(&ptr).is_none_or(Vec::is_empty) {
                    freed_at.insert(ptr, line);
                }
            }
            other => {
                return Err(at(format!(
                    "unknown action {} (expected allocate, allocate failure, free or deallocate)",
                    shown(other)
                )))
            }
        }
    }
    if lines_read == 0 {
        return Err(fail(format!(
            "line {header_line}: the header is the only line: an RMM log with no allocate or free \
             to replay"
        )));
    }
    let mut skipped = std::collections::BTreeMap::new();
    if allocate_failures > 0 {
        skipped.insert("allocate failure lines".to_string(), allocate_failures);
    }
    if zero_byte > 0 {
        skipped.insert("zero-byte allocations".to_string(), zero_byte);
    }
    let start = if skipped_frees == 0 {
        StartState::Empty
    } else {
        StartState::Warm
    };
    Ok(RmmLog {
        trace: Trace {
            name: name.to_string(),
            initial: Vec::new(),
            events,
            start,
            skipped_frees,
            recorded: None,
            alloc_conf: None,
            skipped,
        },
        allocate_failures,
        free_size_mismatches,
    })
}

/// Where the columns the reader needs are.
struct Columns {
    action: usize,
    pointer: usize,
    size: usize,
    stream: Option<usize>,
    /// Fields a line needs to hold every column above.
    needed: usize,
}

impl Columns {
    fn from_header(header: &str) -> Result<Columns, String> {
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        let find = |want: &str| names.iter().position(|n| n.eq_ignore_ascii_case(want));
        let need = |want: &str| {
            find(want).ok_or_else(|| format!("header {} has no {want:?} column", shown(header)))
        };
        let action = need("Action")?;
        let pointer = need("Pointer")?;
        let size = need("Size")?;
        let stream = find("Stream");
        let needed = 1 + action.max(pointer).max(size).max(stream.unwrap_or(0));
        Ok(Columns {
            action,
            pointer,
            size,
            stream,
            needed,
        })
    }
}

fn parse_pointer(s: &str) -> Result<u64, String> {
    if s == "(nil)" {
        return Ok(0);
    }
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    parse_digits(digits, 16)
        .ok_or_else(|| format!("pointer {} is not a hexadecimal address", shown(s)))
}

fn parse_size(s: &str) -> Result<u64, String> {
    let size = parse_digits(s, 10)
        .ok_or_else(|| format!("size {} is not a non-negative integer", shown(s)));
    match size {
        Ok(n) if n > MAX_SIZE => Err(format!("size {} is larger than 2^60", shown(s))),
        Err(_) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            Err(format!("size {} is larger than 2^60", shown(s)))
        }
        other => other,
    }
}

fn parse_stream(s: &str) -> Result<u64, String> {
    if s == "(nil)" {
        return Ok(0);
    }
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => parse_digits(hex, 16),
        None => parse_digits(s, 10),
    };
    v.ok_or_else(|| {
        format!(
            "stream {} is not a number (hexadecimal with 0x, or decimal)",
            shown(s)
        )
    })
}

/// Digits only (no sign, no spaces), fitting in a u64.
fn parse_digits(s: &str, radix: u32) -> Option<u64> {
    if s.is_empty() || !s.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(s, radix).ok()
}
