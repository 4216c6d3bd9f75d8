//! The simulated device's address space: which ranges are reserved, and where the next
//! reservation goes, in O(log n) per reserve and free for n live reservations.
//!
//! Reservations sit one guard granule apart (so two never look contiguous). The free space is
//! kept as *gaps*: `[start, end)` is the range of addresses where a reservation may begin and
//! end, i.e. from the previous reservation's end plus a guard (or the base) to the next one's
//! start less a guard (or the limit). A request takes the smallest gap that holds it, the lowest
//! address among equals (best fit; with no holes, the one gap is the tail and this is the lowest
//! address, as before). Before issue 21 a reserve walked every reservation: 200,000 streams'
//! segments took minutes.

use std::collections::{BTreeMap, BTreeSet};

/// Live reservations and the gaps between them.
#[derive(Debug)]
pub(crate) struct VaMap {
    base: u64,
    limit: u64,
    guard: u64,
    /// start -> len of each live reservation.
    used: BTreeMap<u64, u64>,
    /// start -> end of each gap.
    gaps: BTreeMap<u64, u64>,
    /// (len, start) of each gap: the best-fit index.
    by_len: BTreeSet<(u64, u64)>,
    /// Reservations go to the highest gap that holds them, at its end (`SimConfig::reserve_from_top`).
    from_top: bool,
}

impl VaMap {
    /// An empty address space `[base, limit)` with `guard` bytes between reservations.
    pub(crate) fn new(base: u64, limit: u64, guard: u64) -> Self {
        let mut map = Self {
            base,
            limit,
            guard,
            used: BTreeMap::new(),
            gaps: BTreeMap::new(),
            by_len: BTreeSet::new(),
            from_top: false,
        };
        map.add_gap(base, limit);
        map
    }

    /// With `yes`, reservations go to the highest gap that holds them, at its end.
    pub(crate) fn placing_from_top(mut self, yes: bool) -> Self {
        self.from_top = yes;
        self
    }

    fn add_gap(&mut self, start: u64, end: u64) {
        if start < end {
            self.gaps.insert(start, end);
            self.by_len.insert((end - start, start));
        }
    }

    fn remove_gap(&mut self, start: u64) {
        if let Some(end) = self.gaps.remove(&start) {
            self.by_len.remove(&(end - start, start));
        }
    }

    /// Reserves `len` bytes (a positive multiple of the guard) and returns the start, or `None`
    /// when no gap holds them.
    pub(crate) fn reserve(&mut self, len: u64) -> Option<u64> {
        if self.from_top {
            return self.reserve_from_top(len);
        }
        let &(_, start) = self.by_len.range((len, 0)..).next()?;
        let end = self.gaps[&start];
        self.remove_gap(start);
        // What is left after the reservation and its guard.
        self.add_gap(start.saturating_add(len).saturating_add(self.guard), end);
        self.used.insert(start, len);
        Some(start)
    }

    /// [`reserve`](Self::reserve) from the top: the highest gap that holds `len`, at its end
    /// (a walk down the gaps: a test configuration, not the default's O(log n)).
    fn reserve_from_top(&mut self, len: u64) -> Option<u64> {
        let (&gap_start, &end) = self.gaps.iter().rev().find(|(&s, &e)| e - s >= len)?;
        let start = end - len;
        self.remove_gap(gap_start);
        // What is left below the reservation and its guard.
        self.add_gap(gap_start, start.saturating_sub(self.guard));
        self.used.insert(start, len);
        Some(start)
    }

    /// Frees the reservation at `start`; false when there is none.
    pub(crate) fn free(&mut self, start: u64) -> bool {
        let Some(len) = self.used.remove(&start) else {
            return false;
        };
        let gap_start = match self.used.range(..start).next_back() {
            Some((&prev, &prev_len)) => prev + prev_len + self.guard,
            None => self.base,
        };
        let gap_end = match self.used.range(start..).next() {
            Some((&next, _)) => next.saturating_sub(self.guard),
            None => self.limit,
        };
        // The gaps on either side (if any) merge with the freed range into one.
        self.remove_gap(gap_start);
        self.remove_gap(start + len + self.guard);
        self.add_gap(gap_start, gap_end);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 0x10;

    /// The gaps recomputed from the reservations, by a walk: what the index must equal.
    fn walked(map: &VaMap) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut cursor = map.base;
        for (&start, &len) in &map.used {
            if cursor < start.saturating_sub(map.guard) {
                gaps.push((cursor, start - map.guard));
            }
            cursor = start + len + map.guard;
        }
        if cursor < map.limit {
            gaps.push((cursor, map.limit));
        }
        gaps
    }

    fn check(map: &VaMap) {
        let gaps: Vec<_> = map.gaps.iter().map(|(&s, &e)| (s, e)).collect();
        assert_eq!(gaps, walked(map));
        assert_eq!(map.by_len.len(), map.gaps.len());
    }

    #[test]
    fn reservations_go_lowest_first_a_guard_apart_and_freed_gaps_merge_and_are_reused() {
        let mut m = VaMap::new(0x100, 0x200, G);
        let a = m.reserve(0x20).unwrap();
        let b = m.reserve(0x20).unwrap();
        let c = m.reserve(0x20).unwrap();
        assert_eq!((a, b, c), (0x100, 0x130, 0x160));
        check(&m);
        assert!(m.free(b));
        check(&m);
        // The hole between a and c holds 0x20 exactly: best fit takes it over the tail.
        assert_eq!(m.reserve(0x20), Some(0x130));
        assert!(m.free(a) && m.free(0x130) && m.free(c));
        check(&m);
        assert_eq!(m.gaps.len(), 1, "everything merged back into one gap");
        assert!(!m.free(c), "a second free of one reservation is refused");
        assert_eq!(m.reserve(0x101), None, "larger than the space");
        assert_eq!(m.reserve(0x100), Some(0x100));
    }

    #[test]
    fn from_the_top_reservations_go_down_a_guard_apart_and_freed_gaps_merge_and_are_reused() {
        let mut m = VaMap::new(0x100, 0x200, G).placing_from_top(true);
        let a = m.reserve(0x20).unwrap();
        let b = m.reserve(0x20).unwrap();
        let c = m.reserve(0x20).unwrap();
        assert_eq!((a, b, c), (0x1e0, 0x1b0, 0x180));
        check(&m);
        assert!(m.free(b));
        check(&m);
        // The hole between c and a is the highest gap that holds 0x20.
        assert_eq!(m.reserve(0x20), Some(0x1b0));
        assert!(m.free(a) && m.free(0x1b0) && m.free(c));
        check(&m);
        assert_eq!(m.gaps.len(), 1, "everything merged back into one gap");
        assert_eq!(m.reserve(0x101), None, "larger than the space");
        assert_eq!(m.reserve(0x100), Some(0x100));
    }

    #[test]
    fn random_reserves_and_frees_keep_the_index_equal_to_a_walk() {
        for from_top in [false, true] {
            random_reserves_and_frees(
                VaMap::new(0x1000, 0x1000 + 4096 * G, G).placing_from_top(from_top),
            );
        }
    }

    fn random_reserves_and_frees(mut m: VaMap) {
        let mut live = Vec::new();
        let mut x: u64 = 12345;
        for _ in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if live.is_empty() || x >> 63 == 0 {
                let len = ((x >> 20) % 8 + 1) * G;
                if let Some(s) = m.reserve(len) {
                    assert!(live
                        .iter()
                        .all(|&(o, l): &(u64, u64)| s + len + G <= o || o + l + G <= s));
                    live.push((s, len));
                }
            } else {
                let (s, _) = live.swap_remove((x >> 20) as usize % live.len());
                assert!(m.free(s));
            }
            check(&m);
        }
    }
}
