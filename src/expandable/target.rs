//! Where a growth goes (Note [Growth] in `growth.rs`): the place in a segment of the request's
//! (stream, pool) where it fits once a hole is mapped.
//!
//! Note [One target walk]: with pages parked (Note [Parked pages] in `parked.rs`) a growth
//! weighs two places, the best counting parked pages as mapped and the best counting them as
//! holes. Both come from one walk of the gap map: a gap with no parked or stuck chunk in it is
//! one hole for both, and only the few gaps that hold one are cut into holes twice. Two walks
//! (one per way of counting) were a seventh of the churn bench's full-device run.

use crate::backend::{Backend, StreamId};
use crate::expandable::pieces::{Kind, Piece, PieceId, NIL};
use crate::expandable::segment::{holes_less, Chunk, SegmentKey};
use crate::expandable::size_index::StreamPool;
use crate::expandable::state::State;
use crate::stats::PoolKind;

/// Where a growth goes: the segment, the block's start (and the free piece that starts there,
/// ending where the hole begins, if any), and the hole mapped from.
pub(super) struct Target {
    pub(super) seg: SegmentKey,
    pub(super) start: u64,
    pub(super) before: Option<PieceId>,
    pub(super) hole_start: u64,
    pub(super) hole_end: u64,
    pub(super) new_segment: bool,
}

/// The best place found so far for one way of counting parked pages: its span and the place;
/// `done` once the first fit decides (without `best_fit_growth`).
#[derive(Default)]
struct Best {
    found: Option<(u64, Target)>,
    done: bool,
}

impl<B: Backend> State<B> {
    /// Where a growth of `rounded` bytes for (stream, pool) goes (Note [Growth]). With pages
    /// parked (Note [Parked pages] in `parked.rs`), the lowest place counting them as mapped,
    /// unless counting them as holes needs fewer new bytes mapped there (a free range then
    /// reaches into them): unparking may cost a synchronization, mapping more costs memory.
    pub(super) fn choose_target(
        &self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
    ) -> Option<Target> {
        let parked = !self.parked_handles.is_empty();
        let (around, over) = self.find_targets(stream, pool, rounded, parked);
        if !parked {
            return around;
        }
        let g = self.granularity as u64;
        let new_bytes = |t: &Target| {
            let need_end = (t.start + rounded as u64).next_multiple_of(g);
            need_end.min(t.hole_end).saturating_sub(t.hole_start)
        };
        match (around, over) {
            (Some(a), Some(o)) if new_bytes(&o) < new_bytes(&a) => Some(o),
            (None, o) => o,
            (a, _) => a,
        }
    }

    /// The place in an existing segment of (stream, pool) where `rounded` fits once the hole
    /// there is mapped: the best fit with `best_fit_growth`, else the lowest (Note [Growth]);
    /// counting parked pages as mapped, and (with `over_parked`) as holes too (Note [One target
    /// walk]).
    fn find_targets(
        &self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
        over_parked: bool,
    ) -> (Option<Target>, Option<Target>) {
        let Some(slot) = self.index.find(StreamPool { stream, pool }) else {
            return (None, None);
        };
        let (mut around, mut over) = (Best::default(), Best::default());
        // Without `over_parked`, its search is done before it starts.
        over.done = !over_parked;
        let all = (slot, 0, SegmentKey::MIN)..=(slot, u64::MAX, SegmentKey::MAX);
        for &(_, _, key) in self.segments_by_slot.range(all) {
            let seg = &self.segments[&key];
            let mut stuck = seg.stuck.iter().peekable();
            let mut parked = seg.parked.iter().peekable();
            for &gap in seg.gaps.values() {
                if around.done && over.done {
                    break;
                }
                let p = self.pieces.get(gap);
                let end = p.end();
                // Stuck and parked chunks lie in gaps (Note [Holes from gaps] in `segment.rs`):
                // those before this gap's end lie in it.
                let in_gap = |&(&at, _): &(&u64, &Chunk)| at < end;
                if !stuck.peek().is_some_and(in_gap) && !parked.peek().is_some_and(in_gap) {
                    // One hole, the whole gap, for both ways of counting.
                    let both = &mut [&mut around, &mut over];
                    self.consider(key, p, p.start, end, rounded, both);
                    continue;
                }
                let (st, pk) = (stuck.clone(), parked.clone());
                while stuck.next_if(in_gap).is_some() {}
                while parked.next_if(in_gap).is_some() {}
                let (st, pk) = (st.take_while(in_gap), pk.take_while(in_gap));
                for (h_start, h_end) in holes_less(p.start, end, st.clone(), pk) {
                    self.consider(key, p, h_start, h_end, rounded, &mut [&mut around]);
                }
                for (h_start, h_end) in holes_less(p.start, end, st, std::iter::empty()) {
                    self.consider(key, p, h_start, h_end, rounded, &mut [&mut over]);
                }
            }
        }
        let out = |b: Best| b.found.map(|(_, target)| target);
        (out(around), if over_parked { out(over) } else { None })
    }

    /// Weighs the hole `[h_start, h_end)` of segment `key`, which lies in gap piece `gap`, as a
    /// place for `rounded` bytes, for each search in `bests` (its span computed once): the
    /// smallest span (free bytes before, hole, free bytes after) that holds the request, the
    /// lowest address among equals (Note [Growth]).
    fn consider(
        &self,
        key: SegmentKey,
        gap: &Piece,
        h_start: u64,
        h_end: u64,
        rounded: usize,
        bests: &mut [&mut Best],
    ) {
        if bests.iter().all(|b| b.done) {
            return;
        }
        // The hole lies in one gap piece (gaps are merged), whose neighbours may be free.
        // The free neighbours the hole touches, each looked up once (this runs for every gap
        // of the segment on every growth).
        let (mut start, mut before, mut after) = (h_start, None, 0);
        if gap.start == h_start && gap.prev != NIL {
            let p = self.pieces.get(gap.prev);
            if p.kind == Kind::Free {
                (start, before) = (p.start, Some(gap.prev));
            }
        }
        if gap.end() == h_end && gap.next != NIL {
            let p = self.pieces.get(gap.next);
            if p.kind == Kind::Free {
                after = p.len as u64;
            }
        }
        let span = h_end - start + after;
        if span < rounded as u64 {
            return;
        }
        for best in bests.iter_mut() {
            if best.done || best.found.as_ref().is_some_and(|(b, _)| span >= *b) {
                continue;
            }
            let target = Target {
                seg: key,
                start,
                before,
                hole_start: h_start,
                hole_end: h_end,
                new_segment: false,
            };
            best.found = Some((span, target));
            best.done = !self.config.best_fit_growth;
        }
    }
}
