//! The invariants of one segment: its chunks, its tiling (Note [Pieces]) and its blocks.

use crate::backend::Backend;
use crate::expandable::check::Sums;
use crate::expandable::pieces::{Kind, PieceId, NIL};
use crate::expandable::segment::{Chunk, Segment, SegmentKey};
use crate::expandable::size_index::{FreeRange, StreamPool};
use crate::expandable::state::State;
use crate::mechanism::violation::InvariantViolation as V;
use crate::units::DevAddr;

/// What a walk of a tiling counts.
#[derive(Default)]
struct Tiled {
    free_bytes: usize,
    free_ranges: usize,
    gaps: usize,
    used: usize,
}

impl<B: Backend> State<B> {
    pub(super) fn check_segment(
        &self,
        key: SegmentKey,
        seg: &Segment,
        (lent, lent_pieces): (usize, usize),
        sums: &mut Sums,
    ) -> Result<(), V> {
        if key != SegmentKey::of(&seg.va) {
            return Err(V::SegmentKey {
                key: DevAddr::new(key.start()),
                start: seg.va.start,
            });
        }
        sums.mapped += self.check_chunks(seg)?;
        let tiling = self.pieces.tiling(seg.tail);
        sums.pieces += tiling.len();
        let tiled = self.check_tiling(seg, &tiling)?;
        sums.free_ranges += tiled.free_ranges;
        if tiled.gaps != seg.gaps.len() {
            return Err(V::Count {
                what: "gap pieces listed in the segment's gap map",
                kept: seg.gaps.len(),
                found: tiled.gaps,
            });
        }
        let key = StreamPool {
            stream: seg.stream,
            pool: seg.pool,
        };
        if self.index.find(key) != Some(seg.slot) {
            return Err(V::NotIndexed {
                at: seg.va.start,
                len: seg.va.len,
            });
        }
        // Lent ends are used pieces of no block (Note [Alias rescue] in `rescue.rs`).
        let used = tiled.used.checked_sub(lent_pieces).ok_or(V::Count {
            what: "used pieces of a segment, against the ends it lent",
            kept: lent_pieces,
            found: tiled.used,
        })?;
        let (live, pending) = self.check_segment_blocks(seg, used)?;
        if tiled.free_bytes + live + pending + lent != seg.mapped_bytes {
            return Err(V::Conservation {
                segment: seg.va.start,
                free: tiled.free_bytes,
                live,
                pending,
                mapped: seg.mapped_bytes,
            });
        }
        sums.live += live;
        sums.pending += pending;
        Ok(())
    }

    /// Chunks lie inside the VA, disjoint, in whole granules, summing to `mapped_bytes`; stuck
    /// and parked chunks overlap none; the parked bytes are counted. Returns the bytes mapped.
    fn check_chunks(&self, seg: &Segment) -> Result<usize, V> {
        let segment = seg.va.start;
        let (mut cursor, mut sum) = (seg.start(), 0);
        for (&at, c) in &seg.chunks {
            if at < cursor || at + c.len as u64 > seg.end() || c.len % self.granularity != 0 {
                let at = DevAddr::new(at);
                return Err(V::ChunkPlacement {
                    segment,
                    at,
                    len: c.len,
                });
            }
            cursor = at + c.len as u64;
            sum += c.len;
        }
        let key = SegmentKey::of(&seg.va);
        for (&at, c) in &seg.parked {
            // Parked pages are listed under their handle, and no chunk or stuck chunk is there.
            let end = at + c.len as u64;
            let clash = |m: &std::collections::BTreeMap<u64, Chunk>| {
                m.range(..end)
                    .next_back()
                    .is_some_and(|(&s, k)| s + k.len as u64 > at)
            };
            let listed = self.parked_handles.get(&c.handle) == Some(&(key, at));
            if !listed
                || clash(&seg.chunks)
                || clash(&seg.stuck)
                || at < seg.start()
                || end > seg.end()
            {
                let at = DevAddr::new(at);
                return Err(V::ChunkPlacement {
                    segment,
                    at,
                    len: c.len,
                });
            }
        }
        for (&at, c) in &seg.stuck {
            let end = at + c.len as u64;
            let clash = seg.chunks.range(..end).next_back();
            if clash.is_some_and(|(&s, k)| s + k.len as u64 > at) || end > seg.end() {
                let at = DevAddr::new(at);
                return Err(V::ChunkPlacement {
                    segment,
                    at,
                    len: c.len,
                });
            }
        }
        let parked: usize = seg.parked.values().map(|c| c.len).sum();
        if parked != seg.parked_bytes {
            return Err(V::Count {
                what: "parked bytes kept by the segment, against its parked chunks",
                kept: seg.parked_bytes,
                found: parked,
            });
        }
        if sum != seg.mapped_bytes {
            return Err(V::MappedBytes {
                segment,
                recorded: seg.mapped_bytes,
                chunks: sum,
            });
        }
        Ok(sum)
    }

    /// The tiling covers the VA in linked order; free pieces are mapped, never touch and are
    /// indexed; gaps are merged, listed and hold no chunk; used pieces are mapped.
    fn check_tiling(&self, seg: &Segment, tiling: &[PieceId]) -> Result<Tiled, V> {
        let segment = seg.va.start;
        let (mut cursor, mut prev) = (seg.start(), (NIL, None));
        let mut t = Tiled::default();
        for &id in tiling {
            let p = *self.pieces.get(id);
            let at = DevAddr::new(p.start);
            if p.start != cursor || p.len == 0 || p.prev != prev.0 {
                let at = DevAddr::new(cursor);
                return Err(V::Tiling { segment, at });
            }
            if prev.1 == Some(p.kind) && p.kind != Kind::Used {
                return Err(V::Unmerged { segment, at });
            }
            if p.kind != Kind::Gap && !seg.is_mapped(p.start, p.len) {
                return Err(V::Unmapped { at, len: p.len });
            }
            match p.kind {
                Kind::Free => {
                    t.free_bytes += p.len;
                    t.free_ranges += 1;
                    let range = FreeRange::new(p.len, p.start, id);
                    if !self.index.at(seg.slot).contains(range) {
                        return Err(V::NotIndexed { at, len: p.len });
                    }
                }
                Kind::Gap => {
                    t.gaps += 1;
                    // With the mapped non-gap pieces: the gaps are exactly what no chunk
                    // covers, which `holes` relies on (Note [Holes from gaps]).
                    if seg.chunk_in(p.start, p.end()) {
                        return Err(V::Tiling { segment, at });
                    }
                    if seg.gaps.get(&p.start) != Some(&id) {
                        return Err(V::Count {
                            what: "gap pieces listed in the segment's gap map",
                            kept: seg.gaps.len(),
                            found: t.gaps,
                        });
                    }
                }
                Kind::Used => t.used += 1,
            }
            cursor = p.end();
            prev = (id, Some(p.kind));
        }
        if cursor != seg.end() || self.pieces.get(seg.tail).next != NIL {
            let at = DevAddr::new(cursor);
            return Err(V::Tiling { segment, at });
        }
        Ok(t)
    }

    /// Each live or pending block of the segment owns one used piece starting at its address,
    /// under the segment's index; returns (live bytes, pending bytes).
    fn check_segment_blocks(&self, seg: &Segment, used: usize) -> Result<(usize, usize), V> {
        let inside = |at: u64| seg.start() <= at && at < seg.end();
        let live = self.live.iter().map(|(&at, b)| (at, b, false));
        let pending = self.pending.iter().map(|p| (p.addr, &p.block, true));
        let (mut blocks, mut live_bytes, mut pending_bytes) = (0, 0, 0);
        for (at, b, pending) in live.chain(pending).filter(|&(at, _, _)| inside(at)) {
            let p = self.pieces.get(b.piece);
            if p.kind != Kind::Used || p.start != at || b.slot != seg.slot {
                return Err(V::BlockRecord {
                    at: DevAddr::new(at),
                });
            }
            blocks += 1;
            if pending {
                pending_bytes += p.len;
            } else {
                live_bytes += p.len;
            }
        }
        if blocks != used {
            return Err(V::Count {
                what: "used pieces of a segment, one per block",
                kept: blocks,
                found: used,
            });
        }
        Ok((live_bytes, pending_bytes))
    }
}
