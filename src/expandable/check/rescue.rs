//! The alias rescues' rules (Note [Alias rescue] in `rescue.rs`): each rescue's tiling is gap,
//! its block, gap over its reservation; a live rescue's block is a live or pending block there,
//! a dead one's is not; each lent end is a used piece inside a chunk of a large-pool home
//! segment under the home's index slot, and no block's.

use rustc_hash::FxHashMap;

use crate::backend::Backend;
use crate::expandable::pieces::Kind;
use crate::expandable::segment::SegmentKey;
use crate::expandable::state::State;
use crate::mechanism::violation::InvariantViolation as V;
use crate::stats::PoolKind;
use crate::units::DevAddr;

/// What the rescues add to the totals the other rules compare.
#[derive(Default)]
pub(super) struct RescueSums {
    /// Pieces of the rescues' tilings.
    pub(super) pieces: usize,
    /// Bytes of the rescues' new handles.
    pub(super) owned: usize,
    /// Bytes of rescued blocks live, and pending.
    pub(super) live: usize,
    pub(super) pending: usize,
    /// Rescues not yet torn down (each a segment in the statistics).
    pub(super) count: usize,
    /// Per home segment: bytes and pieces lent.
    pub(super) lent: FxHashMap<SegmentKey, (usize, usize)>,
}

impl<B: Backend> State<B> {
    pub(super) fn check_rescues(&self) -> Result<RescueSums, V> {
        let mut sums = RescueSums::default();
        let live = self.rescues.iter().map(|(&at, r)| (Some(at), r));
        for (at, r) in live.chain(self.dead_rescues.iter().map(|r| (None, r))) {
            sums.count += 1;
            sums.owned += r.owned.iter().map(|c| c.len).sum::<usize>();
            let broken = |place: u64| V::Tiling {
                segment: r.va.start,
                at: DevAddr::new(place),
            };
            let tiling = self.pieces.tiling(r.tail);
            sums.pieces += tiling.len();
            let (mut cursor, mut used) = (r.va.start.get(), 0);
            for &id in &tiling {
                let p = self.pieces.get(id);
                let expected = if id == r.block { Kind::Used } else { Kind::Gap };
                if p.start != cursor || p.kind != expected {
                    return Err(broken(p.start));
                }
                used += usize::from(id == r.block);
                cursor = p.end();
            }
            if cursor != r.va.start.get() + r.va.len as u64 || used != 1 {
                return Err(broken(cursor));
            }
            let block_at = self.pieces.get(r.block).start;
            // A parked rescue (Note [Parked rescue]) is dead and lends nothing.
            if r.parked && (at.is_some() || !r.lent.is_empty()) {
                return Err(V::BlockRecord {
                    at: DevAddr::new(block_at),
                });
            }
            let live = self.live.get(&block_at).filter(|b| b.piece == r.block);
            let pending = self
                .pending
                .iter()
                .find(|p| p.addr == block_at && p.block.piece == r.block);
            let len = self.pieces.get(r.block).len;
            match (at, live, pending) {
                (Some(at), Some(_), None) if at == block_at => sums.live += len,
                (Some(at), None, Some(_)) if at == block_at => sums.pending += len,
                (None, None, None) => {}
                _ => {
                    return Err(V::BlockRecord {
                        at: DevAddr::new(block_at),
                    })
                }
            }
            for &(slot, piece) in &r.lent {
                let p = self.pieces.get(piece);
                let home = self.segment_of(p.start).map(|k| (k, &self.segments[&k]));
                let whose = self.live.get(&p.start).map(|b| b.piece) == Some(piece)
                    || self.pending.iter().any(|q| q.block.piece == piece);
                match home {
                    Some((key, seg))
                        if seg.slot == slot
                            && seg.pool == PoolKind::Large
                            && p.kind == Kind::Used
                            && !whose
                            && seg.is_mapped(p.start, p.len) =>
                    {
                        let e = sums.lent.entry(key).or_default();
                        e.0 += p.len;
                        e.1 += 1;
                    }
                    _ => return Err(broken(p.start)),
                }
            }
        }
        Ok(sums)
    }
}
