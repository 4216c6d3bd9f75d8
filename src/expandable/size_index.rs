//! The best-fit index of one (stream, pool): every free range by (length, address).
//!
//! Note [Size classes]: ranges are binned by a TLSF-style size class (the power of two below the
//! length, split in four), and a bitmap says which bins hold anything. Best fit looks in the
//! request's own bin (only there can a range be too small), then takes the first range of the
//! next non-empty bin, found with one bit scan: every length in a higher bin is larger than every
//! length in a lower one, so this is still the exact best fit (smallest length that fits, lowest
//! address on ties) that one ordered set gave, while each set stays small: a hot path that keeps
//! carving the tail of a segment no longer shares a B-tree with 100,000 fragments of other sizes.

use std::collections::BTreeSet;

use crate::backend::StreamId;
use crate::expandable::pieces::PieceId;
use crate::stats::PoolKind;

/// One free range: (length, start, piece). Ordered by length, then start (the piece never
/// decides: two ranges never share a start).
pub(crate) type Entry = (usize, u64, PieceId);

/// A bin holding more ranges than this becomes a B-tree; one holding fewer than `SMALL_AGAIN`
/// becomes a sorted vector again (the gap keeps a bin at the border from converting every call).
const SMALL_MAX: usize = 48;
const SMALL_AGAIN: usize = 16;

/// The ranges of one size class, ordered by (length, start). Most bins hold a handful, and a
/// sorted vector searched with a binary search costs a fraction of a B-tree's insert and remove
/// (which were a quarter of the hot path); a bin that fills up with fragments switches to a
/// B-tree so that no operation ever moves more than `SMALL_MAX` entries.
#[derive(Debug)]
enum Bin {
    Small(Vec<Entry>),
    Large(BTreeSet<Entry>),
}

impl Bin {
    fn insert(&mut self, key: Entry) -> bool {
        match self {
            Bin::Small(v) => match v.binary_search(&key) {
                Ok(_) => false,
                Err(i) => {
                    if v.len() < SMALL_MAX {
                        v.insert(i, key);
                    } else {
                        let mut set: BTreeSet<_> = v.drain(..).collect();
                        set.insert(key);
                        *self = Bin::Large(set);
                    }
                    true
                }
            },
            Bin::Large(set) => set.insert(key),
        }
    }

    fn remove(&mut self, key: Entry) -> bool {
        match self {
            Bin::Small(v) => match v.binary_search(&key) {
                Ok(i) => {
                    v.remove(i);
                    true
                }
                Err(_) => false,
            },
            Bin::Large(set) => {
                let removed = set.remove(&key);
                if set.len() < SMALL_AGAIN {
                    *self = Bin::Small(std::mem::take(set).into_iter().collect());
                }
                removed
            }
        }
    }

    fn contains(&self, key: Entry) -> bool {
        match self {
            Bin::Small(v) => v.binary_search(&key).is_ok(),
            Bin::Large(set) => set.contains(&key),
        }
    }

    /// Replaces `old` by `new` where it stands, if `new` sorts to the same place: true if done.
    /// Carving an allocation from the front of a range, or freeing a block next to one, changes
    /// the range's key by a little, and usually not its rank: one search instead of two, and no
    /// entries moved.
    fn replace(&mut self, old: Entry, new: Entry) -> bool {
        let Bin::Small(v) = self else {
            return false;
        };
        let Ok(i) = v.binary_search(&old) else {
            return false;
        };
        let after_prev = i == 0 || v[i - 1] < new;
        let before_next = v.get(i + 1).is_none_or(|&n| new < n);
        if after_prev && before_next {
            v[i] = new;
            return true;
        }
        false
    }

    fn iter(&self) -> Box<dyn Iterator<Item = Entry> + '_> {
        match self {
            Bin::Small(v) => Box::new(v.iter().copied()),
            Bin::Large(set) => Box::new(set.iter().copied()),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Bin::Small(v) => v.is_empty(),
            Bin::Large(set) => set.is_empty(),
        }
    }

    /// The first entry at or after `key`.
    fn first_from(&self, key: Entry) -> Option<Entry> {
        match self {
            Bin::Small(v) => {
                let i = v.partition_point(|&e| e < key);
                v.get(i).copied()
            }
            Bin::Large(set) => set.range(key..).next().copied(),
        }
    }
}

/// Four classes per power of two, for lengths up to 2^64.
const CLASSES: usize = 64 * 4;
const WORDS: usize = CLASSES / 64;

/// The class of a length: monotone, so a longer range never has a lower class.
fn class_of(len: usize) -> usize {
    let len = len.max(1);
    let fl = (usize::BITS - 1 - len.leading_zeros()) as usize;
    let sl = if fl >= 2 { (len >> (fl - 2)) & 3 } else { 0 };
    fl * 4 + sl
}

#[derive(Debug)]
pub(crate) struct SizeIndex {
    bins: Vec<Bin>,
    nonempty: [u64; WORDS],
    count: usize,
}

impl Default for SizeIndex {
    fn default() -> Self {
        Self {
            bins: (0..CLASSES).map(|_| Bin::Small(Vec::new())).collect(),
            nonempty: [0; WORDS],
            count: 0,
        }
    }
}

impl SizeIndex {
    pub(crate) fn insert(&mut self, e: Entry) {
        let c = class_of(e.0);
        if self.bins[c].insert(e) {
            self.count += 1;
            self.nonempty[c / 64] |= 1 << (c % 64);
        }
    }

    pub(crate) fn remove(&mut self, e: Entry) -> bool {
        let c = class_of(e.0);
        let bin = &mut self.bins[c];
        if !bin.remove(e) {
            return false;
        }
        self.count -= 1;
        if bin.is_empty() {
            self.nonempty[c / 64] &= !(1 << (c % 64));
        }
        true
    }

    /// Replaces the entry `old` (which must be present) by `new`.
    pub(crate) fn replace(&mut self, old: Entry, new: Entry) {
        let c = class_of(old.0);
        if c == class_of(new.0) && self.bins[c].replace(old, new) {
            return;
        }
        let removed = self.remove(old);
        debug_assert!(removed, "replacing {old:?}, which is not indexed");
        self.insert(new);
    }

    pub(crate) fn contains(&self, e: Entry) -> bool {
        self.bins[class_of(e.0)].contains(e)
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Entry> + '_ {
        self.bins.iter().flat_map(Bin::iter)
    }

    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// The smallest range of at least `len` bytes (lowest address on ties).
    pub(crate) fn best_fit(&self, len: usize) -> Option<Entry> {
        let c = class_of(len);
        if let Some(found) = self.bins[c].first_from((len, 0, 0)) {
            return Some(found);
        }
        let higher = self.next_nonempty(c + 1)?;
        self.bins[higher].first_from((0, 0, 0))
    }

    /// The first non-empty class at or above `from`.
    fn next_nonempty(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        if word >= WORDS {
            return None;
        }
        let mut bits = self.nonempty[word] & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word >= WORDS {
                return None;
            }
            bits = self.nonempty[word];
        }
    }
}

/// One `SizeIndex` per (stream, pool), in a vector searched linearly: a program uses a handful
/// of streams, and comparing a few keys is cheaper than hashing one. Each index keeps its slot
/// for the allocator's life, so segments and blocks name theirs by slot and skip the search.
#[derive(Debug, Default)]
pub(crate) struct Indexes {
    all: Vec<((StreamId, PoolKind), SizeIndex)>,
}

impl Indexes {
    /// The slot of `key`'s index, if it has one.
    pub(crate) fn find(&self, key: (StreamId, PoolKind)) -> Option<u32> {
        self.all
            .iter()
            .position(|(k, _)| *k == key)
            .map(|i| i as u32)
    }

    /// The slot of `key`'s index, created empty on first use.
    pub(crate) fn slot(&mut self, key: (StreamId, PoolKind)) -> u32 {
        match self.find(key) {
            Some(i) => i,
            None => {
                self.all.push((key, SizeIndex::default()));
                (self.all.len() - 1) as u32
            }
        }
    }

    pub(crate) fn at(&self, slot: u32) -> &SizeIndex {
        &self.all[slot as usize].1
    }

    pub(crate) fn at_mut(&mut self, slot: u32) -> &mut SizeIndex {
        &mut self.all[slot as usize].1
    }

    /// How many ranges all indexes hold.
    pub(crate) fn len(&self) -> usize {
        self.all.iter().map(|(_, ix)| ix.len()).sum()
    }

    pub(crate) fn clear(&mut self) {
        self.all.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit(ix: &SizeIndex, len: usize) -> Option<(usize, u64)> {
        ix.best_fit(len).map(|(l, at, _)| (l, at))
    }

    #[test]
    fn replace_keeps_the_order_whether_or_not_the_rank_changes() {
        let mut ix = SizeIndex::default();
        for (i, at) in [0x1000u64, 0x3000, 0x5000].into_iter().enumerate() {
            ix.insert((4096, at, i as PieceId));
        }
        // Same rank: replaced where it stands.
        ix.replace((4096, 0x3000, 1), (4096, 0x3200, 1));
        assert!(ix.contains((4096, 0x3200, 1)) && !ix.contains((4096, 0x3000, 1)));
        // A new rank in the same class, then another class.
        ix.replace((4096, 0x5000, 2), (4096, 0x0200, 2));
        assert_eq!(fit(&ix, 4096), Some((4096, 0x0200)));
        ix.replace((4096, 0x0200, 2), (1 << 20, 0x0200, 2));
        assert_eq!(fit(&ix, 4096), Some((4096, 0x1000)));
        assert_eq!(fit(&ix, 4097), Some((1 << 20, 0x0200)));
        assert_eq!(ix.len(), 3);
        let mut all: Vec<Entry> = ix.iter().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            vec![(4096, 0x1000, 0), (4096, 0x3200, 1), (1 << 20, 0x0200, 2)]
        );
    }

    #[test]
    fn classes_are_monotone_and_cover_every_length() {
        let mut lens: Vec<usize> = (0..64u32)
            .flat_map(|shift| {
                let p = 1usize << shift;
                [
                    p,
                    p + 1,
                    p + p / 4,
                    p + p / 2,
                    p + 3 * p / 4,
                    p.wrapping_mul(2).wrapping_sub(1),
                ]
            })
            .filter(|&l| l > 0)
            .collect();
        lens.push(usize::MAX);
        lens.sort_unstable();
        for w in lens.windows(2) {
            assert!(class_of(w[0]) <= class_of(w[1]), "{} > {}", w[0], w[1]);
        }
        assert_eq!(class_of(usize::MAX), CLASSES - 1);
    }

    #[test]
    fn a_bin_that_fills_up_and_empties_again_keeps_every_range_in_order() {
        let mut ix = SizeIndex::default();
        // 200 ranges of one class (4096..5120 bytes): the bin becomes a B-tree and back.
        let ranges: Vec<(usize, u64)> = (0..200u64)
            .map(|i| (4096 + 512 * (i % 2) as usize, 0x10_0000 * (200 - i)))
            .collect();
        for &(len, at) in &ranges {
            ix.insert((len, at, 7));
        }
        assert_eq!(ix.len(), 200);
        assert_eq!(fit(&ix, 4096), Some((4096, 0x10_0000 * 2)));
        assert_eq!(fit(&ix, 4097), Some((4608, 0x10_0000)));
        for &(len, at) in &ranges[..190] {
            assert!(ix.remove((len, at, 7)));
        }
        assert_eq!(ix.len(), 10);
        for &(len, at) in &ranges[190..] {
            assert!(ix.contains((len, at, 7)));
        }
        assert_eq!(fit(&ix, 4096), Some((4096, 0x10_0000 * 2)));
    }

    #[test]
    fn best_fit_is_the_smallest_that_fits_lowest_address_first() {
        let mut ix = SizeIndex::default();
        for &(len, at) in &[
            (4096, 0x9000),
            (2048, 0x1000),
            (4096, 0x5000),
            (1 << 30, 0x10),
        ] {
            ix.insert((len, at, 7));
        }
        assert_eq!(fit(&ix, 2048), Some((2048, 0x1000)));
        assert_eq!(fit(&ix, 2049), Some((4096, 0x5000)));
        assert_eq!(fit(&ix, 5000), Some((1 << 30, 0x10)));
        assert_eq!(fit(&ix, (1 << 30) + 1), None);
        assert!(ix.remove((4096, 0x5000, 7)));
        assert!(!ix.remove((4096, 0x5000, 7)));
        assert_eq!(fit(&ix, 2049), Some((4096, 0x9000)));
        assert_eq!(ix.len(), 3);
    }
}
