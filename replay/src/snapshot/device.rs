//! One device's trace entries turned into a [`Trace`]: the start state rebuilt from the dump,
//! the events, the release runs classified, and the recorded allocator's own figures.

use std::collections::{BTreeMap, HashMap};

use super::dump_state::{dump_segments, dump_state, granules, RangeSet};
use super::entries::{parse_entry, Action, Entry, Work};
use super::free_segments::SegmentTracker;
use super::release_runs::{classify_run, RunContext, RunKind};
use super::{DeviceTrace, ReleaseRuns, RetryRun, SegmentAllocAt};
use crate::pickle::Value;
use crate::start_segments::start_segments;
use crate::{Event, InitialBlock, Recorded, StartState, Trace};
use vmm_alloc::config::{parse_alloc_conf, round_size, ROUNDUP_INTERVALS};

pub(super) fn device_trace(
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
            // A free of 0 bytes (a missing or null size) frees nothing an allocator handed
            // out: no block of 0 bytes was live at the start, so it counts as a skipped free.
            Action::FreeCompleted => {
                if e.size == 0 {
                    start.remove(&e.addr);
                } else {
                    start.insert(e.addr, (e.size, e.stream));
                }
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
    let conf = alloc_conf.as_deref().and_then(|c| parse_alloc_conf(c).ok());
    let divisions = conf
        .as_ref()
        .map_or([0; ROUNDUP_INTERVALS], |c| c.roundup_power2_divisions);
    let gc_on = conf
        .as_ref()
        .is_some_and(|c| c.garbage_collection_threshold > 0.0);
    let max_split = conf.and_then(|c| c.max_split_size).map(|m| m as u64);
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
    let dump_segs = dump_segments(dev, segments);
    let mut tracker = SegmentTracker::at_start(
        dump_segs.iter().map(|s| (s.address, s.size)),
        &entries,
        start.iter().filter_map(|&(addr, _)| addr),
    );
    let start_segs = start_segments(
        &dump_segs,
        &segment_events,
        &live_at_start,
        |requested| round_size(requested as usize, &divisions).map_or(requested, |r| r as u64),
        max_split,
    );

    let mut next_id = initial.len() as u64;
    let mut events = Vec::with_capacity(entries.len() / 2);
    let mut live: HashMap<Option<i128>, u64> = HashMap::new();
    let mut skipped_frees = 0;
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    // Addresses freed and not allocated since, with the entry that freed them: a second
    // `free_completed` there frees nothing any allocator handed out (a corrupt trace).
    let mut freed_at: HashMap<Option<i128>, usize> = HashMap::new();
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
    // Reserved bytes as the entries go by, anchored at the dump as below, and their largest.
    let reserved_change = |e: &Entry<'_>| match e.action {
        Action::SegmentAlloc | Action::SegmentMap => i128::from(e.size),
        Action::SegmentFree | Action::SegmentUnmap => -i128::from(e.size),
        _ => 0,
    };
    let net: i128 = entries.iter().map(reserved_change).sum();
    let no_segment_entries = !entries.iter().any(|e| {
        matches!(
            e.action,
            Action::SegmentAlloc | Action::SegmentMap | Action::SegmentFree | Action::SegmentUnmap
        )
    });
    let reserved_start = (has_segments || no_segment_entries).then_some(reserved_at_dump - net);
    let mut reserved_now = reserved_start.unwrap_or(0);
    let max_reserved = entries
        .iter()
        .scan(reserved_now, |r, e| {
            *r += reserved_change(e);
            Some(*r)
        })
        .fold(reserved_now, i128::max);

    let mut call_reserved: Option<i128> = None;
    for (i, e) in entries.iter().enumerate() {
        if !e.is_release() && e.action != Action::FreeCompleted {
            call_reserved = None;
        }
        let run_starts =
            e.is_release() && (i == 0 || !entries.get(i - 1).is_some_and(Entry::is_release));
        if run_starts {
            let mut end = i;
            while entries.get(end + 1).is_some_and(Entry::is_release) {
                end += 1;
            }
            let cx = RunContext {
                tracker: &tracker,
                reserved_before: call_reserved.unwrap_or(reserved_now),
                max_reserved,
                gc_on,
            };
            let kind = classify_run(&entries, i, end, &cx);
            // A later run of the same call (after a partial release and the completions of its
            // synchronization) failed its cudaMalloc where the first did.
            call_reserved = matches!(kind, RunKind::Partial).then_some(cx.reserved_before);
            match kind {
                RunKind::EmptyCache => {
                    runs.empty_cache += 1;
                    events.push(Event::EmptyCache);
                }
                kind @ (RunKind::AllocRetry | RunKind::Partial) => {
                    if matches!(kind, RunKind::AllocRetry) {
                        runs.alloc_retry += 1;
                    } else {
                        runs.partial += 1;
                    }
                    retry_runs.push(RetryRun {
                        allocs_before: allocs_seen,
                        segments: (end + 1 - i) as u64,
                    });
                }
                RunKind::BeforeOom => runs.before_oom += 1,
            }
        }
        tracker.apply(e);
        reserved_now += reserved_change(e);
        let delta = i128::from(e.size);
        let no_addr = || format!("entry {i}: {} without an address", e.action.name());
        match e.action {
            Action::Alloc => {
                allocs_seen += 1;
                first_alloc.get_or_insert(i);
                add(e.size)?;
                let id = next_id;
                next_id += 1;
                live.insert(e.addr, id);
                freed_at.remove(&e.addr);
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
                    None => {
                        if let Some(j) = freed_at.get(&e.addr) {
                            return Err(format!(
                                "entry {i}: free_completed of address {} that entry {j} already \
                                 freed, with no alloc there in between (a double free)",
                                addr_shown(e.addr)
                            ));
                        }
                        skipped_frees += 1;
                    }
                }
                freed_at.insert(e.addr, i);
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
            // The request that failed: PyTorch writes no `alloc` for it (size = round_size).
            Action::Oom => events.push(Event::FailedAlloc {
                size: e.size,
                stream: e.stream,
            }),
            Action::Skipped(kind) => *skipped.entry(kind.to_string()).or_default() += 1,
        }
    }

    // Reserved bytes, anchored at the dump, peak from the first alloc on (trace_summary).
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
        skipped,
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

/// An address for an error message (hexadecimal, as PyTorch's viewer shows them).
fn addr_shown(addr: Option<i128>) -> String {
    addr.map_or("(none)".into(), |a| format!("{a:#x}"))
}
