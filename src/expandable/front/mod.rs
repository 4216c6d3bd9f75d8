//! The per-stream front cache (Note [Front cache]): freed blocks kept aside per stream and handed
//! out again to an identical request on that stream without the allocator's lock.
//!
//! Note [Front cache]: with one lock around the whole state, two threads on two streams run at
//! 0.78× the throughput of one (BENCHMARKS.md, "Threads"): every call moves the lock and the
//! state's cache lines from one core to the other. Sharding the state per stream would need the
//! segments, the handle cache, the limits and the release index split apart, and the pressure
//! path (memory one stream holds, reclaimed when another runs out) to see every shard; the
//! statistics' peaks need one order of every allocate and free anyway. So the core stays one
//! state behind one lock, and what scales is put in front of it:
//!
//! * Each stream hashes to one of [`SHARDS`] shards, each behind its own lock on its own cache
//!   line. A free through [`Allocator::deallocate`](crate::Allocator::deallocate) (which knows the
//!   block's stream, size and request) stashes the block in its stream's shard, up to
//!   [`PER_SHARD`] blocks, and returns; an allocation on that stream of the same rounded size
//!   and the same requested size takes the latest such block back. Neither touches the state:
//!   the core still counts the stashed block live, exactly as before the free.
//! * Every other call is the slow path: it takes the state's lock, then every shard's lock in
//!   index order, and runs holding all of them, so no fast call runs in the middle of a slow
//!   one. An allocation (`slow_allocate.rs`) takes a stashed block back if one fits it (the fast
//!   path found it but could not pay for it: Note [Front allowance]), else lets the core serve
//!   it from the stream's free ranges with the stash left stashed, and gives every stashed
//!   block back to the core first only where the core would otherwise grow, borrow or fail, so
//!   the core never maps memory while memory it could use sits stashed. Every other slow call
//!   (`empty_cache`, `stats`, snapshots, `reset_peak_stats`, `deallocate_ptr`,
//!   `record_stream`) gives every stashed block back first (the frees the core never saw).
//! * Lock order: state, then shards by index. A fast call holds one shard's lock, takes nothing
//!   else while holding it, and gives it up before it falls back to the slow path: no cycle, so
//!   no deadlock.
//! * Statistics stay exact. A free stashed and then taken back is a pair: the shard counts the
//!   pairs (per pool: how many, bytes, requested bytes) and the slow path adds them to the
//!   `allocated` and `freed` totals. What a user reads of a block counter is the core's
//!   `current` less what is stashed; the core allocates with the stash taken out of `current`,
//!   so the peaks it sets are those; a take under every lock raises them to it; and a take
//!   without the lock is paid for by its shard's allowance, which cannot let the sum over the
//!   shards pass a peak (Note [Front allowance] in `allowance.rs`). So every figure a user can
//!   read, and every peak, is what the calls in their order made it.
//! * Blocks the front cache must not stash go the slow way: a block used by another stream
//!   (`record_stream`: its free must record events) and a block borrowed from the other pool
//!   (Note [Borrowing]: its statistics count in the pool that holds it) are named in their
//!   stream's shard (`slow_only`) when the core makes them so, under all the locks.
//! * `deallocate_ptr` (what the C ABI calls) knows only the address, so it takes the slow path.
//!
//! What it serves, measured (BENCHMARKS.md, "Threads"): a stream that frees blocks and then asks
//! for their sizes again (inference and training loops, at their innermost; a ring of several
//! sizes, each freed a few calls before it is asked for again), served without the lock while
//! the core serves the other sizes. Before the allowances, the first request of another size
//! gave every stashed block back (leaving them stashed broke the peaks: the core set a peak with
//! a stashed block counted live), so a ring of several sizes missed on every call and ran at
//! 0.4–0.5× of one thread with two. A request of a size not stashed is carved from the free
//! range the last slow call lent its stream's shard (Note [Front arena] in `arena.rs`), so sizes
//! that do not recur are served without the lock too; before the arenas, two threads ran such
//! a loop at 0.78–0.95× of one.
//!
//! Why it waits for contention by default ([`ExpandableConfig::front_cache`](crate::config::ExpandableConfig::front_cache),
//! [`FrontCacheMode::OnContention`](crate::config::FrontCacheMode)): a stashed block is not
//! merged with its free neighbours until the next slow call, and a hit reuses the stashed block
//! where best fit might have chosen another range, so which addresses a program gets, and in
//! corner cases how much a segment grows, can differ from the allocator without it (on the 23
//! shared traces, one thread each, 0.08 GiB more minimum capacity summed); and a request it
//! misses costs about twice the default's. So it stashes only once threads contend for the
//! lock, and stops while it serves too few requests (Note [Engage on contention] in
//! `engage.rs`): one thread gets the allocator without it, call for call. Everything a user
//! reads (the block counters and their peaks) is the same with it engaged (the property test
//! `front_cache_counts_match_the_core` in `tests/all/front_cache.rs`).

mod allowance;
mod arena;
mod engage;
mod slow_allocate;

pub(crate) use slow_allocate::allocate;

use arrayvec::ArrayVec;
use rustc_hash::FxHashSet;

use allowance::{Amount, Scoped};
use arena::{Arena, GiveBack, ARENA_RANGES};
pub(crate) use engage::{Engagement, OtherCall};

use crate::backend::{Backend, StreamId};
use crate::config::{ExpandableConfig, FrontCacheMode, ROUNDUP_INTERVALS};
use crate::expandable::size_index::StreamPool;
use crate::expandable::state::State;
use crate::mechanism::request::pool_of;
use crate::mechanism::violation::InvariantViolation;
use crate::stats::{MemoryStats, PoolKind, StatArray};
use crate::sync::{Mutex, MutexGuard};
use crate::units::DevAddr;

/// Shards of the front cache: streams hash into them (a power of two).
pub(crate) const SHARDS: usize = 4;
/// Blocks one shard keeps stashed at most: enough for a loop that frees a few sizes before it
/// allocates them again, few enough that a scan of them is a handful of compares.
pub(crate) const PER_SHARD: usize = 16;

/// Slow allocations of its stream a stashed block stays stashed through at most (Note [Stash
/// age]).
pub(crate) const STASH_AGE: u32 = 4;

/// A block freed by the user and stashed: still live in the core.
#[derive(Clone, Copy, Debug)]
struct Stashed {
    addr: u64,
    stream: StreamId,
    size: usize,
    requested: usize,
    /// Slow allocations of its stream it has stayed stashed through (Note [Stash age]).
    age: u32,
}

/// One shard: its stashed blocks, the blocks that must be freed through the core, and the pairs
/// to count.
#[derive(Default, Debug)]
pub(crate) struct Shard {
    stashed: ArrayVec<Stashed, PER_SHARD>,
    slow_only: FxHashSet<u64>,
    /// Pairs (a stashed block taken back) not yet added to the statistics, small pool and large
    /// pool: how many, their bytes, their requests.
    pairs: [Amount; 2],
    /// How far this shard's takes may run ahead of its stashes until the next slow call (Note
    /// [Front allowance]).
    allowance: Scoped,
    /// Allocations on this shard's streams that took the slow path (a test kit counter).
    pub(crate) slow_allocations: u64,
    /// Allocations served without the lock, and slow ones, since the engaged cache was last
    /// judged (Note [Engage on contention] in `engage.rs`).
    window_fast: u32,
    window_slow: u32,
    /// The free ranges lent to this shard by the last slow call, and what was carved from them
    /// since (Note [Front arena] in `arena.rs`).
    arena: Arena,
    /// The stream and pool of this shard's last slow allocation: what the next slow call lends
    /// an arena for. Set only while the cache is engaged.
    arena_want: Option<(StreamId, PoolKind)>,
    /// Whether the core, as the last slow call left it, has work for its next allocation's
    /// look at events (blocks waiting for other streams, event releases to retry): then every
    /// allocation takes the slow path, so events are looked at when they would be without the
    /// front cache.
    events_due: bool,
}

impl Shard {
    /// The arena, if a range is lent to it.
    fn lent(&self) -> Option<&Arena> {
        self.arena.is_lent().then_some(&self.arena)
    }

    /// The arena, if a range is lent to it.
    fn lent_mut(&mut self) -> Option<&mut Arena> {
        self.arena.is_lent().then_some(&mut self.arena)
    }

    /// The latest block stashed on `stream` of `rounded` bytes for a request of `requested`.
    fn find(&self, stream: StreamId, rounded: usize, requested: usize) -> Option<usize> {
        self.stashed
            .iter()
            .rposition(|p| p.stream == stream && p.size == rounded && p.requested == requested)
    }

    /// Takes stashed block `i` back for the user and counts the pair; returns its address.
    fn take(&mut self, i: usize) -> u64 {
        let p = self.stashed.remove(i);
        self.pairs[pool_slot(pool_of(p.size))].add(&Amount::block(p.size, p.requested));
        p.addr
    }

    /// Note [Stash age]: a slow allocation on `stream` that the stash could not serve ages the
    /// stream's stashed blocks by one and gives back to the core (a free the core now sees)
    /// every one that borders a free range, or is older than [`STASH_AGE`]. A stashed block is
    /// not merged with its free neighbours, so while it stays stashed the core serves other
    /// requests around it and keeps the free range beside it smaller than it would be: what
    /// later requests need, fragmented. A block between used memory would merge with nothing,
    /// so keeping it costs only what a free range of its own size would have served; the age
    /// bounds that, and bounds how long memory sits where its stream may not come back for it.
    /// A loop that frees a few sizes before it asks for them again (a ring of sizes, each freed
    /// a few allocations before it is asked for again) runs from the stash once warm, however
    /// cold it started (`a_ring_of_six_sizes_is_served_without_the_lock_once_warm`).
    ///
    /// Measured (Sim; the 23 shared traces replayed with the front cache on, one thread; min
    /// capacity summed; the default allocator needs 290.41 GiB and more than
    /// pytorch-expandable on none): every block given back at the first slow allocation (the
    /// front cache before the allowances, under which the six-size ring missed on every
    /// request) 290.32 GiB; every block kept through 2, 4 or 8 slow allocations, or never given
    /// back, 290.75, 290.88, 290.95, 291.02; kept through 4 where its shape had come back
    /// before, 290.95; this rule with an age of 2, 4 (the one kept) or 8: 290.48, 290.49,
    /// 290.36 GiB, more than pytorch-expandable on 5, 4 and 6 traces (by 4–38 MiB at 4). With
    /// an age of 2 the six-size ring never warms up (each block is asked for four allocations
    /// after its free).
    fn age<B: Backend>(&mut self, state: &mut State<B>, stream: StreamId) {
        let mut i = 0;
        while i < self.stashed.len() {
            let p = &mut self.stashed[i];
            if p.stream == stream {
                p.age += 1;
                if p.age > STASH_AGE || state.borders_free(p.addr) {
                    let p = self.stashed.remove(i);
                    // As in `flush`: live in the core, used by no other stream.
                    let _ = state.deallocate(DevAddr::new(p.addr));
                    continue;
                }
            }
            i += 1;
        }
    }

    /// What this shard holds stashed, per scope.
    fn stash(&self) -> Scoped {
        let mut total = Scoped::default();
        for p in &self.stashed {
            total.add(pool_of(p.size), &Amount::block(p.size, p.requested));
        }
        total
    }
}

/// What every shard's arena has carved and the core does not know yet, per scope.
fn carved_total(shards: &AllShards<'_>) -> Scoped {
    let mut total = Scoped::default();
    for shard in shards.iter() {
        if let Some(a) = shard.lent() {
            total.add(a.pool, &a.carved_amount());
        }
    }
    total
}

/// Settles every shard's arena (Note [Front arena] in `arena.rs`): each block carved and not
/// given back is recorded in the core where it lies, with the stashed blocks out of the
/// counters' `current` (a user already read the block live: no peak may rise for it), and the
/// lent range goes back to being only the core's. What every slow call does before it looks at
/// the core.
pub(crate) fn settle<B: Backend>(state: &mut State<B>, shards: &mut AllShards<'_>) {
    if shards.iter().all(|s| !s.arena.is_lent()) {
        return;
    }
    let stashed = stashed_total(shards);
    allowance::shift_current(&mut state.stats, &stashed, true);
    for shard in shards.iter_mut() {
        let arena = &shard.arena;
        if arena.has_carved() {
            for (lent, carved) in arena.carved_by_range() {
                let mut free = Some(lent.piece);
                for c in carved {
                    let piece = free.expect("the lent range holds every block carved from it");
                    free = state.allocate_at(
                        arena.slot,
                        piece,
                        c.addr,
                        (c.size, c.requested),
                        arena.pool,
                    );
                }
            }
        }
        // Cleared in place: an arena is a few KiB, moved out and back on every slow call it
        // was most of the stress test's slow path.
        shard.arena.clear();
    }
    allowance::shift_current(&mut state.stats, &stashed, false);
}

/// Lends each shard that asked for one an arena (Note [Front arena]): free ranges of the stream
/// and pool of its last slow allocation, the smallest of each size class from the longest down
/// and the longest itself (`SizeIndex::spread`), so that best fit among them is most often the
/// core's own. Every arena was settled by the slow call that now ends, so none is lent twice.
fn lend_arenas<B: Backend>(state: &State<B>, shards: &mut AllShards<'_>) {
    for shard in shards.iter_mut() {
        let Some((stream, pool)) = shard.arena_want else {
            continue;
        };
        debug_assert!(!shard.arena.is_lent(), "an arena lent twice");
        let Some(slot) = state.index.find(StreamPool { stream, pool }) else {
            continue;
        };
        let ranges = state.index.at(slot).spread::<ARENA_RANGES>();
        shard.arena.lend((stream, pool), slot, ranges);
    }
}

/// What every shard holds stashed, per scope.
fn stashed_total(shards: &AllShards<'_>) -> Scoped {
    let mut total = Scoped::default();
    for shard in shards.iter() {
        total.add_all(&shard.stash());
    }
    total
}

/// Lends the arenas (Note [Front arena]) and hands every shard its allowance anew (Note [Front
/// allowance]): what every slow call does last, holding every lock. A shard gets its stash's
/// share, and a shard with an arena an equal share of the headroom left after the stashes.
pub(crate) fn hand_out_allowances<B: Backend>(state: &State<B>, shards: &mut AllShards<'_>) {
    lend_arenas(state, shards);
    let mut stashes = [Scoped::default(); SHARDS];
    let mut total = Scoped::default();
    for (stash, shard) in stashes.iter_mut().zip(shards.iter()) {
        if !shard.stashed.is_empty() {
            *stash = shard.stash();
            total.add_all(stash);
        }
    }
    // No headroom only if a user already reads more than a peak, which `check` reports; then no
    // take is paid for without the lock.
    let room = allowance::headroom(&state.stats, &total, &Scoped::default());
    let mut given = Scoped::default();
    for (shard, stash) in shards.iter_mut().zip(&stashes) {
        shard.allowance = match &room {
            Some(room) if !shard.stashed.is_empty() => allowance::share(room, &total, stash),
            _ => Scoped::default(),
        };
        given.add_all(&shard.allowance);
    }
    let arenas = shards.iter().filter(|s| s.arena.is_lent()).count() as u64;
    if let (Some(room), true) = (&room, arenas > 0) {
        let each = allowance::rest(room, &given, arenas);
        for shard in shards.iter_mut().filter(|s| s.arena.is_lent()) {
            shard.allowance.add_all(&each);
        }
    }
}

/// A shard's lock alone on its cache lines, so two streams' shards do not share one.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

/// The shards (none when the switch is off) and whether they stash now.
pub(crate) struct FrontCache {
    shards: Vec<Padded>,
    /// Note [Engage on contention] (`engage.rs`).
    pub(crate) engagement: Engagement,
    /// The configuration's `roundup_power2_divisions`: a request's rounded size, without the
    /// state's lock.
    pub(crate) divisions: [usize; ROUNDUP_INTERVALS],
}

/// Every shard, locked in index order by the slow path.
pub(crate) type AllShards<'a> = Vec<MutexGuard<'a, Shard>>;

fn pool_slot(pool: PoolKind) -> usize {
    match pool {
        PoolKind::Small => 0,
        PoolKind::Large => 1,
    }
}

/// The shard of `stream`: CUDA streams are pointers, Sim streams small numbers; both spread.
fn shard_of(stream: StreamId) -> usize {
    let h = stream.raw() ^ (stream.raw() >> 7);
    (h as usize) & (SHARDS - 1)
}

impl FrontCache {
    pub(crate) fn new(config: &ExpandableConfig) -> Self {
        let shards = if config.front_cache != FrontCacheMode::Off {
            (0..SHARDS)
                .map(|_| Padded(Mutex::new(Shard::default())))
                .collect()
        } else {
            Vec::new()
        };
        Self {
            shards,
            engagement: Engagement::new(config.front_cache),
            divisions: config.roundup_power2_divisions,
        }
    }

    /// Whether the switch is on (engaged or not).
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        !self.shards.is_empty()
    }

    /// Whether it stashes now (Note [Engage on contention]): settled under the state's lock or
    /// a shard's, a hint otherwise.
    #[inline]
    pub(crate) fn is_engaged(&self) -> bool {
        self.engagement.is_engaged()
    }

    /// Stashes a block the user freed; false when it must go through the core (its shard is full,
    /// or the block is one of its `slow_only`).
    pub(crate) fn try_stash(
        &self,
        addr: u64,
        stream: StreamId,
        size: usize,
        requested: usize,
    ) -> bool {
        let Some(shard) = self.shards.get(shard_of(stream)) else {
            return false;
        };
        let mut shard = shard.0.lock();
        if let Some(arena) = shard.lent_mut().filter(|a| a.stream == stream) {
            match arena.give_back(addr, size) {
                GiveBack::NotHere => {}
                GiveBack::Full => return false,
                GiveBack::Taken => {
                    // Note [Front arena]: carved and freed between two slow calls, a pair.
                    let pool = pool_of(size);
                    let block = Amount::block(size, requested);
                    shard.allowance.add(pool, &block);
                    shard.pairs[pool_slot(pool)].add(&block);
                    return true;
                }
            }
        }
        // Settled under the shard's lock: a disengaged cache stashes nothing.
        if !self.is_engaged()
            || shard.stashed.len() >= PER_SHARD
            || (!shard.slow_only.is_empty() && shard.slow_only.contains(&addr))
        {
            return false;
        }
        shard.stashed.push(Stashed {
            addr,
            stream,
            size,
            requested,
            age: 0,
        });
        shard
            .allowance
            .add(pool_of(size), &Amount::block(size, requested));
        true
    }

    /// Takes back the latest block stashed on `stream` of `rounded` bytes for a request of
    /// `requested`, if the shard's allowance pays for it (Note [Front allowance]), and counts
    /// the pair.
    pub(crate) fn try_take(
        &self,
        stream: StreamId,
        rounded: usize,
        requested: usize,
    ) -> Option<u64> {
        let mut shard = self.shards.get(shard_of(stream))?.0.lock();
        if shard.events_due {
            return None;
        }
        let pool = pool_of(rounded);
        let found = shard.find(stream, rounded, requested);
        let arena = found.is_none()
            && shard
                .lent()
                .is_some_and(|a| a.stream == stream && a.pool == pool);
        if !(found.is_some() || arena)
            || !shard
                .allowance
                .try_sub(pool, &Amount::block(rounded, requested))
        {
            return None;
        }
        let at = match found {
            Some(i) => Some(shard.take(i)),
            // Note [Front arena]: carved from the range lent to this stream.
            None => shard.lent_mut().and_then(|a| a.carve(rounded, requested)),
        };
        match at {
            Some(_) => shard.window_fast = shard.window_fast.saturating_add(1),
            None => shard
                .allowance
                .add(pool, &Amount::block(rounded, requested)),
        }
        at
    }

    /// Every shard locked, in index order (after the state's lock: Note [Front cache]).
    pub(crate) fn lock_all(&self) -> AllShards<'_> {
        self.shards.iter().map(|s| s.0.lock()).collect()
    }
}

/// Gives every stashed block back to the core and adds the pairs to its statistics: what the
/// slow path does first, holding the state's lock and every shard's.
pub(crate) fn flush<B: Backend>(state: &mut State<B>, shards: &mut AllShards<'_>) {
    settle(state, shards);
    for shard in shards.iter_mut() {
        for p in shard.stashed.drain(..) {
            // A stashed block is live in the core and used by no other stream (those are
            // `slow_only`), so its free records no event and cannot fail.
            let _ = state.deallocate(DevAddr::new(p.addr));
        }
        for (slot, pool) in [(0, PoolKind::Small), (1, PoolKind::Large)] {
            let pairs = std::mem::take(&mut shard.pairs[slot]);
            if pairs.count > 0 {
                count_pairs(&mut state.stats, pool, pairs);
            }
        }
    }
}

/// What the slow path does last: tells every shard whether the core's next allocation has
/// events to look at.
pub(crate) fn note_events<B: Backend>(state: &State<B>, shards: &mut AllShards<'_>) {
    let due = !state.pending.is_empty() || state.deferred.has_events();
    for shard in shards.iter_mut() {
        shard.events_due = due;
    }
}

/// What `pairs` frees-then-allocations changed: the totals, never `current` or `peak`.
fn count_pairs(stats: &mut MemoryStats, pool: PoolKind, pairs: Amount) {
    let both = |a: &mut StatArray, n: u64| {
        let in_pool = match pool {
            PoolKind::Small => &mut a.small_pool,
            PoolKind::Large => &mut a.large_pool,
        };
        for s in [&mut a.all, in_pool] {
            s.allocated += n;
            s.freed += n;
        }
    };
    both(&mut stats.allocation, pairs.count);
    both(&mut stats.active, pairs.count);
    both(&mut stats.allocated_bytes, pairs.bytes);
    both(&mut stats.active_bytes, pairs.bytes);
    both(&mut stats.requested_bytes, pairs.requested);
}

impl<B: Backend> State<B> {
    /// The stream of live block `addr` and the pool that holds it.
    fn home_of(&self, addr: u64) -> Option<(StreamId, PoolKind, bool)> {
        let b = self.live.get(&addr)?;
        let key = self.index.key(b.slot);
        Some((key.stream, key.pool, !b.uses.is_empty()))
    }
}

/// The stream of live block `addr` if its free must go through the core (Note [Front cache]):
/// it is used by another stream (its free records events) or borrowed from the other pool (its
/// statistics count in the pool that holds it).
fn core_only_stream<B: Backend>(state: &State<B>, addr: u64) -> Option<StreamId> {
    let (stream, pool, used) = state.home_of(addr)?;
    let size = state.size_of(&state.live[&addr]);
    (used || pool != pool_of(size)).then_some(stream)
}

/// After the core allocated `addr`: a block borrowed from the other pool must be freed through
/// the core (Note [Front cache]).
pub(crate) fn after_allocate<B: Backend>(state: &State<B>, shards: &mut AllShards<'_>, addr: u64) {
    if let Some(stream) = core_only_stream(state, addr) {
        slow_only(shards, stream, addr);
    }
}

/// After `record_stream` on `addr`: its free must record events, in the core.
pub(crate) fn after_record_stream<B: Backend>(
    state: &State<B>,
    shards: &mut AllShards<'_>,
    addr: u64,
) {
    if let Some((stream, _, _)) = state.home_of(addr) {
        slow_only(shards, stream, addr);
    }
}

/// Names `addr` in `stream`'s shard as a block to free through the core (none when off).
fn slow_only(shards: &mut AllShards<'_>, stream: StreamId, addr: u64) {
    if let Some(shard) = shards.get_mut(shard_of(stream)) {
        shard.slow_only.insert(addr);
    }
}

/// The stream of the block at `addr`, before the core frees it (so the slow path can forget it
/// from its shard's `slow_only` after).
pub(crate) fn stream_of<B: Backend>(state: &State<B>, addr: u64) -> Option<StreamId> {
    state.home_of(addr).map(|(s, _, _)| s)
}

/// After the core freed `addr` of `stream`: nothing to remember about it any more.
pub(crate) fn after_free(shards: &mut AllShards<'_>, stream: StreamId, addr: u64) {
    if let Some(shard) = shards.get_mut(shard_of(stream)) {
        shard.slow_only.remove(&addr);
    }
}

/// The front cache's invariants, without flushing it: every stashed block is live in the core on
/// its stream, of its size and request, used by no other stream, held in its own pool, stashed
/// once, in its stream's shard; every `slow_only` block is live.
pub(crate) fn check<B: Backend>(
    front: &FrontCache,
    state: &State<B>,
    shards: &AllShards<'_>,
) -> Result<(), InvariantViolation> {
    engage::check(front.is_engaged(), state, shards)?;
    let mut seen = FxHashSet::default();
    for (i, shard) in shards.iter().enumerate() {
        for p in &shard.stashed {
            let bad = InvariantViolation::BlockRecord {
                at: DevAddr::new(p.addr),
            };
            let Some((stream, pool, used)) = state.home_of(p.addr) else {
                return Err(bad);
            };
            let block = &state.live[&p.addr];
            let fits = stream == p.stream
                && shard_of(stream) == i
                && state.size_of(block) == p.size
                && block.requested == p.requested
                && pool == pool_of(p.size)
                && !used
                && seen.insert(p.addr);
            if !fits {
                return Err(bad);
            }
        }
        if let Some(a) = shard.lent() {
            let bad = InvariantViolation::FrontArena {
                at: DevAddr::new(a.lent.first().map_or(0, |l| l.start)),
            };
            let key = (state.index.slots() > a.slot as usize).then(|| state.index.key(a.slot));
            let lent_free = a.lent.iter().all(|&l| state.index.at(a.slot).contains(l));
            let home = StreamPool {
                stream: a.stream,
                pool: a.pool,
            };
            let fits = key == Some(home)
                && shard_of(a.stream) == i
                && lent_free
                && a.tiles()
                && a.carved_addresses()
                    .all(|c| !state.live.contains_key(&c) && seen.insert(c));
            if !fits {
                return Err(bad);
            }
        }
        for &addr in &shard.slow_only {
            if !state.live.contains_key(&addr) {
                return Err(InvariantViolation::BlockRecord {
                    at: DevAddr::new(addr),
                });
            }
        }
    }
    // Note [Front allowance]: what a user reads is within every peak, and the allowances never
    // sum to more than the room left below them.
    let mut allowed = Scoped::default();
    for shard in shards.iter() {
        allowed.add_all(&shard.allowance);
    }
    match allowance::headroom(&state.stats, &stashed_total(shards), &carved_total(shards)) {
        Some(room) if allowed.within(&room) => Ok(()),
        _ => Err(InvariantViolation::FrontAllowance),
    }
}
