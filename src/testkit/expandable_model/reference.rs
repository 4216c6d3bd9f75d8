//! The reference model: plain vectors of what is live and what waits for events, with its own
//! sums of every PyTorch stat that applies, compared with the allocator after every step.

use crate::snapshot::{BlockState, Snapshot};
use crate::stats::{PoolKind, Stat, StatArray};
use crate::{Allocation, MemoryStats, StreamId};
use proptest::prelude::*;

use crate::testkit::{MappingState, Seen};

use crate::testkit::pytorch_rounding::SMALL_SIZE;

/// What the model knows about one live allocation.
pub struct Live {
    pub alloc: Allocation,
    pub id: u64,
    /// Streams it was recorded on (other than its own).
    pub uses: Vec<StreamId>,
    /// The pool whose segment holds it: its size's, or the large pool for a small block
    /// borrowed under pressure (Note \[Borrowing\]); see [`Model::pool_holding`].
    pub pool: PoolKind,
}

/// A block freed with uses on other streams: the allocator keeps it active until every event
/// recorded at the free has completed and it next looks at its events.
struct Pending {
    stream: StreamId,
    start: u64,
    size: usize,
    pool: PoolKind,
    requested: usize,
    /// (stream, its generation at the free, whether the stream was held then).
    events: Vec<(StreamId, u64, bool)>,
}

fn pool_of(size: usize) -> PoolKind {
    if size <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// The model's value of one stat per pool: `[small, large]`.
type Sums = [u64; 2];

fn idx(p: PoolKind) -> usize {
    match p {
        PoolKind::Small => 0,
        PoolKind::Large => 1,
    }
}

#[derive(Default)]
pub struct Model {
    pub live: Vec<Live>,
    pending: Vec<Pending>,
    /// Ranges freed on their own stream while it was held: its queued work may still touch them,
    /// so they must not be unmapped before that stream is synchronized (Note \[Syncs\]).
    unquiet: Vec<(u64, u64, StreamId)>,
    /// Peaks of [allocated_bytes, active_bytes, requested_bytes, allocation, active] per pool.
    peaks: [Sums; 5],
    peak_all: [u64; 5],
    /// What `sequences_reach_the_interesting_states` wants to see: frees left pending on a held
    /// stream, allocations made while such a block of their stream would have fitted, and
    /// memory freed on a held stream made safe to unmap by the allocator's own synchronize.
    pub pending_held: u64,
    pub blocked_reuse: u64,
    pub synced_before_unmap: u64,
}

impl Model {
    /// The pool of the segment of `snap` that holds `a`: its size's pool, or the large pool
    /// for a small block borrowed under pressure; a large block in a small segment, or one in
    /// no segment, is an error.
    pub fn pool_holding(a: &Allocation, snap: &Snapshot) -> Result<PoolKind, String> {
        let at = a.ptr().get();
        let seg = snap
            .segments
            .iter()
            .find(|s| s.address.get() <= at && at < s.address.get() + s.total_size as u64)
            .ok_or(format!("{:?} lies in no segment", a.ptr()))?;
        match (pool_of(a.size()), seg.pool) {
            (want, got) if want == got => Ok(got),
            (PoolKind::Small, PoolKind::Large) => Ok(PoolKind::Large),
            (want, got) => Err(format!(
                "{:?}: a {want:?} block in a {got:?} segment",
                a.ptr()
            )),
        }
    }

    /// Counts an allocation of `size` on `stream` that a still-pending block of that stream would
    /// have held: the allocator must have put it elsewhere.
    pub fn note_blocked(&mut self, stream: StreamId, size: usize) {
        if self
            .pending
            .iter()
            .any(|p| p.stream == stream && p.size >= size)
        {
            self.blocked_reuse += 1;
        }
    }

    /// Whether `[s, e)` overlaps a block the allocator must still consider in use.
    pub fn overlaps_pending(&self, s: u64, e: u64) -> bool {
        self.pending
            .iter()
            .any(|p| s < p.start + p.size as u64 && p.start < e)
    }

    pub fn freed(&mut self, l: Live, held: &[StreamId], gen: impl Fn(StreamId) -> u64) {
        let a = &l.alloc;
        let (start, end) = (a.ptr().get(), a.ptr().get() + a.size() as u64);
        if held.contains(&a.stream()) {
            self.unquiet.push((start, end, a.stream()));
        }
        if !l.uses.is_empty() {
            if l.uses.iter().any(|s| held.contains(s)) {
                self.pending_held += 1;
            }
            self.pending.push(Pending {
                stream: a.stream(),
                start,
                size: a.size(),
                pool: l.pool,
                requested: a.requested(),
                events: l
                    .uses
                    .iter()
                    .map(|&s| (s, gen(s), held.contains(&s)))
                    .collect(),
            });
        }
    }

    /// The allocator looked at its events (start of every allocate): pending blocks whose events
    /// all completed become free. `gen` gives the generations as they were at that moment.
    pub fn process(&mut self, gen: impl Fn(StreamId) -> u64) {
        self.pending
            .retain(|p| !p.events.iter().all(|&(s, g, held)| !held || gen(s) > g));
    }

    /// The allocator synchronized every stream pending blocks wait on (empty_cache, OOM retry).
    pub fn process_all(&mut self) {
        self.pending.clear();
    }

    pub fn released(&mut self, s: StreamId) {
        self.unquiet.retain(|u| u.2 != s);
    }

    /// Replays the synchronizes and unmaps of one step, in order: an unmap of memory freed on a
    /// held stream before that stream was synchronized is a use-after-free on the device.
    pub fn device_calls(&mut self, seen: &[Seen]) -> Result<(), String> {
        for &x in seen {
            match x {
                Seen::Sync(s) => {
                    let n = self.unquiet.len();
                    self.unquiet.retain(|u| u.2 != s);
                    self.synced_before_unmap += (self.unquiet.len() < n) as u64;
                }
                Seen::Unmap { at, len } => {
                    let end = at + len as u64;
                    if let Some(u) = self.unquiet.iter().find(|u| at < u.1 && u.0 < end) {
                        return Err(format!(
                            "unmapped {at:#x}+{len:#x}, freed on held {:?} at {:#x}, before synchronizing it",
                            u.2, u.0
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The model's sums: [allocated_bytes, active_bytes, requested_bytes, allocation, active].
    fn sums(&self) -> [Sums; 5] {
        let mut s = [[0u64; 2]; 5];
        for l in &self.live {
            let p = idx(l.pool);
            s[0][p] += l.alloc.size() as u64;
            s[1][p] += l.alloc.size() as u64;
            s[2][p] += l.alloc.requested() as u64;
            s[3][p] += 1;
            s[4][p] += 1;
        }
        for b in &self.pending {
            let p = idx(b.pool);
            s[1][p] += b.size as u64;
            s[2][p] += b.requested as u64;
            s[4][p] += 1;
        }
        s
    }

    /// Compares every stat PyTorch names that applies, per pool and in total, current and peak.
    pub fn check_stats(&mut self, stats: &MemoryStats) -> Result<(), String> {
        let sums = self.sums();
        let names = [
            "allocated_bytes",
            "active_bytes",
            "requested_bytes",
            "allocation",
            "active",
        ];
        let arrays: [&StatArray; 5] = [
            &stats.allocated_bytes,
            &stats.active_bytes,
            &stats.requested_bytes,
            &stats.allocation,
            &stats.active,
        ];
        for i in 0..5 {
            let all = sums[i][0] + sums[i][1];
            self.peak_all[i] = self.peak_all[i].max(all);
            for (peak, &sum) in self.peaks[i].iter_mut().zip(&sums[i]) {
                *peak = (*peak).max(sum);
            }
            let want = [
                ("all", all, self.peak_all[i], arrays[i].all),
                (
                    "small_pool",
                    sums[i][0],
                    self.peaks[i][0],
                    arrays[i].small_pool,
                ),
                (
                    "large_pool",
                    sums[i][1],
                    self.peaks[i][1],
                    arrays[i].large_pool,
                ),
            ];
            for (pool, cur, peak, got) in want {
                let Stat { current, .. } = got;
                if (current, got.peak) != (cur, peak) || got.allocated - got.freed != current {
                    return Err(format!(
                        "{}.{pool}: allocator {got:?}, model current {cur} peak {peak}",
                        names[i]
                    ));
                }
            }
        }
        Ok(())
    }

    /// Reserved bytes per pool equal the bytes the backend has mapped in that pool's segments,
    /// and every live allocation lies in pages the backend has mapped.
    pub fn check_mapped(
        &self,
        stats: &MemoryStats,
        snap: &Snapshot,
        log: &MappingState,
    ) -> Result<(), String> {
        let mut by_pool = [0u64; 2];
        let mut parked = 0u64;
        for (&at, &len) in &log.mapped {
            let seg = snap
                .segments
                .iter()
                .find(|s| {
                    let a = s.address.get();
                    a <= at && at + len as u64 <= a + s.total_size as u64
                })
                .ok_or(format!("backend mapping {at:#x}+{len:#x} in no segment"))?;
            // A mapping where the snapshot shows unmapped addresses is a parked page (Note
            // [Parked pages]): no reserved memory of its own, counted by `parked_bytes`. One
            // partly shown unmapped is a page mapped twice (Note [Alias rescue]): each of its
            // bytes counts where the snapshot shows it mapped, once.
            let end = at + len as u64;
            let unmapped: u64 = seg
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::Unmapped)
                .map(|b| {
                    let (a, e) = (b.address.get(), b.address.get() + b.size as u64);
                    e.min(end).saturating_sub(a.max(at))
                })
                .sum();
            if unmapped == len as u64 {
                parked += len as u64;
            } else {
                by_pool[idx(seg.pool)] += len as u64 - unmapped;
            }
        }
        if parked != stats.parked_bytes {
            return Err(format!(
                "the backend maps {parked} B where the snapshot shows unmapped addresses, but \
                 parked_bytes is {}",
                stats.parked_bytes
            ));
        }
        let got = [
            stats.reserved_bytes.small_pool.current,
            stats.reserved_bytes.large_pool.current,
        ];
        if got != by_pool || stats.reserved_bytes.all.current != by_pool[0] + by_pool[1] {
            return Err(format!(
                "reserved_bytes {:?} (small, large) but the backend maps {by_pool:?}",
                got
            ));
        }
        for l in &self.live {
            if !log.covers(l.alloc.ptr().get(), l.alloc.size()) {
                return Err(format!(
                    "{:?}+{:#x} is not mapped by the backend",
                    l.alloc.ptr(),
                    l.alloc.size()
                ));
            }
        }
        Ok(())
    }

    /// The snapshot tiles each segment exactly, in address order, and agrees with the stats and
    /// with the model's live and pending blocks.
    pub fn check_snapshot(&self, stats: &MemoryStats, snap: &Snapshot) -> Result<(), String> {
        let (mut allocated, mut active, mut mapped) = (0u64, 0u64, 0u64);
        let mut live_blocks = Vec::new();
        let mut pending_blocks = Vec::new();
        for seg in &snap.segments {
            let mut cursor = seg.address.get();
            let (mut seg_alloc, mut seg_mapped) = (0usize, 0usize);
            for b in &seg.blocks {
                if b.address.get() != cursor || b.size == 0 {
                    return Err(format!(
                        "segment {:?}: block {:?}+{:#x} does not start where the last ended ({cursor:#x})",
                        seg.address, b.address, b.size
                    ));
                }
                cursor += b.size as u64;
                match b.state {
                    BlockState::ActiveAllocated => {
                        seg_alloc += b.size;
                        live_blocks.push((b.address.get(), b.size, b.requested_size));
                    }
                    BlockState::ActivePendingFree => {
                        active += b.size as u64;
                        pending_blocks.push((b.address.get(), b.size, b.requested_size));
                    }
                    BlockState::Inactive | BlockState::Unmapped => {}
                }
                if b.state != BlockState::Unmapped {
                    seg_mapped += b.size;
                }
            }
            if cursor != seg.address.get() + seg.total_size as u64 {
                return Err(format!(
                    "segment {:?}: blocks end at {cursor:#x}",
                    seg.address
                ));
            }
            if seg_alloc != seg.allocated_size || seg_mapped != seg.mapped_size {
                return Err(format!(
                    "segment {:?}: sizes disagree with its blocks",
                    seg.address
                ));
            }
            allocated += seg_alloc as u64;
            active += seg_alloc as u64;
            mapped += seg_mapped as u64;
        }
        if (allocated, active, mapped)
            != (
                stats.allocated_bytes.all.current,
                stats.active_bytes.all.current,
                stats.reserved_bytes.all.current,
            )
            || snap.segments.len() as u64 != stats.segment.all.current
        {
            return Err("snapshot sums disagree with the stats".into());
        }
        let mut want: Vec<_> = self
            .live
            .iter()
            .map(|l| (l.alloc.ptr().get(), l.alloc.size(), l.alloc.requested()))
            .collect();
        let mut want_pending: Vec<_> = self
            .pending
            .iter()
            .map(|p| (p.start, p.size, p.requested))
            .collect();
        want.sort_unstable();
        want_pending.sort_unstable();
        live_blocks.sort_unstable();
        pending_blocks.sort_unstable();
        if want != live_blocks || want_pending != pending_blocks {
            return Err("snapshot blocks differ from the model's live and pending blocks".into());
        }
        Ok(())
    }
}

/// Checks one allocation against the backend it came from, for callers that hold an `Observed`.
pub fn no_overlap(live: &[Live]) -> Result<(), TestCaseError> {
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .map(|l| {
            let a = &l.alloc;
            (a.ptr().get(), a.ptr().get() + a.size() as u64)
        })
        .collect();
    spans.sort_unstable();
    prop_assert!(
        spans.windows(2).all(|w| w[0].1 <= w[1].0),
        "live allocations overlap"
    );
    for l in live {
        let a = &l.alloc;
        prop_assert!(a.ptr().get() % 512 == 0 && a.size() >= a.requested() && a.size() % 512 == 0);
    }
    Ok(())
}
