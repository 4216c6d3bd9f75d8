//! A shard's front arena: free ranges of one stream lent by the core, from which allocations of
//! any size are carved without the allocator's lock (Note [Front arena]).
//!
//! Note [Front arena]: the stash serves a request only with a block of its very size freed
//! before, so a stream whose sizes do not recur (every request of a new shape) misses on every
//! call and takes the one lock, and two threads on two streams then run no faster than one
//! (BENCHMARKS.md, "Threads", `threads-varied`). So every slow call, holding every lock, also
//! *lends* each shard up to [`ARENA_RANGES`] free ranges of the stream and pool its last slow
//! allocation was for (the longest, and the smallest of each size class from the longest down:
//! best fit among them is then, for most requests, the core's own), and:
//!
//! * An allocation the stash misses is carved best fit (the smallest free part that holds it,
//!   lowest address on ties, from that part's front, as the core carves) from its shard's
//!   arena, if the arena is its stream's and pool's, paid by the shard's allowance exactly as a
//!   stash take is (Note [Front allowance]: one block, its bytes, its request).
//! * A free through `deallocate` of a block carved from the arena since it was lent goes back
//!   to the arena (merged with the free parts beside it) and earns the allowance back, as a
//!   stash does; the pair is counted as a stash take's pair is.
//! * Nothing in the core changes while a range is lent: every slow call *settles* every arena
//!   first, before it looks at the core (`settle`): each block still carved is recorded in the
//!   core where it lies (`State::allocate_at`, with the stashed blocks out of the counters'
//!   `current`, so no peak rises past what a user read), and the lent range's free parts are
//!   simply what the core's free range still holds. A block freed before the settling never
//!   reaches the core at all. So the core's decisions (growth, the pressure path, events,
//!   `empty_cache`) are taken on the state the calls in their order made, as with the stash.
//! * A free the arena cannot take (its list of free parts is full and the block touches none of
//!   them) goes the slow way, which settles the arena first and then frees the block in the
//!   core; so does a free by address (`deallocate_ptr`), and every call but these two.
//!
//! What it changes: which range a request gets, while the cache is engaged (threads contend):
//! best fit among the lent ranges' parts rather than among every free range of the stream. On
//! the 23 shared traces replayed with the cache always on (one thread, a worst case) that costs
//! 290.50 GiB of minimum capacity summed against the stash alone's 290.49 (lending only the
//! longest range, measured first: 290.89). One thread never engages the cache by default and
//! gets the measured policy, call for call. Two threads on two streams whose sizes do not recur
//! run 2.1–3.4 × one (BENCHMARKS.md, "Threads"; before: 0.78–0.95 ×).

use arrayvec::ArrayVec;

use super::allowance::Amount;
use crate::backend::StreamId;
use crate::expandable::size_index::FreeRange;
use crate::stats::PoolKind;

/// Free ranges lent to one arena at most.
pub(crate) const ARENA_RANGES: usize = 8;
/// Free parts an arena keeps apart at most: a free that would need one more goes the slow way.
pub(crate) const ARENA_PARTS: usize = 24;
/// Blocks an arena carves between two settlings at most: a request past them goes the slow way.
pub(crate) const ARENA_BLOCKS: usize = 64;

/// A block carved from an arena, not yet known to the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Carved {
    pub(crate) addr: u64,
    pub(crate) size: usize,
    pub(crate) requested: usize,
}

/// What became of a free offered to an arena.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum GiveBack {
    /// The block was not carved from this arena.
    NotHere,
    /// Back among the free parts.
    Taken,
    /// Carved here, but the free parts are full: the free must settle the arena first.
    Full,
}

/// Where a lent free range ends.
fn end(r: &FreeRange) -> u64 {
    r.start + r.len as u64
}

/// Whether lent free range `r` holds address `at`.
fn holds(r: &FreeRange, at: u64) -> bool {
    r.start <= at && at < end(r)
}

/// The free ranges lent to one shard for one (stream, pool), and what became of them since.
#[derive(Debug)]
pub(crate) struct Arena {
    pub(crate) stream: StreamId,
    pub(crate) pool: PoolKind,
    /// The core's index slot of (stream, pool).
    pub(crate) slot: u32,
    /// The core's free ranges lent, unchanged in the core while lent; in address order.
    pub(crate) lent: ArrayVec<FreeRange, ARENA_RANGES>,
    /// The free parts, in address order, no two of one lent range touching: (start, length).
    /// Two lent ranges never touch inside a segment, where free ranges are merged, but two
    /// segments' reservations may: parts merge only inside one lent range.
    parts: ArrayVec<(u64, usize), ARENA_PARTS>,
    carved: ArrayVec<Carved, ARENA_BLOCKS>,
}

impl Default for Arena {
    /// An arena with nothing lent.
    fn default() -> Self {
        Self {
            stream: StreamId::DEFAULT,
            pool: PoolKind::Small,
            slot: 0,
            lent: ArrayVec::new(),
            parts: ArrayVec::new(),
            carved: ArrayVec::new(),
        }
    }
}

impl Arena {
    /// Whether a range is lent to it.
    pub(crate) fn is_lent(&self) -> bool {
        !self.lent.is_empty()
    }

    /// Whether blocks carved from it are still out.
    pub(crate) fn has_carved(&self) -> bool {
        !self.carved.is_empty()
    }

    /// Lends nothing any more (what settling leaves: the core holds what was carved).
    pub(crate) fn clear(&mut self) {
        self.lent.clear();
        self.parts.clear();
        self.carved.clear();
    }

    /// Lends it the free ranges `lent` (distinct free pieces of `slot`, at most
    /// [`ARENA_RANGES`] taken) of (stream, pool), in place; none leaves it unlent.
    pub(crate) fn lend(
        &mut self,
        (stream, pool): (StreamId, PoolKind),
        slot: u32,
        lent: impl IntoIterator<Item = FreeRange>,
    ) {
        self.clear();
        self.lent.extend(lent.into_iter().take(ARENA_RANGES));
        self.lent.sort_unstable_by_key(|l| l.start);
        self.parts
            .extend(self.lent.iter().map(|l| (l.start, l.len)));
        (self.stream, self.pool, self.slot) = (stream, pool, slot);
    }

    /// The lent range that holds `at`.
    fn range_of(&self, at: u64) -> Option<&FreeRange> {
        self.lent.iter().find(|l| holds(l, at))
    }

    /// Carves `rounded` bytes for a request of `requested` from the front of the smallest free
    /// part that holds them (lowest address on ties); its address, or `None`.
    pub(crate) fn carve(&mut self, rounded: usize, requested: usize) -> Option<u64> {
        if self.carved.is_full() {
            return None;
        }
        let (i, &(at, len)) = self
            .parts
            .iter()
            .enumerate()
            .filter(|(_, p)| p.1 >= rounded)
            .min_by_key(|(_, p)| (p.1, p.0))?;
        if len == rounded {
            self.parts.remove(i);
        } else {
            self.parts[i] = (at + rounded as u64, len - rounded);
        }
        self.carved.push(Carved {
            addr: at,
            size: rounded,
            requested,
        });
        Some(at)
    }

    /// Takes back block `addr` of `size` bytes if it was carved here, merged with the free
    /// parts of its lent range beside it.
    pub(crate) fn give_back(&mut self, addr: u64, size: usize) -> GiveBack {
        let Some(c) = self
            .carved
            .iter()
            .position(|c| c.addr == addr && c.size == size)
        else {
            return GiveBack::NotHere;
        };
        let Some(range) = self.range_of(addr).copied() else {
            return GiveBack::NotHere;
        };
        let end = addr + size as u64;
        // The first part after the block; the one before it, if any, is just before.
        let i = self.parts.partition_point(|p| p.0 < addr);
        let joins_before = i > 0 && {
            let (s, l) = self.parts[i - 1];
            s + l as u64 == addr && holds(&range, s)
        };
        let joins_after = i < self.parts.len() && self.parts[i].0 == end && holds(&range, end);
        match (joins_before, joins_after) {
            (true, true) => {
                let (_, next) = self.parts.remove(i);
                self.parts[i - 1].1 += size + next;
            }
            (true, false) => self.parts[i - 1].1 += size,
            (false, true) => self.parts[i] = (addr, self.parts[i].1 + size),
            (false, false) => {
                if self.parts.is_full() {
                    return GiveBack::Full;
                }
                self.parts.insert(i, (addr, size));
            }
        }
        self.carved.swap_remove(c);
        GiveBack::Taken
    }

    /// Each lent range with the blocks carved from it and not given back, by address.
    pub(crate) fn carved_by_range(&self) -> Vec<(FreeRange, Vec<Carved>)> {
        let mut carved = self.carved.to_vec();
        carved.sort_unstable_by_key(|c| c.addr);
        self.lent
            .iter()
            .map(|l| {
                let mine = carved
                    .iter()
                    .filter(|c| holds(l, c.addr))
                    .copied()
                    .collect();
                (*l, mine)
            })
            .collect()
    }

    /// The addresses of the blocks carved and not given back.
    pub(crate) fn carved_addresses(&self) -> impl Iterator<Item = u64> + '_ {
        self.carved.iter().map(|c| c.addr)
    }

    /// What the carved blocks add up to, as one [`Amount`] of the arena's pool.
    pub(crate) fn carved_amount(&self) -> Amount {
        let mut total = Amount::default();
        for c in &self.carved {
            total.add(&Amount::block(c.size, c.requested));
        }
        total
    }

    /// Whether the free parts and the carved blocks tile each lent range exactly, without
    /// overlap, the ranges apart, the parts in order and no two of one range touching (for
    /// `check`).
    pub(crate) fn tiles(&self) -> bool {
        let ordered = self.parts.windows(2).all(|w| {
            let end = w[0].0 + w[0].1 as u64;
            end < w[1].0 || (end == w[1].0 && self.range_of(w[0].0) != self.range_of(w[1].0))
        });
        let apart = self.lent.windows(2).all(|w| end(&w[0]) <= w[1].start);
        let pieces = self
            .parts
            .iter()
            .map(|&(s, n)| (s, s + n as u64))
            .chain(self.carved.iter().map(|c| (c.addr, c.addr + c.size as u64)));
        let mut pieces: Vec<(u64, u64)> = pieces.collect();
        pieces.sort_unstable();
        let mut next = pieces.iter();
        let each_tiled = self.lent.iter().all(|l| {
            let mut at = l.start;
            while at < end(l) {
                match next.next() {
                    Some(&(s, e)) if s == at && e > s => at = e,
                    _ => return false,
                }
            }
            at == end(l)
        });
        ordered && apart && each_tiled && next.next().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expandable::pieces::PieceId;

    const MB: usize = 1 << 20;

    fn lent(ranges: impl IntoIterator<Item = FreeRange>) -> Arena {
        let mut a = Arena::default();
        a.lend((StreamId::sim(1), PoolKind::Large), 0, ranges);
        assert!(a.is_lent());
        a
    }

    fn arena(len: usize) -> Arena {
        lent([FreeRange::new(len, 1 << 30, PieceId::LEAST)])
    }

    #[test]
    fn carves_best_fit_and_merges_what_comes_back() {
        let mut a = arena(10 * MB);
        let x = a.carve(2 * MB, 2 * MB).unwrap();
        let y = a.carve(3 * MB, 3 * MB - 1).unwrap();
        let z = a.carve(MB, MB).unwrap();
        let base = 1u64 << 30;
        assert_eq!(
            (x, y, z),
            (base, base + 2 * MB as u64, base + 5 * MB as u64)
        );
        assert!(a.tiles());
        // A 2 MiB hole at the front and 4 MiB at the end: 1 MiB goes in the smaller one.
        assert_eq!(a.give_back(x, 2 * MB), GiveBack::Taken);
        assert_eq!(a.carve(MB, MB), Some(x));
        assert_eq!(a.carved_amount().bytes, 5 * MB as u64);
        // Freed in any order, everything merges back into one part.
        for (addr, size) in [(z, MB), (x, MB), (y, 3 * MB)] {
            assert_eq!(a.give_back(addr, size), GiveBack::Taken);
            assert!(a.tiles());
        }
        assert_eq!(a.parts.as_slice(), &[(base, 10 * MB)]);
        assert_eq!(
            a.give_back(y, 3 * MB),
            GiveBack::NotHere,
            "given back twice"
        );
    }

    #[test]
    fn parts_of_two_touching_lent_ranges_never_merge() {
        // Two segments' reservations side by side, each with a free range at the border.
        let (a0, b0) = (1u64 << 30, (1u64 << 30) + 4 * MB as u64);
        let ranges = [b0, a0].map(|start| FreeRange::new(4 * MB, start, PieceId::LEAST));
        let mut a = lent(ranges);
        assert!(a.tiles());
        assert_eq!(a.carve(6 * MB, 6 * MB), None, "a block across two ranges");
        let x = a.carve(4 * MB, 4 * MB).unwrap();
        let y = a.carve(4 * MB, 4 * MB).unwrap();
        assert_eq!((x, y), (a0, b0));
        assert_eq!(a.give_back(x, 4 * MB), GiveBack::Taken);
        assert_eq!(a.give_back(y, 4 * MB), GiveBack::Taken);
        assert_eq!(a.parts.as_slice(), &[(a0, 4 * MB), (b0, 4 * MB)]);
        assert!(a.tiles());
        assert_eq!(a.carve(8 * MB, 8 * MB), None);
    }

    #[test]
    fn a_request_longer_than_every_part_is_refused() {
        let mut a = arena(4 * MB);
        assert_eq!(a.carve(5 * MB, 5 * MB), None);
        assert!(a.carve(4 * MB, 4 * MB).is_some());
        assert_eq!(a.carve(512, 1), None);
        assert!(a.tiles());
    }

    #[test]
    fn a_free_that_needs_one_part_too_many_is_refused_and_changes_nothing() {
        let mut a = arena(2 * ARENA_PARTS * MB + MB);
        let blocks: Vec<u64> = (0..2 * ARENA_PARTS)
            .map(|_| a.carve(MB, MB).unwrap())
            .collect();
        // Every other block back: the tail part plus one part per block given back.
        for &b in blocks.iter().step_by(2).take(ARENA_PARTS - 1) {
            assert_eq!(a.give_back(b, MB), GiveBack::Taken);
        }
        let last = blocks[2 * (ARENA_PARTS - 1)];
        assert_eq!(a.give_back(last, MB), GiveBack::Full);
        assert!(a.tiles());
        // Beside a free part it merges, full or not.
        assert_eq!(a.give_back(blocks[1], MB), GiveBack::Taken);
        assert!(a.tiles());
    }
}
