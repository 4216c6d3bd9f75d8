//! `ExpandableAllocator`: expandable segments over any [`Backend`], better than PyTorch's.
//!
//! One segment per (stream, pool): a VA range reserved once and grown in place by mapping pages
//! (Note \[Growth\] in `growth.rs`). Small requests (≤ 1 MiB) and large ones use separate segments,
//! as in PyTorch. Freed blocks coalesce with free neighbours and are reused best-fit on their
//! stream; memory used by other streams (`record_stream`) is reused only after their events
//! complete. The improvements over PyTorch, each a [`ExpandableConfig`] switch: the handle cache
//! (Note \[Handle cache\]), remap-defrag (Note \[Remap\]), one set-access call per mapped run, exact
//! rollback of a failed growth, and `max_split_size` not applied to expandable blocks.
//!
//! Threads: one state behind one lock, and in front of it a per-stream front cache
//! ([`ExpandableConfig::front_cache`]) that serves a free and an identical allocation on one
//! stream without that lock (Note \[Front cache\] in `front/mod.rs`, Note \[Front allowance\] in
//! `front/allowance.rs`), and an allocation of any size from a free range of its stream lent by
//! the last call that took the lock (Note \[Front arena\] in `front/arena.rs`). By default it engages only once threads contend for the lock, and
//! disengages while it serves too few requests (Note \[Engage on contention\] in
//! `front/engage.rs`).

mod allocate;
mod check;
mod chunk_cache;
mod free;
mod free_ranges;
mod front;
mod growth;
mod handle_cache;
mod hopeless;
mod kept;
mod last_free;
mod parked;
mod pieces;
mod put_back;
mod recent_frees;
mod releasable;
mod release;
mod rescue;
mod segment;
mod size_index;
mod snapshot;
mod sorted_runs;
mod state;
mod target;

use crate::sync::Mutex;

use crate::allocator::{Allocation, Allocator, AllocatorId};
use crate::backend::{Backend, StreamId};
use crate::config::ExpandableConfig;
use crate::error::AllocError;
use crate::mechanism::owner::take_back;
use crate::mechanism::request::Request;
use crate::snapshot::Snapshot;
use crate::stats::MemoryStats;
use crate::units::DevAddr;

use front::{FrontCache, OtherCall};
use state::State;

/// Expandable-segments allocator: see the [module docs](self).
///
/// ```
/// use vmm_alloc::{Allocator, ExpandableAllocator, SimBackend, StreamId};
/// use vmm_alloc::config::ExpandableConfig;
/// let alloc = ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
/// let a = alloc.allocate(3 << 20, StreamId::DEFAULT).unwrap();
/// assert!(a.size() >= 3 << 20);
/// assert_eq!(alloc.stats().reserved_bytes.all.current, 20 << 20); // one 20 MiB page
/// alloc.deallocate(a).unwrap();
/// alloc.empty_cache().unwrap();
/// assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
/// ```
pub struct ExpandableAllocator<B: Backend> {
    /// Lock order: `state`, then `front`'s shards by index (Note [Front cache]).
    state: Mutex<State<B>>,
    front: FrontCache,
    /// Stamped on every allocation; checked outside the lock when one is given back.
    owner: AllocatorId,
}

impl<B: Backend> ExpandableAllocator<B> {
    /// An allocator over `backend` with `config` (validated).
    pub fn new(backend: B, config: ExpandableConfig) -> Result<Self, AllocError> {
        let state = State::new(backend, config)?;
        Ok(Self {
            owner: state.owner,
            front: FrontCache::new(&state.config),
            state: Mutex::new(state),
        })
    }

    /// The state's lock, for a call the front cache never serves (Note [Other calls] in
    /// `front/engage.rs`): a free that finds it taken by such a call is no contention.
    fn other_call(&self) -> OtherCall<'_, State<B>> {
        OtherCall::lock(&self.state, &self.front.engagement)
    }

    /// The configuration in force.
    pub fn config(&self) -> ExpandableConfig {
        self.other_call().config.clone()
    }

    /// Runs `f` on the backend (e.g. a test's clone of a Sim backend is simpler; this is for the
    /// rest).
    pub fn with_backend<T>(&self, f: impl FnOnce(&B) -> T) -> T {
        f(&self.other_call().backend)
    }

    /// Checks every internal invariant (segments, free ranges, index, stats) and returns the first
    /// violation. Walks the whole state: for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), crate::InvariantViolation> {
        let state = self.other_call();
        let shards = self.front.lock_all();
        front::check(&self.front, &state, &shards)?;
        state.check()
    }

    /// Runs `f` on the state with every stashed block given back to it first (Note [Front
    /// cache]): the slow path of every call but `allocate` (`front::allocate`), `config`,
    /// `with_backend` and `held_bytes`, which read what a stashed block does not change.
    fn slow<T>(&self, f: impl FnOnce(&mut State<B>, &mut front::AllShards<'_>) -> T) -> T {
        let mut state = self.other_call();
        if !self.front.is_engaged() {
            // Settled under the state's lock: nothing is stashed (Note [Engage on contention]).
            return f(&mut state, &mut Vec::new());
        }
        let mut shards = self.front.lock_all();
        Self::slow_locked(&mut state, &mut shards, f)
    }

    /// The slow path of an engaged front cache, the state's lock and every shard's held.
    fn slow_locked<T>(
        state: &mut State<B>,
        shards: &mut front::AllShards<'_>,
        f: impl FnOnce(&mut State<B>, &mut front::AllShards<'_>) -> T,
    ) -> T {
        front::flush(state, shards);
        let out = f(state, shards);
        front::note_events(state, shards);
        front::hand_out_allowances(state, shards);
        out
    }

    /// A free through the core with the front cache engaged and every lock held: the block's
    /// `slow_only` name, if any, is forgotten.
    fn free_engaged(
        state: &mut State<B>,
        shards: &mut front::AllShards<'_>,
        ptr: DevAddr,
    ) -> Result<(), AllocError> {
        Self::slow_locked(state, shards, |state, shards| {
            let stream = front::stream_of(state, ptr.get());
            state.deallocate(ptr)?;
            if let Some(stream) = stream {
                front::after_free(shards, stream, ptr.get());
            }
            Ok(())
        })
    }

    /// A free through `deallocate` while the front cache waits for contention (Note [Engage on
    /// contention]): the lock tried first, a taken one counted, and the cache engaged once
    /// enough were.
    fn free_watching(&self, ptr: DevAddr) -> Result<(), AllocError> {
        let state = self.state.try_lock();
        // Loom never runs a failing `try_lock` (a thread about to try a held lock counts as
        // blocked), so its models count every such free as contended: engagement then happens
        // mid-flight, which is what they explore.
        let contended = state.is_none() || cfg!(loom);
        // Counted before waiting for the lock: its holder may be waiting for the count.
        let engage = contended && self.front.engagement.note_contention();
        let mut state = state.unwrap_or_else(|| self.state.lock());
        if !engage && !self.front.is_engaged() {
            return state.deallocate(ptr);
        }
        let mut shards = self.front.lock_all();
        self.front.engagement.engage(&state, &mut shards);
        Self::free_engaged(&mut state, &mut shards, ptr)
    }

    /// Whether the front cache stashes now (Note [Engage on contention] in
    /// `front/engage.rs`): with [`FrontCacheMode::Always`](crate::config::FrontCacheMode) from
    /// the start, with `OnContention` once threads contend, never with `Off`. A test kit reading.
    #[cfg(feature = "testkit")]
    pub fn front_engaged(&self) -> bool {
        let _state = self.other_call();
        self.front.is_engaged()
    }

    /// Frees through `deallocate` that found the allocator's lock taken while the front cache
    /// waited for contention, since it last disengaged (Note [Engage on contention]). Read
    /// without the lock. A test kit counter.
    #[cfg(feature = "testkit")]
    pub fn front_contended_frees(&self) -> u32 {
        self.front.engagement.contended()
    }

    /// Frees through `deallocate` that found the allocator's lock held by a call the front
    /// cache never serves (statistics, snapshots, `empty_cache`, ...), and so did not count as
    /// contention (Note [Other calls] in `front/engage.rs`). A test kit counter.
    #[cfg(feature = "testkit")]
    pub fn front_frees_behind_other_calls(&self) -> u32 {
        self.front.engagement.behind_other_calls()
    }

    /// Runs `f` holding the allocator's lock as an allocation or a free does: a free on
    /// another thread meanwhile finds it contended (Note [Engage on contention]). For tests
    /// that make contention instead of waiting for it.
    #[cfg(feature = "testkit")]
    pub fn while_allocating<T>(&self, f: impl FnOnce() -> T) -> T {
        let _state = self.state.lock();
        f()
    }

    /// Segments the release path (`empty_cache`, the last resort of a failing allocation) has
    /// examined or walked so far: work that must grow with what changed and what it gives back,
    /// not with every segment (issue 21). A test kit counter.
    #[cfg(feature = "testkit")]
    pub fn release_walk_steps(&self) -> u64 {
        self.other_call().releasable.visits
    }

    /// Allocations that took the allocator's lock with the front cache on (Note [Front
    /// cache]): every allocation a shard's stash did not serve. A test kit counter; 0 with the
    /// front cache off.
    #[cfg(feature = "testkit")]
    pub fn front_slow_allocations(&self) -> u64 {
        self.front
            .lock_all()
            .iter()
            .map(|s| s.slow_allocations)
            .sum()
    }

    /// Chunks the walks for fully-free chunks (the release path, the release index, a pressured
    /// growth's remap candidates) have examined so far: work that must grow with the free
    /// pieces, not with every chunk mapped under live blocks. A test kit counter.
    #[cfg(feature = "testkit")]
    pub fn chunk_walk_steps(&self) -> u64 {
        self.other_call().chunk_walk_steps.get()
    }

    /// Pieces the listings of fully-free chunks (a pressured growth's remap candidates, the
    /// release index, the release path) have examined so far: only free pieces long enough to
    /// hold a chunk, found in the best-fit index, never the used pieces and gaps between them
    /// (Note [Indexed chunk listing]). A test kit counter.
    #[cfg(feature = "testkit")]
    pub fn listed_free_pieces(&self) -> u64 {
        self.other_call().listed_pieces
    }
}

impl<B: Backend> std::fmt::Debug for ExpandableAllocator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = self.other_call().backend.name();
        f.debug_struct("ExpandableAllocator")
            .field("backend", &backend)
            .field("held_bytes", &self.held_bytes())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Allocator for ExpandableAllocator<B> {
    fn allocate(&self, size: usize, stream: StreamId) -> Result<Allocation, AllocError> {
        // Rounded only when engaged: the default path of one thread pays for no stash.
        if self.front.is_engaged() {
            if let Ok(req) = Request::new(size, &self.front.divisions) {
                if let Some(at) = self.front.try_take(stream, req.rounded, req.size) {
                    return Ok(Allocation {
                        ptr: DevAddr::new(at),
                        size: req.rounded,
                        requested: req.size,
                        stream,
                        owner: self.owner,
                    });
                }
            }
        }
        let mut state = self.state.lock();
        // Settled under the state's lock (Note [Engage on contention]).
        if !self.front.is_engaged() {
            return state.allocate(size, stream);
        }
        let mut shards = self.front.lock_all();
        let out = front::allocate(
            &self.front.engagement,
            &mut state,
            &mut shards,
            size,
            stream,
            self.owner,
        );
        front::note_events(&state, &mut shards);
        front::hand_out_allowances(&state, &mut shards);
        out
    }

    fn deallocate(&self, allocation: Allocation) -> Result<(), AllocError> {
        if self.front.is_on() && allocation.owner == self.owner {
            if self.front.is_engaged() {
                let (addr, stream) = (allocation.ptr.get(), allocation.stream);
                if self
                    .front
                    .try_stash(addr, stream, allocation.size, allocation.requested)
                {
                    let _ = allocation.into_ptr();
                    return Ok(());
                }
            } else if self.front.engagement.watches() {
                return self.free_watching(take_back(self.owner, allocation)?);
            }
        }
        self.deallocate_ptr(take_back(self.owner, allocation)?)
    }

    fn deallocate_ptr(&self, ptr: DevAddr) -> Result<(), AllocError> {
        let mut state = self.state.lock();
        // Settled under the state's lock (Note [Engage on contention]).
        if !self.front.is_engaged() {
            return state.deallocate(ptr);
        }
        let mut shards = self.front.lock_all();
        Self::free_engaged(&mut state, &mut shards, ptr)
    }

    fn record_stream(&self, ptr: DevAddr, stream: StreamId) -> Result<(), AllocError> {
        self.slow(|state, shards| {
            state.record_stream(ptr, stream)?;
            front::after_record_stream(state, shards, ptr.get());
            Ok(())
        })
    }

    fn empty_cache(&self) -> Result<(), AllocError> {
        self.slow(|state, _| state.empty_cache())
    }

    fn stats(&self) -> MemoryStats {
        self.slow(|state, _| state.stats_now())
    }

    fn held_bytes(&self) -> u64 {
        let s = self.other_call();
        s.stats.reserved_bytes.all.current + (s.cache.bytes() + s.kept.bytes()) as u64
    }

    fn reset_peak_stats(&self) {
        self.slow(|state, _| state.stats.reset_peak());
    }

    fn snapshot(&self) -> Snapshot {
        self.slow(|state, _| state.snapshot())
    }
}

impl<B: Backend> Drop for ExpandableAllocator<B> {
    /// Gives everything back to the backend: pending events, mappings, handles (cached ones too)
    /// and reservations. Errors are ignored: there is no one to report them to.
    fn drop(&mut self) {
        self.state.get_mut().teardown();
    }
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ExpandableAllocator<crate::SimBackend>>();
};
