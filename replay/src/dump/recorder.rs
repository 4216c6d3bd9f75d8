//! Records a replay's history as trace entries, step by step, without looking inside the
//! allocator: blocks come from the replay's calls, mapping changes from comparing the allocator's
//! [`snapshot`](vmm_alloc::Allocator::snapshot) before and after a step, taken only when the step
//! made a map or unmap call.

use vmm_alloc::backend::CallKind;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::error::AllocError;
use vmm_alloc::stats::MemoryStats;
use vmm_alloc::{Allocation, Allocator};

use super::mapped::{mapped_ranges, subtract, MappedRanges};
use super::{Action, SnapshotDump, TraceEntry};

/// The history so far. One replayed event is one step: its entries are collected, then
/// [`Recorder::end_step`] writes the step's mapping changes followed by them.
pub(crate) struct Recorder {
    entries: Vec<TraceEntry>,
    /// Entries of the step in progress.
    step: Vec<TraceEntry>,
    /// The mapped memory after the last step.
    mapped: MappedRanges,
    /// Map and unmap calls made up to the last step.
    map_calls: (u64, u64),
    /// The index of the step in progress (the entries' `time_us`).
    time: u64,
    peak_mapped: u64,
    capacity: u64,
    alloc_conf: Option<String>,
    config: ExpandableConfig,
}

/// Map and unmap calls so far.
fn map_calls(stats: &MemoryStats) -> (u64, u64) {
    (
        stats.calls.calls(CallKind::Map),
        stats.calls.calls(CallKind::Unmap),
    )
}

impl Recorder {
    /// Starts recording `alloc` (a fresh allocator, `config` applied with `alloc_conf`) on a
    /// device of `capacity` bytes.
    pub(crate) fn new<A: Allocator>(
        alloc: &A,
        capacity: u64,
        config: ExpandableConfig,
        alloc_conf: Option<String>,
    ) -> Self {
        let stats = alloc.stats();
        Self {
            entries: Vec::new(),
            step: Vec::new(),
            mapped: mapped_ranges(&alloc.snapshot()),
            map_calls: map_calls(&stats),
            time: 0,
            peak_mapped: stats.reserved_bytes.all.current,
            capacity,
            alloc_conf,
            config,
        }
    }

    fn push(&mut self, action: Action, addr: u64, size: u64, stream: u64) {
        self.step.push(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: self.time,
        });
    }

    /// `a` was handed out.
    pub(crate) fn alloc(&mut self, a: &Allocation) {
        let (addr, stream) = (a.ptr().get(), a.stream().raw());
        self.push(Action::Alloc, addr, a.requested() as u64, stream);
    }

    /// `a` was freed; the replay records no stream use, so its memory is reusable at once.
    pub(crate) fn free(&mut self, a: &Allocation) {
        let (addr, size, stream) = (a.ptr().get(), a.requested() as u64, a.stream().raw());
        self.push(Action::FreeRequested, addr, size, stream);
        self.push(Action::FreeCompleted, addr, size, stream);
    }

    /// A request of `size` bytes on `stream` failed with `err`. PyTorch records the bytes free on
    /// the device and the rounded size, which the OOM report carries; a request too large to
    /// round is recorded as asked, with the free bytes the allocator's statistics imply.
    pub(crate) fn oom<A: Allocator>(
        &mut self,
        err: &AllocError,
        size: u64,
        stream: u64,
        alloc: &A,
    ) {
        let (device_free, size) = match err {
            AllocError::OutOfMemory(report) => (report.free, report.tried),
            _ => {
                let s = alloc.stats();
                let held = s
                    .reserved_bytes
                    .all
                    .current
                    .saturating_add(s.handle_cache_bytes);
                (self.capacity.saturating_sub(held), size)
            }
        };
        self.push(Action::Oom, device_free, size, stream);
    }

    /// Ends the step: writes what it mapped and unmapped, then its own entries. `stats` are the
    /// allocator's statistics after the step.
    pub(crate) fn end_step<A: Allocator>(&mut self, alloc: &A, stats: &MemoryStats) {
        self.peak_mapped = self.peak_mapped.max(stats.reserved_bytes.all.current);
        let calls = map_calls(stats);
        if calls != self.map_calls {
            self.map_calls = calls;
            let now = mapped_ranges(&alloc.snapshot());
            self.mapping_changes(&now);
            self.mapped = now;
        }
        self.entries.append(&mut self.step);
        self.time += 1;
    }

    /// One `segment_unmap` per range mapped before and not now, then one `segment_map` per range
    /// mapped now and not before: releases first, as PyTorch frees before it maps again, so that
    /// the mapped total between the entries of a step never exceeds its value at either end.
    fn mapping_changes(&mut self, now: &MappedRanges) {
        let empty = Vec::new();
        let (mut unmapped, mut mapped) = (Vec::new(), Vec::new());
        for (key, before) in &self.mapped {
            let after = now.get(key).unwrap_or(&empty);
            unmapped.extend(subtract(before, after).into_iter().map(|r| (r, key.0)));
        }
        for (key, after) in now {
            let before = self.mapped.get(key).unwrap_or(&empty);
            mapped.extend(subtract(after, before).into_iter().map(|r| (r, key.0)));
        }
        let time = self.time;
        let entry = |action, ((start, end), stream): ((u64, u64), u64)| TraceEntry {
            action,
            addr: start,
            size: end.saturating_sub(start),
            stream,
            time_us: time,
        };
        unmapped.sort_unstable();
        mapped.sort_unstable();
        let unmaps = unmapped.into_iter().map(|r| entry(Action::SegmentUnmap, r));
        let maps = mapped.into_iter().map(|r| entry(Action::SegmentMap, r));
        self.entries.extend(unmaps.chain(maps));
    }

    /// The history and the allocator's final state.
    pub(crate) fn finish<A: Allocator>(self, alloc: &A) -> SnapshotDump {
        SnapshotDump {
            entries: self.entries,
            final_state: alloc.snapshot(),
            config: self.config,
            alloc_conf: self.alloc_conf,
            peak_mapped_bytes: self.peak_mapped,
        }
    }
}
