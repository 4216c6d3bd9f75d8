//! An ordered set kept as sorted runs, smallest entries last: a B+-tree of height two.
//!
//! Note [Sorted runs]: a size class can hold 25,000 free ranges of one length (a program that
//! keeps every other block of a size); `BTreeSet` spent ~340 instructions per insert, remove or
//! lower-bound search there, three of which make an allocate + free pair (BENCHMARKS.md, hot
//! path). Here the entries are kept in runs of at most `RUN_MAX`, found by a binary search over
//! each run's smallest entry, and stored in *descending* order: the smallest entry is the last of
//! the last run. Best fit wants the smallest entry of a class that fits, which in a class of
//! equal lengths is the lowest address, and a program that frees what it just allocated brings
//! the same entry back: both ends of that pair are then a `pop` and a `push` at the end of a
//! vector, with no search and nothing moved. Anywhere else an operation costs two short binary
//! searches and a move of at most `RUN_MAX` entries. A class holding a handful of ranges is one
//! short run, so one structure serves every class and no bin ever converts.

/// A run growing past this splits in half.
const RUN_MAX: usize = 128;
/// A run shrinking below this merges with a neighbour they both fit in (`RUN_MAX`). A merged run
/// must lose `RUN_MAX / 2 - RUN_MERGE` entries before it can merge again, so a bin at a border
/// never splits and merges on every call.
const RUN_MERGE: usize = 32;

/// A set of `T`, ordered.
#[derive(Debug, Clone)]
pub(crate) struct SortedRuns<T> {
    /// Each sorted in descending order, every entry of a run above every entry of the next;
    /// non-empty, except that the only run of an empty set is kept (with its capacity): a class
    /// whose only range keeps leaving and coming back (a segment's tail crossing a class border
    /// on every allocate + free pair) would otherwise free and allocate a vector each time.
    runs: Vec<Vec<T>>,
    /// `lasts[i]` is the last (smallest) entry of `runs[i]`: the outer search reads only this.
    lasts: Vec<T>,
    len: usize,
}

impl<T> Default for SortedRuns<T> {
    fn default() -> Self {
        Self {
            runs: Vec::new(),
            lasts: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Ord + Copy> SortedRuns<T> {
    /// The run that holds `key` or would: the first whose smallest entry is at most `key` (the
    /// last run if none). Only call on a non-empty set.
    #[inline(always)]
    fn run_of(&self, key: &T) -> usize {
        let last = self.lasts.len() - 1;
        if *key <= self.lasts[last] {
            return last;
        }
        self.lasts.partition_point(|l| l > key)
    }

    /// Where `key` stands in run `r`, or would: `Ok(i)` if present, else `Err(i)`, the index it
    /// would be inserted at.
    #[inline(always)]
    fn position(&self, r: usize, key: &T) -> Result<usize, usize> {
        let run = &self.runs[r];
        match run.last() {
            Some(l) if key < l => Err(run.len()),
            Some(l) if key == l => Ok(run.len() - 1),
            _ => run.binary_search_by(|e| key.cmp(e)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `key`; false if it was present.
    #[inline]
    pub(crate) fn insert(&mut self, key: T) -> bool {
        if self.len == 0 {
            match self.runs.first_mut() {
                Some(run) => {
                    run.push(key);
                    self.lasts[0] = key;
                }
                None => {
                    self.runs.push(vec![key]);
                    self.lasts.push(key);
                }
            }
            self.len = 1;
            return true;
        }
        let r = self.run_of(&key);
        let Err(i) = self.position(r, &key) else {
            return false;
        };
        let run = &mut self.runs[r];
        run.insert(i, key);
        if i + 1 == run.len() {
            self.lasts[r] = key;
        }
        if run.len() > RUN_MAX {
            let back = run.split_off(run.len() / 2);
            self.lasts.insert(r, run[run.len() - 1]);
            self.runs.insert(r + 1, back);
        }
        self.len += 1;
        true
    }

    /// Removes `key`; false if it was absent.
    #[inline]
    pub(crate) fn remove(&mut self, key: &T) -> bool {
        if self.len <= 1 {
            // The commonest bin of all: one range (a segment's tail), leaving it.
            let found = self.len == 1 && self.lasts[0] == *key;
            if found {
                self.runs[0].clear();
                self.len = 0;
            }
            return found;
        }
        let r = self.run_of(key);
        let Ok(i) = self.position(r, key) else {
            return false;
        };
        let run = &mut self.runs[r];
        run.remove(i);
        self.len -= 1;
        match run.last() {
            None => {
                if self.len > 0 {
                    self.runs.remove(r);
                    self.lasts.remove(r);
                }
                return true;
            }
            Some(&l) => self.lasts[r] = l,
        }
        if run.len() < RUN_MERGE {
            self.merge_around(r);
        }
        true
    }

    /// Merges the short run `r` into a neighbour if both fit in one run.
    fn merge_around(&mut self, r: usize) {
        let fits = |a: usize, b: usize| self.runs[a].len() + self.runs[b].len() <= RUN_MAX;
        if r + 1 < self.runs.len() && fits(r, r + 1) {
            let next = self.runs.remove(r + 1);
            self.lasts.remove(r);
            self.runs[r].extend(next);
        } else if r > 0 && fits(r - 1, r) {
            let run = self.runs.remove(r);
            self.lasts.remove(r - 1);
            self.runs[r - 1].extend(run);
        }
    }

    pub(crate) fn contains(&self, key: &T) -> bool {
        self.len > 0 && self.position(self.run_of(key), key).is_ok()
    }

    /// The first (smallest) entry at or after `key`.
    #[inline]
    pub(crate) fn first_from(&self, key: &T) -> Option<T> {
        let smallest = self.first()?;
        if smallest >= *key {
            return Some(smallest);
        }
        // In descending order: the last entry of run `r` at or above `key`, else the smallest
        // entry of the run before it.
        let r = self.run_of(key);
        let i = self.runs[r].partition_point(|e| e >= key);
        match i.checked_sub(1) {
            Some(i) => Some(self.runs[r][i]),
            None => r.checked_sub(1).map(|p| self.lasts[p]),
        }
    }

    /// The smallest entry.
    #[inline]
    pub(crate) fn first(&self) -> Option<T> {
        self.lasts.last().copied().filter(|_| self.len > 0)
    }

    /// The largest entry: the first of the first run (runs are in descending order).
    pub(crate) fn last(&self) -> Option<T> {
        self.runs
            .first()
            .and_then(|r| r.first())
            .copied()
            .filter(|_| self.len > 0)
    }

    /// Replaces `old` by `new` where it stands, if `new` sorts to the same place: true if done,
    /// false (nothing changed) if `old` is absent or `new` belongs elsewhere.
    #[inline]
    pub(crate) fn replace_in_place(&mut self, old: &T, new: T) -> bool {
        if self.len == 0 {
            return false;
        }
        let r = self.run_of(old);
        let Ok(i) = self.position(r, old) else {
            return false;
        };
        let run = &self.runs[r];
        // Descending: the larger neighbour comes before, the smaller after.
        let larger = match i {
            0 => r.checked_sub(1).map(|p| &self.lasts[p]),
            _ => run.get(i - 1),
        };
        let smaller = run
            .get(i + 1)
            .or_else(|| self.runs.get(r + 1).and_then(|n| n.first()));
        if larger.is_some_and(|l| *l <= new) || smaller.is_some_and(|s| new <= *s) {
            return false;
        }
        self.runs[r][i] = new;
        if i + 1 == self.runs[r].len() {
            self.lasts[r] = new;
        }
        true
    }

    /// Calls `f` with every entry, in no particular order.
    #[inline]
    pub(crate) fn for_each(&self, mut f: impl FnMut(T)) {
        for run in &self.runs {
            for &x in run {
                f(x);
            }
        }
    }

    /// Every entry, in ascending order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = T> + '_ {
        self.runs.iter().rev().flat_map(|r| r.iter().rev()).copied()
    }

    /// Whether the runs are sorted, non-empty, ordered, indexed and counted: for tests.
    #[cfg(test)]
    fn well_formed(&self) -> bool {
        let sorted = self.iter().zip(self.iter().skip(1)).all(|(a, b)| a < b);
        let kept_empty = self.len == 0 && self.runs.len() <= 1;
        sorted
            && self.runs.len() == self.lasts.len()
            && (kept_empty
                || self
                    .runs
                    .iter()
                    .zip(&self.lasts)
                    .all(|(r, l)| !r.is_empty() && r.len() <= RUN_MAX && r.last() == Some(l)))
            && self.runs.iter().map(Vec::len).sum::<usize>() == self.len
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// A deterministic stream of pseudo-random numbers (a 64-bit LCG's high bits); the size
    /// index's model test draws from it too.
    pub(crate) struct Lcg(pub(crate) u64);

    impl Lcg {
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % n
        }
    }

    #[test]
    fn agrees_with_a_btreeset_through_growth_and_shrinking() {
        let mut runs = SortedRuns::default();
        let mut set = BTreeSet::new();
        let mut rng = Lcg(7);
        // Grow to thousands (many splits), then shrink to nothing (merges and empty runs).
        for phase in 0..2 {
            for _ in 0..40_000 {
                let key = rng.below(5_000);
                let grow = if phase == 0 { 3 } else { 1 };
                match rng.below(4) {
                    k if k < grow => assert_eq!(runs.insert(key), set.insert(key)),
                    _ => assert_eq!(runs.remove(&key), set.remove(&key)),
                }
                let probe = rng.below(5_100);
                assert_eq!(runs.first_from(&probe), set.range(probe..).next().copied());
                assert_eq!(runs.contains(&probe), set.contains(&probe));
                let (old, new) = (rng.below(5_000), rng.below(5_000));
                if set.contains(&old) && !set.contains(&new) {
                    let before = runs.clone();
                    if runs.replace_in_place(&old, new) {
                        set.remove(&old);
                        set.insert(new);
                    } else {
                        // Refused: nothing changed, and the new key really sorts elsewhere.
                        assert!(before.iter().eq(runs.iter()));
                        let rank = |k: u64| set.range(..k).count();
                        assert_ne!(rank(old), rank(new) - usize::from(new > old));
                    }
                }
            }
            assert!(runs.well_formed());
            assert_eq!(runs.len(), set.len());
            assert!(runs.iter().eq(set.iter().copied()));
            assert_eq!(runs.first(), set.first().copied());
        }
        for k in set.iter() {
            assert!(runs.remove(k));
        }
        assert!(runs.is_empty() && runs.well_formed() && runs.first().is_none());
    }

    #[test]
    fn one_entry_is_replaced_by_any_key_and_an_absent_one_is_refused() {
        let mut runs = SortedRuns::default();
        // Emptied and refilled too: the kept empty run then holds the one entry.
        for round in 0..3u64 {
            assert!(runs.insert(100 + round));
            assert!(!runs.replace_in_place(&7, 8), "an absent key is refused");
            assert!(runs.iter().eq([100 + round]));
            // Larger, then smaller than the entry: one entry has no neighbours to keep between.
            assert!(runs.replace_in_place(&(100 + round), 5_000));
            assert!(runs.replace_in_place(&5_000, 3));
            assert!(runs.well_formed() && runs.len() == 1);
            assert_eq!(runs.first(), Some(3));
            assert_eq!(runs.first_from(&2), Some(3));
            assert!(runs.contains(&3) && !runs.contains(&5_000));
            assert!(runs.remove(&3) && runs.is_empty() && runs.well_formed());
        }
    }
}
