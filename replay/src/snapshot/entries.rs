//! One trace entry of a snapshot, read from its pickled dict with every field checked, and the
//! bound on the work the reader does (see `Work`).

use crate::pickle::Value;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Other,
}

/// One trace entry, with the fields this reader uses.
pub(super) struct Entry<'a> {
    pub(super) action: Action,
    pub(super) addr: Option<i128>,
    pub(super) size: u64,
    pub(super) stream: u64,
    pub(super) frames: Option<&'a Value>,
}

impl Entry<'_> {
    pub(super) fn is_release(&self) -> bool {
        matches!(self.action, Action::SegmentFree | Action::SegmentUnmap)
    }
}

/// A non-negative integer field (`None` or absent = 0, as `trace_summary`'s `or 0`).
pub(super) fn size_field(d: &Value, key: &str) -> Result<u64, String> {
    match d.get(key) {
        None | Some(Value::None) => Ok(0),
        Some(Value::Int(i)) if *i < 0 => Err(format!("\"{key}\" must not be negative, got {i}")),
        Some(v) => v.as_u64().ok_or_else(|| {
            format!(
                "\"{key}\" must be an integer below 2^64, not a {}",
                v.type_name()
            )
        }),
    }
}

/// An address field, if it is an integer.
pub(super) fn addr_field(d: &Value, key: &str) -> Option<i128> {
    d.get(key).and_then(Value::as_i128)
}

/// A stream field (a `cudaStream_t` as an integer, negative ones as their 64-bit pattern;
/// absent = 0, the default stream).
pub(super) fn stream_field(d: &Value) -> u64 {
    d.get("stream")
        .and_then(Value::as_i128)
        .map_or(0, |s| s as u64)
}

/// Bounds the reader's work by the input's size: a hostile pickle can refer to one list or dict
/// many times over (each reference costs two bytes), and walking it once per reference (say,
/// `device_traces` naming one long trace a million times) would take quadratic time. Each dict
/// the reader looks keys up in costs its length, each list it walks its length.
pub(super) struct Work {
    left: u64,
}

impl Work {
    pub(super) fn new(input_len: usize) -> Self {
        Work {
            left: (input_len as u64)
                .saturating_mul(16)
                .saturating_add(1 << 16),
        }
    }

    pub(super) fn spend(&mut self, v: &Value) -> Result<(), String> {
        let n = match v {
            Value::Dict(p) => p.len(),
            Value::List(x) | Value::Tuple(x) => x.len(),
            _ => 0,
        };
        self.left = self.left.checked_sub(n as u64 + 1).ok_or(
            "the snapshot refers to the same lists so often that reading it would take \
             far longer than its size warrants",
        )?;
        Ok(())
    }
}

pub(super) fn parse_entry<'a>(
    i: usize,
    e: &'a Value,
    work: &mut Work,
) -> Result<Entry<'a>, String> {
    work.spend(e)?;
    if !matches!(e, Value::Dict(_)) {
        // trace_summary counts these and moves on; so do we.
        return Ok(Entry {
            action: Action::Other,
            addr: None,
            size: 0,
            stream: 0,
            frames: None,
        });
    }
    let action = match e.get("action").and_then(Value::as_str) {
        Some("alloc") => Action::Alloc,
        Some("free_requested") => Action::FreeRequested,
        Some("free_completed") => Action::FreeCompleted,
        Some("segment_alloc") => Action::SegmentAlloc,
        Some("segment_free") => Action::SegmentFree,
        Some("segment_map") => Action::SegmentMap,
        Some("segment_unmap") => Action::SegmentUnmap,
        Some("oom") => Action::Oom,
        _ => Action::Other,
    };
    let size = if action == Action::Other {
        0
    } else {
        size_field(e, "size").map_err(|m| format!("entry {i}: {m}"))?
    };
    Ok(Entry {
        action,
        addr: addr_field(e, "addr"),
        size,
        stream: stream_field(e),
        frames: e
            .get("frames")
            .filter(|f| f.as_seq().is_some_and(|f| !f.is_empty())),
    })
}
