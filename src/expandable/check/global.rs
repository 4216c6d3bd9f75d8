//! The invariants that span segments: piece and index counts, live blocks, statistics.

use crate::backend::Backend;
use crate::expandable::check::rescue::RescueSums;
use crate::expandable::check::Sums;
use crate::expandable::pieces::Kind;
use crate::expandable::size_index::FreeRange;
use crate::expandable::state::State;
use crate::mechanism::violation::{
    allocated_within_reserved, stat_equals, InvariantViolation as V,
};
use crate::units::DevAddr;

impl<B: Backend> State<B> {
    /// The release index (Note [Release index]) against a recomputation: every segment of an
    /// untouched slot is filed exactly when it has something to give back, and nothing else is
    /// filed.
    pub(super) fn check_release_index(&self) -> Result<(), V> {
        let mut filed = 0;
        for (&key, seg) in &self.segments {
            let is_filed = self.releasable.contains(key);
            filed += usize::from(is_filed);
            if self.releasable.is_touched(seg.slot) {
                continue;
            }
            if is_filed != self.has_releasable(seg) {
                return Err(V::NotIndexed {
                    at: DevAddr::new(key.start()),
                    len: seg.va.len,
                });
            }
        }
        if filed != self.releasable.len() {
            return Err(V::Count {
                what: "segments in the release index, against the live segments filed",
                kept: self.releasable.len(),
                found: filed,
            });
        }
        Ok(())
    }

    /// Every piece in use is in a tiling; every index entry is a free piece; the handle cache's
    /// counts match its lists.
    pub(super) fn check_counts(&self, sums: &Sums) -> Result<(), V> {
        if sums.pieces != self.pieces.in_use() {
            return Err(V::Count {
                what: "pieces in use, against the pieces of the tilings",
                kept: self.pieces.in_use(),
                found: sums.pieces,
            });
        }
        let parked: usize = self.segments.values().map(|s| s.parked.len()).sum();
        if parked != self.parked_handles.len() {
            return Err(V::Count {
                what: "parked pages, against the handles listed as parked",
                kept: self.parked_handles.len(),
                found: parked,
            });
        }
        let indexed = self.index.len();
        if indexed != sums.free_ranges {
            return Err(V::IndexCount {
                indexed,
                free: sums.free_ranges,
            });
        }
        self.cache.check()?;
        self.kept.check()
    }

    /// The stream `free_block` remembers as the last it made unsynced is in the set of unsynced
    /// streams: the cache may only spare a lookup, never hide a stream that needs a
    /// synchronization.
    pub(super) fn check_unsynced(&self) -> Result<(), V> {
        match self.last_unsynced {
            Some(s) if !self.unsynced_frees.contains(&s) => Err(V::Count {
                what: "the last unsynced stream, in the set of unsynced streams",
                kept: 1,
                found: 0,
            }),
            _ => Ok(()),
        }
    }

    /// The last free (Note [Last free] in `last_free.rs`) is still a free piece of its slot,
    /// indexed there: every change of that piece since the free must have forgotten it.
    pub(super) fn check_last_free(&self) -> Result<(), V> {
        let Some(last) = self.last_free else {
            return Ok(());
        };
        let (slot, piece) = last.parts();
        let p = self.pieces.get(piece);
        let indexed = p.kind == Kind::Free
            && (slot as usize) < self.index.slots()
            && self
                .index
                .at(slot)
                .contains(FreeRange::new(p.len, p.start, piece));
        if indexed {
            Ok(())
        } else {
            Err(V::Count {
                what: "the last free's piece, a free range indexed in its slot",
                kept: 1,
                found: 0,
            })
        }
    }

    /// Live blocks are aligned, mapped, at least their request; no two blocks overlap.
    pub(super) fn check_live_blocks(&self) -> Result<(), V> {
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for (&at, b) in &self.live {
            let size = self.size_of(b);
            let placed = V::BlockPlacement {
                at: DevAddr::new(at),
                len: size,
            };
            if at % 512 != 0 || size < b.requested {
                return Err(placed);
            }
            if self.rescues.contains_key(&at) {
                // Its reservation is mapped whole (`check_rescues` holds it to its tiling).
                spans.push((at, at + size as u64));
                continue;
            }
            let seg = self.segment_of(at).and_then(|k| self.segments.get(&k));
            let Some(seg) = seg else {
                return Err(placed);
            };
            if !seg.is_mapped(at, size) {
                return Err(V::Unmapped {
                    at: DevAddr::new(at),
                    len: size,
                });
            }
            spans.push((at, at + size as u64));
        }
        for p in &self.pending {
            spans.push((p.addr, p.addr + self.size_of(&p.block) as u64));
        }
        spans.sort_unstable();
        match spans.windows(2).find(|w| w[0].1 > w[1].0) {
            Some(w) => Err(V::Overlap {
                first: DevAddr::new(w[0].0),
                second: DevAddr::new(w[1].0),
            }),
            None => Ok(()),
        }
    }

    /// The statistics equal the sums over the state.
    pub(super) fn check_stats(&self, sums: &Sums, rescued: &RescueSums) -> Result<(), V> {
        let s = &self.stats;
        let (live, pending) = (self.live.len() as u64, self.pending.len() as u64);
        stat_equals(
            "reserved_bytes",
            s.reserved_bytes.all.current,
            (sums.mapped + rescued.owned) as u64,
        )?;
        stat_equals(
            "allocated_bytes",
            s.allocated_bytes.all.current,
            (sums.live + rescued.live) as u64,
        )?;
        let active_bytes = (sums.live + sums.pending + rescued.live + rescued.pending) as u64;
        stat_equals("active_bytes", s.active_bytes.all.current, active_bytes)?;
        stat_equals("allocation", s.allocation.all.current, live)?;
        stat_equals("active", s.active.all.current, live + pending)?;
        let segments = (self.segments.len() + rescued.count) as u64;
        stat_equals("segment", s.segment.all.current, segments)?;
        allocated_within_reserved(s)
    }
}
