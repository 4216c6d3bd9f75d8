//! The fully-free chunks of each free piece, remembered between the walks of pressured growths.
//!
//! Note [Chunk cache]: a pressured growth lists every fully-free chunk (Note [Harvest list] in
//! `growth.rs`): a walk down each segment's tiling and, for every free piece of a granule or
//! more, a search of the chunk map for the chunks inside it (Note [Free chunk walk] in
//! `free_ranges.rs`). On the churn bench's full device (`replay/benches/churn.rs`, max256MiB)
//! those searches were a third of the run, and between two growths only the few pieces that a
//! handful of allocations and frees touched had changed. The chunks inside a free piece change
//! only when the piece does: a chunk is unmapped only out of a free piece (which is split, or
//! becomes a gap), and mapped only into a gap (which becomes free by merging into a piece).
//! Every change of a piece (made, split, merged, another kind) gives it a new stamp from the
//! arena's clock (`pieces.rs`), so a free piece whose stamp is the one recorded with its chunks
//! still holds exactly those chunks; any other is searched again. Stamps are the clock's low
//! 32 bits: the cache is emptied before the clock has moved 2^32 since it was started, so two
//! different changes never share a stamp while an entry lives. Allocate and free pay one clock
//! tick per change of a piece, no lookup. `check` compares every valid entry with a search.

use std::cell::Cell;

use crate::backend::Backend;
use crate::expandable::pieces::{Kind, PieceId, NIL};
use crate::expandable::segment::{Chunk, FreeChunk, Segment, SegmentKey};
use crate::expandable::state::State;
use crate::mechanism::violation::InvariantViolation;

/// The chunks found inside one free piece, highest address first, and its stamp then.
#[derive(Debug, Default)]
struct Entry {
    stamp: u32,
    filled: bool,
    chunks: Vec<(u64, Chunk)>,
}

/// The cache: one entry per arena index.
#[derive(Debug, Default)]
pub(crate) struct ChunkCache {
    entries: Vec<Entry>,
    /// The arena's clock when the cache was last emptied.
    started: u64,
}

impl ChunkCache {
    /// Empties the cache if its stamps could repeat (Note [Chunk cache]).
    fn refresh(&mut self, clock: u64) {
        if clock - self.started >= u64::from(u32::MAX) {
            self.entries.clear();
            self.started = clock;
        }
    }

    /// The chunks recorded for piece `id` if its stamp is still `stamp`.
    fn get(&self, id: PieceId, stamp: u32) -> Option<&[(u64, Chunk)]> {
        let e = self.entries.get(id.index())?;
        (e.filled && e.stamp == stamp).then_some(&e.chunks[..])
    }

    /// Records `chunks` for piece `id` at `stamp`.
    fn put(&mut self, id: PieceId, stamp: u32, chunks: impl Iterator<Item = (u64, Chunk)>) {
        let i = id.index();
        if i >= self.entries.len() {
            self.entries.resize_with(i + 1, Entry::default);
        }
        let e = &mut self.entries[i];
        e.stamp = stamp;
        e.filled = true;
        e.chunks.clear();
        e.chunks.extend(chunks);
    }
}

impl<B: Backend> State<B> {
    /// Appends the fully-free chunks of segment `key` to `out`, highest address first, with the
    /// cache's help (Note [Chunk cache]); returns how many were appended.
    pub(crate) fn free_chunks_cached(
        &mut self,
        key: SegmentKey,
        out: &mut Vec<(SegmentKey, FreeChunk)>,
    ) -> usize {
        let from = out.len();
        self.chunk_cache.refresh(self.pieces.clock());
        let seg = &self.segments[&key];
        // Every chunk is a whole number of granules: a shorter free piece holds none.
        let granule = self.granularity;
        let mut id = seg.tail;
        while id != NIL {
            // Only the link, the kind and the length are read for most pieces (used pieces
            // and gaps): this walk runs over every piece on every pressured growth.
            let p = self.pieces.get(id);
            let piece = id;
            id = p.prev;
            if p.kind != Kind::Free || p.len < granule {
                continue;
            }
            let p = *p;
            let found = |(at, chunk): (u64, Chunk)| (key, FreeChunk { at, chunk, piece });
            if let Some(chunks) = self.chunk_cache.get(piece, p.stamp) {
                // Most free pieces hold no whole chunk: nothing to copy.
                if !chunks.is_empty() {
                    out.extend(chunks.iter().copied().map(found));
                }
                continue;
            }
            let steps = Some(&self.chunk_walk_steps);
            let inside = chunks_inside(seg, p.start, p.end(), steps).flatten();
            let before = out.len();
            out.extend(inside.map(found));
            let listed = out[before..].iter().map(|(_, c)| (c.at, c.chunk));
            self.chunk_cache.put(piece, p.stamp, listed);
        }
        out.len() - from
    }

    /// Every entry still valid for its piece (same stamp) holds exactly the chunks inside it.
    pub(crate) fn check_chunk_cache(&self) -> Result<(), InvariantViolation> {
        for seg in self.segments.values() {
            for id in self.pieces.tiling(seg.tail) {
                let p = self.pieces.get(id);
                let Some(cached) = self.chunk_cache.get(id, p.stamp) else {
                    continue;
                };
                let real: Vec<(u64, Chunk)> = if p.kind == Kind::Free {
                    chunks_inside(seg, p.start, p.end(), None)
                        .flatten()
                        .collect()
                } else {
                    Vec::new()
                };
                if real != cached {
                    return Err(InvariantViolation::Count {
                        what: "chunk cache: chunks recorded for a piece, against the chunks \
                               inside it",
                        kept: cached.len(),
                        found: real.len(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The chunks of `seg` inside `[start, end)`, highest first (`None` for one that sticks out of
/// the range); each chunk the search examines, the one below that ends it too, counts a step in
/// `steps` (Note [Free chunk walk]). A one-sided range: one search down the tree, not two.
fn chunks_inside<'a>(
    seg: &'a Segment,
    start: u64,
    end: u64,
    steps: Option<&'a Cell<u64>>,
) -> impl Iterator<Item = Option<(u64, Chunk)>> + 'a {
    seg.chunks
        .range(..end)
        .rev()
        .inspect(move |_| {
            if let Some(s) = steps {
                s.set(s.get() + 1);
            }
        })
        .take_while(move |(&at, _)| at >= start)
        .map(move |(&at, &c)| (at + c.len as u64 <= end).then_some((at, c)))
}
