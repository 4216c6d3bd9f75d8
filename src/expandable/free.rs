//! Frees: a block goes back to the free ranges at once, or, if other streams used it, once the
//! events recorded for them complete (Note [Syncs] says when its pages may be unmapped).

use std::collections::BTreeSet;

use crate::backend::{Backend, CallKind, EventId, StreamId};
use crate::error::{AllocError, BackendError};
use crate::expandable::size_index::StreamPool;
use crate::expandable::state::{Block, Pending, State};
use crate::mechanism::counters::track;
use crate::units::DevAddr;

impl<B: Backend> State<B> {
    pub(crate) fn deallocate(&mut self, ptr: DevAddr) -> Result<(), AllocError> {
        let addr = ptr.get();
        let Some(block) = self.live.remove(&addr) else {
            return Err(
                if self.recent_frees.contains(addr) || self.pending.iter().any(|p| p.addr == addr) {
                    AllocError::DoubleFree(ptr)
                } else {
                    AllocError::InvalidPointer(ptr)
                },
            );
        };
        let events = if block.uses.is_empty() {
            Vec::new()
        } else {
            let recorded =
                block
                    .uses
                    .record_events(&self.backend, &mut self.stats, &mut self.deferred);
            match recorded {
                Ok(events) => events,
                Err(err) => {
                    self.live.insert(addr, block);
                    return Err(err.into());
                }
            }
        };
        let (pool, size) = (self.index.key(block.slot).pool, self.size_of(&block));
        self.stats.count_deallocated(pool, size);
        self.recent_frees.remember(addr);
        if events.is_empty() {
            self.free_block(&block);
        } else {
            self.pending.push(Pending {
                addr,
                block,
                events,
            });
        }
        Ok(())
    }

    /// A block's size: its piece's length.
    pub(crate) fn size_of(&self, block: &Block) -> usize {
        self.pieces.get(block.piece).len
    }

    fn free_block(&mut self, block: &Block) {
        // A block's stream is its segment's: blocks are carved from their (stream, pool)'s ranges.
        let StreamPool { stream, pool } = self.index.key(block.slot);
        // A loop frees on one stream over and over: the set is looked at only when it changes.
        if self.last_unsynced != Some(stream) {
            self.unsynced_frees.insert(stream);
            self.last_unsynced = Some(stream);
        }
        if !self.rescues.is_empty() {
            let addr = self.pieces.get(block.piece).start;
            if let Some(r) = self.rescues.remove(&addr) {
                self.end_rescue(r, block);
                return;
            }
        }
        let size = self.size_of(block);
        let merged = self.make_free(block.slot, block.piece);
        self.remember_free(block.slot, block.piece, merged, size);
        self.stats.count_inactive(pool, size, block.requested);
    }

    /// Waits for `stream`'s queued work before its free pages are unmapped (Note [Syncs]).
    ///
    /// Note [Syncs]: unmapping does not wait for the GPU, so a page freed on a stream whose
    /// kernels may still run must not be unmapped before the stream is synchronized; PyTorch
    /// synchronizes before every unmap. Work queued after a block was freed cannot legally touch
    /// it, so once a stream was synchronized after its latest free, every page free on it is
    /// quiet: with `sync_only_after_frees` we skip the call then. Under memory pressure that
    /// turns one synchronization per harvested page into one per stream per burst of frees.
    /// A growth remapping its own stream's pages need not unmap them at all (Note [Parked
    /// pages] in `parked.rs`); every synchronization unmaps that stream's parked pages.
    pub(crate) fn sync_before_unmap(&mut self, stream: StreamId) -> Result<(), BackendError> {
        if !self.needs_sync(stream) {
            return Ok(());
        }
        self.synchronize(stream)
    }

    /// Whether unmapping a free page of `stream` must first synchronize it (Note [Syncs]).
    pub(crate) fn needs_sync(&self, stream: StreamId) -> bool {
        !self.config.sync_only_after_frees || self.unsynced_frees.contains(&stream)
    }

    /// Waits for `stream`'s queued work: every page freed on it is quiet after (Note [Syncs]).
    fn synchronize(&mut self, stream: StreamId) -> Result<(), BackendError> {
        let synced = self.backend.synchronize(stream);
        track(&mut self.stats, CallKind::Synchronize, synced)?;
        self.unsynced_frees.remove(&stream);
        if self.last_unsynced == Some(stream) {
            self.last_unsynced = None;
        }
        // Nothing queued can touch the stream's parked pages any more (Note [Parked pages]). A
        // page the driver will not unmap stays parked, tried again at the next chance: the
        // synchronization itself succeeded.
        let _ = self.unpark_stream(stream);
        Ok(())
    }

    pub(crate) fn record_stream(
        &mut self,
        ptr: DevAddr,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        let block = self
            .live
            .get_mut(&ptr.get())
            .ok_or(AllocError::InvalidPointer(ptr))?;
        block.uses.record(self.index.key(block.slot).stream, stream);
        Ok(())
    }

    /// Frees the pending blocks whose events have all completed; with `sync`, first waits for
    /// every stream they wait on. Returns the first backend error met while syncing. Always
    /// inlined: out of line (the compiler's choice once `allocate` grew a caller more), the
    /// cached pair paid 24 instructions for the call (callgrind, 100,000 pairs).
    #[inline(always)]
    pub(crate) fn process_events(&mut self, sync: bool) -> Result<(), BackendError> {
        // Every allocation looks: nothing to do is the common case, decided without a call.
        if self.pending.is_empty() && !self.deferred.has_events() {
            return Ok(());
        }
        self.process_pending(sync)
    }

    fn process_pending(&mut self, sync: bool) -> Result<(), BackendError> {
        // A failed release stays deferred: nothing else depends on it.
        let _ = self.deferred.retry_events(&self.backend, &mut self.stats);
        if self.pending.is_empty() {
            return Ok(());
        }
        if sync {
            let streams: BTreeSet<StreamId> = self
                .pending
                .iter()
                .flat_map(|p| p.events.iter().map(|&(s, _)| s))
                .collect();
            for s in streams {
                self.synchronize(s)?;
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            let done = self.pending[i].events.iter().all(|&(_, e)| {
                // A failing query counts as "not done": the block stays pending, never reused early.
                matches!(
                    track(
                        &mut self.stats,
                        CallKind::QueryEvent,
                        self.backend.query_event(e)
                    ),
                    Ok(true)
                )
            });
            if done {
                let p = self.pending.swap_remove(i);
                for &(_, e) in &p.events {
                    self.release_event(e);
                }
                self.free_block(&p.block);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Releases an event no pending block waits for any more; one whose release fails is
    /// deferred and tried again later.
    fn release_event(&mut self, e: EventId) {
        self.deferred
            .release_event(&self.backend, &mut self.stats, e);
    }
}
