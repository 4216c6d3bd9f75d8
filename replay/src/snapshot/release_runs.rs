//! What a run of segment releases was: `empty_cache()`, malloc's release-and-retry, the
//! allocator's own partial release, or the release before an OOM (Note [Release runs] in the
//! module docs).

use super::entries::{Action, Entry};
use super::free_segments::SegmentTracker;

/// What the reader knows when a run begins.
pub(super) struct RunContext<'t> {
    /// The segments and their live blocks just before the run.
    pub(super) tracker: &'t SegmentTracker,
    /// Reserved bytes just before the run.
    pub(super) reserved_before: i128,
    /// The largest reserved total anywhere in the trace (at the start included): the device
    /// held at least that much.
    pub(super) max_reserved: i128,
    /// The recorded settings turn the garbage collector on: it releases inside `malloc`
    /// without any `cudaMalloc` having failed.
    pub(super) gc_on: bool,
}

/// Classifies the run `entries[start..=end]`.
pub(super) fn classify_run(
    entries: &[Entry<'_>],
    start: usize,
    end: usize,
    cx: &RunContext<'_>,
) -> RunKind {
    let next = entries.get(end + 1);
    if next.is_some_and(|e| e.action == Action::Oom) {
        return RunKind::BeforeOom;
    }
    let run = &entries[start..=end];
    // Expandable segments' unmaps are left to the rules below: neither partial release touches
    // expandable blocks.
    let frees_only = run.iter().all(|e| e.action == Action::SegmentFree);
    if frees_only && cx.tracker.leaves_free_segment(run) {
        return RunKind::Partial;
    }
    // Completions and then more releases: the completions are `synchronize_and_free_events`
    // inside a later `release_cached_blocks` of the same call (after `empty_cache()` nothing is
    // pending unless a `free_requested` came since), so this run came before any
    // synchronization: `release_available_cached_blocks` or the collector.
    let after = entries[end + 1..]
        .iter()
        .find(|e| e.action != Action::FreeCompleted);
    if frees_only
        && next.is_some_and(|e| e.action == Action::FreeCompleted)
        && after.is_some_and(Entry::is_release)
    {
        return RunKind::Partial;
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
                let in_new_segment = a < s.saturating_add(i128::from(seg.size))
                    && s < a.saturating_add(i128::from(alloc.size.max(1)));
                // A retry follows a failed cudaMalloc: the new segment did not fit on top of
                // what was reserved, on a device that held `max_reserved`.
                let device_full =
                    cx.gc_on || cx.reserved_before + i128::from(seg.size) > cx.max_reserved;
                in_new_segment && device_full
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

pub(super) enum RunKind {
    EmptyCache,
    AllocRetry,
    Partial,
    BeforeOom,
}
