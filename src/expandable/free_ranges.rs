//! The free ranges: every free range is a free piece of its segment's tiling (Note [Pieces] in
//! `pieces.rs`) and an entry of its (stream, pool)'s best-fit index, keyed (length, start,
//! piece). The functions here are the only ones that change either, so the two stay in step;
//! each marks its slot touched for the release index (Note [Release index]).

use crate::backend::Backend;
use crate::expandable::pieces::{Kind, PieceId, NIL};
use crate::expandable::segment::{FreeChunk, Segment, SegmentKey};
use crate::expandable::size_index::FreeRange;
use crate::expandable::state::State;

impl<B: Backend> State<B> {
    fn entry(&self, id: PieceId) -> FreeRange {
        let p = self.pieces.get(id);
        FreeRange::new(p.len, p.start, id)
    }

    /// Carves `take` bytes from the front of free piece `id` (indexed in `slot`) into a used
    /// piece, which is returned: what every allocation does, so it forgets the last free (Note
    /// [Last free] in `last_free.rs`: the carve may split its piece, also where a release inside
    /// the allocation completed that free just before). Inlined: with a second caller
    /// (`take_at`) the compiler stopped inlining it into `allocate`, 17 instructions more a
    /// cached pair (callgrind, 1 MiB beside 1,000 live blocks: 1,116 → 1,133).
    #[inline(always)]
    pub(super) fn take_front(&mut self, slot: u32, id: PieceId, take: usize) -> PieceId {
        self.last_free = None;
        self.releasable.touch(slot);
        let old = self.entry(id);
        if take == old.len {
            self.index.at_mut(slot).remove(old);
            self.pieces.set_kind(id, Kind::Used);
            return id;
        }
        let used = self.pieces.split_front(id, old.start + take as u64);
        self.pieces.set_kind(used, Kind::Used);
        self.index.at_mut(slot).replace(
            old,
            FreeRange::new(old.len - take, old.start + take as u64, id),
        );
        used
    }

    /// Carves `[at, at + take)` out of free piece `id` (indexed in `slot`), which holds it: the
    /// free bytes before it become a free piece of their own, `id` keeps those after it (or
    /// becomes the used piece, if none are). Returns the used piece. What settling a front
    /// arena does for each block it carved (Note [Front arena] in `front/arena.rs`).
    pub(crate) fn take_at(&mut self, slot: u32, id: PieceId, at: u64, take: usize) -> PieceId {
        let old = self.entry(id);
        debug_assert!(
            old.start <= at && at + take as u64 <= old.start + old.len as u64,
            "a block carved outside its free range"
        );
        if at > old.start {
            self.releasable.touch(slot);
            let before = (at - old.start) as usize;
            let front = self.pieces.split_front(id, at);
            let ix = self.index.at_mut(slot);
            ix.replace(old, FreeRange::new(old.len - before, at, id));
            ix.insert(FreeRange::new(before, old.start, front));
        }
        self.take_front(slot, id, take)
    }

    /// Makes piece `id` (a block's, or a gap just mapped) free, merged with the free pieces
    /// around it; returns the merged piece. What every free does: no lookup, the neighbours are
    /// linked (Note [Pieces]).
    pub(crate) fn make_free(&mut self, slot: u32, id: PieceId) -> PieceId {
        self.releasable.touch(slot);
        self.pieces.set_kind(id, Kind::Free);
        let (mut cur, mut replaced) = (id, None);
        let next = self.pieces.get(id).next;
        if self.pieces.kind(next) == Some(Kind::Free) {
            replaced = Some(self.entry(next));
            cur = self.pieces.merge_into_next(id);
        }
        let prev = self.pieces.get(cur).prev;
        if self.pieces.kind(prev) == Some(Kind::Free) {
            let e = self.entry(prev);
            match replaced {
                None => replaced = Some(e),
                Some(_) => {
                    self.index.at_mut(slot).remove(e);
                }
            }
            cur = self.pieces.merge_into_next(prev);
        }
        let merged = self.entry(cur);
        let ix = self.index.at_mut(slot);
        match replaced {
            Some(old) => ix.replace(old, merged),
            None => ix.insert(merged),
        }
        cur
    }

    /// Maps the tiling of `seg` over `[at, at + len)`, which lies in one gap piece: the range
    /// becomes free (merged with its free neighbours), and the merged free piece is returned.
    pub(crate) fn gap_to_free(&mut self, seg: SegmentKey, at: u64, len: usize) -> Option<PieceId> {
        // The run may merge with the last free's piece (Note [Last free] in `last_free.rs`).
        self.last_free = None;
        let s = self.segments.get_mut(&seg)?;
        let slot = s.slot;
        let g = s.gap_before(at)?;
        let p = *self.pieces.get(g);
        let end = at + len as u64;
        debug_assert!(p.kind == Kind::Gap && p.start <= at && end <= p.end());
        if p.start < at {
            let front = self.pieces.split_front(g, at);
            s.gaps.insert(p.start, front);
        } else {
            s.gaps.remove(&p.start);
        }
        let mapped = if end < p.end() {
            s.gaps.insert(end, g);
            self.pieces.split_front(g, end)
        } else {
            g
        };
        Some(self.make_free(slot, mapped))
    }

    /// Takes `[at, at + len)` out of free piece `id` of `seg` (unmapped: it becomes a gap,
    /// merged with the gaps around it). The piece keeps what follows the range, under its index;
    /// what precedes it, if anything, becomes a new free piece, returned.
    pub(crate) fn free_to_gap(
        &mut self,
        seg: SegmentKey,
        id: PieceId,
        at: u64,
        len: usize,
    ) -> Option<PieceId> {
        // The last free's piece may be this one (Note [Last free] in `last_free.rs`).
        self.last_free = None;
        let s = self.segments.get_mut(&seg)?;
        let p = *self.pieces.get(id);
        let end = at + len as u64;
        debug_assert!(p.kind == Kind::Free && p.start <= at && end <= p.end());
        self.releasable.touch(s.slot);
        let ix = self.index.at_mut(s.slot);
        ix.remove(FreeRange::new(p.len, p.start, id));
        let mut front = None;
        if p.start < at {
            let f = self.pieces.split_front(id, at);
            ix.insert(FreeRange::new((at - p.start) as usize, p.start, f));
            front = Some(f);
        }
        let mut gap = if end < p.end() {
            ix.insert(FreeRange::new((p.end() - end) as usize, end, id));
            self.pieces.split_front(id, end)
        } else {
            id
        };
        // The same merge as `make_free`'s, for gaps and the gap map. One helper for both cost
        // the hot allocate + free pair about 8 ns (measured), so each keeps its own.
        self.pieces.set_kind(gap, Kind::Gap);
        let next = self.pieces.get(gap).next;
        if self.pieces.kind(next) == Some(Kind::Gap) {
            s.gaps.remove(&self.pieces.get(next).start);
            gap = self.pieces.merge_into_next(gap);
        }
        let prev = self.pieces.get(gap).prev;
        if self.pieces.kind(prev) == Some(Kind::Gap) {
            // The merged gap starts where the gap before did: its entry changes piece, one
            // search instead of a removal and an insertion.
            let merged = self.pieces.merge_into_next(prev);
            if let Some(id) = s.gaps.get_mut(&self.pieces.get(merged).start) {
                *id = merged;
            }
            return front;
        }
        s.gaps.insert(self.pieces.get(gap).start, gap);
        front
    }

    /// The free pieces of `seg` as (start, length, piece), in address order: a walk of its
    /// tiling, no search and no sort.
    pub(crate) fn free_pieces(&self, seg: &Segment) -> Vec<(u64, usize, PieceId)> {
        self.pieces
            .tiling(seg.tail)
            .into_iter()
            .map(|id| (id, self.pieces.get(id)))
            .filter(|(_, p)| p.kind == Kind::Free)
            .map(|(id, p)| (p.start, p.len, id))
            .collect()
    }

    /// Whether `seg` has a chunk wholly inside a free piece: stops at the first one found. A
    /// walk of the tiling, for `check`'s reference: the allocator lists free chunks from the
    /// best-fit index (Note [Indexed chunk listing] in `chunk_cache.rs`).
    pub(crate) fn has_free_chunk(&self, seg: &Segment) -> bool {
        self.free_chunks_downward(seg).next().is_some()
    }

    /// The free chunks of `seg`, highest address first, found lazily.
    ///
    /// Note [Free chunk walk]: one walk down the tiling, and for each free piece only the chunks
    /// that start inside it (a range of the chunk map), never the chunks under live blocks. In
    /// the churn bench's full 16 GiB device (`replay/benches/churn.rs`, max256MiB) a walk met on
    /// average 613 chunks, 14 of them free, and 338 pieces, 81 of them free and a granule or
    /// longer; examining every chunk for each pressured growth's harvest list and each
    /// release-index update was a third of the run's time. (Those listings now find the free
    /// pieces in the best-fit index instead, Note [Indexed chunk listing]; the chunk search
    /// inside each is this one's.)
    fn free_chunks_downward<'a>(
        &'a self,
        seg: &'a Segment,
    ) -> impl Iterator<Item = FreeChunk> + 'a {
        // Every chunk is a whole number of granules: a shorter free piece holds none.
        let granule = self.granularity;
        let steps = &self.chunk_walk_steps;
        let mut id = seg.tail;
        let free_pieces = std::iter::from_fn(move || {
            while id != NIL {
                let (cur, p) = (id, self.pieces.get(id));
                id = p.prev;
                if p.kind == Kind::Free && p.len >= granule {
                    return Some((cur, p.start, p.end()));
                }
            }
            None
        });
        free_pieces.flat_map(move |(piece, start, end)| {
            // A one-sided range: one search down the tree, not two.
            seg.chunks
                .range(..end)
                .rev()
                .inspect(|_| steps.set(steps.get() + 1))
                .take_while(move |(&at, _)| at >= start)
                .filter(move |(&at, c)| at + c.len as u64 <= end)
                .map(move |(&at, &chunk)| FreeChunk { at, chunk, piece })
        })
    }
}
