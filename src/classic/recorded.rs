//! Replaying a recorded `malloc` faithfully: what a PyTorch memory snapshot shows of one call
//! that needed a new segment, fed back into the port so its path through `malloc` is the
//! recorded one (Note [Recorded mallocs]).
//!
//! # Note [Recorded mallocs]
//!
//! A snapshot's trace orders entries by when the allocator recorded them, not by when a replay
//! may act on them. Two things inside one `malloc` cannot be replayed as the separate events
//! they look like (reference `pytorch-allocator.md` §1.3, §1.9, §1.10):
//!
//! * a block freed with `record_stream` uses stays pending until its events complete; the
//!   `free_completed` of such a block may come from `synchronize_and_free_events`, which runs
//!   inside `release_cached_blocks` *after* the search for a cached block failed (and after the
//!   first `cudaMalloc` failed). Freed before the search, as a replay of the entries in order
//!   would, the block could serve the request that PyTorch served from a new segment;
//! * a run of `segment_free` before the `segment_alloc` of the same call is not always "free
//!   every cached segment": with `max_split_size` set, `release_available_cached_blocks` frees
//!   only oversize blocks first, and with `garbage_collection_threshold` the collector frees only
//!   old large blocks. Replaying the run as `empty_cache()` frees more than PyTorch did.
//!
//! So a replay passes, for a call that recorded a new segment, the frees recorded since the
//! previous call and the number of segments the call released. The port then runs its own
//! `malloc`: the search sees the cache without those frees (PyTorch's search failed with them
//! applied, so it fails without them too: fewer free bytes, never a larger block); the frees
//! complete as soon as the search has failed, before the garbage collector, the device
//! allocation and the releases, which need the blocks freed in the ordinary way back in their
//! pool; and every device allocation attempt other than the final retry is refused until the
//! call has released as many segments as recorded (the recording GPU was full there, the
//! simulated one is not), so the port's own chain decides *what* to release.
//!
//! Not reproduced: a block pending until the synchronization of `release_cached_blocks` is
//! back in its pool one step early, during `release_available_cached_blocks` or the collector,
//! which could then free it (a pending oversize block with `max_split_size` set, or a pending
//! old large block with the collector on).

use crate::backend::Backend;
use crate::classic::state::State;
use crate::error::AllocError;
use crate::units::DevAddr;

/// The recorded shape of the `malloc` being replayed.
#[derive(Debug, Default)]
pub(crate) struct Replaying {
    /// Allocations freed after the search failed (see the note).
    pub(crate) pending: Vec<DevAddr>,
    /// Segments the recorded call released before its successful `cudaMalloc`.
    pub(crate) released_recorded: usize,
    /// Segments released so far in this call.
    pub(crate) released: usize,
}

impl<B: Backend> State<B> {
    /// Whether `alloc_block` must report the device full: a recorded call that released
    /// segments first was refused by the device until it had released them all. The final retry
    /// is never refused.
    pub(crate) fn refuse_device_alloc(&self, is_retry: bool) -> bool {
        self.replaying
            .as_ref()
            .is_some_and(|r| !is_retry && r.released < r.released_recorded)
    }

    /// Frees the recorded call's pending allocations now (where PyTorch completed them).
    pub(crate) fn complete_pending(&mut self) -> Result<(), AllocError> {
        let Some(r) = self.replaying.as_mut() else {
            return Ok(());
        };
        for ptr in std::mem::take(&mut r.pending) {
            self.free(ptr)?;
        }
        Ok(())
    }

    /// Counts a released segment towards the recorded call's.
    pub(crate) fn count_release(&mut self) {
        if let Some(r) = self.replaying.as_mut() {
            r.released += 1;
        }
    }

    /// `malloc(size, stream)` as the trace recorded it: `pending` freed after the search,
    /// `released` segments released before the device allocation (Note [Recorded mallocs]).
    /// The frees happen whatever the outcome.
    pub(crate) fn malloc_as_recorded(
        &mut self,
        size: usize,
        stream: crate::backend::StreamId,
        pending: Vec<DevAddr>,
        released: usize,
    ) -> Result<crate::Allocation, AllocError> {
        self.replaying = Some(Replaying {
            pending,
            released_recorded: released,
            released: 0,
        });
        let result = self.malloc(size, stream);
        let done = self.complete_pending();
        self.replaying = None;
        let a = result?;
        done.map(|()| a)
    }
}
