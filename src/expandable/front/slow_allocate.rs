//! The front cache's slow allocation: under every lock, an allocation that leaves the stashed
//! blocks stashed where it can (Note [Front cache], Note [Front allowance]).

use super::{
    after_allocate, allowance, flush, settle, shard_of, stashed_total, AllShards, Engagement,
};
use crate::allocator::{Allocation, AllocatorId};
use crate::backend::{Backend, StreamId};
use crate::error::AllocError;
use crate::expandable::state::State;
use crate::mechanism::request::Request;
use crate::units::DevAddr;

/// Serves `size` on `stream` holding the state's lock and every shard's, in this order:
///
/// 1. a block stashed on the stream for this very request (the fast path found it but its
///    allowance could not pay for it): taken back, and every peak raised to what a user reads;
/// 2. after the stream's stashed blocks aged (Note [Stash age] in `mod.rs`: those beside a free
///    range, or older than `STASH_AGE`, go back to the core), a free range of the stream's own
///    segment: the core allocates with the stashed blocks out
///    of its counters' `current`, so the peaks it sets are what a user reads, and the stash
///    stays (a loop freeing several sizes before it asks for them again keeps its blocks);
/// 3. anything else (a growth, borrowing, the out-of-memory path, events to look at): every
///    stashed block goes back to the core first, so the core never grows while memory it could
///    use sits stashed, and then it allocates as without the front cache.
///
/// Before any of it, an engaged cache whose window has ended is judged (Note [Engage on
/// contention] in `engage.rs`); one that disengages serves this allocation as the core alone.
pub(crate) fn allocate<B: Backend>(
    engagement: &Engagement,
    state: &mut State<B>,
    shards: &mut AllShards<'_>,
    size: usize,
    stream: StreamId,
    owner: AllocatorId,
) -> Result<Allocation, AllocError> {
    // Note [Front arena]: the core is looked at only with every arena settled.
    settle(state, shards);
    let own = &mut shards[shard_of(stream)];
    own.slow_allocations += 1;
    own.window_slow = own.window_slow.saturating_add(1);
    if engagement.judge(state, shards) {
        return state.allocate(size, stream);
    }
    let req = Request::new(size, &state.config.roundup_power2_divisions);
    if let Ok(req) = &req {
        // What the slow call's end lends this shard an arena of.
        shards[shard_of(stream)].arena_want = Some((stream, req.pool));
    }
    let events_due = !state.pending.is_empty() || state.deferred.has_events();
    if let (Ok(req), false) = (req, events_due) {
        let own = &mut shards[shard_of(stream)];
        if let Some(i) = own.find(stream, req.rounded, req.size) {
            let at = own.take(i);
            allowance::raise_peaks(&mut state.stats, &stashed_total(shards));
            return Ok(Allocation {
                ptr: DevAddr::new(at),
                size: req.rounded,
                requested: req.size,
                stream,
                owner,
            });
        }
        own.age(state, stream);
        if state.fits_free(stream, req.pool, req.rounded) {
            let stashed = stashed_total(shards);
            allowance::shift_current(&mut state.stats, &stashed, true);
            let out = state.allocate(size, stream);
            allowance::shift_current(&mut state.stats, &stashed, false);
            let a = out?;
            after_allocate(state, shards, a.ptr.get());
            return Ok(a);
        }
    }
    flush(state, shards);
    let a = state.allocate(size, stream)?;
    after_allocate(state, shards, a.ptr.get());
    Ok(a)
}
