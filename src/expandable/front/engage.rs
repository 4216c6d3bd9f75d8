//! When the front cache stashes: from the first call, or once threads contend (Note [Engage on
//! contention]).
//!
//! Note [Engage on contention]: the front cache pays for itself only where two things hold.
//! Threads must contend for the allocator's lock: one thread gains nothing from skipping a lock
//! nobody else wants, and the stash changes which blocks a request gets, which on the 23 shared
//! traces (one thread each) costs 0.08 GiB of minimum capacity summed and puts 4 of them above
//! pytorch-expandable. And the stashes and arenas must serve most allocations: a request they
//! miss takes the slow path, which costs about twice the default allocator's (every shard's
//! lock, the stash's ageing, settling and lending the arenas, the allowances). So with
//! [`FrontCacheMode::OnContention`], the default:
//!
//! * The cache starts *disengaged*: every call takes the state's lock alone, as with the cache
//!   off, and nothing is stashed. A free through `Allocator::deallocate` (the only free the
//!   cache could stash) tries the lock first; each time it finds it taken counts. After
//!   [`ENGAGE_AFTER`] such frees the cache *engages*, under the state's lock and every shard's:
//!   each live block that must be freed through the core (used by another stream, or borrowed
//!   from the other pool) is named in its shard's `slow_only`, which an engaged cache keeps up
//!   to date itself from then on (Note [Front cache]).
//! * Engaged, every [`WINDOW`] allocations the slow path judges the last window: if the stashes
//!   served fewer than half of them without the lock (a stash take or a carve from an arena,
//!   Note [Front arena] in `arena.rs`), the cache disengages (every stashed block goes back to
//!   the core, every arena is settled, `slow_only` is emptied) and the next engagement waits for
//!   four times as many contended frees, up to [`ENGAGE_AFTER_MAX`], so a program the front
//!   cache cannot serve (requests spread over more streams than its shards follow, each of a
//!   new size) spends a vanishing share of its calls engaged.
//! * Whether it is engaged changes only under the state's lock and every shard's, so a call
//!   holding either reads a settled answer; the lock-free read that chooses a path is a hint
//!   each path checks again under its lock. A disengaged cache holds nothing: no stash, no
//!   `slow_only`, no allowance (`check`).
//!
//! A program that allocates from one thread never engages it and gets exactly the measured
//! policy (the replay is single-threaded: its figures are those of the cache off).
//! [`FrontCacheMode::Always`] engages from the first call and never disengages (tests, and
//! programs that know their threads contend); [`FrontCacheMode::Off`] never engages.

use std::sync::atomic::Ordering::Relaxed;

use super::{core_only_stream, flush, shard_of, slow_only, AllShards};
use crate::backend::Backend;
use crate::config::FrontCacheMode;
use crate::expandable::state::State;
use crate::mechanism::violation::InvariantViolation;
use crate::sync::{AtomicBool, AtomicU32, Mutex, MutexGuard};
use crate::units::DevAddr;

/// Contended frees that engage a disengaged front cache the first time (one under loom, whose
/// models have a handful of calls and count every free of a disengaged cache as contended).
#[cfg(not(loom))]
pub(crate) const ENGAGE_AFTER: u32 = 64;
#[cfg(loom)]
pub(crate) const ENGAGE_AFTER: u32 = 1;
/// The most contended frees an engagement waits for, however often the cache disengaged.
pub(crate) const ENGAGE_AFTER_MAX: u32 = 1 << 20;
/// Allocations (served by a stash or not) per judgement of an engaged cache (two under loom).
#[cfg(not(loom))]
pub(crate) const WINDOW: u64 = 4096;
#[cfg(loom)]
pub(crate) const WINDOW: u64 = 2;

/// Whether the front cache stashes now, and what engages it.
#[derive(Debug)]
pub(crate) struct Engagement {
    mode: FrontCacheMode,
    /// Changed only holding the state's lock and every shard's.
    engaged: AtomicBool,
    /// Contended frees since the cache last disengaged (or since the start).
    contended: AtomicU32,
    /// Whether the state's lock is held by a call the cache never serves (Note [Other
    /// calls]): set just after such a call takes the lock, cleared just before it lets go.
    other_call: AtomicBool,
    /// Frees that found the lock held by such a call, and so did not count (a test kit
    /// reading).
    behind_other_calls: AtomicU32,
    /// Contended frees the next engagement waits for; changed under every lock.
    engage_after: AtomicU32,
}

impl Engagement {
    pub(crate) fn new(mode: FrontCacheMode) -> Self {
        Self {
            mode,
            engaged: AtomicBool::new(mode == FrontCacheMode::Always),
            contended: AtomicU32::new(0),
            other_call: AtomicBool::new(false),
            behind_other_calls: AtomicU32::new(0),
            engage_after: AtomicU32::new(ENGAGE_AFTER),
        }
    }

    /// Whether the cache stashes now: settled under the state's lock or any shard's, a hint
    /// otherwise.
    #[inline]
    pub(crate) fn is_engaged(&self) -> bool {
        self.engaged.load(Relaxed)
    }

    /// Whether contended frees may engage it (`OnContention`, disengaged or not).
    #[inline]
    pub(crate) fn watches(&self) -> bool {
        self.mode == FrontCacheMode::OnContention
    }

    /// Contended frees counted since the cache last disengaged (or since the start).
    #[cfg(feature = "testkit")]
    pub(crate) fn contended(&self) -> u32 {
        self.contended.load(Relaxed)
    }

    /// Frees that found the lock held by a call the cache never serves (Note [Other calls]).
    #[cfg(feature = "testkit")]
    pub(crate) fn behind_other_calls(&self) -> u32 {
        self.behind_other_calls.load(Relaxed)
    }

    /// Counts a free that found the state's lock taken; true when enough have to engage. A
    /// lock held by a call the cache never serves does not count (Note [Other calls]).
    pub(crate) fn note_contention(&self) -> bool {
        if self.other_call.load(Relaxed) {
            self.behind_other_calls.fetch_add(1, Relaxed);
            return false;
        }
        let seen = self.contended.fetch_add(1, Relaxed).saturating_add(1);
        seen >= self.engage_after.load(Relaxed)
    }

    /// Engages the cache (holding the state's lock and every shard's): names in their shards
    /// the live blocks that must be freed through the core. Nothing if already engaged.
    pub(crate) fn engage<B: Backend>(&self, state: &State<B>, shards: &mut AllShards<'_>) {
        if self.is_engaged() || self.mode == FrontCacheMode::Off {
            return;
        }
        for &addr in state.live.keys() {
            if let Some(stream) = core_only_stream(state, addr) {
                slow_only(shards, stream, addr);
            }
        }
        // The windows' counts are 0: nothing counts while disengaged, and `judge` emptied them.
        self.engaged.store(true, Relaxed);
    }

    /// Judges the last window of an engaged cache (holding every lock): disengages it where
    /// its stashes served fewer than half the window's allocations. True if it disengaged; the
    /// caller's slow path then hands out the allowances, none to a shard with nothing stashed.
    pub(crate) fn judge<B: Backend>(
        &self,
        state: &mut State<B>,
        shards: &mut AllShards<'_>,
    ) -> bool {
        if !self.watches() || !self.is_engaged() {
            return false;
        }
        let (fast, slow) = shards.iter().fold((0u64, 0u64), |(f, s), shard| {
            (
                f + u64::from(shard.window_fast),
                s + u64::from(shard.window_slow),
            )
        });
        if fast + slow < WINDOW {
            return false;
        }
        for shard in shards.iter_mut() {
            shard.window_fast = 0;
            shard.window_slow = 0;
        }
        if 2 * fast >= fast + slow {
            return false;
        }
        flush(state, shards);
        for shard in shards.iter_mut() {
            shard.slow_only.clear();
            // A disengaged cache lends no arena (Note [Front arena] in `arena.rs`).
            shard.arena_want = None;
        }
        let next = self
            .engage_after
            .load(Relaxed)
            .saturating_mul(4)
            .min(ENGAGE_AFTER_MAX);
        self.engage_after.store(next, Relaxed);
        self.contended.store(0, Relaxed);
        self.engaged.store(false, Relaxed);
        true
    }
}

/// Note [Other calls]: only a thread that allocates or frees makes the contention the cache
/// relieves; a thread that reads statistics or snapshots, empties the cache or records a
/// stream takes the lock too, but the cache never serves those calls, and a monitoring thread
/// calling `stats()` beside a program that allocates from one thread would otherwise engage
/// the cache there, changing which blocks that program gets for no gain. Every such call holds
/// the lock through an [`OtherCall`], which marks it held for the length of the call; a free
/// that finds the lock taken while it is marked does not count. The mark is a hint read without
/// the lock (set just after the lock is taken, cleared just before it is let go): a free in
/// those few instructions may count wrongly, which at worst moves an engagement by one free.
pub(crate) struct OtherCall<'a, T> {
    guard: MutexGuard<'a, T>,
    mark: &'a AtomicBool,
}

impl<'a, T> OtherCall<'a, T> {
    /// Takes `lock` for a call the front cache never serves, marked in `engagement`.
    pub(crate) fn lock(lock: &'a Mutex<T>, engagement: &'a Engagement) -> Self {
        let guard = lock.lock();
        engagement.other_call.store(true, Relaxed);
        Self {
            guard,
            mark: &engagement.other_call,
        }
    }
}

impl<T> std::ops::Deref for OtherCall<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for OtherCall<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for OtherCall<'_, T> {
    /// Cleared while the lock is still held: the guard is dropped after this.
    fn drop(&mut self) {
        self.mark.store(false, Relaxed);
    }
}

/// Note [Engage on contention]'s invariants (holding every lock): a disengaged cache holds no
/// stashed block, no `slow_only` name and no allowance; an engaged one names every live block
/// that must be freed through the core (used by another stream, or borrowed from the other
/// pool) in its stream's shard.
pub(crate) fn check<B: Backend>(
    engaged: bool,
    state: &State<B>,
    shards: &AllShards<'_>,
) -> Result<(), InvariantViolation> {
    if !engaged {
        for shard in shards.iter() {
            if let Some(addr) = shard
                .stashed
                .iter()
                .map(|p| p.addr)
                .chain(shard.slow_only.iter().copied())
                .next()
            {
                return Err(InvariantViolation::FrontEngagement {
                    at: Some(DevAddr::new(addr)),
                });
            }
            if shard.allowance != Default::default()
                || shard.arena.is_lent()
                || shard.arena_want.is_some()
            {
                return Err(InvariantViolation::FrontEngagement { at: None });
            }
        }
        return Ok(());
    }
    for &addr in state.live.keys() {
        if let Some(stream) = core_only_stream(state, addr) {
            if !shards[shard_of(stream)].slow_only.contains(&addr) {
                return Err(InvariantViolation::FrontEngagement {
                    at: Some(DevAddr::new(addr)),
                });
            }
        }
    }
    Ok(())
}
