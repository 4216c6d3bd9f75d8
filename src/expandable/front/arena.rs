//! A shard's front arena: a free range of one stream lent by the core, from which allocations
//! of any size are carved without the allocator's lock (Note [Front arena]).
//!
//! Note [Front arena]: the stash serves a request only with a block of its very size freed
//! before, so a stream whose sizes do not recur (every request of a new shape) misses on every
//! call and takes the one lock, and two threads on two streams then run no faster than one
//! (BENCHMARKS.md, "Threads", `threads-varied`). So every slow call, holding every lock, also
//! *lends* each shard the longest free range of the stream and pool its last slow allocation
//! was for, and:
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
//! best fit among the lent range's parts rather than among every free range of the stream.
//! One thread never engages the cache and gets the measured policy, call for call.

use arrayvec::ArrayVec;

use super::allowance::Amount;
use crate::backend::StreamId;
use crate::expandable::pieces::PieceId;
use crate::stats::PoolKind;

/// Free parts an arena keeps apart at most: a free that would need one more goes the slow way.
pub(crate) const ARENA_PARTS: usize = 16;
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

/// One lent free range and what became of it since.
#[derive(Debug)]
pub(crate) struct Arena {
    pub(crate) stream: StreamId,
    pub(crate) pool: PoolKind,
    /// The core's index slot of (stream, pool) and the free piece lent, unchanged while lent.
    pub(crate) slot: u32,
    pub(crate) piece: PieceId,
    pub(crate) start: u64,
    pub(crate) len: usize,
    /// The free parts, in address order, no two touching: (start, length).
    parts: ArrayVec<(u64, usize), ARENA_PARTS>,
    carved: ArrayVec<Carved, ARENA_BLOCKS>,
}

impl Arena {
    /// An arena over the free range `[start, start + len)`, piece `piece` of `slot`.
    pub(crate) fn lend(
        (stream, pool): (StreamId, PoolKind),
        slot: u32,
        piece: PieceId,
        start: u64,
        len: usize,
    ) -> Self {
        let mut parts = ArrayVec::new();
        parts.push((start, len));
        Self {
            stream,
            pool,
            slot,
            piece,
            start,
            len,
            parts,
            carved: ArrayVec::new(),
        }
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
    /// parts beside it.
    pub(crate) fn give_back(&mut self, addr: u64, size: usize) -> GiveBack {
        let Some(c) = self
            .carved
            .iter()
            .position(|c| c.addr == addr && c.size == size)
        else {
            return GiveBack::NotHere;
        };
        let end = addr + size as u64;
        // The first part after the block; the one before it, if any, is just before.
        let i = self.parts.partition_point(|p| p.0 < addr);
        let joins_before = i > 0 && {
            let (s, l) = self.parts[i - 1];
            s + l as u64 == addr
        };
        let joins_after = i < self.parts.len() && self.parts[i].0 == end;
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

    /// The blocks carved and not given back, by address.
    pub(crate) fn carved_by_address(&self) -> Vec<Carved> {
        let mut out = self.carved.to_vec();
        out.sort_unstable_by_key(|c| c.addr);
        out
    }

    /// What the carved blocks add up to, as [`Amount`]s of their pool.
    pub(crate) fn carved_amount(&self) -> Amount {
        let mut total = Amount::default();
        for c in &self.carved {
            total.add(&Amount::block(c.size, c.requested));
        }
        total
    }

    /// Whether the free parts and the carved blocks tile the lent range exactly, without
    /// overlap, the parts in order and never touching (for `check`).
    pub(crate) fn tiles(&self) -> bool {
        let mut pieces: Vec<(u64, u64, bool)> = self
            .parts
            .iter()
            .map(|&(s, l)| (s, s + l as u64, true))
            .chain(
                self.carved
                    .iter()
                    .map(|c| (c.addr, c.addr + c.size as u64, false)),
            )
            .collect();
        pieces.sort_unstable();
        let ordered = self
            .parts
            .windows(2)
            .all(|w| w[0].0 + (w[0].1 as u64) < w[1].0);
        let mut at = self.start;
        for &(s, e, _) in &pieces {
            if s != at || e <= s {
                return false;
            }
            at = e;
        }
        ordered && at == self.start + self.len as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    fn arena(len: usize) -> Arena {
        Arena::lend(
            (StreamId::sim(1), PoolKind::Large),
            0,
            PieceId::LEAST,
            1 << 30,
            len,
        )
    }

    #[test]
    fn carves_best_fit_and_merges_what_comes_back() {
        let mut a = arena(10 * MB);
        let x = a.carve(2 * MB, 2 * MB).unwrap();
        let y = a.carve(3 * MB, 3 * MB - 1).unwrap();
        let z = a.carve(MB, MB).unwrap();
        assert_eq!(
            (x, y, z),
            (
                1 << 30,
                (1 << 30) + 2 * MB as u64,
                (1 << 30) + 5 * MB as u64
            )
        );
        assert!(a.tiles());
        // A 2 MiB hole at the front and 4 MiB at the end: 1 MiB goes in the smaller one.
        assert_eq!(a.give_back(x, 2 * MB), GiveBack::Taken);
        assert_eq!(a.carve(MB, MB), Some(x));
        assert_eq!(a.carved_amount().bytes, (3 + 1 + 1) as u64 * MB as u64);
        // Freed in any order, everything merges back into one part.
        for (addr, size) in [(z, MB), (x, MB), (y, 3 * MB)] {
            assert_eq!(a.give_back(addr, size), GiveBack::Taken);
            assert!(a.tiles());
        }
        assert_eq!(a.parts.as_slice(), &[(1 << 30, 10 * MB)]);
        assert_eq!(
            a.give_back(y, 3 * MB),
            GiveBack::NotHere,
            "given back twice"
        );
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
