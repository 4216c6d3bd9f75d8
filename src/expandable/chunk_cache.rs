//! The fully-free chunks of each free piece, remembered between the listings of pressured
//! growths, and those listings.
//!
//! Note [Chunk cache]: a pressured growth lists every fully-free chunk (Note [Harvest list] in
//! `growth.rs`): every free piece of a granule or more (Note [Indexed chunk listing] below) and,
//! for each, a search of the chunk map for the chunks inside it (Note [Free chunk walk] in
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
//!
//! Note [Indexed chunk listing]: the free pieces that can hold a chunk are found in the best-fit
//! index of their (stream, pool) slot, which holds exactly the slot's free pieces (`check`):
//! its bins from a granule's class up. The listing used to walk each segment's tiling, every
//! used piece and gap included, to find them; on the churn bench's full device at max 64 MiB a
//! listing walked about 1,000 pieces for the 140 free ones of a granule or more and the two
//! chunks among them, once per pressured growth (for the hopeless check and the harvest), once
//! more for the release index, and `release_cached` walked every filed segment again without
//! the cache: two fifths of the run. The index gives the 140 without the walk; a segment is
//! looked up (by address) only for a piece that holds a chunk or is not cached. The listing
//! comes in the bins' order: the harvest's choices do not depend on it (`best_candidate` takes
//! the greatest of a key no two candidates share; the hopeless check and the give-back rules
//! sum), so only Note [Drain after sync], which takes candidates in the list's order, sorts it
//! into the walk's (each slot's segments by `seq`, chunks by address); `release_cached` sorts
//! each slot's listing by (segment, address) once, and lists the slot again only after a
//! synchronization freed blocks. Every decision is the walk's (the shared traces' and every
//! generated workload's min-capacity runs, the churn bench's call counts): at max 64 MiB the
//! churn run takes 60 ms instead of 90 (Sim, this machine).

use std::cell::Cell;

use crate::backend::Backend;
use crate::expandable::pieces::{Kind, PieceId};
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
    /// Appends the fully-free chunks of every segment of index slot `slot` to `out`, each with
    /// its segment's `seq` and key, in no particular order, found from the slot's best-fit index with the cache's help (Note
    /// [Indexed chunk listing]); each segment that holds one is looked up once per free piece
    /// that holds one.
    pub(crate) fn slot_free_chunks(
        &mut self,
        slot: u32,
        out: &mut Vec<(u64, SegmentKey, FreeChunk)>,
    ) {
        self.chunk_cache.refresh(self.pieces.clock());
        let (segments, pieces) = (&self.segments, &self.pieces);
        let (cache, steps) = (&mut self.chunk_cache, Some(&self.chunk_walk_steps));
        let examined = &mut self.listed_pieces;
        // Every chunk is a whole number of granules: a shorter free piece holds none.
        self.index
            .at(slot)
            .for_each_at_least(self.granularity, |r| {
                *examined += 1;
                let stamp = pieces.get(r.piece).stamp;
                let cached = cache.get(r.piece, stamp);
                // Most free pieces hold no whole chunk: nothing to look up.
                if cached.is_some_and(<[_]>::is_empty) {
                    return;
                }
                let Some((&key, seg)) = segments.range(..=SegmentKey::search(r.start)).next_back()
                else {
                    return;
                };
                let seq = seg.seq;
                let found = |(at, chunk): (u64, Chunk)| {
                    (
                        seq,
                        key,
                        FreeChunk {
                            at,
                            chunk,
                            piece: r.piece,
                        },
                    )
                };
                if let Some(chunks) = cached {
                    out.extend(chunks.iter().copied().map(found));
                    return;
                }
                let end = r.start + r.len as u64;
                let before = out.len();
                out.extend(chunks_inside(seg, r.start, end, steps).flatten().map(found));
                let listed = out[before..].iter().map(|(_, _, c)| (c.at, c.chunk));
                cache.put(r.piece, stamp, listed);
            });
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
