//! Giving memory back: `empty_cache` (PyTorch's `release_cached_blocks`), unmapping free
//! chunks, freeing empty segments, trimming the handle cache, retrying what the driver refused.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

use crate::backend::{Backend, CallKind, PhysHandle};
use crate::error::{AllocError, BackendError};
use crate::expandable::pieces::PieceId;
use crate::expandable::put_back::Unmapped;
use crate::expandable::segment::{Chunk, FreeChunk, Segment, SegmentKey};
use crate::expandable::state::State;
use crate::mechanism::counters::track;
use crate::mechanism::deferred::Leftover;
use crate::stats::MemoryStats;
use crate::units::DevAddr;

/// `release_cached`'s listings of free chunks, per slot, each sorted by (segment, address).
/// A listing stays true while only the segments already released change: each segment's pieces
/// are its own. Emptied when a synchronization frees blocks, which may free chunks anywhere.
#[derive(Default)]
struct SlotListings {
    by_slot: FxHashMap<u32, Vec<(u64, SegmentKey, FreeChunk)>>,
}

impl<B: Backend> State<B> {
    pub(crate) fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.release_cached(true, None)?;
        // The program asks for a fresh start, as after catching an OOM (Note [Alias rescue]).
        self.rescue_paused = false;
        Ok(())
    }

    /// PyTorch's `release_cached_blocks`: waits for pending frees, unmaps every fully-free page of
    /// every segment, frees segments left with no page, and (with `trim`) releases cached handles
    /// beyond the cache limit. `unmapped`, if given, receives each free chunk unmapped, with its
    /// segment, in the order unmapped (Note [Pages put back] in `put_back.rs`).
    pub(crate) fn release_cached(
        &mut self,
        trim: bool,
        mut unmapped: Option<&mut Vec<Unmapped>>,
    ) -> Result<(), AllocError> {
        self.process_events(true)?;
        // What the driver refused before is tried again; what it refuses again stays deferred.
        let _ = self.retry_deferred();
        let _ = self.retry_dead_rescues(false);
        // Only the segments with something to give back, in address order as before
        // (Note [Release index]).
        self.update_release_index();
        let keys: Vec<SegmentKey> = self.releasable.segments().collect();
        self.releasable.visits += keys.len() as u64;
        let mut listings = SlotListings::default();
        for seg in keys {
            self.unmap_stuck(seg)?;
            let chunks = self.listed_free_chunks(&mut listings, seg);
            let parked = !self.segments[&seg].parked.is_empty();
            if !chunks.is_empty() || parked {
                let clock = self.pieces.clock();
                self.sync_before_unmap(self.segments[&seg].stream)?;
                // Blocks freed by the synchronization may have freed chunks anywhere.
                if self.pieces.clock() != clock {
                    listings.by_slot.clear();
                }
            }
            // A synchronization unparked them already; without one the stream was quiet.
            self.unpark_segment(seg)?;
            self.unmap_free_chunks(seg, &chunks)?;
            if let Some(out) = unmapped.as_deref_mut() {
                self.record_unmapped(seg, &chunks, out);
            }
            let s = &self.segments[&seg];
            if s.holds_nothing() && s.stuck.is_empty() && s.parked.is_empty() {
                self.free_segment(seg)?;
            } else {
                // Every free chunk and stuck chunk is gone: nothing left to give back.
                self.releasable.set(seg, false);
            }
        }
        // The walk touched only the slots of the segments it emptied, all now up to date.
        self.releasable.take_touched();
        if trim {
            self.release_kept();
            self.trim_cache(self.cache_bound())?;
        }
        Ok(())
    }

    /// The free chunks of segment `seg`, in address order (unmapping them in that order leaves
    /// each next one in a piece of the same index, Note [Pieces]), from its slot's listing
    /// (Note [Indexed chunk listing]), made once for all the slot's segments.
    fn listed_free_chunks(
        &mut self,
        listings: &mut SlotListings,
        seg: SegmentKey,
    ) -> Vec<FreeChunk> {
        let slot = self.segments[&seg].slot;
        let listed = match listings.by_slot.entry(slot) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let mut listed = Vec::new();
                self.slot_free_chunks(slot, &mut listed);
                listed.sort_unstable_by_key(|&(_, key, c)| (key, c.at));
                e.insert(listed)
            }
        };
        let from = listed.partition_point(|&(_, key, _)| key < seg);
        let to = listed.partition_point(|&(_, key, _)| key <= seg);
        listed[from..to].iter().map(|&(_, _, c)| c).collect()
    }

    /// Re-examines the segments of the slots touched since the last call, so that the release
    /// index holds exactly the segments with something to give back (Note [Release index]).
    pub(crate) fn update_release_index(&mut self) {
        let (mut listed, mut with_chunk) = (Vec::new(), Vec::new());
        for slot in self.releasable.take_touched() {
            listed.clear();
            self.slot_free_chunks(slot, &mut listed);
            let visited = self.file_slot(slot, &listed, &mut with_chunk);
            self.releasable.visits += visited;
        }
    }

    /// Files each segment of slot `slot` in the release index or takes it out, `listed` being
    /// the slot's free chunks (`slot_free_chunks`): `has_releasable` without a walk. Returns how
    /// many segments it examined. `with_chunk`: scratch space.
    pub(crate) fn file_slot(
        &mut self,
        slot: u32,
        listed: &[(u64, SegmentKey, FreeChunk)],
        with_chunk: &mut Vec<SegmentKey>,
    ) -> u64 {
        with_chunk.clear();
        with_chunk.extend(listed.iter().map(|&(_, key, _)| key));
        with_chunk.sort_unstable();
        with_chunk.dedup();
        let keys = self.segments_of_slot(slot);
        for &key in &keys {
            let s = &self.segments[&key];
            let has = !s.stuck.is_empty()
                || !s.parked.is_empty()
                || s.holds_nothing()
                || with_chunk.binary_search(&key).is_ok();
            self.releasable.set(key, has);
        }
        keys.len() as u64
    }

    /// Whether `seg` has something `release_cached` gives back: a stuck or parked chunk, a chunk
    /// wholly free, or no chunk at all and no rescue in its rescue space (the segment itself
    /// goes).
    pub(crate) fn has_releasable(&self, seg: &Segment) -> bool {
        !seg.stuck.is_empty()
            || !seg.parked.is_empty()
            || seg.holds_nothing()
            || self.has_free_chunk(seg)
    }

    /// Keeps the handle of an unmapped chunk in the cache, or releases it without the cache.
    pub(crate) fn unmapped_handle(&mut self, chunk: Chunk) -> Result<(), BackendError> {
        if !self.config.handle_cache {
            // Released at once: its parked mapping, if any, goes first (Note [Parked pages]).
            self.unpark_handle(chunk.handle)?;
        }
        self.cache.keep_or_release(
            self.config.handle_cache,
            &self.backend,
            &mut self.stats,
            chunk.handle,
            chunk.len,
        )
    }

    /// Releases a handle the allocator no longer needs. One whose release fails goes to the
    /// cache, whatever the config, so it is never lost: the next trim (`trim_to_bound` keeps
    /// none without the cache) releases it again.
    pub(crate) fn release_or_keep(
        &mut self,
        h: PhysHandle,
        len: usize,
    ) -> Result<(), BackendError> {
        self.cache
            .keep_or_release(false, &self.backend, &mut self.stats, h, len)
    }

    /// How many bytes of handles may stay cached between calls.
    fn cache_bound(&self) -> usize {
        if self.config.handle_cache {
            self.config.handle_cache_limit
        } else {
            0
        }
    }

    /// Tries again to unmap the chunks of `seg` a rollback left mapped (Note [Stuck chunks] in
    /// `growth.rs`). No sync: no block was ever carved from them, so no queued work uses them.
    fn unmap_stuck(&mut self, seg: SegmentKey) -> Result<(), BackendError> {
        while let Some((&at, &chunk)) = self.segments[&seg].stuck.first_key_value() {
            let unmapped = self.backend.unmap(DevAddr::new(at), chunk.len);
            track(&mut self.stats, CallKind::Unmap, unmapped)?;
            if let Some(s) = self.segments.get_mut(&seg) {
                s.remove_stuck(at);
                self.releasable.touch(s.slot);
            }
            self.unmapped_handle(chunk)?;
        }
        Ok(())
    }

    /// Releases cached handles beyond the bound (`handle_cache_limit`, 0 without the cache).
    /// The OOM retry and remap put handles in the cache in the middle of an allocation; this
    /// runs at its end, so the bound holds between calls. A failed release leaves the handle
    /// cached (consistent; tried again next time): the allocation's result stands.
    pub(super) fn trim_to_bound(&mut self) {
        let _ = self.trim_cache(self.cache_bound());
    }

    /// Unmaps every chunk of `chunks` (free chunks of `seg`, in address order) and hands each
    /// handle to [`unmapped_handle`](Self::unmapped_handle).
    ///
    /// Note [Unmap runs]: one `cuMemUnmap` may span many adjacent whole mappings (the H100's
    /// behaviour, `../shared/reference/cudarc-and-vmm.md`; the ledger checks the same on every
    /// backend), so with `batch_unmaps` each run of adjacent chunks is one driver call. A run
    /// the driver refuses whole is unmapped chunk by chunk, as without the setting, so an error
    /// leaves exactly the chunks before the failing one unmapped, each with its handle handed on.
    /// The bookkeeping is per chunk either way, in address order (each chunk's `free_to_gap`
    /// leaves the piece of the chunks after it as it was).
    fn unmap_free_chunks(
        &mut self,
        seg: SegmentKey,
        chunks: &[FreeChunk],
    ) -> Result<(), BackendError> {
        let mut rest = chunks;
        while let Some(first) = rest.first() {
            let mut n = 1;
            if self.config.batch_unmaps {
                while n < rest.len() && rest[n - 1].at + rest[n - 1].chunk.len as u64 == rest[n].at
                {
                    n += 1;
                }
            }
            let (run, after) = rest.split_at(n);
            rest = after;
            let last = run[n - 1];
            let whole = n > 1 && {
                let len = (last.at - first.at) as usize + last.chunk.len;
                let unmapped = self.backend.unmap(DevAddr::new(first.at), len);
                track(&mut self.stats, CallKind::Unmap, unmapped).is_ok()
            };
            if !whole {
                for &c in run {
                    self.unmap_chunk(seg, c)?;
                    self.unmapped_handle(c.chunk)?;
                }
                continue;
            }
            // Every chunk of the run is unmapped: each is forgotten before any handle is handed
            // on, so that a handle the cache refuses cannot leave a chunk counted as mapped.
            for &c in run {
                self.forget_unmapped_chunk(seg, c);
            }
            let mut result = Ok(());
            for &c in run {
                result = result.and(self.unmapped_handle(c.chunk));
            }
            result?;
        }
        Ok(())
    }

    /// Unmaps one free chunk and takes it out of the free ranges; the handle is the caller's.
    /// Returns the new free piece before the chunk, if its piece was split (`free_to_gap`).
    pub(crate) fn unmap_chunk(
        &mut self,
        seg: SegmentKey,
        free: FreeChunk,
    ) -> Result<Option<PieceId>, BackendError> {
        track(
            &mut self.stats,
            CallKind::Unmap,
            self.backend.unmap(DevAddr::new(free.at), free.chunk.len),
        )?;
        Ok(self.forget_unmapped_chunk(seg, free))
    }

    /// The bookkeeping of [`unmap_chunk`](Self::unmap_chunk) once the driver unmapped `free`.
    fn forget_unmapped_chunk(&mut self, seg: SegmentKey, free: FreeChunk) -> Option<PieceId> {
        let FreeChunk { at, chunk, piece } = free;
        let front = self.free_to_gap(seg, piece, at, chunk.len);
        let s = self.segments.get_mut(&seg).expect("live segment");
        s.remove_chunk(at);
        s.mapped_bytes -= chunk.len;
        let pool = s.pool;
        self.stats.reserved_bytes.decrease(pool, chunk.len as u64);
        self.stats.num_device_free += 1;
        front
    }

    fn free_segment(&mut self, seg: SegmentKey) -> Result<(), BackendError> {
        let va = self.segments[&seg].reservation();
        track(
            &mut self.stats,
            CallKind::FreeReservation,
            self.backend.free_reservation(va),
        )?;
        if let Some(s) = self.segments.remove(&seg) {
            self.segments_by_slot.remove(&(s.slot, s.seq, seg));
            self.releasable.set(seg, false);
            self.pieces.release_tiling(s.tail);
            self.stats.segment.decrease(s.pool, 1);
        }
        Ok(())
    }

    /// Releases cached handles, largest first, until at most `keep` bytes stay cached.
    pub(crate) fn trim_cache(&mut self, keep: usize) -> Result<(), BackendError> {
        while self.cache.bytes() > keep {
            let Some((h, len)) = self.cache.take_largest() else {
                break;
            };
            if let Err(e) = self.unpark_handle(h) {
                self.cache.put(h, len);
                return Err(e);
            }
            self.release_or_keep(h, len)?;
        }
        Ok(())
    }

    /// Gives back `left`, the rest of a rolled-back growth's new segment, or defers what the
    /// driver refuses (Note [Deferred releases]): unmapped handles go to the handle cache or are
    /// released, as any unmapped handle. Returns whether all of it was given back now.
    pub(crate) fn give_back_or_defer(&mut self, left: Leftover) -> bool {
        let (cache, cached) = (&mut self.cache, self.config.handle_cache);
        // A failed release keeps the handle in the cache (released by a later trim).
        let mut dispose = |b: &B, s: &mut MemoryStats, h, len| {
            let _ = cache.keep_or_release(cached, b, s, h, len);
            Ok(())
        };
        self.deferred
            .give_back_or_keep(&self.backend, &mut self.stats, left, &mut dispose)
    }

    /// Tries again to give back what the driver refused (Note [Deferred releases]).
    pub(crate) fn retry_deferred(&mut self) -> Result<(), BackendError> {
        let (cache, cached) = (&mut self.cache, self.config.handle_cache);
        let mut dispose = |b: &B, s: &mut MemoryStats, h, len| {
            let _ = cache.keep_or_release(cached, b, s, h, len);
            Ok(())
        };
        self.deferred
            .retry_leftovers(&self.backend, &mut self.stats, &mut dispose)
    }
}
