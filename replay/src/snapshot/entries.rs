//! One trace entry of a snapshot, read from its pickled dict with every field checked, and the
//! bound on the work the reader does (see `Work`).

use crate::pickle::Value;
use crate::shown;

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
    /// An action the replay does not need, skipped on purpose and counted under this name
    /// (Note [Skipped actions]).
    Skipped(&'static str),
}

// Note [Skipped actions]
//
// PyTorch's `TraceEntry::Action` has ten actions (pytorch-allocator.md §4.2 lists nine and
// `annotate`; PyTorch's enum names the tenth `USER_DEFINED`, written `user_defined`). Eight are
// read: `alloc`, `free_requested`, `free_completed`, `segment_alloc`, `segment_free`,
// `segment_map`, `segment_unmap` and `oom`. The others carry no allocation and are skipped on
// purpose, each counted in `Trace::skipped` so the summary says how many: `snapshot` (a
// `_snapshot()` call; its size is the active bytes at that moment, which the replay rebuilds
// itself) and the user annotations `user_defined` / `annotate` (markers in the timeline). Any
// other action, an entry that is not a dict, or one without an `action` string is refused,
// naming the entry: a trace whose entries the reader does not understand would replay as
// something else.

/// The actions this reader replays.
const READ_ACTIONS: &str = "alloc, free_requested, free_completed, segment_alloc, \
    segment_free, segment_map, segment_unmap, oom";

/// The actions skipped on purpose, and the name their count goes under.
const SKIPPED_ACTIONS: [(&str, &str); 3] = [
    ("snapshot", "snapshot entries"),
    ("user_defined", "user_defined entries"),
    ("annotate", "annotate entries"),
];

/// One trace entry, with the fields this reader uses.
pub(super) struct Entry<'a> {
    pub(super) action: Action,
    pub(super) addr: Option<i128>,
    pub(super) size: u64,
    pub(super) stream: u64,
    pub(super) frames: Option<&'a Value>,
}

impl Action {
    /// The action as PyTorch writes it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Skipped(kind) => kind,
        }
    }
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
        return Err(format!(
            "entry {i} is a {}, expected a dict with an \"action\"",
            e.type_name()
        ));
    }
    let action = match e.get("action") {
        None => return Err(format!("entry {i} has no \"action\"")),
        Some(Value::Str(a)) => match &**a {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            other => match SKIPPED_ACTIONS.iter().find(|(a, _)| *a == other) {
                Some(&(_, kind)) => Action::Skipped(kind),
                None => {
                    let known: Vec<&str> = SKIPPED_ACTIONS.iter().map(|(a, _)| *a).collect();
                    return Err(format!(
                        "entry {i}: unknown action {} (PyTorch writes {READ_ACTIONS}, which are \
                         replayed, and {}, which are skipped)",
                        shown(other),
                        known.join(", ")
                    ));
                }
            },
        },
        Some(v) => {
            return Err(format!(
                "entry {i}: \"action\" is a {}, expected a string",
                v.type_name()
            ))
        }
    };
    let size = if let Action::Skipped(_) = action {
        0
    } else {
        size_field(e, "size").map_err(|m| format!("entry {i}: {m}"))?
    };
    let addr = addr_field(e, "addr");
    let needs_addr = !matches!(action, Action::Oom | Action::Skipped(_));
    if needs_addr && addr.is_none() {
        return Err(format!(
            "entry {i}: {} without an integer \"addr\"",
            action.name()
        ));
    }
    // PyTorch's allocator never records an empty request (`malloc` returns null for 0 bytes
    // before it reaches the trace), and no allocator replays one.
    if size == 0 && matches!(action, Action::Alloc | Action::Oom) {
        return Err(format!(
            "entry {i}: {} of 0 bytes (PyTorch records only requests of at least 1 byte)",
            action.name()
        ));
    }
    Ok(Entry {
        action,
        addr,
        size,
        stream: stream_field(e),
        frames: e
            .get("frames")
            .filter(|f| f.as_seq().is_some_and(|f| !f.is_empty())),
    })
}
