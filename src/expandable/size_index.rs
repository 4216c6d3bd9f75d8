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
use crate::stats::PoolKind;

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
    Small(Vec<(usize, u64)>),
    Large(BTreeSet<(usize, u64)>),
}

impl Bin {
    fn insert(&mut self, key: (usize, u64)) -> bool {
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

    fn remove(&mut self, key: (usize, u64)) -> bool {
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

    fn contains(&self, key: (usize, u64)) -> bool {
        match self {
            Bin::Small(v) => v.binary_search(&key).is_ok(),
            Bin::Large(set) => set.contains(&key),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Bin::Small(v) => v.is_empty(),
            Bin::Large(set) => set.is_empty(),
        }
    }

    /// The first entry at or after `key`.
    fn first_from(&self, key: (usize, u64)) -> Option<(usize, u64)> {
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
    pub(crate) fn insert(&mut self, len: usize, at: u64) {
        let c = class_of(len);
        if self.bins[c].insert((len, at)) {
            self.count += 1;
            self.nonempty[c / 64] |= 1 << (c % 64);
        }
    }

    pub(crate) fn remove(&mut self, len: usize, at: u64) -> bool {
        let c = class_of(len);
        let bin = &mut self.bins[c];
        if !bin.remove((len, at)) {
            return false;
        }
        self.count -= 1;
        if bin.is_empty() {
            self.nonempty[c / 64] &= !(1 << (c % 64));
        }
        true
    }

    pub(crate) fn contains(&self, len: usize, at: u64) -> bool {
        self.bins[class_of(len)].contains((len, at))
    }

    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// The smallest range of at least `len` bytes (lowest address on ties), as (length, start).
    pub(crate) fn best_fit(&self, len: usize) -> Option<(usize, u64)> {
        let c = class_of(len);
        if let Some(found) = self.bins[c].first_from((len, 0)) {
            return Some(found);
        }
        let higher = self.next_nonempty(c + 1)?;
        self.bins[higher].first_from((0, 0))
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
/// of streams, and comparing a few keys is cheaper than hashing one (this runs several times
/// per allocation).
#[derive(Debug, Default)]
pub(crate) struct Indexes {
    all: Vec<((StreamId, PoolKind), SizeIndex)>,
}

impl Indexes {
    pub(crate) fn get(&self, key: (StreamId, PoolKind)) -> Option<&SizeIndex> {
        self.all.iter().find(|(k, _)| *k == key).map(|(_, ix)| ix)
    }

    /// The index of `key`, created empty on first use.
    pub(crate) fn of(&mut self, key: (StreamId, PoolKind)) -> &mut SizeIndex {
        let i = match self.all.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                self.all.push((key, SizeIndex::default()));
                self.all.len() - 1
            }
        };
        &mut self.all[i].1
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
            ix.insert(len, at);
        }
        assert_eq!(ix.len(), 200);
        assert_eq!(ix.best_fit(4096), Some((4096, 0x10_0000 * 2)));
        assert_eq!(ix.best_fit(4097), Some((4608, 0x10_0000)));
        for &(len, at) in &ranges[..190] {
            assert!(ix.remove(len, at));
        }
        assert_eq!(ix.len(), 10);
        for &(len, at) in &ranges[190..] {
            assert!(ix.contains(len, at));
        }
        assert_eq!(ix.best_fit(4096), Some((4096, 0x10_0000 * 2)));
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
            ix.insert(len, at);
        }
        assert_eq!(ix.best_fit(2048), Some((2048, 0x1000)));
        assert_eq!(ix.best_fit(2049), Some((4096, 0x5000)));
        assert_eq!(ix.best_fit(5000), Some((1 << 30, 0x10)));
        assert_eq!(ix.best_fit((1 << 30) + 1), None);
        assert!(ix.remove(4096, 0x5000));
        assert!(!ix.remove(4096, 0x5000));
        assert_eq!(ix.best_fit(2049), Some((4096, 0x9000)));
        assert_eq!(ix.len(), 3);
    }
}
