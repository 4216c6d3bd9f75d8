//! The recorded allocator's segments and how many live blocks each holds, as the entries go by,
//! to tell which segments were entirely free when a run of releases began (Note [Release runs]).

use std::collections::BTreeMap;

use super::entries::{Action, Entry};

/// Segments by address: (size, live blocks in it); and how many hold no live block.
pub(super) struct SegmentTracker {
    segments: BTreeMap<i128, (u64, u64)>,
    free: usize,
}

impl SegmentTracker {
    /// The state when recording began: the dump's segments `(address, size)` with the trace
    /// undone backwards (a `segment_alloc` removes its segment, a `segment_free` puts it back),
    /// holding the blocks live at the start.
    pub(super) fn at_start(
        dump: impl IntoIterator<Item = (i128, u64)>,
        entries: &[Entry<'_>],
        live_at_start: impl IntoIterator<Item = i128>,
    ) -> Self {
        let mut sizes: BTreeMap<i128, u64> = dump.into_iter().collect();
        for e in entries.iter().rev() {
            match (e.action, e.addr) {
                (Action::SegmentAlloc, Some(a)) => {
                    sizes.remove(&a);
                }
                (Action::SegmentFree, Some(a)) => {
                    sizes.insert(a, e.size);
                }
                _ => {}
            }
        }
        let mut tracker = SegmentTracker {
            free: sizes.len(),
            segments: sizes.into_iter().map(|(a, s)| (a, (s, 0))).collect(),
        };
        for a in live_at_start {
            tracker.change_block(a, true);
        }
        tracker
    }

    /// Counts a block allocated (`up`) or freed at `addr` in the segment that holds it.
    fn change_block(&mut self, addr: i128, up: bool) {
        let Some((&start, (size, live))) = self.segments.range_mut(..=addr).next_back() else {
            return;
        };
        if addr >= start.saturating_add(i128::from(*size)) {
            return;
        }
        match (up, *live) {
            (true, 0) => self.free -= 1,
            (false, 1) => self.free += 1,
            (false, 0) => return,
            _ => {}
        }
        *live = if up { *live + 1 } else { *live - 1 };
    }

    /// Applies one entry (after the run it may start was classified).
    pub(super) fn apply(&mut self, e: &Entry<'_>) {
        let Some(a) = e.addr else { return };
        match e.action {
            Action::Alloc => self.change_block(a, true),
            Action::FreeCompleted => self.change_block(a, false),
            Action::SegmentAlloc => {
                if let Some((_, live)) = self.segments.insert(a, (e.size, 0)) {
                    self.free -= usize::from(live == 0);
                }
                self.free += 1;
            }
            Action::SegmentFree => {
                if let Some((_, live)) = self.segments.remove(&a) {
                    self.free -= usize::from(live == 0);
                }
            }
            _ => {}
        }
    }

    /// Whether some segment holding no live block is not among `released`: a release that left
    /// an entirely free segment standing, which `release_cached_blocks` never does.
    pub(super) fn leaves_free_segment(&self, released: &[Entry<'_>]) -> bool {
        let mut addrs: Vec<i128> = released
            .iter()
            .filter_map(|r| r.addr)
            .filter(|a| self.segments.get(a).is_some_and(|&(_, live)| live == 0))
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        self.free > addrs.len()
    }
}
