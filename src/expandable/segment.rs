//! One segment: a reserved VA range that grows in place by mapping pages.
//!
//! ```text
//!  va.start                                                                va.start + va.len
//!  ├── chunk ──┬── chunk ──┬── chunk ──┤  unmapped hole  ├── chunk ──┤  unmapped tail ...  │
//!  │ live │ free range     │ live │fr.│                  │ free      │                      │
//! ```
//!
//! A *chunk* is one physical handle mapped whole with one `map` call (a page, or a larger or
//! smaller handle harvested from elsewhere); it can only be unmapped whole. The VA is tiled into
//! pieces (Note [Pieces] in `pieces.rs`): free ranges lie in mapped memory only, never span a
//! hole, and are always coalesced with their neighbours, so two free ranges never touch.
//! Invariants (checked by `check`):
//! * chunks do not overlap and lie inside `va`; `mapped_bytes == Σ chunk.len`;
//! * the pieces cover `va`; every free piece and every block lies inside contiguous chunks, and
//!   the gap pieces are exactly what no chunk covers;
//! * `Σ free + Σ live + Σ pending == mapped_bytes`.

use std::collections::BTreeMap;

use crate::backend::{PhysHandle, StreamId};
use crate::expandable::pieces::PieceId;
use crate::stats::PoolKind;
use crate::units::VaRange;

/// The key of a segment among the allocator's segments: the start of its reservation. Its field
/// is private to this module, so a block's address or an offset cannot stand in for one: a key
/// comes from a segment's reservation ([`SegmentKey::of`]), or is a search bound built from an
/// address on purpose ([`SegmentKey::search`]). As cheap as the `u64` it wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct SegmentKey(u64);

impl SegmentKey {
    /// The least and greatest keys: bounds of a range over every segment.
    pub(crate) const MIN: SegmentKey = SegmentKey(0);
    pub(crate) const MAX: SegmentKey = SegmentKey(u64::MAX);

    /// The key of the segment reserved at `va`.
    pub(crate) fn of(va: &VaRange) -> Self {
        Self(va.start.get())
    }

    /// A bound for a range search: the segment that may hold `addr` is the last key at or below
    /// it.
    pub(crate) const fn search(addr: u64) -> Self {
        Self(addr)
    }

    /// The segment's start address.
    pub(crate) const fn start(self) -> u64 {
        self.0
    }
}

/// A handle mapped whole at one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) handle: PhysHandle,
    pub(crate) len: usize,
}

/// A chunk with nothing allocated in it, and the free piece that holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FreeChunk {
    pub(crate) at: u64,
    pub(crate) chunk: Chunk,
    pub(crate) piece: PieceId,
}

#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) va: VaRange,
    pub(crate) stream: StreamId,
    pub(crate) pool: PoolKind,
    /// start address -> chunk. Changed only through `add_chunk` / `remove_chunk`, which keep
    /// `occupied` in step.
    pub(crate) chunks: BTreeMap<u64, Chunk>,
    /// The slot of the best-fit index of (stream, pool) in `State::index`.
    pub(crate) slot: u32,
    /// The last piece of the tiling (Note [Pieces]): its index never changes.
    pub(crate) tail: PieceId,
    /// start -> gap piece: where growth finds the pieces around a hole.
    pub(crate) gaps: BTreeMap<u64, PieceId>,
    pub(crate) mapped_bytes: usize,
    /// Chunks a rolled-back growth could not unmap (Note [Stuck chunks] in `growth.rs`): still
    /// mapped in the backend, never handed out, not counted in `mapped_bytes`.
    /// Changed only through `add_stuck` / `remove_stuck`.
    pub(crate) stuck: BTreeMap<u64, Chunk>,
    /// Old mappings of handles remapped elsewhere without a synchronization (Note [Parked
    /// pages] in `release.rs`): still mapped, never handed out, not counted in `mapped_bytes`;
    /// the handle belongs to where it was remapped. Changed only through `add_parked` /
    /// `remove_parked`.
    pub(crate) parked: BTreeMap<u64, Chunk>,
    /// start -> end of each maximal run of chunks, stuck and parked chunks: the mapped parts of
    /// `va`, so that finding a hole walks the holes, not every chunk (growth asks on every page
    /// it maps; collecting all chunks each time was a fifth of a replay's time).
    occupied: BTreeMap<u64, u64>,
    /// The same runs without the parked chunks: what growth may map over once it unparks them
    /// (Note [Parked pages] in `parked.rs`).
    solid: BTreeMap<u64, u64>,
}

impl Segment {
    /// A segment over `va` whose tiling is the single gap piece `tail`.
    pub(crate) fn new(
        va: VaRange,
        stream: StreamId,
        pool: PoolKind,
        slot: u32,
        tail: PieceId,
    ) -> Self {
        Self {
            gaps: BTreeMap::from([(va.start.get(), tail)]),
            va,
            stream,
            pool,
            slot,
            tail,
            chunks: BTreeMap::new(),
            mapped_bytes: 0,
            stuck: BTreeMap::new(),
            parked: BTreeMap::new(),
            occupied: BTreeMap::new(),
            solid: BTreeMap::new(),
        }
    }

    pub(crate) fn start(&self) -> u64 {
        self.va.start.get()
    }

    pub(crate) fn end(&self) -> u64 {
        self.va.start.get() + self.va.len as u64
    }

    /// The unmapped holes, in address order, as `(start, end)`. Stuck and parked chunks are no
    /// hole: they are still mapped, and mapping over them would fail.
    pub(crate) fn holes(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.holes_between(&self.occupied)
    }

    /// The holes growth may map once it unparks the parked chunks in them: parked chunks count
    /// as unmapped (Note [Parked pages] in `parked.rs`).
    pub(crate) fn holes_unparked(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.holes_between(&self.solid)
    }

    /// Whether a parked chunk lies in `[at, end)`.
    pub(crate) fn parked_in(&self, at: u64, end: u64) -> bool {
        self.parked
            .range(..end)
            .next_back()
            .is_some_and(|(&s, c)| s + c.len as u64 > at)
    }

    fn holes_between<'a>(
        &'a self,
        runs: &'a BTreeMap<u64, u64>,
    ) -> impl Iterator<Item = (u64, u64)> + 'a {
        let mut cursor = self.start();
        let end = self.end();
        runs.iter()
            .map(|(&s, &e)| (s, e))
            .chain(std::iter::once((end, end)))
            .filter_map(move |(s, e)| {
                let hole = (s > cursor).then_some((cursor, s));
                cursor = e;
                hole
            })
    }

    pub(crate) fn add_chunk(&mut self, at: u64, chunk: Chunk) {
        self.chunks.insert(at, chunk);
        self.occupy(at, at + chunk.len as u64, true);
    }

    pub(crate) fn remove_chunk(&mut self, at: u64) -> Option<Chunk> {
        let chunk = self.chunks.remove(&at)?;
        self.vacate(at, at + chunk.len as u64, true);
        Some(chunk)
    }

    pub(crate) fn add_stuck(&mut self, at: u64, chunk: Chunk) {
        self.stuck.insert(at, chunk);
        self.occupy(at, at + chunk.len as u64, true);
    }

    pub(crate) fn remove_stuck(&mut self, at: u64) -> Option<Chunk> {
        let chunk = self.stuck.remove(&at)?;
        self.vacate(at, at + chunk.len as u64, true);
        Some(chunk)
    }

    pub(crate) fn add_parked(&mut self, at: u64, chunk: Chunk) {
        self.parked.insert(at, chunk);
        self.occupy(at, at + chunk.len as u64, false);
    }

    pub(crate) fn remove_parked(&mut self, at: u64) -> Option<Chunk> {
        let chunk = self.parked.remove(&at)?;
        self.vacate(at, at + chunk.len as u64, false);
        Some(chunk)
    }

    /// Whether `occupied` is exactly the runs of `chunks`, `stuck` and `parked`, and `solid`
    /// those of `chunks` and `stuck`: for `check`.
    pub(crate) fn occupied_is_consistent(&self) -> bool {
        let solid = self.chunks.iter().chain(&self.stuck);
        let runs = |m: &BTreeMap<u64, u64>| m.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>();
        Self::runs_of(solid.clone()) == runs(&self.solid)
            && Self::runs_of(solid.chain(&self.parked)) == runs(&self.occupied)
    }

    fn runs_of<'a>(chunks: impl Iterator<Item = (&'a u64, &'a Chunk)>) -> Vec<(u64, u64)> {
        let mut taken: Vec<(u64, u64)> = chunks.map(|(&at, c)| (at, at + c.len as u64)).collect();
        taken.sort_unstable();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (s, e) in taken {
            match runs.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => runs.push((s, e)),
            }
        }
        runs
    }

    /// `[at, end)` became mapped (`solid`: by a chunk or a stuck chunk, not a parked one):
    /// merge it with the runs it touches.
    fn occupy(&mut self, at: u64, end: u64, solid: bool) {
        Self::occupy_in(&mut self.occupied, at, end);
        if solid {
            Self::occupy_in(&mut self.solid, at, end);
        }
    }

    fn occupy_in(runs: &mut BTreeMap<u64, u64>, at: u64, end: u64) {
        let mut start = at;
        let before = runs.range(..=at).next_back().map(|(&s, &e)| (s, e));
        if let Some((s, e)) = before.filter(|&(_, e)| e == at) {
            runs.remove(&s);
            start = s;
            debug_assert_eq!(e, at);
        }
        let end = runs.remove(&end).unwrap_or(end);
        runs.insert(start, end);
    }

    /// `[at, end)` is no longer mapped: split the runs holding it.
    fn vacate(&mut self, at: u64, end: u64, solid: bool) {
        Self::vacate_in(&mut self.occupied, at, end);
        if solid {
            Self::vacate_in(&mut self.solid, at, end);
        }
    }

    fn vacate_in(runs: &mut BTreeMap<u64, u64>, at: u64, end: u64) {
        let run = runs.range(..=at).next_back().map(|(&s, &e)| (s, e));
        let Some((s, e)) = run.filter(|&(_, e)| e >= end) else {
            debug_assert!(false, "vacating {at:#x}..{end:#x}, which is not occupied");
            return;
        };
        runs.remove(&s);
        if s < at {
            runs.insert(s, at);
        }
        if end < e {
            runs.insert(end, e);
        }
    }

    /// The last gap piece starting at or before `at` (the caller checks that it reaches `at`).
    pub(crate) fn gap_before(&self, at: u64) -> Option<PieceId> {
        self.gaps.range(..=at).next_back().map(|(_, &id)| id)
    }

    /// Whether `[at, at + len)` lies in contiguous chunks.
    pub(crate) fn is_mapped(&self, at: u64, len: usize) -> bool {
        let end = at + len as u64;
        let mut cursor = at;
        let first = self.chunks.range(..=at).next_back();
        for (&s, c) in first.into_iter().chain(self.chunks.range(at + 1..end)) {
            let c_end = s + c.len as u64;
            if c_end <= cursor {
                continue;
            }
            if s > cursor {
                return false;
            }
            cursor = c_end;
            if cursor >= end {
                return true;
            }
        }
        cursor >= end
    }
}
