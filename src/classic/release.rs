//! Frees, cross-stream events and giving memory back, ported from PyTorch's `free`,
//! `free_block`, `try_merge_blocks`, `insert_events`, `process_events`, `release_*` and
//! `garbage_collect_cached_blocks` (reference §1.8–1.11).

use crate::backend::{Backend, CallKind, StreamId};
use crate::classic::blocks::BlockId;
use crate::classic::device::{device_free, FreeFailed};
use crate::classic::state::State;
use crate::error::{AllocError, BackendError};
use crate::mechanism::counters::track;
use crate::mechanism::deferred::release_handle;
use crate::stats::PoolKind;
use crate::units::DevAddr;

impl<B: Backend> State<B> {
    /// `free(block)`: the allocation at `ptr` is given back; with other streams' uses it waits for
    /// their events first.
    pub(crate) fn free(&mut self, ptr: DevAddr) -> Result<(), AllocError> {
        let Some(&id) = self.active.get(&ptr.get()) else {
            return Err(AllocError::InvalidPointer(ptr));
        };
        // Record the events first: if that fails the block is still allocated, nothing changed.
        let recorded = self.blocks.at(id).stream_uses.record_events(
            &self.backend,
            &mut self.stats,
            &mut self.deferred,
        )?;
        self.active.remove(&ptr.get());
        let b = self.blocks.at_mut(id);
        b.stream_uses = Default::default();
        b.allocated = false;
        b.event_count = recorded.len();
        let (kind, size) = (b.pool, b.size);
        self.stats.count_deallocated(kind, size);
        if size >= self.conf.max_split_size.unwrap_or(usize::MAX) {
            self.oversize_allocations -= 1;
        }
        if recorded.is_empty() {
            self.free_block(id);
        } else {
            for (s, e) in recorded {
                self.events.entry(s).or_default().push_back((e, id));
            }
        }
        Ok(())
    }

    /// `free_block`: merges with free neighbours of the same segment and returns the block to
    /// its pool.
    pub(crate) fn free_block(&mut self, id: BlockId) {
        let b = self.blocks.at(id);
        let (kind, original_size, requested) = (b.pool, b.size, b.requested);
        let (prev, next) = (b.prev, b.next);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for candidate in [prev, next] {
            let subsumed = self.try_merge_blocks(id, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.insert_into_blocks(id);
        let merged = self.blocks.at(id);
        if merged.is_split() {
            net_blocks += 1;
            net_bytes += merged.size as i64;
        }
        let s = &mut self.stats;
        apply(&mut s.inactive_split, kind, net_blocks);
        apply(&mut s.inactive_split_bytes, kind, net_bytes);
        s.count_inactive(kind, original_size, requested);
    }

    /// `try_merge_blocks(dst, src)`: absorbs `src` into `dst` if it is free and idle; returns the
    /// bytes absorbed.
    fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> usize {
        let Some(src) = src else { return 0 };
        let s = self.blocks.at(src);
        if s.allocated || s.event_count > 0 || !s.stream_uses.is_empty() {
            return 0;
        }
        self.remove_from_pool(src);
        let Some(s) = self.blocks.remove(src) else {
            return 0;
        };
        let d = self.blocks.at_mut(dst);
        if d.prev == Some(src) {
            d.ptr = s.ptr;
            d.prev = s.prev;
            if let Some(p) = s.prev {
                self.blocks.at_mut(p).next = Some(dst);
            }
        } else {
            d.next = s.next;
            if let Some(n) = s.next {
                self.blocks.at_mut(n).prev = Some(dst);
            }
        }
        self.blocks.at_mut(dst).size += s.size;
        s.size
    }

    /// `recordStream`: the block is used on `stream` too.
    pub(crate) fn record_stream(
        &mut self,
        ptr: DevAddr,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        let &id = self
            .active
            .get(&ptr.get())
            .ok_or(AllocError::InvalidPointer(ptr))?;
        let b = self.blocks.at_mut(id);
        b.stream_uses.record(b.stream, stream);
        Ok(())
    }

    /// `process_events`: per stream, frees blocks whose events completed, stopping at the first
    /// that has not (events complete in order on a stream).
    pub(crate) fn process_events(&mut self) {
        let streams: Vec<StreamId> = self.events.keys().copied().collect();
        for s in streams {
            while let Some(&(event, id)) = self.events.get(&s).and_then(|q| q.front()) {
                let done = track(
                    &mut self.stats,
                    CallKind::QueryEvent,
                    self.backend.query_event(event),
                );
                // A failing query counts as "not done": never reuse early.
                if !matches!(done, Ok(true)) {
                    break;
                }
                self.events.get_mut(&s).map(|q| q.pop_front());
                self.event_done(event, id);
            }
            if self.events.get(&s).is_some_and(|q| q.is_empty()) {
                self.events.remove(&s);
            }
        }
    }

    /// Tries again to give back what earlier failures left (Note [Deferred releases]): events,
    /// then what device allocations and frees left; returns the first error, keeping the rest.
    fn give_back_leftovers(&mut self) -> Result<(), BackendError> {
        let (backend, stats) = (&self.backend, &mut self.stats);
        self.deferred.retry_events(backend, stats)?;
        self.deferred
            .retry_leftovers(backend, stats, &mut release_handle)
    }

    fn event_done(&mut self, event: crate::backend::EventId, id: BlockId) {
        self.deferred
            .release_event(&self.backend, &mut self.stats, event);
        let b = self.blocks.at_mut(id);
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(id);
        }
    }

    /// `synchronize_and_free_events`: waits for every outstanding event, then frees their blocks.
    fn synchronize_and_free_events(&mut self) -> Result<(), BackendError> {
        let streams: Vec<StreamId> = self.events.keys().copied().collect();
        for s in &streams {
            track(
                &mut self.stats,
                CallKind::Synchronize,
                self.backend.synchronize(*s),
            )?;
        }
        for s in streams {
            for (event, id) in self.events.remove(&s).unwrap_or_default() {
                self.event_done(event, id);
            }
        }
        Ok(())
    }

    /// `release_cached_blocks`: waits for pending frees, then frees every free whole segment,
    /// large pool first, each pool in (stream, size, address) order.
    pub(crate) fn release_cached_blocks(&mut self) -> Result<(), AllocError> {
        // A replayed call's frees are done before its first release (its own sync included).
        self.complete_pending()?;
        self.give_back_leftovers()?;
        self.synchronize_and_free_events()?;
        self.release_blocks(PoolKind::Large)?;
        self.release_blocks(PoolKind::Small)?;
        Ok(())
    }

    fn release_blocks(&mut self, kind: PoolKind) -> Result<(), AllocError> {
        for id in self.unsplit_free(kind) {
            self.release_block(id)?;
        }
        Ok(())
    }

    /// The free blocks of a pool that are whole segments, in pool order (the order of PyTorch's
    /// walk over the pool, which skips split blocks): from the pool's index of them, so the cost
    /// is in what is found, not in every free block.
    fn unsplit_free(&mut self, kind: PoolKind) -> Vec<BlockId> {
        let found: Vec<BlockId> = self.pool_of(kind).unsplit().map(|k| k.id).collect();
        self.release_walk_steps += found.len() as u64;
        found
    }

    /// `release_block`: `cudaFree` of a free, unsplit block (a whole segment).
    pub(crate) fn release_block(&mut self, id: BlockId) -> Result<(), AllocError> {
        let b = self.blocks.at(id);
        let (ptr, size, kind) = (b.ptr, b.size, b.pool);
        let Some(seg) = self.segments.get(&ptr).copied() else {
            return Ok(());
        };
        // If the unmap worked but the rest did not, the segment is gone all the same (its memory
        // is unmapped: its block must never be handed out again); what is left is deferred.
        let failed = match device_free(&self.backend, &mut self.stats, &seg) {
            Ok(()) => None,
            Err(FreeFailed::Untouched(e)) => return Err(e.into()),
            Err(FreeFailed::Partly(e, left)) => {
                self.deferred.keep(*left);
                Some(e)
            }
        };
        self.segments.remove(&ptr);
        self.total_allocated_memory -= size;
        self.remove_from_pool(id);
        self.blocks.remove(id);
        self.stats.segment.decrease(kind, 1);
        self.stats.reserved_bytes.decrease(kind, size as u64);
        if size >= self.conf.max_split_size.unwrap_or(usize::MAX) {
            self.oversize_segments -= 1;
        }
        self.stats.num_device_free += 1;
        self.count_release();
        failed.map_or(Ok(()), |e| Err(e.into()))
    }

    /// `release_available_cached_blocks`: with `max_split_size` set, frees one oversize block big
    /// enough for the request, or oversize blocks from the largest down until enough is freed.
    pub(crate) fn release_available_cached_blocks(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        size: usize,
    ) -> Result<bool, AllocError> {
        let Some(max_split) = self.conf.max_split_size else {
            return Ok(false);
        };
        let key = size.max(max_split);
        if let Some((_, id)) = self.pool(kind).lower_bound(stream, key) {
            self.release_block(id)?;
            return Ok(true);
        }
        // No single block is large enough: free oversize blocks of this stream, largest first,
        // until enough is freed (only those are visited: the walk stops where the loop below
        // would, so its cost is in what it frees).
        let candidates: Vec<(usize, BlockId)> = self
            .pool(kind)
            .below(stream, key)
            .rev()
            .take_while(|k| k.stream == stream && k.size >= max_split)
            .scan(0usize, |taken, k| {
                (*taken < key).then(|| {
                    *taken += k.size;
                    (k.size, k.id)
                })
            })
            .collect();
        let mut released = 0;
        for (len, id) in candidates {
            if released >= key {
                break;
            }
            self.release_block(id)?;
            released += len;
        }
        Ok(released >= key)
    }

    /// `garbage_collect_cached_blocks`: above `garbage_collection_threshold` of the allowed
    /// memory, frees the unsplit large blocks that went unused longest (age ≥ the average) until
    /// the excess is reclaimed.
    pub(crate) fn garbage_collect_cached_blocks(&mut self) -> Result<(), AllocError> {
        // The first step after a failed search: a replayed call's frees are done by now.
        self.complete_pending()?;
        let Some(allowed) = self.allowed_memory_maximum else {
            return Ok(());
        };
        let gc_threshold = (self.conf.garbage_collection_threshold * allowed as f64) as usize;
        if self.total_allocated_memory <= gc_threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - gc_threshold;
        let clock = self.large.get_free_blocks_call_count;
        let age = |s: &Self, id: BlockId| (clock - s.blocks.at(id).gc_count_base) as f64;
        let freeable = self.unsplit_free(PoolKind::Large);
        let mut total_age: f64 = freeable.iter().map(|&id| age(self, id)).sum();
        let mut count = freeable.len();
        let mut reclaimed = 0;
        let mut freed_one = true;
        while reclaimed < target && freed_one && count > 0 {
            let threshold = total_age / count as f64;
            freed_one = false;
            for id in self.unsplit_free(PoolKind::Large) {
                let a = age(self, id);
                if a >= threshold {
                    freed_one = true;
                    reclaimed += self.blocks.at(id).size;
                    total_age -= a;
                    count -= 1;
                    self.release_block(id)?;
                }
            }
        }
        Ok(())
    }
}

/// Adds a signed change to a count stat.
fn apply(stat: &mut crate::stats::StatArray, kind: PoolKind, delta: i64) {
    if delta > 0 {
        stat.increase(kind, delta as u64);
    } else if delta < 0 {
        stat.decrease(kind, delta.unsigned_abs());
    }
}
