//! `check`: every invariant of the expandable allocator, as equations over the whole state.
//!
//! One walk per segment (`segment.rs`: its chunks, its tiling, its blocks), then what spans the
//! segments (`global.rs`: piece and index counts, live blocks, statistics). Each broken rule is
//! an [`InvariantViolation`] naming the rule and the place.

mod global;
mod rescue;
mod segment;

use crate::backend::Backend;
use crate::expandable::state::State;
use crate::mechanism::violation::InvariantViolation;

/// What the walk of one segment adds to the totals the global checks compare.
#[derive(Default)]
struct Sums {
    /// Pieces in the tilings.
    pieces: usize,
    /// Free pieces, each of which must be an index entry.
    free_ranges: usize,
    /// Bytes mapped (chunks).
    mapped: usize,
    /// Bytes of live blocks.
    live: usize,
    /// Bytes of freed blocks waiting for events.
    pending: usize,
}

impl<B: Backend> State<B> {
    /// Checks every invariant; returns the first violation.
    pub(crate) fn check(&self) -> Result<(), InvariantViolation> {
        let mut sums = Sums::default();
        let rescued = self.check_rescues()?;
        for (&key, seg) in &self.segments {
            let lent = rescued.lent.get(&key).copied().unwrap_or_default();
            self.check_segment(key, seg, lent, &mut sums)?;
        }
        sums.pieces += rescued.pieces;
        self.check_counts(&sums)?;
        self.check_release_index()?;
        self.check_chunk_cache()?;
        self.check_live_blocks()?;
        self.check_unsynced()?;
        self.check_last_free()?;
        self.check_stats(&sums, &rescued)
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::StreamId;
    use crate::config::ExpandableConfig;
    use crate::expandable::state::State;
    use crate::mechanism::violation::InvariantViolation as V;
    use crate::SimBackend;

    #[test]
    fn a_stream_synchronized_and_then_freed_on_again_needs_a_synchronization() {
        let mut s = State::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
        let stream = StreamId::sim(3);
        let a = s.allocate(3 << 20, stream).unwrap();
        let b = s.allocate(3 << 20, stream).unwrap();
        assert!(!s.needs_sync(stream), "nothing freed on it yet");
        s.deallocate(a.ptr()).unwrap();
        assert!(s.needs_sync(stream));
        s.sync_before_unmap(stream).unwrap();
        assert!(!s.needs_sync(stream), "synchronized after its last free");
        s.check().unwrap();
        // The free after the synchronization must count again, though it is the same stream
        // as the free before it.
        s.deallocate(b.ptr()).unwrap();
        assert!(s.needs_sync(stream));
        s.check().unwrap();
        s.last_unsynced = Some(StreamId::sim(4));
        assert!(matches!(s.check().unwrap_err(), V::Count { .. }));
    }

    #[test]
    fn a_last_free_whose_piece_changed_unnoticed_is_named() {
        let mut s = State::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
        let stream = StreamId::sim(1);
        let a = s.allocate(3 << 20, stream).unwrap();
        let b = s.allocate(3 << 20, stream).unwrap();
        let _c = s.allocate(3 << 20, stream).unwrap();
        s.deallocate(a.ptr()).unwrap();
        s.check().unwrap();
        // A last free whose piece is a live block's (what the last resort's release followed by
        // the allocation it served once left) must not pass.
        let block = s.live[&b.ptr().get()].piece;
        let slot = s.live[&b.ptr().get()].slot;
        s.remember_free(slot, block, block, s.pieces.get(block).len);
        assert!(s.last_free.is_some());
        assert!(matches!(s.check().unwrap_err(), V::Count { .. }));
    }

    #[test]
    fn a_stat_out_of_step_is_named() {
        let mut s = State::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
        let a = s.allocate(3 << 20, StreamId::DEFAULT).unwrap();
        let _live = s.allocate(5000, StreamId::DEFAULT).unwrap();
        s.deallocate(a.ptr()).unwrap();
        s.check().unwrap();
        s.stats.active_bytes.all.current -= 512;
        let v = s.check().unwrap_err();
        assert!(
            matches!(
                v,
                V::Stat {
                    name: "active_bytes",
                    ..
                }
            ),
            "{v}"
        );
    }

    #[test]
    fn a_segment_missing_from_the_release_index_is_found() {
        let mut s = State::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
        let a = s.allocate(3 << 20, StreamId::DEFAULT).unwrap();
        let _live = s.allocate(5000, StreamId::DEFAULT).unwrap();
        s.deallocate(a.ptr()).unwrap();
        // Bring the index up to date, as the release path does, without releasing anything.
        s.update_release_index();
        s.check().unwrap();
        let seg = s.segment_of(a.ptr().get()).unwrap();
        assert!(
            s.releasable.contains(seg),
            "its freed 4 MiB hold a whole free page"
        );
        s.releasable.set(seg, false);
        let v = s.check().unwrap_err();
        assert!(
            matches!(v, V::NotIndexed { at, .. } if at.get() == seg.start()),
            "{v}"
        );
        // And one filed with nothing to give back.
        s.releasable.set(seg, true);
        s.check().unwrap();
        let b = s.allocate(3 << 20, StreamId::DEFAULT).unwrap();
        s.update_release_index();
        s.releasable.set(seg, true);
        let v = s.check().unwrap_err();
        assert!(matches!(v, V::NotIndexed { .. }), "{v}");
        s.deallocate(b.ptr()).unwrap();
    }

    #[test]
    fn a_free_range_missing_from_the_index_is_found() {
        let mut s = State::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
        let a = s.allocate(3 << 20, StreamId::DEFAULT).unwrap();
        s.deallocate(a.ptr()).unwrap();
        let seg = *s.segments.keys().next().unwrap();
        let (at, len, id) = s.free_pieces(&s.segments[&seg])[0];
        let slot = s.segments[&seg].slot;
        let range = crate::expandable::size_index::FreeRange::new(len, at, id);
        assert!(s.index.at_mut(slot).remove(range));
        let v = s.check().unwrap_err();
        assert!(matches!(v, V::NotIndexed { len: l, .. } if l == len), "{v}");
    }

    #[test]
    fn a_chunk_inside_a_gap_and_parked_bytes_out_of_step_are_found() {
        use crate::expandable::segment::Chunk;
        let mut s = State::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
        let _live = s.allocate(3 << 20, StreamId::DEFAULT).unwrap();
        s.check().unwrap();
        let seg = *s.segments.keys().next().unwrap();
        let g = s.granularity;
        let s_ = s.segments.get_mut(&seg).unwrap();
        // Past the mapped pages: the segment's last gap, where `holes` would map over it (Note
        // [Holes from gaps]).
        let at = s_.end() - g as u64;
        let chunk = Chunk {
            handle: crate::backend::PhysHandle(u64::MAX),
            len: g,
        };
        s_.add_chunk(at, chunk);
        s_.mapped_bytes += g;
        let v = s.check().unwrap_err();
        assert!(matches!(v, V::Tiling { .. }), "{v}");
        let s_ = s.segments.get_mut(&seg).unwrap();
        s_.remove_chunk(at);
        s_.mapped_bytes -= g;
        s.check().unwrap();
        s.segments.get_mut(&seg).unwrap().parked_bytes += g;
        let v = s.check().unwrap_err();
        assert!(matches!(v, V::Count { .. }), "{v}");
    }
}
