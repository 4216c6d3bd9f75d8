//! The free ranges of one segment, by address, with O(1) neighbour lookups.
//!
//! Note [Boundary tags]: coalescing only ever asks "which free range ends where this one starts"
//! and "which starts where it ends", so ranges are kept in two hash maps keyed by their two ends
//! instead of one ordered map: on a segment with 100,000 live blocks the ordered map made every
//! free and allocation walk a four-level B-tree (BENCHMARKS.md, hot path). The questions that do
//! need address order (which ranges contain a chunk, walking a segment for `check` or a snapshot)
//! come from `empty_cache`, remap-defrag and diagnostics, and sort on demand (`sorted`).

use rustc_hash::FxHashMap;

/// What `insert_merging` did: the range it made and the neighbours it absorbed, as
/// (start, length), so the caller can update the best-fit index.
pub(crate) struct Merged {
    pub(crate) start: u64,
    pub(crate) len: usize,
    pub(crate) prev: Option<(u64, usize)>,
    pub(crate) next: Option<(u64, usize)>,
}

#[derive(Debug, Default)]
pub(crate) struct FreeMap {
    /// start -> length
    by_start: FxHashMap<u64, usize>,
    /// end (exclusive) -> start
    by_end: FxHashMap<u64, u64>,
}

impl FreeMap {
    /// Records `[at, at + len)`; the caller guarantees it overlaps no other range.
    pub(crate) fn insert(&mut self, at: u64, len: usize) {
        debug_assert!(len > 0, "empty free range at {at:#x}");
        self.by_start.insert(at, len);
        self.by_end.insert(at + len as u64, at);
    }

    /// Removes the range starting at `at`, returning its length.
    pub(crate) fn remove(&mut self, at: u64) -> Option<usize> {
        let len = self.by_start.remove(&at)?;
        self.by_end.remove(&(at + len as u64));
        Some(len)
    }

    /// Takes `[at, at + take)` from the front of the range `[at, at + len)` (`take < len`):
    /// what every allocation does. The end's entry stays; only the start moves.
    pub(crate) fn take_front(&mut self, at: u64, len: usize, take: usize) {
        let (new_at, end) = (at + take as u64, at + len as u64);
        debug_assert!(take < len && self.by_start.get(&at) == Some(&len));
        self.by_start.remove(&at);
        self.by_start.insert(new_at, len - take);
        if let Some(start) = self.by_end.get_mut(&end) {
            *start = new_at;
        }
    }

    /// Adds `[at, at + len)`, merged with the ranges that end where it starts and start where it
    /// ends: what every free does, with four map operations in the common case.
    pub(crate) fn insert_merging(&mut self, at: u64, len: usize) -> Merged {
        let (mut start, mut end) = (at, at + len as u64);
        let prev = self.by_end.remove(&at).map(|p| {
            let plen = self.by_start.remove(&p).unwrap_or(0);
            start = p;
            (p, plen)
        });
        let next = self.by_start.remove(&end).map(|nlen| (end, nlen));
        match next {
            // The merged range ends where the next one did: update that end's entry in place.
            Some((n, nlen)) => {
                end = n + nlen as u64;
                if let Some(s) = self.by_end.get_mut(&end) {
                    *s = start;
                }
            }
            None => {
                self.by_end.insert(end, start);
            }
        }
        self.by_start.insert(start, (end - start) as usize);
        Merged {
            start,
            len: (end - start) as usize,
            prev,
            next,
        }
    }

    /// The length of the range starting exactly at `at`.
    pub(crate) fn starting_at(&self, at: u64) -> Option<usize> {
        self.by_start.get(&at).copied()
    }

    /// The range ending exactly at `end`, as (start, length).
    pub(crate) fn ending_at(&self, end: u64) -> Option<(u64, usize)> {
        self.by_end
            .get(&end)
            .map(|&start| (start, (end - start) as usize))
    }

    pub(crate) fn len(&self) -> usize {
        self.by_start.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// Every range as (start, length), in address order. O(n log n): for the slow paths only.
    pub(crate) fn sorted(&self) -> Vec<(u64, usize)> {
        let mut all: Vec<(u64, usize)> = self.by_start.iter().map(|(&s, &l)| (s, l)).collect();
        all.sort_unstable();
        all
    }

    /// Whether the two maps agree (each range's end maps back to its start): for `check`.
    pub(crate) fn consistent(&self) -> bool {
        self.by_start.len() == self.by_end.len()
            && self
                .by_start
                .iter()
                .all(|(&s, &l)| self.by_end.get(&(s + l as u64)) == Some(&s))
    }
}
