//! PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot` pickles) as [`Trace`]s, one
//! per device that recorded trace entries.
//!
//! The figures follow `shared/traces/README.md` ("What the figures mean") and its reference reader
//! `trace_summary.py`, which the test suite compares against file by file:
//!
//! * every `alloc` entry is an [`Event::Alloc`](crate::Event::Alloc) with a fresh id; a `free_completed` of that address
//!   is its [`Event::Free`](crate::Event::Free) (`free_requested` only marks a free as pending, as in `trace_summary`);
//! * blocks live when recording began become [`InitialBlock`](crate::InitialBlock)s: the dump-time `segments` list gives
//!   the blocks live at the end, and undoing the trace backwards (an `alloc` removes its address,
//!   a `free_completed` adds it back with the size it records), as memory_viz does, gives those
//!   live at the start; a second `free_completed` of an address with no `alloc` there in between
//!   is refused (a double free: PyTorch records one per block);
//! * entries are dicts with one of the actions PyTorch writes: `snapshot` and annotation entries
//!   are skipped on purpose and counted in [`Trace::skipped`] (Note [Skipped actions] in
//!   `entries.rs`); any other action, an entry that is not a dict, an `alloc` or `oom` of 0 bytes,
//!   a segment or block that is not a dict, and a block state PyTorch does not write are refused,
//!   naming the device and entry (or segment and block);
//! * an allocation at an address that is still live leaves the older block live for good, as
//!   `trace_summary`'s peak-live figure does (no real snapshot has one);
//! * [`Recorded::peak_reserved_bytes`](crate::Recorded::peak_reserved_bytes) is PyTorch's reserved memory rebuilt from segment events,
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
//! A run of consecutive `segment_free` / `segment_unmap` entries comes from one of four places
//! in PyTorch's allocator (pytorch-allocator.md §1.3, §1.9, §1.11):
//!
//! * the program's `empty_cache()`: `release_cached_blocks` completes every pending event
//!   (`synchronize_and_free_events`, whose `free_completed` entries come *before* the run) and
//!   then releases every cached block that is a whole segment, in every pool;
//! * `malloc`'s release-and-retry after a failed `cudaMalloc`: the same `release_cached_blocks`,
//!   followed by the `segment_alloc` and the `alloc` of that call (all with its frames), or by an
//!   `oom` entry if the retry fails too;
//! * inside `malloc`, before that: with `max_split_size` set, `release_available_cached_blocks`
//!   frees only oversize blocks (after a failed `cudaMalloc`); with a memory fraction and
//!   `garbage_collection_threshold`, the collector frees only old whole large blocks (before any
//!   `cudaMalloc`). Neither synchronizes first.
//!
//! The first is replayed as an [`Event::EmptyCache`](crate::Event::EmptyCache) where the run
//! starts; the others are no event, since the replayed allocator under the recorded settings
//! makes them by itself (its own retry needs its device to be full there too). The reader tracks
//! the recorded segments and the blocks live in each as the entries go by, and decides, in order:
//!
//! 1. the entry after the run is `oom`: the failed retry's release, no event
//!    ([`ReleaseRuns::before_oom`]);
//! 2. the run (of `segment_free`s) leaves standing a segment that held no live block when it
//!    began: `release_cached_blocks` never does, so this is the allocator's own partial release,
//!    no event ([`ReleaseRuns::partial`]);
//! 3. the run is followed by `free_completed` entries only and then another run: those
//!    completions are the synchronization of a `release_cached_blocks` in the same call (after
//!    `empty_cache()` nothing is pending until a `free_requested`), so this run, which came
//!    before it, is that call's first release: partial, no event. The next run's reserved
//!    figure (rule 4) is taken from before this one, where the call's `cudaMalloc` failed;
//! 4. the run is followed by `segment_alloc`/`segment_map` and then `alloc`: when the run's last
//!    entry and that `alloc` both carry frames, equal frames mean a retry and different frames
//!    an `empty_cache()`. When either has no frames, the run is a retry only if the `alloc` lies
//!    in the segment just reserved (a call that needed new memory) *and* the reserved bytes
//!    before the run plus the new segment exceed the largest reserved total seen anywhere in the
//!    trace (segments at the start included): a retry follows a failed `cudaMalloc`, and the
//!    device held at least that total. With the collector on in the recorded settings the second
//!    condition is dropped (the collector releases without any `cudaMalloc` failing);
//! 5. anything else: `empty_cache()`.
//!
//! Ambiguous still: without frames, a retry on a GPU shared with other memory (another process,
//! or memory outside the allocator) where the new segment would have fitted under the trace's
//! peak is read as `empty_cache()`; with the collector on, an `empty_cache()` followed by an
//! allocation in a new segment is read as the collector; a `release_cached_blocks` that leaves
//! a free segment of a private pool (CUDA graphs, `MemPool`) in use standing is read as partial;
//! runs of `segment_unmap` (expandable segments) skip rules 2 and 3. `free_completed` entries
//! written by a retry's synchronization stay [`Event::Free`](crate::Event::Free)s before the
//! `alloc` of the call, in entry order, on purpose: `--check-classic` reads the same events and
//! completes the frees since the previous call after the search (Note [Recorded mallocs] in the
//! classic allocator), and deferring them past the `alloc` in the events would count them live
//! beside it, above the program's peak. So in the ordinary replay such a block can serve the
//! request that PyTorch served from a new segment, which only matters where the replayed device
//! is as full as the recording's (elsewhere the replay makes no retry release either).
//! [`ReleaseRuns`] counts each kind.
//!
//! # Untrusted input
//!
//! The pickle is read by [`pickle::parse`], which builds plain values only. Malformed fields are
//! errors, never panics; sizes must add up to less than 2^64; and the work done on the values is
//! bounded by the file's size (see `Work`), since a hostile pickle can name one long list from
//! many places at two bytes a reference.

mod device;
mod dump_state;
mod entries;
mod free_segments;
mod release_runs;
mod settings;

use std::path::Path;

use crate::pickle::{self, Value};
use crate::start_segments::StartSegment;
use crate::{Trace, TraceError};
use device::device_trace;
use entries::Work;
use settings::alloc_conf;

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
    /// Where the traced allocator released cached segments inside a `malloc` that then
    /// allocated a new segment (runs of [`ReleaseRuns::alloc_retry`] and
    /// [`ReleaseRuns::partial`]), in order.
    pub retry_runs: Vec<RetryRun>,
}

/// A run of segment releases inside one `malloc` that then allocated a new segment: PyTorch's
/// release-and-retry after a failed `cudaMalloc` (all free segments, or only oversize blocks
/// with `max_split_size`), or its garbage collector.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RetryRun {
    /// `alloc` entries before the run: the call that released is that allocation ordinal.
    pub allocs_before: u64,
    /// Segments the run released.
    pub segments: u64,
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
    /// Runs taken for an explicit `empty_cache()` (each is one [`Event::EmptyCache`](crate::Event::EmptyCache)).
    pub empty_cache: u64,
    /// Runs taken for `malloc`'s release-and-retry that succeeded.
    pub alloc_retry: u64,
    /// Runs that left an entirely free segment standing: the allocator's own partial release
    /// inside `malloc` (its garbage collector, or with `max_split_size` the first release of a
    /// retry), which a replayed allocator under the same settings makes by itself.
    pub partial: u64,
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
    // Every segment is a dict: a list of anything else (`[1, 2, 3]`, or lists nested through the
    // memo into a tree of 16^30 leaves) is not a snapshot, whatever its shape on disk.
    if let Some((i, s)) = segments
        .iter()
        .enumerate()
        .find(|(_, s)| !matches!(s, Value::Dict(_)))
    {
        let (top, why) = if matches!(root, Value::List(_)) {
            (
                "the top-level list",
                " (a snapshot that is a bare list, as torch 1.13 wrote, holds only segments)",
            )
        } else {
            ("\"segments\"", "")
        };
        return Err(fail(format!(
            "item {i} of {top} is a {}, expected a segment (a dict with \"address\", \
             \"total_size\" and \"blocks\"){why}",
            s.type_name()
        )));
    }
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
