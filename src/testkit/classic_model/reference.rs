//! The reference model of the classic allocator: plain vectors of what is live and what waits for
//! events, PyTorch's placement rules (best fit, oversize limits, `should_split`,
//! `get_allocation_size`) written out from reference §1.5–1.7, and every check that compares the
//! allocator with them.
//!
//! Written apart from `expandable_model/reference.rs` (the expandable allocator's model, private
//! to its module): classic blocks never unmap, merge only inside one device allocation and are placed
//! by rules the model can predict exactly, so the two share ideas but little code.

use crate::config::AllocConf;
use crate::snapshot::{BlockState, Snapshot};
use crate::stats::{PoolKind, StatArray};
use crate::{Allocation, MemoryStats, StreamId};

use crate::testkit::pytorch_rounding::{segment_size, MIN_BLOCK_SIZE, SMALL_SIZE};

/// What the model knows about one live allocation.
pub struct Live {
    pub alloc: Allocation,
    pub pool: PoolKind,
    /// Streams it was recorded on (other than its own).
    pub uses: Vec<StreamId>,
}

/// One event recorded at a free: on `stream`, whose generation was `gen` and which was `held`
/// then; `popped` once the allocator has seen it complete.
struct Event {
    stream: StreamId,
    gen: u64,
    held: bool,
    popped: bool,
}

/// A block freed with uses on other streams, active until all its events complete and the
/// allocator next looks at them (the start of a `malloc`), or it synchronizes them.
struct Pending {
    stream: StreamId,
    start: u64,
    size: usize,
    requested: usize,
    pool: PoolKind,
    events: Vec<Event>,
}

/// `[all, small_pool, large_pool]`.
type Sums = [u64; 3];

fn idx(p: PoolKind) -> usize {
    match p {
        PoolKind::Small => 1,
        PoolKind::Large => 2,
    }
}

/// The pool of a rounded request (≤ 1 MiB is small).
pub fn pool_of(rounded: usize) -> PoolKind {
    if rounded <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// The rules of `max_split_size` and friends, from the configuration in force.
pub struct Rules {
    pub max_split: usize,
    pub max_non_split_rounding: usize,
    pub large_segment_size: usize,
}

impl Rules {
    pub fn new(conf: &AllocConf) -> Self {
        Self {
            max_split: conf.max_split_size.unwrap_or(usize::MAX),
            max_non_split_rounding: conf.max_non_split_rounding,
            large_segment_size: conf.large_segment_size,
        }
    }

    /// `get_free_block`'s oversize rules: may a cached block of `len` serve `rounded`?
    pub fn may_serve(&self, len: usize, rounded: usize) -> bool {
        let oversize_for_small = rounded < self.max_split && len >= self.max_split;
        let too_loose =
            rounded >= self.max_split && len >= rounded.saturating_add(self.max_non_split_rounding);
        !oversize_for_small && !too_loose
    }

    /// The size an allocation of `rounded` gets from a block of `len`: split off (`should_split`)
    /// or the whole block.
    pub fn usable(&self, pool: PoolKind, len: usize, rounded: usize) -> usize {
        let remaining = len - rounded;
        let split = match pool {
            PoolKind::Small => remaining >= MIN_BLOCK_SIZE,
            PoolKind::Large => rounded < self.max_split && remaining > SMALL_SIZE,
        };
        if split {
            rounded
        } else {
            len
        }
    }

    /// `get_allocation_size`: a new segment for `rounded` (the model's own, `rounding.rs`).
    pub fn segment_size(&self, rounded: usize) -> usize {
        segment_size(rounded, self.large_segment_size)
    }
}

/// A free block the allocator may hand out: (stream, pool, address, size).
pub type Free = (StreamId, PoolKind, u64, usize);

/// The free blocks of `snap` once the pending blocks starting at `done` are freed too: their runs
/// with inactive neighbours coalesce, as `free_block` merges them.
pub fn free_blocks(snap: &Snapshot, done: &[u64]) -> Vec<Free> {
    let mut out = Vec::new();
    for seg in &snap.segments {
        let mut run: Option<(u64, usize)> = None;
        for b in &seg.blocks {
            let free = b.state == BlockState::Inactive
                || (b.state == BlockState::ActivePendingFree && done.contains(&b.address.get()));
            run = match (free, run) {
                (true, Some((at, len))) => Some((at, len + b.size)),
                (true, None) => Some((b.address.get(), b.size)),
                (false, r) => {
                    out.extend(r.map(|(at, len)| (seg.stream, seg.pool, at, len)));
                    None
                }
            };
        }
        out.extend(run.map(|(at, len)| (seg.stream, seg.pool, at, len)));
    }
    out
}

/// `lower_bound({stream, size})` over one pool: the smallest free block of `stream` holding
/// `rounded`, lowest address on ties.
pub fn best_fit(free: &[Free], stream: StreamId, pool: PoolKind, rounded: usize) -> Option<Free> {
    free.iter()
        .filter(|f| f.0 == stream && f.1 == pool && f.3 >= rounded)
        .min_by_key(|f| (f.3, f.2))
        .copied()
}

#[derive(Default)]
pub struct Model {
    pub live: Vec<Live>,
    pending: Vec<Pending>,
    /// Peaks of [allocated_bytes, active_bytes, requested_bytes, allocation, active].
    peaks: [Sums; 5],
    /// What `sequences_reach_the_interesting_states` wants to see.
    pub pending_held: u64,
    pub blocked_reuse: u64,
    pub merges: u64,
}

impl Model {
    /// A new allocation: it must not touch a block some stream may still be using. Counts it as
    /// blocked when a pending block of its stream would have held it.
    pub fn allocated(&mut self, alloc: Allocation, pool: PoolKind) -> Result<(), String> {
        let (s, e) = (alloc.ptr().get(), alloc.ptr().get() + alloc.size() as u64);
        let mut blocked = false;
        for p in &self.pending {
            if s < p.start + p.size as u64 && p.start < e {
                return Err(format!(
                    "{alloc:?} reuses {:#x}+{:#x}, which stream(s) {:?} may still be using",
                    p.start,
                    p.size,
                    p.events.iter().map(|e| e.stream).collect::<Vec<_>>()
                ));
            }
            blocked |= p.stream == alloc.stream() && p.size >= alloc.size();
        }
        self.blocked_reuse += blocked as u64;
        self.live.push(Live {
            alloc,
            pool,
            uses: Vec::new(),
        });
        Ok(())
    }

    /// `l` was freed: with uses on other streams it waits for an event on each.
    pub fn freed(&mut self, l: Live, held: &[StreamId], gen: impl Fn(StreamId) -> u64) {
        if l.uses.is_empty() {
            return;
        }
        if l.uses.iter().any(|s| held.contains(s)) {
            self.pending_held += 1;
        }
        let a = &l.alloc;
        self.pending.push(Pending {
            stream: a.stream(),
            start: a.ptr().get(),
            size: a.size(),
            requested: a.requested(),
            pool: l.pool,
            events: l
                .uses
                .iter()
                .map(|&s| Event {
                    stream: s,
                    gen: gen(s),
                    held: held.contains(&s),
                    popped: false,
                })
                .collect(),
        });
    }

    /// `process_events` at the start of a `malloc`, with the stream generations of that moment:
    /// completed events are popped; blocks whose events all completed are freed. Returns their
    /// addresses.
    pub fn process(&mut self, gen: impl Fn(StreamId) -> u64) -> Vec<u64> {
        for e in self.pending.iter_mut().flat_map(|p| &mut p.events) {
            e.popped |= !e.held || gen(e.stream) > e.gen;
        }
        let (done, left): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.events.iter().all(|e| e.popped));
        self.pending = left;
        done.iter().map(|p| p.start).collect()
    }

    /// The allocator synchronized every stream its pending blocks wait on (empty_cache, the
    /// free-everything retry).
    pub fn process_all(&mut self) {
        self.pending.clear();
    }

    /// Events recorded and not yet popped: what the backend must still hold.
    pub fn outstanding_events(&self) -> usize {
        self.pending
            .iter()
            .flat_map(|p| &p.events)
            .filter(|e| !e.popped)
            .count()
    }

    /// The model's sums: [allocated_bytes, active_bytes, requested_bytes, allocation, active].
    fn sums(&self) -> [Sums; 5] {
        let mut s = [[0u64; 3]; 5];
        let mut add = |pool: PoolKind, stat: usize, n: u64| {
            s[stat][0] += n;
            s[stat][idx(pool)] += n;
        };
        for l in &self.live {
            let (size, requested) = (l.alloc.size() as u64, l.alloc.requested() as u64);
            for (stat, n) in [(0, size), (1, size), (2, requested), (3, 1), (4, 1)] {
                add(l.pool, stat, n);
            }
        }
        for p in &self.pending {
            for (stat, n) in [(1, p.size as u64), (2, p.requested as u64), (4, 1)] {
                add(p.pool, stat, n);
            }
        }
        s
    }

    /// Compares the five stats the model knows exactly, per pool and in total, current and peak.
    pub fn check_stats(&mut self, stats: &MemoryStats) -> Result<(), String> {
        let sums = self.sums();
        let arrays: [(&str, &StatArray); 5] = [
            ("allocated_bytes", &stats.allocated_bytes),
            ("active_bytes", &stats.active_bytes),
            ("requested_bytes", &stats.requested_bytes),
            ("allocation", &stats.allocation),
            ("active", &stats.active),
        ];
        for (i, (name, array)) in arrays.into_iter().enumerate() {
            let got = [array.all, array.small_pool, array.large_pool];
            for (j, pool) in ["all", "small_pool", "large_pool"].into_iter().enumerate() {
                let peak = &mut self.peaks[i][j];
                *peak = (*peak).max(sums[i][j]);
                let g = got[j];
                if (g.current, g.peak) != (sums[i][j], *peak) || g.allocated - g.freed != g.current
                {
                    return Err(format!(
                        "{name}.{pool}: allocator {g:?}, model current {} peak {peak}",
                        sums[i][j]
                    ));
                }
            }
        }
        Ok(())
    }

    /// The snapshot against the stats and the model: blocks tile each segment, free neighbours
    /// are merged, segments have `get_allocation_size` sizes, the live and pending blocks are the
    /// model's, each in a segment of its stream and pool, `reserved_bytes`, `segment` and
    /// `inactive_split*` are the snapshot's sums, and the oversize counters count what is at
    /// least `max_split_size`.
    pub fn check_snapshot(
        &self,
        stats: &MemoryStats,
        snap: &Snapshot,
        rules: &Rules,
        oversize: (u64, u64),
    ) -> Result<(), String> {
        let (mut reserved, mut segments) = ([0u64; 3], [0u64; 3]);
        let (mut split_count, mut split_bytes) = ([0u64; 3], [0u64; 3]);
        let mut live_blocks = Vec::new();
        let mut pending_blocks = Vec::new();
        let mut oversize_segments = 0;
        let mut end_of_last = 0;
        for seg in &snap.segments {
            let at = seg.address.get();
            if at < end_of_last {
                return Err(format!("segment {at:#x} overlaps the one before it"));
            }
            end_of_last = at + seg.total_size as u64;
            let (total, p) = (seg.total_size, idx(seg.pool));
            let size_ok = match seg.pool {
                PoolKind::Small => total == 2 * SMALL_SIZE,
                PoolKind::Large => {
                    total == rules.large_segment_size
                        || (total >= 10 * SMALL_SIZE && total.is_multiple_of(2 * SMALL_SIZE))
                }
            };
            if !size_ok || seg.mapped_size != total {
                return Err(format!(
                    "segment {at:#x}: {total:#x} bytes ({:?} pool, {:#x} mapped) is no cudaMalloc size",
                    seg.pool, seg.mapped_size
                ));
            }
            oversize_segments += (total >= rules.max_split) as u64;
            let mut cursor = at;
            let mut allocated = 0;
            for (i, b) in seg.blocks.iter().enumerate() {
                let (start, len) = (b.address.get(), b.size);
                if start != cursor || len == 0 || !len.is_multiple_of(MIN_BLOCK_SIZE) {
                    return Err(format!(
                        "segment {at:#x}: block {start:#x}+{len:#x} does not start where the last ended ({cursor:#x})"
                    ));
                }
                cursor += len as u64;
                let owner = (seg.stream, seg.pool);
                match b.state {
                    BlockState::ActiveAllocated => {
                        allocated += len;
                        live_blocks.push((start, len, b.requested_size, owner));
                    }
                    BlockState::ActivePendingFree => {
                        pending_blocks.push((start, len, b.requested_size, owner))
                    }
                    BlockState::Inactive => {
                        let next = seg.blocks.get(i + 1).map(|n| n.state);
                        if next == Some(BlockState::Inactive) {
                            return Err(format!(
                                "segment {at:#x}: free blocks at {start:#x} and after it were not merged"
                            ));
                        }
                        if seg.blocks.len() > 1 {
                            for x in [0, p] {
                                split_count[x] += 1;
                                split_bytes[x] += len as u64;
                            }
                        }
                    }
                    BlockState::Unmapped => {
                        return Err(format!("segment {at:#x}: an unmapped block in classic"))
                    }
                }
            }
            if cursor != at + total as u64 || allocated != seg.allocated_size {
                return Err(format!(
                    "segment {at:#x}: blocks end at {cursor:#x} and hold {allocated:#x} allocated bytes, not {total:#x} and {:#x}",
                    seg.allocated_size
                ));
            }
            for x in [0, p] {
                reserved[x] += total as u64;
                segments[x] += 1;
            }
        }
        let pools = |a: &StatArray| [a.all.current, a.small_pool.current, a.large_pool.current];
        for (name, got, want) in [
            ("reserved_bytes", &stats.reserved_bytes, reserved),
            ("segment", &stats.segment, segments),
            ("inactive_split", &stats.inactive_split, split_count),
            (
                "inactive_split_bytes",
                &stats.inactive_split_bytes,
                split_bytes,
            ),
        ] {
            if pools(got) != want {
                return Err(format!(
                    "{name} (all, small, large) {:?} but the snapshot sums to {want:?}",
                    pools(got)
                ));
            }
        }
        let mut want: Vec<_> = self
            .live
            .iter()
            .map(|l| {
                let a = &l.alloc;
                let owner = (a.stream(), l.pool);
                (a.ptr().get(), a.size(), a.requested(), owner)
            })
            .collect();
        let mut want_pending: Vec<_> = self
            .pending
            .iter()
            .map(|p| (p.start, p.size, p.requested, (p.stream, p.pool)))
            .collect();
        for v in [
            &mut want,
            &mut want_pending,
            &mut live_blocks,
            &mut pending_blocks,
        ] {
            v.sort_unstable_by_key(|b| b.0);
        }
        if want != live_blocks {
            return Err(format!(
                "live blocks (address, size, requested, (stream, pool)) of the snapshot {live_blocks:x?}, of the model {want:x?}"
            ));
        }
        if want_pending != pending_blocks {
            return Err(format!(
                "pending blocks of the snapshot {pending_blocks:x?}, of the model {want_pending:x?}"
            ));
        }
        let oversize_live = self
            .live
            .iter()
            .filter(|l| l.alloc.size() >= rules.max_split)
            .count() as u64;
        if oversize != (oversize_live, oversize_segments) {
            return Err(format!(
                "oversize (allocations, segments) {oversize:?}, model ({oversize_live}, {oversize_segments})"
            ));
        }
        Ok(())
    }
}

/// Live allocations never overlap; each is 512-aligned and holds what was asked for.
pub fn no_overlap(live: &[Live]) -> Result<(), String> {
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .map(|l| {
            (
                l.alloc.ptr().get(),
                l.alloc.ptr().get() + l.alloc.size() as u64,
            )
        })
        .collect();
    spans.sort_unstable();
    if let Some(w) = spans.windows(2).find(|w| w[0].1 > w[1].0) {
        return Err(format!("live allocations overlap: {w:x?}"));
    }
    for l in live {
        let a = &l.alloc;
        if !a.ptr().get().is_multiple_of(512) || a.size() < a.requested() {
            return Err(format!("{a:?} is misaligned or too small"));
        }
    }
    Ok(())
}
