//! PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot` pickles) as [`Trace`]s, one
//! per device that recorded trace entries.
//!
//! The figures follow `shared/traces/README.md` ("What the figures mean") and its reference reader
//! `trace_summary.py`, which the test suite compares against file by file:
//!
//! * every `alloc` entry is an [`Event::Alloc`] with a fresh id; a `free_completed` of that address
//!   is its [`Event::Free`] (`free_requested` only marks a free as pending, as in `trace_summary`);
//! * blocks live when recording began become [`InitialBlock`]s: the dump-time `segments` list gives
//!   the blocks live at the end, and undoing the trace backwards (an `alloc` removes its address,
//!   a `free_completed` adds it back with the size it records), as memory_viz does, gives those
//!   live at the start; a `free_completed` of an address that is neither live in the trace nor
//!   such a block is skipped and counted in [`Trace::skipped_frees`];
//! * an allocation at an address that is still live leaves the older block live for good, as
//!   `trace_summary`'s peak-live figure does (no real snapshot has one);
//! * [`Recorded::peak_reserved_bytes`] is PyTorch's reserved memory rebuilt from segment events,
//!   anchored at the dump (reserved at start = reserved at dump − net change in the trace) and
//!   taken from the first `alloc` on (`trace_summary`'s `peak_reserved`); without a dump-time
//!   segments list the anchor is 0;
//! * the start state uses `trace_summary`'s rules: *empty* when nothing was live or reserved and
//!   no segment release names a segment reserved before recording; *near-empty* when no such
//!   release happened, reserved-at-start is at most 2 % of peak reserved and live-at-start at most
//!   2 % of peak live; *warm* otherwise.
//!
//! # Note [Release runs]
//!
//! A run of consecutive `segment_free` / `segment_unmap` entries comes either from the program's
//! `empty_cache()` or from `malloc`'s silent release-and-retry after a failed `cudaMalloc`
//! (pytorch-allocator.md §1.9: the run is followed by the `segment_alloc` and the `alloc` of the
//! same call, all with that call's stack frames; if the retry fails too, an `oom` entry follows
//! the run instead). The heuristic, in order:
//!
//! 1. the entry after the run is `oom`: a failed retry, no event;
//! 2. the run is followed by `segment_alloc`/`segment_map` and then `alloc`: when the run's last
//!    entry and that `alloc` both carry frames, equal frames mean a retry and different frames an
//!    `empty_cache()`; when either has no frames, the run counts as a retry if the `alloc` lies in
//!    the segment just reserved (a call that needed new memory), else as `empty_cache()`;
//! 3. anything else: `empty_cache()`, emitted as [`Event::EmptyCache`] where the run starts.
//!
//! Without frames an explicit `empty_cache()` directly followed by an allocation that needs a new
//! segment is taken for a retry; a replayed allocator that needs the memory releases its own
//! cache then. [`ReleaseRuns`] counts each kind.
//!
//! # Untrusted input
//!
//! The pickle is read by [`pickle::parse`], which builds plain values only. Malformed fields are
//! errors, never panics; sizes must add up to less than 2^64; and the work done on the values is
//! bounded by the file's size (see `Work`), since a hostile pickle can name one long list from
//! many places at two bytes a reference.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::pickle::{self, Value};
use super::{Event, InitialBlock, Recorded, StartState, Trace, TraceError};
use vmm_alloc::config::{parse_alloc_conf, round_size, ROUNDUP_INTERVALS};
use crate::start_segments::{start_segments, DumpSegment, StartSegment};

/// More devices than any machine has: segments naming more are a corrupt file, and refusing them
/// keeps the per-device work bounded.
const MAX_STATE_ONLY_DEVICES: usize = 1024;

/// One device's trace, with what the reader learned on the way.
#[derive(Clone, PartialEq, Debug)]
pub struct DeviceTrace {
    /// The device index (its position in `device_traces`).
    pub device: u64,
    /// The trace.
    pub trace: Trace,
    /// How the runs of segment releases were classified (Note [Release runs]).
    pub release_runs: ReleaseRuns,
    /// The traced allocator's `segment_alloc` entries, in order: what a faithful replay of the
    /// classic allocator must reproduce.
    pub segment_allocs: Vec<SegmentAllocAt>,
    /// The traced allocator's segments when recording began, with the blocks live in them.
    pub start_segments: Vec<StartSegment>,
    /// Where the traced allocator released its cache to retry a failed `cudaMalloc` (runs of
    /// [`ReleaseRuns::alloc_retry`]): the number of `alloc` entries before each run.
    pub retry_runs: Vec<u64>,
}

/// One recorded `segment_alloc` (a `cudaMalloc` of the traced program's allocator).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SegmentAllocAt {
    /// `alloc` entries before it in the trace: the allocation it was made for is that ordinal.
    pub allocs_before: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// Runs of consecutive `segment_free`/`segment_unmap` entries, by kind (Note [Release runs]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ReleaseRuns {
    /// Runs taken for an explicit `empty_cache()` (each is one [`Event::EmptyCache`]).
    pub empty_cache: u64,
    /// Runs taken for `malloc`'s release-and-retry that succeeded.
    pub alloc_retry: u64,
    /// Runs followed by an `oom` entry (the retry failed).
    pub before_oom: u64,
}

/// Reads a snapshot from its bytes: one [`Trace`] per device with trace entries or segments,
/// named `name` (the file stem), plus `#<device>` when there are several. A device with segments
/// and no entries (a state-only snapshot) gives a trace of its blocks live at the dump and no
/// events.
pub fn read_snapshot(bytes: &[u8], name: &str) -> Result<Vec<Trace>, TraceError> {
    Ok(analyse_snapshot(bytes, name)?
        .into_iter()
        .map(|d| d.trace)
        .collect())
}

/// Reads a snapshot file (see [`read_snapshot`]); traces are named after the file stem.
pub fn read_snapshot_file(path: &Path) -> Result<Vec<Trace>, TraceError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| TraceError {
        file: file.clone(),
        message: e.to_string(),
    })?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.clone());
    read_snapshot(&bytes, &stem).map_err(|e| TraceError {
        file,
        message: e.message,
    })
}

/// Like [`read_snapshot`], with each device's index and release-run counts.
pub fn analyse_snapshot(bytes: &[u8], name: &str) -> Result<Vec<DeviceTrace>, TraceError> {
    let fail = |message: String| TraceError {
        file: name.to_string(),
        message,
    };
    let root = pickle::parse(bytes).map_err(|e| fail(e.to_string()))?;
    let (segments, traces, settings) = match &root {
        // torch 1.13's memory_snapshot(): a bare list of segments, no trace.
        Value::List(_) => (Some(&root), None, None),
        Value::Dict(_) if root.get("segments").is_some() || root.get("device_traces").is_some() => (
            root.get("segments"),
            root.get("device_traces"),
            root.get("allocator_settings"),
        ),
        other => {
            return Err(fail(format!(
                "not a PyTorch memory snapshot (top level is a {} without \"segments\" or \"device_traces\")",
                other.type_name()
            )))
        }
    };
    let seq = |v: Option<&Value>, what: &str| -> Result<Vec<Value>, TraceError> {
        match v {
            None | Some(Value::None) => Ok(Vec::new()),
            Some(v) => v
                .as_seq()
                .map(<[Value]>::to_vec)
                .ok_or_else(|| fail(format!("\"{what}\" is a {}, not a list", v.type_name()))),
        }
    };
    let segments = seq(segments, "segments")?;
    let traces = seq(traces, "device_traces")?;
    let conf = alloc_conf(settings);
    let mut per_device = Vec::new();
    for (dev, entries) in traces.iter().enumerate() {
        let entries = entries.as_seq().ok_or_else(|| {
            fail(format!(
                "device_traces[{dev}] is a {}, not a list",
                entries.type_name()
            ))
        })?;
        if !entries.is_empty() {
            per_device.push((dev as u64, entries));
        }
    }
    // A device with segments but no trace entries (a state-only snapshot, recorded with history
    // off) still replays: its blocks live at the dump are allocated, and nothing else happens.
    let mut state_only: Vec<u64> = segments
        .iter()
        .map(|s| s.get("device").and_then(Value::as_u64).unwrap_or(0))
        .filter(|d| per_device.iter().all(|(dev, _)| dev != d))
        .collect();
    state_only.sort_unstable();
    state_only.dedup();
    if state_only.len() > MAX_STATE_ONLY_DEVICES {
        return Err(fail(format!(
            "segments name {} devices; no machine has more than {MAX_STATE_ONLY_DEVICES}",
            state_only.len()
        )));
    }
    per_device.extend(state_only.into_iter().map(|dev| (dev, &[][..])));
    per_device.sort_unstable_by_key(|(dev, _)| *dev);
    let several = per_device.len() > 1;
    let mut work = Work::new(bytes.len());
    per_device
        .into_iter()
        .map(|(dev, entries)| {
            let trace_name = if several {
                format!("{name}#{dev}")
            } else {
                name.to_string()
            };
            device_trace(dev, entries, &segments, trace_name, conf.clone(), &mut work)
                .map_err(|m| fail(format!("device {dev}: {m}")))
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Action {
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
struct Entry<'a> {
    action: Action,
    addr: Option<i128>,
    size: u64,
    stream: u64,
    frames: Option<&'a Value>,
}

impl Entry<'_> {
    fn is_release(&self) -> bool {
        matches!(self.action, Action::SegmentFree | Action::SegmentUnmap)
    }
}

/// A non-negative integer field (`None` or absent = 0, as `trace_summary`'s `or 0`).
fn size_field(d: &Value, key: &str) -> Result<u64, String> {
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
fn addr_field(d: &Value, key: &str) -> Option<i128> {
    d.get(key).and_then(Value::as_i128)
}

/// A stream field (a `cudaStream_t` as an integer, negative ones as their 64-bit pattern;
/// absent = 0, the default stream).
fn stream_field(d: &Value) -> u64 {
    d.get("stream")
        .and_then(Value::as_i128)
        .map_or(0, |s| s as u64)
}

/// Bounds the reader's work by the input's size: a hostile pickle can refer to one list or dict
/// many times over (each reference costs two bytes), and walking it once per reference (say,
/// `device_traces` naming one long trace a million times) would take quadratic time. Each dict
/// the reader looks keys up in costs its length, each list it walks its length.
struct Work {
    left: u64,
}

impl Work {
    fn new(input_len: usize) -> Self {
        Work {
            left: (input_len as u64)
                .saturating_mul(16)
                .saturating_add(1 << 16),
        }
    }

    fn spend(&mut self, v: &Value) -> Result<(), String> {
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

fn parse_entry<'a>(i: usize, e: &'a Value, work: &mut Work) -> Result<Entry<'a>, String> {
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

/// Disjoint half-open ranges of 2 MiB granules (expandable-segment mappings), merged on insert.
#[derive(Default)]
struct RangeSet(BTreeMap<i128, i128>);

impl RangeSet {
    fn covers(&self, lo: i128, hi: i128) -> bool {
        lo >= hi
            || self
                .0
                .range(..=lo)
                .next_back()
                .is_some_and(|(_, &end)| end >= hi)
    }

    fn insert(&mut self, mut lo: i128, mut hi: i128) {
        if lo >= hi {
            return;
        }
        if let Some((&s, &e)) = self.0.range(..=lo).next_back() {
            if e >= lo {
                lo = s;
                hi = hi.max(e);
            }
        }
        let overlapping: Vec<(i128, i128)> = self.0.range(lo..=hi).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in overlapping {
            self.0.remove(&s);
            hi = hi.max(e);
        }
        self.0.insert(lo, hi);
    }

    fn remove(&mut self, lo: i128, hi: i128) {
        let hit: Vec<(i128, i128)> = self
            .0
            .range(..hi)
            .rev()
            .take_while(|&(_, &e)| e > lo)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in hit {
            self.0.remove(&s);
            if s < lo {
                self.0.insert(s, lo);
            }
            if e > hi {
                self.0.insert(hi, e);
            }
        }
    }
}

/// The granules `[addr, addr + size)` touches (2 MiB, the smallest expandable page).
fn granules(addr: i128, size: u64) -> (i128, i128) {
    let g = 1i128 << 21;
    let end = addr.saturating_add(i128::from(size)).saturating_add(g - 1);
    (addr >> 21, end >> 21)
}

/// Blocks live at dump time on `dev`, by address: (requested size, stream). Also returns the
/// reserved bytes at dump and whether the device has any segment.
type DumpState = (HashMap<Option<i128>, (u64, u64)>, i128, bool);

fn dump_state(dev: u64, segments: &[Value], work: &mut Work) -> Result<DumpState, String> {
    let mut blocks = HashMap::new();
    let mut reserved: i128 = 0;
    let mut any = false;
    for (si, s) in segments.iter().enumerate() {
        work.spend(s)?;
        if !matches!(s, Value::Dict(_)) {
            continue;
        }
        // A segment without "device" belongs to every device, as in trace_summary.
        if s.get("device")
            .and_then(Value::as_i128)
            .unwrap_or(i128::from(dev))
            != i128::from(dev)
        {
            continue;
        }
        any = true;
        let total = size_field(s, "total_size").map_err(|m| format!("segment {si}: {m}"))?;
        reserved += i128::from(total);
        let stream = stream_field(s);
        let seg_addr = addr_field(s, "address");
        let mut offset: i128 = 0;
        let list = s.get("blocks").filter(|b| b.as_seq().is_some());
        if let Some(list) = list {
            work.spend(list)?;
        }
        for b in list.and_then(Value::as_seq).unwrap_or(&[]) {
            work.spend(b)?;
            if !matches!(b, Value::Dict(_)) {
                continue;
            }
            let bsize = size_field(b, "size").map_err(|m| format!("segment {si}: {m}"))?;
            // Blocks sit back to back from the segment's start when no address is recorded.
            let at =
                addr_field(b, "address").or_else(|| seg_addr.map(|a| a.saturating_add(offset)));
            offset = offset.saturating_add(i128::from(bsize));
            let state = b.get("state").and_then(Value::as_str).unwrap_or("");
            if matches!(
                state,
                "active_allocated" | "active_pending_free" | "active_awaiting_free"
            ) {
                let requested = if b.get("requested_size").is_some() {
                    size_field(b, "requested_size")
                } else {
                    Ok(bsize)
                };
                let requested = requested.map_err(|m| format!("segment {si}: {m}"))?;
                blocks.insert(at, (requested, stream));
            }
        }
    }
    Ok((blocks, reserved, any))
}

/// The device's segments at the dump, with the sizes of their live blocks. Only what the
/// state-reading pass (`dump_state`) already validated is read here, so nothing fails.
fn dump_segments(dev: u64, segments: &[Value]) -> Vec<DumpSegment> {
    let mut out = Vec::new();
    for s in segments {
        let on_dev = s
            .get("device")
            .and_then(Value::as_i128)
            .unwrap_or(i128::from(dev))
            == i128::from(dev);
        let (Some(address), Ok(size)) = (addr_field(s, "address"), size_field(s, "total_size"))
        else {
            continue;
        };
        if !on_dev {
            continue;
        }
        let small = match s.get("segment_type").and_then(Value::as_str) {
            Some(kind) => kind == "small",
            None => size == 2 << 20,
        };
        let mut live = HashMap::new();
        let mut offset: i128 = 0;
        for b in s.get("blocks").and_then(Value::as_seq).unwrap_or(&[]) {
            let bsize = size_field(b, "size").unwrap_or(0);
            let at = addr_field(b, "address").unwrap_or(address.saturating_add(offset));
            offset = offset.saturating_add(i128::from(bsize));
            let state = b.get("state").and_then(Value::as_str).unwrap_or("");
            if state.starts_with("active") {
                live.insert(at, bsize);
            }
        }
        out.push(DumpSegment {
            address,
            size,
            stream: stream_field(s),
            small,
            live,
        });
    }
    out
}

/// Classifies the release run that ends at `entries[end]` (Note [Release runs]).
fn classify_run(entries: &[Entry<'_>], end: usize) -> RunKind {
    let next = entries.get(end + 1);
    if next.is_some_and(|e| e.action == Action::Oom) {
        return RunKind::BeforeOom;
    }
    let (Some(seg), Some(alloc)) = (next, entries.get(end + 2)) else {
        return RunKind::EmptyCache;
    };
    if !matches!(seg.action, Action::SegmentAlloc | Action::SegmentMap)
        || alloc.action != Action::Alloc
    {
        return RunKind::EmptyCache;
    }
    let retry = match (entries.get(end).and_then(|e| e.frames), alloc.frames) {
        (Some(run), Some(call)) => run.same_as(call),
        _ => match (seg.addr, alloc.addr) {
            (Some(s), Some(a)) => {
                a < s.saturating_add(i128::from(seg.size))
                    && s < a.saturating_add(i128::from(alloc.size.max(1)))
            }
            _ => false,
        },
    };
    if retry {
        RunKind::AllocRetry
    } else {
        RunKind::EmptyCache
    }
}

enum RunKind {
    EmptyCache,
    AllocRetry,
    BeforeOom,
}

fn device_trace(
    dev: u64,
    raw: &[Value],
    segments: &[Value],
    name: String,
    alloc_conf: Option<String>,
    work: &mut Work,
) -> Result<DeviceTrace, String> {
    let entries: Vec<Entry<'_>> = raw
        .iter()
        .enumerate()
        .map(|(i, e)| parse_entry(i, e, work))
        .collect::<Result<_, _>>()?;
    let (dump_blocks, reserved_at_dump, has_segments) = dump_state(dev, segments, work)?;

    // Blocks live at the start: undo the trace from the dump backwards.
    let mut start = dump_blocks;
    // Addresses the trace allocated or freed: a block there at the start is not the dump's.
    let mut touched = std::collections::HashSet::new();
    for e in entries.iter().rev() {
        match e.action {
            Action::Alloc => {
                start.remove(&e.addr);
                touched.insert(e.addr);
            }
            Action::FreeCompleted => {
                start.insert(e.addr, (e.size, e.stream));
                touched.insert(e.addr);
            }
            _ => {}
        }
    }
    let mut start: Vec<(Option<i128>, (u64, u64))> = start.into_iter().collect();
    start.sort_unstable_by_key(|&(addr, _)| addr);
    let mut total: u64 = 0;
    let mut add = |size: u64| -> Result<(), String> {
        total = total
            .checked_add(size)
            .ok_or("sizes add up to more than 2^64 bytes")?;
        Ok(())
    };
    let mut initial = Vec::with_capacity(start.len());
    let mut initial_at: HashMap<Option<i128>, u64> = HashMap::new();
    for (id, &(addr, (size, stream))) in start.iter().enumerate() {
        add(size)?;
        initial.push(InitialBlock {
            id: id as u64,
            size,
            stream,
        });
        initial_at.insert(addr, id as u64);
    }
    let divisions = alloc_conf
        .as_deref()
        .and_then(|c| parse_alloc_conf(c).ok())
        .map_or([0; ROUNDUP_INTERVALS], |c| c.roundup_power2_divisions);
    let live_at_start: Vec<_> = start
        .iter()
        .enumerate()
        .filter_map(|(id, &(addr, (size, _)))| {
            Some((addr?, id as u64, size, !touched.contains(&addr)))
        })
        .collect();
    let segment_events: Vec<_> = entries
        .iter()
        .filter_map(|e| match e.action {
            Action::SegmentAlloc => Some((true, e.addr?, e.size, e.stream)),
            Action::SegmentFree => Some((false, e.addr?, e.size, e.stream)),
            _ => None,
        })
        .collect();
    let start_segs = start_segments(
        &dump_segments(dev, segments),
        &segment_events,
        &live_at_start,
        |requested| round_size(requested as usize, &divisions).map_or(requested, |r| r as u64),
    );

    let mut next_id = initial.len() as u64;
    let mut events = Vec::with_capacity(entries.len() / 2);
    let mut live: HashMap<Option<i128>, u64> = HashMap::new();
    let mut skipped_frees = 0;
    let mut orphan_free_requests = 0u64;
    let mut runs = ReleaseRuns::default();
    let mut first_alloc: Option<usize> = None;
    // Segment bookkeeping, as trace_summary: (entry index, change in reserved bytes).
    let mut seg_series: Vec<(usize, i128)> = Vec::new();
    let mut seg_live: HashMap<Option<i128>, u64> = HashMap::new();
    let mut mapped = RangeSet::default();
    let mut orphan_seg_releases = 0u64;
    let (mut segment_allocs, mut segment_frees) = (0u64, 0u64);
    let mut segment_alloc_log = Vec::new();
    let mut retry_runs = Vec::new();
    let mut allocs_seen = 0u64;

    for (i, e) in entries.iter().enumerate() {
        let run_starts =
            e.is_release() && (i == 0 || !entries.get(i - 1).is_some_and(Entry::is_release));
        if run_starts {
            let mut end = i;
            while entries.get(end + 1).is_some_and(Entry::is_release) {
                end += 1;
            }
            match classify_run(&entries, end) {
                RunKind::EmptyCache => {
                    runs.empty_cache += 1;
                    events.push(Event::EmptyCache);
                }
                RunKind::AllocRetry => {
                    runs.alloc_retry += 1;
                    retry_runs.push(allocs_seen);
                }
                RunKind::BeforeOom => runs.before_oom += 1,
            }
        }
        let delta = i128::from(e.size);
        let no_addr = || format!("entry {i}: {:?} without an address", e.action);
        match e.action {
            Action::Alloc => {
                allocs_seen += 1;
                first_alloc.get_or_insert(i);
                add(e.size)?;
                let id = next_id;
                next_id += 1;
                live.insert(e.addr, id);
                events.push(Event::Alloc {
                    id,
                    size: e.size,
                    stream: e.stream,
                });
            }
            Action::FreeRequested => {
                if !live.contains_key(&e.addr) {
                    orphan_free_requests += 1;
                }
            }
            Action::FreeCompleted => {
                match live.remove(&e.addr).or_else(|| initial_at.remove(&e.addr)) {
                    Some(id) => events.push(Event::Free { id }),
                    None => skipped_frees += 1,
                }
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                segment_allocs += 1;
                seg_series.push((i, delta));
                if e.action == Action::SegmentAlloc {
                    segment_alloc_log.push(SegmentAllocAt {
                        allocs_before: allocs_seen,
                        size: e.size,
                    });
                    seg_live.insert(e.addr, e.size);
                } else {
                    let (lo, hi) = granules(e.addr.ok_or_else(no_addr)?, e.size);
                    mapped.insert(lo, hi);
                }
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                segment_frees += 1;
                seg_series.push((i, -delta));
                let known = if e.action == Action::SegmentFree {
                    seg_live.remove(&e.addr).is_some()
                } else {
                    let (lo, hi) = granules(e.addr.ok_or_else(no_addr)?, e.size);
                    let known = mapped.covers(lo, hi);
                    if known {
                        mapped.remove(lo, hi);
                    }
                    known
                };
                if !known {
                    orphan_seg_releases += 1;
                }
            }
            Action::Oom | Action::Other => {}
        }
    }

    // Reserved bytes, anchored at the dump, peak from the first alloc on (trace_summary).
    let net: i128 = seg_series.iter().map(|&(_, d)| d).sum();
    let reserved_start = (has_segments || seg_series.is_empty()).then_some(reserved_at_dump - net);
    let first = first_alloc.unwrap_or(entries.len());
    let mut cur = reserved_start.unwrap_or(0);
    let mut peak: Option<i128> = None;
    for &(ix, d) in &seg_series {
        if ix > first && peak.is_none() {
            peak = Some(cur);
        }
        cur += d;
        if ix > first {
            peak = peak.map(|p| p.max(cur));
        }
    }
    let peak_reserved = peak.unwrap_or(cur);
    let recorded = (has_segments || !seg_series.is_empty()).then(|| Recorded {
        peak_reserved_bytes: u64::try_from(peak_reserved.max(0)).unwrap_or(u64::MAX),
        segment_allocs,
        segment_frees,
    });

    let mut trace = Trace {
        name,
        initial,
        events,
        start: StartState::Warm,
        skipped_frees,
        recorded,
        alloc_conf,
    };
    let baseline: u64 = trace.initial.iter().map(|b| b.size).sum();
    let rs = reserved_start.unwrap_or(0);
    trace.start = if trace.initial.is_empty()
        && skipped_frees == 0
        && orphan_free_requests == 0
        && orphan_seg_releases == 0
        && rs == 0
    {
        StartState::Empty
    } else if orphan_seg_releases == 0
        && (rs as f64) <= 0.02 * (peak_reserved.max(1) as f64)
        && (baseline as f64) <= 0.02 * (trace.peak_live_bytes().max(1) as f64)
    {
        StartState::NearEmpty
    } else {
        StartState::Warm
    };
    Ok(DeviceTrace {
        device: dev,
        trace,
        release_runs: runs,
        segment_allocs: segment_alloc_log,
        start_segments: start_segs,
        retry_runs,
    })
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string for the recorded `allocator_settings`: the recorded string
/// when it is set and parses, else one rebuilt from the settings' fields (only keys that differ
/// from PyTorch's defaults, plus `expandable_segments`). Always accepted by
/// [`parse_alloc_conf`]; `None` when the snapshot has no settings (PyTorch before 2.1).
fn alloc_conf(settings: Option<&Value>) -> Option<String> {
    let s = settings.filter(|s| matches!(s, Value::Dict(_)))?;
    if let Some(conf) = s.get("PYTORCH_CUDA_ALLOC_CONF").and_then(Value::as_str) {
        if !conf.trim().is_empty() && parse_alloc_conf(conf).is_ok() {
            return Some(conf.to_string());
        }
    }
    let flag = |key: &str| matches!(s.get(key), Some(Value::Bool(true)));
    let mut parts = Vec::new();
    if let Some(Value::Bool(b)) = s.get("expandable_segments") {
        parts.push(format!(
            "expandable_segments:{}",
            if *b { "True" } else { "False" }
        ));
    }
    if let Some(v) = s.get("max_split_size").and_then(Value::as_int) {
        if v > 0 {
            parts.push(format!(
                "max_split_size_mb:{}",
                v.unsigned_abs().div_ceil(1 << 20)
            ));
        }
    }
    if let Some(t) = s
        .get("garbage_collection_threshold")
        .and_then(|t| match *t {
            Value::Float(f) => Some(f),
            _ => t.as_int().map(|i| i as f64),
        })
    {
        if t > 0.0 {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
    }
    if let Some(r) = s.get("roundup_power2_divisions").and_then(roundup_setting) {
        parts.push(format!("roundup_power2_divisions:{r}"));
    }
    for key in [
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "graph_capture_record_stream_reuse",
        "pinned_use_background_threads",
    ] {
        if flag(key) {
            parts.push(format!("{key}:True"));
        }
    }
    if let Some(n) = s.get("pinned_num_register_threads").and_then(Value::as_int) {
        if n != 1 {
            parts.push(format!("pinned_num_register_threads:{n}"));
        }
    }
    // Keep only settings PyTorch (and so our parser) would accept.
    parts.retain(|p| parse_alloc_conf(p).is_ok());
    let conf = parts.join(",");
    parse_alloc_conf(&conf).is_ok().then_some(conf)
}

/// `roundup_power2_divisions` as recorded (`{"1": d, "2": d, ..., "32768": d}`, keys in MB) as a
/// config value: one number when all intervals agree, a list otherwise; `None` when all are 0.
fn roundup_setting(v: &Value) -> Option<String> {
    let Value::Dict(pairs) = v else {
        return None;
    };
    let mut entries: Vec<(u64, i64)> = pairs
        .iter()
        .filter_map(|(k, d)| {
            let mb = match k {
                Value::Str(s) => s.parse().ok()?,
                other => u64::try_from(other.as_int()?).ok()?,
            };
            Some((mb, d.as_int()?))
        })
        .collect();
    entries.sort_unstable();
    let first = entries.first()?.1;
    if entries.iter().all(|&(_, d)| d == first) {
        return (first > 0).then(|| first.to_string());
    }
    let list: Vec<String> = entries.iter().map(|(mb, d)| format!("{mb}:{d}")).collect();
    Some(format!("[{}]", list.join(",")))
}
