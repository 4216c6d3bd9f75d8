//! How much a shard of the front cache may raise the block counters without the allocator's
//! lock, and still leave every peak exact (Note [Front allowance]).
//!
//! Note [Front allowance]: a stashed block is live in the core and freed for the user, so what a
//! user reads is the core's `current` less what is stashed. Taking a stashed block back without
//! the lock raises that by one block, its bytes and its request; if the sum over every stream
//! then passed the peak, the peak would have to rise, and only a call that sees every shard can
//! know the sum. So every slow call (it holds every lock) hands each shard an allowance, for
//! each counter and each scope (both pools, the small pool, the large pool): how far that
//! shard's takes may run ahead of its stashes until the next slow call. A take spends it, a
//! stash earns it back; a take it cannot pay for goes the slow way, which takes the block under
//! every lock, raises the peaks exactly and hands out allowances anew.
//!
//! The allowances never sum to more than the headroom, the peak less what a user reads now
//! (`headroom`), and a take lowers the headroom by what it spends while a stash raises it by
//! what it earns, so between two slow calls no sequence of fast calls can pass a peak: every
//! peak stays the one the calls in their order set. `check` verifies the sum.
//!
//! Who gets how much: a shard can only take back what it has stashed, so its takes never run
//! ahead of its stashes by more than it held stashed when the allowances were handed out. Each
//! shard gets exactly that when the headroom covers every shard's stash (then no fast take is
//! ever refused), and a share of the headroom in proportion to it when it does not.

use crate::stats::{MemoryStats, PoolKind, Stat, StatArray};

/// What one block moves: one block, its rounded bytes, its requested bytes.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Amount {
    pub(crate) count: u64,
    pub(crate) bytes: u64,
    pub(crate) requested: u64,
}

impl Amount {
    /// The amount of one block of `bytes` for a request of `requested`.
    pub(crate) fn block(bytes: usize, requested: usize) -> Self {
        Self {
            count: 1,
            bytes: bytes as u64,
            requested: requested as u64,
        }
    }

    /// Figure `i`: the count, the bytes, the requested bytes.
    fn figure(&self, i: usize) -> u64 {
        [self.count, self.bytes, self.requested][i]
    }

    fn figure_mut(&mut self, i: usize) -> &mut u64 {
        match i {
            0 => &mut self.count,
            1 => &mut self.bytes,
            _ => &mut self.requested,
        }
    }

    fn covers(&self, other: &Self) -> bool {
        self.count >= other.count && self.bytes >= other.bytes && self.requested >= other.requested
    }

    fn sub(&mut self, other: &Self) {
        self.count -= other.count;
        self.bytes -= other.bytes;
        self.requested -= other.requested;
    }

    pub(crate) fn add(&mut self, other: &Self) {
        self.count = self.count.saturating_add(other.count);
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.requested = self.requested.saturating_add(other.requested);
    }
}

/// An [`Amount`] per scope: both pools, the small pool, the large pool (as a [`StatArray`]).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Scoped(pub(crate) [Amount; 3]);

/// The scope index of `pool` (0 is both pools).
fn scope_of(pool: PoolKind) -> usize {
    match pool {
        PoolKind::Small => 1,
        PoolKind::Large => 2,
    }
}

impl Scoped {
    /// Adds one block of `pool` to both pools' scope and its own.
    pub(crate) fn add(&mut self, pool: PoolKind, amount: &Amount) {
        self.0[0].add(amount);
        self.0[scope_of(pool)].add(amount);
    }

    /// Takes one block of `pool` out of both pools' scope and its own, if both hold it.
    pub(crate) fn try_sub(&mut self, pool: PoolKind, amount: &Amount) -> bool {
        let own = scope_of(pool);
        if !(self.0[0].covers(amount) && self.0[own].covers(amount)) {
            return false;
        }
        self.0[0].sub(amount);
        self.0[own].sub(amount);
        true
    }

    /// Adds every scope of `other`.
    pub(crate) fn add_all(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            a.add(b);
        }
    }

    /// Whether every figure of `self` is at most `other`'s.
    pub(crate) fn within(&self, other: &Self) -> bool {
        other.0.iter().zip(&self.0).all(|(o, s)| o.covers(s))
    }
}

/// Which figure of an [`Amount`] a counter moves by.
type Figure = fn(&Amount) -> u64;

/// The block counters a stashed block stays counted in, with the figure of [`Amount`] each
/// moves by: the allocation and active counts, the allocated and active bytes, the requested
/// bytes.
fn block_counters(stats: &mut MemoryStats) -> [(&mut StatArray, Figure); 5] {
    [
        (&mut stats.allocation, |a| a.count),
        (&mut stats.active, |a| a.count),
        (&mut stats.allocated_bytes, |a| a.bytes),
        (&mut stats.active_bytes, |a| a.bytes),
        (&mut stats.requested_bytes, |a| a.requested),
    ]
}

fn scopes(array: &mut StatArray) -> [&mut Stat; 3] {
    [&mut array.all, &mut array.small_pool, &mut array.large_pool]
}

/// Takes `stashed` out of every block counter's `current` (`out: true`) or puts it back
/// (`false`), totals untouched: around a core call made while blocks stay stashed, so that the
/// peaks it sets are those of what a user reads.
pub(crate) fn shift_current(stats: &mut MemoryStats, stashed: &Scoped, out: bool) {
    for (array, figure) in block_counters(stats) {
        for (stat, amount) in scopes(array).into_iter().zip(&stashed.0) {
            let n = figure(amount);
            stat.current = if out {
                stat.current.saturating_sub(n)
            } else {
                stat.current + n
            };
        }
    }
}

/// Raises every block counter's peak to what a user reads now (`current` less `stashed`): after
/// a stashed block was taken back under every lock.
pub(crate) fn raise_peaks(stats: &mut MemoryStats, stashed: &Scoped) {
    for (array, figure) in block_counters(stats) {
        for (stat, amount) in scopes(array).into_iter().zip(&stashed.0) {
            stat.peak = stat.peak.max(stat.current.saturating_sub(figure(amount)));
        }
    }
}

/// Per scope, how far what a user reads (the core's `current`, less what is `stashed`, plus what
/// the arenas `carved`: Note [Front arena] in `arena.rs`) may rise before some peak must: for
/// the counts and the bytes the smaller of the allocated and active counters' room (a stashed
/// block is counted in both). `None` when a user already reads more than a peak (a broken
/// invariant).
pub(crate) fn headroom(stats: &MemoryStats, stashed: &Scoped, carved: &Scoped) -> Option<Scoped> {
    let arrays = [
        &stats.allocation,
        &stats.active,
        &stats.allocated_bytes,
        &stats.active_bytes,
        &stats.requested_bytes,
    ];
    let mut room = [Amount::default(); 3];
    for (scope, ((r, amount), carved)) in room.iter_mut().zip(&stashed.0).zip(&carved.0).enumerate()
    {
        let of = |array: &StatArray, stashed: u64, carved: u64| -> Option<u64> {
            let stat = [&array.all, &array.small_pool, &array.large_pool][scope];
            stat.peak
                .checked_sub(stat.current.checked_sub(stashed)?.checked_add(carved)?)
        };
        let (c, b) = (carved.count, carved.bytes);
        *r = Amount {
            count: of(arrays[0], amount.count, c)?.min(of(arrays[1], amount.count, c)?),
            bytes: of(arrays[2], amount.bytes, b)?.min(of(arrays[3], amount.bytes, b)?),
            requested: of(arrays[4], amount.requested, carved.requested)?,
        };
    }
    Some(Scoped(room))
}

/// One shard's allowance (Note [Front allowance]): its `stash` where the `headroom` covers every
/// shard's stash (`total`), else its share of the headroom in proportion to its stash. Summed
/// over the shards, never more than the headroom.
pub(crate) fn share(headroom: &Scoped, total: &Scoped, stash: &Scoped) -> Scoped {
    let mut out = *stash;
    for scope in 0..3 {
        for figure in 0..3 {
            let room = headroom.0[scope].figure(figure);
            let all = total.0[scope].figure(figure);
            if all > room {
                let want = stash.0[scope].figure(figure);
                // Floor of room × want / all: the shares sum to at most `room`.
                *out.0[scope].figure_mut(figure) =
                    (u128::from(room) * u128::from(want) / u128::from(all)) as u64;
            }
        }
    }
    out
}

/// What is left of `headroom` once `given` is handed out, split in `n` equal shares (each
/// floored: `n` of them never sum past what is left): each arena's allowance (Note [Front
/// arena] in `arena.rs`).
pub(crate) fn rest(headroom: &Scoped, given: &Scoped, n: u64) -> Scoped {
    let mut out = Scoped::default();
    for scope in 0..3 {
        for figure in 0..3 {
            let left = headroom.0[scope]
                .figure(figure)
                .saturating_sub(given.0[scope].figure(figure));
            *out.0[scope].figure_mut(figure) = left / n.max(1);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scoped(all: u64) -> Scoped {
        let a = Amount {
            count: all,
            bytes: all * 100,
            requested: all * 90,
        };
        Scoped([a, a, Amount::default()])
    }

    fn shares(room: &Scoped, stashes: &[Scoped]) -> Vec<Scoped> {
        let mut total = Scoped::default();
        for s in stashes {
            total.add_all(s);
        }
        stashes.iter().map(|s| share(room, &total, s)).collect()
    }

    #[test]
    fn each_shard_gets_its_stash_when_the_headroom_covers_every_stash() {
        let got = shares(&scoped(10), &[scoped(3), scoped(4), Scoped::default()]);
        assert_eq!(got, vec![scoped(3), scoped(4), Scoped::default()]);
    }

    #[test]
    fn shares_never_sum_past_the_headroom_when_the_stashes_exceed_it() {
        let room = scoped(5);
        let got = shares(&room, &[scoped(3), scoped(4), scoped(2)]);
        let mut sum = Scoped::default();
        for g in &got {
            sum.add_all(g);
        }
        assert!(sum.within(&room), "{sum:?} > {room:?}");
        // In proportion: the largest stash gets the largest share.
        assert!(got[1].0[0].count >= got[0].0[0].count && got[0].0[0].count >= got[2].0[0].count);
    }

    #[test]
    fn a_take_spends_both_scopes_and_is_refused_when_either_lacks_it() {
        let mut a = Scoped::default();
        let block = Amount::block(4096, 4000);
        a.add(PoolKind::Small, &block);
        assert!(
            !a.try_sub(PoolKind::Large, &block),
            "no large-pool allowance"
        );
        assert!(a.try_sub(PoolKind::Small, &block));
        assert_eq!(a, Scoped::default());
        assert!(!a.try_sub(PoolKind::Small, &block));
    }

    #[test]
    fn headroom_is_the_peak_less_what_a_user_reads_and_the_tighter_of_allocated_and_active() {
        let mut s = MemoryStats::default();
        s.allocation.increase(PoolKind::Large, 3);
        s.active.increase(PoolKind::Large, 4);
        s.allocated_bytes.increase(PoolKind::Large, 300);
        s.active_bytes.increase(PoolKind::Large, 300);
        s.requested_bytes.increase(PoolKind::Large, 250);
        s.allocation.decrease(PoolKind::Large, 1);
        s.active.decrease(PoolKind::Large, 1);
        s.allocated_bytes.decrease(PoolKind::Large, 100);
        s.active_bytes.decrease(PoolKind::Large, 100);
        s.requested_bytes.decrease(PoolKind::Large, 80);
        // One block of 100 bytes (90 requested) stashed: a user reads one block less.
        let mut stashed = Scoped::default();
        stashed.add(PoolKind::Large, &Amount::block(100, 90));
        let room = headroom(&s, &stashed, &Scoped::default()).unwrap();
        let want = Amount {
            count: 2,
            bytes: 200,
            requested: 170,
        };
        assert_eq!(room.0[0], want);
        assert_eq!(room.0[2], want);
        assert_eq!(room.0[1], Amount::default());
        // Raising the peaks to what a user reads changes nothing here; shifting and shifting back
        // restores `current`.
        let before = s;
        raise_peaks(&mut s, &stashed);
        shift_current(&mut s, &stashed, true);
        shift_current(&mut s, &stashed, false);
        assert_eq!(s, before);
    }
}
