//! The best-fit index of one (stream, pool): every free range by (length, address).
//!
//! Note [Size classes]: ranges are binned by a TLSF-style size class (the power of two below the
//! length, split in four), and a bitmap says which bins hold anything. Best fit looks in the
//! request's own bin (only there can a range be too small), then takes the first range of the
//! next non-empty bin, found with one bit scan: every length in a higher bin is larger than every
//! length in a lower one, so this is still the exact best fit (smallest length that fits, lowest
//! address on ties) that one ordered set gave, while each set stays small: a hot path that keeps
//! carving the tail of a segment no longer shares a B-tree with 100,000 fragments of other sizes.
//!
//! Note [Hot range]: the range a replace moved to another class (or rank), or that was alone in
//! its bin, waits outside the bins, in one slot, until another range takes its place there. The
//! hot path carves a block from one free range and merges it back on free; where that changes
//! the range's class (1 MiB from a 2 MiB page, 256 MiB from a longer tail), each call would take
//! it out of one bin and put it in another, and where the range is its bin's only one (512 B
//! from a page), each call would still look its class up and check the bin; in the slot it is
//! rewritten after one compare. Best fit compares the slot with the bins' answer, so it is still
//! the exact best fit: the index holds the same set, in another place.

use crate::backend::StreamId;
use crate::expandable::pieces::PieceId;
use crate::expandable::sorted_runs::SortedRuns;
use crate::stats::PoolKind;

/// One free range, as the index files it: ordered by length, then start (the piece never
/// decides: two ranges never share a start). Field order is the order: do not reorder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FreeRange {
    pub(crate) len: usize,
    pub(crate) start: u64,
    /// The free piece of the tiling that is this range (Note [Pieces]).
    pub(crate) piece: PieceId,
}

impl FreeRange {
    #[inline]
    pub(crate) const fn new(len: usize, start: u64, piece: PieceId) -> Self {
        Self { len, start, piece }
    }
}

/// The (stream, pool) an index serves: its key among the indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct StreamPool {
    pub(crate) stream: StreamId,
    pub(crate) pool: PoolKind,
}

/// The ranges of one size class, ordered by (length, start) (Note [Sorted runs]).
type Bin = SortedRuns<FreeRange>;

/// Four classes per power of two, for lengths up to 2^64.
const CLASSES: usize = 64 * 4;
const WORDS: usize = CLASSES / 64;

/// The class of a length: monotone, so a longer range never has a lower class.
///
/// Classes are closed at the top, `(2^k, 2^k + 2^(k-2)]` and so on, not at the bottom: a
/// segment's free tail is usually a whole number of pages, a power of two or a sum of few, and
/// an allocation carved from it (or freed back into it) then changes its length within one
/// class, where the index updates it in place (`replace`), instead of moving it between two
/// classes on every allocate + free pair.
#[inline]
fn class_of(len: usize) -> usize {
    let len = len.saturating_sub(1).max(1);
    let fl = (usize::BITS - 1 - len.leading_zeros()) as usize;
    let sl = if fl >= 2 { (len >> (fl - 2)) & 3 } else { 0 };
    fl * 4 + sl
}

#[derive(Debug)]
pub(crate) struct SizeIndex {
    bins: Vec<Bin>,
    nonempty: [u64; WORDS],
    /// The range last moved by a replace, in no bin (Note [Hot range]).
    hot: Option<FreeRange>,
}

impl Default for SizeIndex {
    fn default() -> Self {
        Self {
            bins: (0..CLASSES).map(|_| Bin::default()).collect(),
            nonempty: [0; WORDS],
            hot: None,
        }
    }
}

impl SizeIndex {
    /// Adds `e` to class `c`'s bin and marks the bin non-empty.
    #[inline]
    fn put(&mut self, c: usize, e: FreeRange) {
        let new = self.bins[c].insert(e);
        debug_assert!(new, "{e:?} indexed twice");
        self.nonempty[c / 64] |= 1 << (c % 64);
    }

    /// Takes `e` out of class `c`'s bin, marking the bin empty if it is; false if absent.
    #[inline]
    fn take(&mut self, c: usize, e: FreeRange) -> bool {
        let bin = &mut self.bins[c];
        let removed = bin.remove(&e);
        if bin.is_empty() {
            self.nonempty[c / 64] &= !(1 << (c % 64));
        }
        removed
    }

    #[inline]
    pub(crate) fn insert(&mut self, e: FreeRange) {
        self.put(class_of(e.len), e);
    }

    #[inline]
    pub(crate) fn remove(&mut self, e: FreeRange) -> bool {
        if self.hot == Some(e) {
            self.hot = None;
            return true;
        }
        self.take(class_of(e.len), e)
    }

    /// Replaces the entry `old` (which must be present) by `new`: in place when it is the hot
    /// range or keeps its class and rank (a page-sized tail carved or given back), else it
    /// becomes the hot range and the one before goes to its bin (Note [Hot range]).
    #[inline]
    pub(crate) fn replace(&mut self, old: FreeRange, new: FreeRange) {
        if self.hot == Some(old) {
            self.hot = Some(new);
            return;
        }
        let co = class_of(old.len);
        // A range alone in its bin moves to the hot slot even when its class stays: taking it
        // out of a bin of one is cheap, and the next replace of it (the pair's other half) is
        // then one compare instead of a class lookup and a bin's checks.
        if co == class_of(new.len)
            && self.bins[co].len() > 1
            && self.bins[co].replace_in_place(&old, new)
        {
            return;
        }
        let removed = self.take(co, old);
        debug_assert!(removed, "replacing {old:?}, which is not indexed");
        if let Some(before) = self.hot.replace(new) {
            self.put(class_of(before.len), before);
        }
    }

    pub(crate) fn contains(&self, e: FreeRange) -> bool {
        self.hot == Some(e) || self.bins[class_of(e.len)].contains(&e)
    }

    /// Calls `f` with every range of at least `len` bytes, in no particular order: the
    /// non-empty bins from `len`'s class up (the first may also hold shorter ones, skipped) and
    /// the hot range (Note [Indexed chunk listing] in `chunk_cache.rs`).
    pub(crate) fn for_each_at_least(&self, len: usize, mut f: impl FnMut(FreeRange)) {
        let mut from = class_of(len);
        while let Some(c) = self.next_nonempty(from) {
            self.bins[c].for_each(|r| {
                if r.len >= len {
                    f(r);
                }
            });
            from = c + 1;
        }
        if let Some(h) = self.hot.filter(|h| h.len >= len) {
            f(h);
        }
    }

    /// Every entry, in no particular order.
    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = FreeRange> + '_ {
        self.bins.iter().flat_map(|b| b.iter()).chain(self.hot)
    }

    /// How many ranges it holds: counted, not kept (only `check` asks).
    pub(crate) fn len(&self) -> usize {
        self.bins.iter().map(SortedRuns::len).sum::<usize>() + usize::from(self.hot.is_some())
    }

    /// The smallest range of at least `len` bytes (lowest address on ties).
    #[inline]
    pub(crate) fn best_fit(&self, len: usize) -> Option<FreeRange> {
        let binned = self.best_fit_in_bins(len);
        match self.hot {
            // (len, start, piece) order: the hot range fits exactly when its length does.
            Some(h) if h.len >= len && binned.is_none_or(|b| h < b) => Some(h),
            _ => binned,
        }
    }

    /// Whether no other range of `e`'s length (`e` indexed here) lies below it, where that is
    /// known without a search: nothing before `e` in its bin's order (length, then address; `e`
    /// itself may be there or be the hot range), and the hot range not one of its length below
    /// it. False where only a search could tell (a shorter range first in the bin). True means
    /// best fit would take `e` for a request of exactly its length (Note \[Last free\] in
    /// `last_free.rs`).
    #[inline]
    pub(crate) fn lowest_of_its_length(&self, e: FreeRange) -> bool {
        if self
            .hot
            .is_some_and(|h| h.len == e.len && h.start < e.start)
        {
            return false;
        }
        self.bins[class_of(e.len)].first().is_none_or(|f| f >= e)
    }

    /// At most `N` distinct ranges spread over the lengths, for a front arena to lend (Note
    /// [Front arena] in `front/arena.rs`): the longest, the hot one, then the smallest of each
    /// non-empty class from the highest down, so that best fit among them is, for most
    /// requests, the best fit among all.
    pub(crate) fn spread<const N: usize>(&self) -> arrayvec::ArrayVec<FreeRange, N> {
        let mut out: arrayvec::ArrayVec<FreeRange, N> = arrayvec::ArrayVec::new();
        for r in self.largest().into_iter().chain(self.hot) {
            if !out.is_full() && !out.contains(&r) {
                out.push(r);
            }
        }
        for w in (0..WORDS).rev() {
            let mut bits = self.nonempty[w];
            while bits != 0 && !out.is_full() {
                let c = w * 64 + 63 - bits.leading_zeros() as usize;
                bits &= !(1 << (c % 64));
                if let Some(first) = self.bins[c].first().filter(|f| !out.contains(f)) {
                    out.push(first);
                }
            }
        }
        out
    }

    /// The longest range (highest address among equals). The highest non-empty class, then the
    /// hot slot.
    pub(crate) fn largest(&self) -> Option<FreeRange> {
        let binned = (0..WORDS).rev().find_map(|w| {
            let bits = self.nonempty[w];
            (bits != 0).then(|| w * 64 + 63 - bits.leading_zeros() as usize)
        });
        let binned = binned.and_then(|c| self.bins[c].last());
        match (binned, self.hot) {
            (Some(b), Some(h)) => Some(b.max(h)),
            (b, h) => b.or(h),
        }
    }

    /// [`best_fit`](Self::best_fit) among the binned ranges.
    #[inline]
    fn best_fit_in_bins(&self, len: usize) -> Option<FreeRange> {
        let c = class_of(len);
        if let Some(found) = self.bins[c].first_from(&FreeRange::new(len, 0, PieceId::LEAST)) {
            return Some(found);
        }
        let higher = self.next_nonempty(c + 1)?;
        self.bins[higher].first()
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

/// One `SizeIndex` per (stream, pool), in a vector: a program uses a handful of streams, and
/// comparing a few keys is cheaper than hashing one, so the first [`SCANNED`] are searched
/// linearly and the rest through a hash map (O(1) with 200,000 streams, issue 21). Each index
/// keeps its slot for the allocator's life, so segments and blocks name theirs by slot and skip
/// the search.
#[derive(Debug, Default)]
pub(crate) struct Indexes {
    all: Vec<(StreamPool, SizeIndex)>,
    /// Slots from [`SCANNED`] on, by key.
    beyond: rustc_hash::FxHashMap<StreamPool, u32>,
    /// Slots of the large pool: the streams that ever took large-pool memory.
    large: u32,
}

/// Indexes searched by a scan before the hash map.
const SCANNED: usize = 8;

impl Indexes {
    /// The slot of `key`'s index, if it has one.
    #[inline]
    pub(crate) fn find(&self, key: StreamPool) -> Option<u32> {
        let scanned = self.all.iter().take(SCANNED).position(|(k, _)| *k == key);
        match scanned {
            Some(i) => Some(i as u32),
            None if self.all.len() > SCANNED => self.beyond.get(&key).copied(),
            None => None,
        }
    }

    /// The slot of `key`'s index, created empty on first use.
    pub(crate) fn slot(&mut self, key: StreamPool) -> u32 {
        match self.find(key) {
            Some(i) => i,
            None => {
                let slot = self.all.len() as u32;
                if self.all.len() >= SCANNED {
                    self.beyond.insert(key, slot);
                }
                self.all.push((key, SizeIndex::default()));
                self.large += u32::from(key.pool == PoolKind::Large);
                slot
            }
        }
    }

    /// How many streams ever took large-pool memory.
    pub(crate) fn large_streams(&self) -> u32 {
        self.large
    }

    /// The (stream, pool) of the index in `slot`.
    #[inline]
    pub(crate) fn key(&self, slot: u32) -> StreamPool {
        self.all[slot as usize].0
    }

    #[inline]
    pub(crate) fn at(&self, slot: u32) -> &SizeIndex {
        &self.all[slot as usize].1
    }

    #[inline]
    pub(crate) fn at_mut(&mut self, slot: u32) -> &mut SizeIndex {
        &mut self.all[slot as usize].1
    }

    /// How many slots there are (every slot below it is one's).
    pub(crate) fn slots(&self) -> usize {
        self.all.len()
    }

    /// How many ranges all indexes hold.
    pub(crate) fn len(&self) -> usize {
        self.all.iter().map(|(_, ix)| ix.len()).sum()
    }

    pub(crate) fn clear(&mut self) {
        self.all.clear();
        self.beyond.clear();
        self.large = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit(ix: &SizeIndex, len: usize) -> Option<(usize, u64)> {
        ix.best_fit(len).map(|r| (r.len, r.start))
    }

    #[test]
    fn replace_keeps_the_order_whether_or_not_the_rank_changes() {
        let mut ix = SizeIndex::default();
        // Three pieces from an arena: ids as the allocator has them.
        let mut arena = crate::expandable::pieces::Pieces::default();
        let id: Vec<PieceId> = (0..3).map(|i| arena.new_tiling(i << 20, 4096)).collect();
        for (&piece, at) in id.iter().zip([0x1000u64, 0x3000, 0x5000]) {
            ix.insert(FreeRange::new(4096, at, piece));
        }
        // Same rank: replaced where it stands.
        ix.replace(
            FreeRange::new(4096, 0x3000, id[1]),
            FreeRange::new(4096, 0x3200, id[1]),
        );
        assert!(
            ix.contains(FreeRange::new(4096, 0x3200, id[1]))
                && !ix.contains(FreeRange::new(4096, 0x3000, id[1]))
        );
        // A new rank in the same class, then another class.
        ix.replace(
            FreeRange::new(4096, 0x5000, id[2]),
            FreeRange::new(4096, 0x0200, id[2]),
        );
        assert_eq!(fit(&ix, 4096), Some((4096, 0x0200)));
        ix.replace(
            FreeRange::new(4096, 0x0200, id[2]),
            FreeRange::new(1 << 20, 0x0200, id[2]),
        );
        assert_eq!(fit(&ix, 4096), Some((4096, 0x1000)));
        assert_eq!(fit(&ix, 4097), Some((1 << 20, 0x0200)));
        assert_eq!(ix.len(), 3);
        let mut all: Vec<FreeRange> = ix.iter().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            vec![
                FreeRange::new(4096, 0x1000, id[0]),
                FreeRange::new(4096, 0x3200, id[1]),
                FreeRange::new(1 << 20, 0x0200, id[2])
            ]
        );
    }

    #[test]
    fn agrees_with_an_ordered_set_through_inserts_removes_and_replaces() {
        use std::collections::BTreeSet;
        let mut rng = crate::expandable::sorted_runs::tests::Lcg(11);
        let mut below = |n: u64| rng.below(n);
        // Lengths across many classes, with ties; each start used by one range at most.
        let lens = [
            512,
            4096,
            1 << 20,
            (1 << 20) + 512,
            2 << 20,
            20 << 20,
            256 << 20,
        ];
        let mut ix = SizeIndex::default();
        let mut set = BTreeSet::new();
        let mut sure = 0;
        for step in 0..20_000 {
            let len = lens[below(lens.len() as u64) as usize] - 512 * below(2) as usize;
            let range = FreeRange::new(len, below(300) << 12, PieceId::LEAST);
            let taken = |set: &BTreeSet<FreeRange>, at: u64| set.iter().any(|r| r.start == at);
            match below(4) {
                0 if !taken(&set, range.start) => {
                    ix.insert(range);
                    set.insert(range);
                }
                1 => {
                    let old = set
                        .iter()
                        .nth(below(set.len() as u64 + 1) as usize)
                        .copied();
                    assert_eq!(
                        ix.remove(old.unwrap_or(range)),
                        set.remove(&old.unwrap_or(range))
                    );
                }
                _ => {
                    // The hot path's replace: one range carved or grown, often the same one.
                    if let Some(&old) = set.iter().nth(below(set.len().min(3) as u64 + 1) as usize)
                    {
                        let new = FreeRange::new(len, old.start, old.piece);
                        if !set.contains(&new) {
                            ix.replace(old, new);
                            set.remove(&old);
                            set.insert(new);
                        }
                    }
                }
            }
            assert_eq!(ix.len(), set.len(), "step {step}");
            for want in [1, 512, 4097, 1 << 20, 3 << 20, 21 << 20, 300 << 20] {
                let model = set.range(FreeRange::new(want, 0, PieceId::LEAST)..).next();
                assert_eq!(
                    ix.best_fit(want),
                    model.copied(),
                    "step {step}, best fit of {want}"
                );
            }
            assert!(ix.contains(range) == set.contains(&range));
            assert_eq!(ix.largest(), set.last().copied(), "step {step}, largest");
            // Never says "lowest" of a range that best fit of its length would not take.
            for &r in set.iter().take(8).chain(set.iter().rev().take(8)) {
                if ix.lowest_of_its_length(r) {
                    sure += 1;
                    assert_eq!(ix.best_fit(r.len), Some(r), "step {step}, lowest of {r:?}");
                }
            }
        }
        assert!(sure > 1_000, "the shortcut almost never applies: {sure}");
        let mut all: Vec<FreeRange> = ix.iter().collect();
        all.sort_unstable();
        assert!(all.iter().eq(set.iter()));
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
            ix.insert(FreeRange::new(len, at, PieceId::LEAST));
        }
        assert_eq!(ix.len(), 200);
        assert_eq!(fit(&ix, 4096), Some((4096, 0x10_0000 * 2)));
        assert_eq!(fit(&ix, 4097), Some((4608, 0x10_0000)));
        for &(len, at) in &ranges[..190] {
            assert!(ix.remove(FreeRange::new(len, at, PieceId::LEAST)));
        }
        assert_eq!(ix.len(), 10);
        for &(len, at) in &ranges[190..] {
            assert!(ix.contains(FreeRange::new(len, at, PieceId::LEAST)));
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
            ix.insert(FreeRange::new(len, at, PieceId::LEAST));
        }
        assert_eq!(fit(&ix, 2048), Some((2048, 0x1000)));
        assert_eq!(fit(&ix, 2049), Some((4096, 0x5000)));
        assert_eq!(fit(&ix, 5000), Some((1 << 30, 0x10)));
        assert_eq!(fit(&ix, (1 << 30) + 1), None);
        assert!(ix.remove(FreeRange::new(4096, 0x5000, PieceId::LEAST)));
        assert!(!ix.remove(FreeRange::new(4096, 0x5000, PieceId::LEAST)));
        assert_eq!(fit(&ix, 2049), Some((4096, 0x9000)));
        assert_eq!(ix.len(), 3);
    }
}
