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
//!   the gap pieces are exactly what no chunk covers; stuck and parked chunks lie in gaps;
//! * `Σ free + Σ live + Σ pending == mapped_bytes`; `parked_bytes == Σ parked chunk.len`.

use std::collections::BTreeMap;

use crate::backend::{PhysHandle, StreamId};
use crate::expandable::pieces::{PieceId, Pieces};
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
    /// start address -> chunk. Changed only through `add_chunk` / `remove_chunk`.
    pub(crate) chunks: BTreeMap<u64, Chunk>,
    /// The slot of the best-fit index of (stream, pool) in `State::index`.
    pub(crate) slot: u32,
    /// The last piece of the tiling (Note [Pieces]): its index never changes.
    pub(crate) tail: PieceId,
    /// start -> gap piece: where growth finds the holes and the pieces around them (Note
    /// [Holes from gaps]).
    pub(crate) gaps: BTreeMap<u64, PieceId>,
    pub(crate) mapped_bytes: usize,
    /// Chunks a rolled-back growth could not unmap (Note [Stuck chunks] in `growth.rs`): still
    /// mapped in the backend, never handed out, not counted in `mapped_bytes`.
    /// Changed only through `add_stuck` / `remove_stuck`.
    pub(crate) stuck: BTreeMap<u64, Chunk>,
    /// Old mappings of handles remapped elsewhere without a synchronization (Note [Parked
    /// pages] in `release.rs`): still mapped, never handed out, not counted in `mapped_bytes`;
    /// the handle belongs to where it was remapped. Changed only through `add_parked`,
    /// `remove_parked` and `take_parked`.
    pub(crate) parked: BTreeMap<u64, Chunk>,
    /// Bytes of the parked chunks, kept by the three functions that change `parked`: the
    /// statistics read it on every call, where summing `parked` cost 800 instructions per call
    /// on the churn bench's full device.
    pub(crate) parked_bytes: usize,
    /// Which segment of the allocator's life this is (0 for the first reserved): where two
    /// segments are ordered for a decision, they are ordered by this, never by address (Note
    /// [Segment order] in `growth.rs`).
    pub(crate) seq: u64,
    /// Addresses reserved with the segment right after `va`, outside its tiling, for an alias
    /// rescue (Note [Rescue space] in `rescue.rs`); 0 for none.
    pub(crate) rescue_space: usize,
    /// Whether a rescue holds the rescue space (or mappings the driver would not take out of
    /// it): the segment's reservation is not freed then.
    pub(crate) rescue_space_busy: bool,
}

impl Segment {
    /// A segment over `va` whose tiling is the single gap piece `tail`.
    pub(crate) fn new(
        va: VaRange,
        stream: StreamId,
        pool: PoolKind,
        slot: u32,
        tail: PieceId,
        seq: u64,
    ) -> Self {
        Self {
            seq,
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
            parked_bytes: 0,
            rescue_space: 0,
            rescue_space_busy: false,
        }
    }

    /// Whether the segment maps no chunk and holds no rescue in its rescue space: unless a
    /// stuck or parked mapping remains, it may go (its reservation freed).
    pub(crate) fn holds_nothing(&self) -> bool {
        self.chunks.is_empty() && !self.rescue_space_busy
    }

    /// The whole reservation: the segment's addresses and its rescue space after them.
    pub(crate) fn reservation(&self) -> VaRange {
        VaRange {
            start: self.va.start,
            len: self.va.len + self.rescue_space,
        }
    }

    pub(crate) fn start(&self) -> u64 {
        self.va.start.get()
    }

    pub(crate) fn end(&self) -> u64 {
        self.va.start.get() + self.va.len as u64
    }

    /// The unmapped holes, in address order, as `(start, end)`; with `over_parked`, parked
    /// chunks count as unmapped (growth may map there once it unparks them, Note [Parked pages]
    /// in `parked.rs`). Stuck chunks are never a hole: they are still mapped, and mapping over
    /// them would fail.
    ///
    /// Note [Holes from gaps]: the gap pieces are exactly what no chunk covers (checked by
    /// `check`), and stuck and parked chunks lie in them, so the holes are the gaps less those.
    /// Maps of the mapped runs kept beside the chunk map (with parked chunks and without) cost
    /// two B-tree updates each per chunk mapped, unmapped or parked: about a fifth of the churn
    /// bench's full-device run.
    pub(crate) fn holes<'a>(
        &'a self,
        pieces: &'a Pieces,
        over_parked: bool,
    ) -> impl Iterator<Item = (u64, u64)> + 'a {
        self.gaps.values().flat_map(move |&id| {
            let p = pieces.get(id);
            self.gap_holes(p.start, p.end(), over_parked)
        })
    }

    /// The holes inside the gap piece `[start, end)`: the gap less the stuck chunks in it and,
    /// unless `over_parked`, less the parked ones (Note [Holes from gaps]).
    pub(crate) fn gap_holes(
        &self,
        start: u64,
        end: u64,
        over_parked: bool,
    ) -> impl Iterator<Item = (u64, u64)> + '_ {
        let parked = self
            .parked
            .range(if over_parked { end..end } else { start..end });
        holes_less(start, end, self.stuck.range(start..end), parked)
    }

    /// Whether a parked chunk lies in `[at, end)`.
    pub(crate) fn parked_in(&self, at: u64, end: u64) -> bool {
        self.parked
            .range(..end)
            .next_back()
            .is_some_and(|(&s, c)| s + c.len as u64 > at)
    }

    /// Whether a chunk (not stuck, not parked) overlaps `[at, end)`: for `check`, which asks it
    /// of every gap piece (Note [Holes from gaps]).
    pub(crate) fn chunk_in(&self, at: u64, end: u64) -> bool {
        self.chunks
            .range(..end)
            .next_back()
            .is_some_and(|(&s, c)| s + c.len as u64 > at)
    }

    pub(crate) fn add_chunk(&mut self, at: u64, chunk: Chunk) {
        self.chunks.insert(at, chunk);
    }

    pub(crate) fn remove_chunk(&mut self, at: u64) -> Option<Chunk> {
        self.chunks.remove(&at)
    }

    pub(crate) fn add_stuck(&mut self, at: u64, chunk: Chunk) {
        self.stuck.insert(at, chunk);
    }

    pub(crate) fn remove_stuck(&mut self, at: u64) -> Option<Chunk> {
        self.stuck.remove(&at)
    }

    pub(crate) fn add_parked(&mut self, at: u64, chunk: Chunk) {
        self.parked.insert(at, chunk);
        self.parked_bytes += chunk.len;
    }

    /// Takes every parked chunk out.
    pub(crate) fn take_parked(&mut self) -> BTreeMap<u64, Chunk> {
        self.parked_bytes = 0;
        std::mem::take(&mut self.parked)
    }

    pub(crate) fn remove_parked(&mut self, at: u64) -> Option<Chunk> {
        let chunk = self.parked.remove(&at)?;
        self.parked_bytes -= chunk.len;
        Some(chunk)
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

/// The holes of `[start, end)` less the chunks of `stuck` and `parked` (each in address order,
/// all inside the range), in address order.
pub(crate) fn holes_less<'a>(
    start: u64,
    end: u64,
    stuck: impl Iterator<Item = (&'a u64, &'a Chunk)>,
    parked: impl Iterator<Item = (&'a u64, &'a Chunk)>,
) -> impl Iterator<Item = (u64, u64)> {
    let (mut stuck, mut parked) = (stuck.peekable(), parked.peekable());
    let mut cursor = start;
    std::iter::from_fn(move || loop {
        if cursor >= end {
            return None;
        }
        // The next stuck or parked chunk, in address order.
        let s = stuck.peek().map(|(&at, _)| at);
        let p = parked.peek().map(|(&at, _)| at);
        let next = match (s, p) {
            (Some(a), Some(b)) if b < a => parked.next(),
            (Some(_), _) => stuck.next(),
            (None, Some(_)) => parked.next(),
            (None, None) => None,
        };
        let (hole_end, after) = match next {
            Some((&at, c)) => (at, at + c.len as u64),
            None => (end, end),
        };
        let hole = (hole_end > cursor).then_some((cursor, hole_end));
        cursor = after;
        if hole.is_some() {
            return hole;
        }
    })
}
