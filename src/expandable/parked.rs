//! Parked pages: remapping a free page of the growing stream without synchronizing it.
//!
//! Note [Parked pages]: a growth under pressure takes fully-free pages it already holds
//! (Note [Remap] in `growth.rs`). Unmapping one must wait for the work queued on its stream
//! (Note [Syncs] in `free.rs`): kernels queued before its block was freed may still touch it.
//! But the handle does not need to be unmapped to be mapped again: a CUDA handle may be mapped
//! at several addresses at once (so may a memfd range, and the Sim ledger counts mappings per
//! handle). When the page belongs to a segment of the growing stream, the growth maps its handle
//! where it is needed and leaves the old mapping *parked*: still mapped, out of the free ranges
//! and never handed out, occupying its addresses (growth does not map over it), its bytes no
//! longer reserved (the handle is counted once, where it was remapped). That is as safe as
//! reusing the free block in place: work that can touch the new addresses is queued on the same
//! stream after the free, so it runs after every kernel that may still use the old ones.
//! Pages of other streams still wait for a synchronization (their queued work is not ordered
//! with the growing stream's). Pages are parked only where the device has no memory left for
//! the growth (`create` failed), not in the headroom: parked addresses cannot be mapped over
//! until they are unmapped, and parking in the headroom too left the churn bench's full 16 GiB
//! device with 9 % more failed requests (max 64 MiB, 100,000 operations: 1,839 against 1,690;
//! max 256 MiB: 1,469 against 1,296) for no capacity gain on the shared traces.
//!
//! A parked mapping is unmapped, with no synchronization of its own, when its stream is next
//! synchronized for another reason (a remap of another stream's page, pending events,
//! `empty_cache`); by `empty_cache` (which synchronizes a stream only to unmap its parked pages
//! if nothing else did); before its handle is released (the memory would stay allocated while
//! any mapping remains); and at teardown. Adjacent parked pages go in one unmap call.
//! A handle is parked at most once: a page whose handle is already parked elsewhere is
//! remapped the ordinary way.

use crate::backend::{Backend, CallKind, PhysHandle, StreamId};
use crate::error::BackendError;
use crate::expandable::pieces::PieceId;
use crate::expandable::segment::{Chunk, FreeChunk, SegmentKey};
use crate::expandable::state::State;
use crate::mechanism::counters::track;
use crate::units::DevAddr;

impl<B: Backend> State<B> {
    /// Whether remapping `free`, a fully-free chunk of a segment of `seg_stream`, for a growth on
    /// `stream` may park its old mapping instead of synchronizing (Note [Parked pages]).
    pub(crate) fn may_park(
        &self,
        seg_stream: StreamId,
        stream: StreamId,
        free: &FreeChunk,
    ) -> bool {
        self.config.park_remaps
            && seg_stream == stream
            && !self.parked_handles.contains_key(&free.chunk.handle)
    }

    /// Takes `free` out of the free ranges without unmapping it: its handle is the caller's, its
    /// old mapping stays parked. Returns the new free piece before the chunk, if its piece was
    /// split (as `unmap_chunk`).
    pub(crate) fn park_chunk(&mut self, seg: SegmentKey, free: FreeChunk) -> Option<PieceId> {
        let FreeChunk { at, chunk, piece } = free;
        let front = self.free_to_gap(seg, piece, at, chunk.len);
        let s = self.segments.get_mut(&seg).expect("live segment");
        s.remove_chunk(at);
        s.add_parked(at, chunk);
        s.mapped_bytes -= chunk.len;
        let pool = s.pool;
        self.releasable.touch(s.slot);
        self.stats.reserved_bytes.decrease(pool, chunk.len as u64);
        self.parked_handles.insert(chunk.handle, (seg, at));
        front
    }

    /// Unmaps every parked page of `stream`'s segments: called once the stream is synchronized,
    /// when nothing queued can touch them. A page the driver will not unmap stays parked (tried
    /// again later); the first error is returned.
    pub(crate) fn unpark_stream(&mut self, stream: StreamId) -> Result<(), BackendError> {
        if self.parked_handles.is_empty() {
            return Ok(());
        }
        let mut segs: Vec<SegmentKey> = self
            .parked_handles
            .values()
            .map(|&(seg, _)| seg)
            .filter(|seg| self.segments[seg].stream == stream)
            .collect();
        segs.sort_unstable();
        segs.dedup();
        let mut result = Ok(());
        for seg in segs {
            let r = self.unpark_segment(seg);
            result = result.and(r);
        }
        result
    }

    /// Unmaps the parked pages of `seg`, each run of adjacent ones with one call (each page alone
    /// if that fails). The caller knows the segment's stream is quiet.
    pub(crate) fn unpark_segment(&mut self, seg: SegmentKey) -> Result<(), BackendError> {
        let runs = adjacent_runs(self.segments[&seg].parked.iter());
        self.unpark_runs(seg, runs, true)
    }

    /// Unmaps the pages the growth just ended harvested and parked (Note [Harvest unmap runs]
    /// in `growth.rs`): per segment, each run of adjacent ones still parked with one call. Their
    /// streams are quiet (each was synchronized, or needed no synchronization, when its page was
    /// taken, and nothing was freed since). A page the driver refuses stays parked, unmapped at
    /// its stream's next synchronization: the growth's result stands either way.
    pub(crate) fn unmap_harvested(&mut self) {
        if self.harvest_unmaps.is_empty() {
            return;
        }
        let mut pages = std::mem::take(&mut self.harvest_unmaps);
        pages.sort_unstable();
        for group in pages.chunk_by(|a, b| a.0 == b.0) {
            let seg = group[0].0;
            // A synchronization of its stream during the growth may have unmapped some already.
            let runs = match self.segments.get(&seg) {
                Some(s) => adjacent_runs(
                    group
                        .iter()
                        .filter_map(|(_, at)| s.parked.get_key_value(at)),
                ),
                None => continue,
            };
            if !runs.is_empty() {
                let _ = self.unpark_runs(seg, runs, false);
            }
        }
        pages.clear();
        self.harvest_unmaps = pages;
    }

    /// Unmaps `runs` (ranges of adjacent parked pages of `seg`, in address order), each with one
    /// call, each page alone if that fails; `every` = the runs cover every parked page of `seg`.
    fn unpark_runs(
        &mut self,
        seg: SegmentKey,
        runs: Vec<(u64, u64)>,
        every: bool,
    ) -> Result<(), BackendError> {
        let mut result = Ok(());
        // What was unmapped, forgotten once every call is made: the whole map at once when
        // every run went (the usual case; a removal per page was a third of a synchronization's
        // cost on the churn bench's full device), else range by range.
        let mut unmapped: Vec<(u64, u64)> = Vec::new();
        let mut all = true;
        for (start, end) in runs {
            let whole = self
                .backend
                .unmap(DevAddr::new(start), (end - start) as usize);
            if track(&mut self.stats, CallKind::Unmap, whole).is_ok() {
                unmapped.push((start, end));
                continue;
            }
            all = false;
            let pages: Vec<(u64, usize)> = self.segments[&seg]
                .parked
                .range(start..end)
                .map(|(&at, c)| (at, c.len))
                .collect();
            for (at, len) in pages {
                let one = self.backend.unmap(DevAddr::new(at), len);
                match track(&mut self.stats, CallKind::Unmap, one) {
                    Ok(()) => unmapped.push((at, at + len as u64)),
                    Err(e) => result = result.and(Err(e)),
                }
            }
        }
        if every && all && !unmapped.is_empty() {
            self.forget_all_parked(seg);
        } else {
            for (start, end) in unmapped {
                self.forget_parked(seg, start, end);
            }
        }
        result
    }

    /// Every parked page of `seg` is unmapped: forget them all.
    fn forget_all_parked(&mut self, seg: SegmentKey) {
        let s = self.segments.get_mut(&seg).expect("live segment");
        for c in s.take_parked().into_values() {
            self.parked_handles.remove(&c.handle);
            self.stats.num_device_free += 1;
        }
        self.releasable.touch(s.slot);
    }

    /// The parked pages of `seg` in `[start, end)` are unmapped: forget them.
    fn forget_parked(&mut self, seg: SegmentKey, start: u64, end: u64) {
        let s = self.segments.get_mut(&seg).expect("live segment");
        let ats: Vec<u64> = s.parked.range(start..end).map(|(&at, _)| at).collect();
        for at in ats {
            if let Some(c) = s.remove_parked(at) {
                self.parked_handles.remove(&c.handle);
                self.stats.num_device_free += 1;
            }
        }
        self.releasable.touch(s.slot);
    }

    /// Unmaps the parked mapping of `handle`, if any, before the handle is released (its memory
    /// would otherwise stay allocated), synchronizing its stream if work queued on it may still
    /// touch the page.
    pub(crate) fn unpark_handle(&mut self, handle: PhysHandle) -> Result<(), BackendError> {
        let Some(&(seg, _)) = self.parked_handles.get(&handle) else {
            return Ok(());
        };
        let stream = self.segments[&seg].stream;
        // Synchronizing unparks every page of the stream (`synchronize`).
        self.sync_before_unmap(stream)?;
        if self.parked_handles.contains_key(&handle) {
            self.unpark_segment(seg)?;
        }
        Ok(())
    }
}

/// The runs of adjacent pages among `pages` (address and chunk, in address order), each as
/// (start, end): one unmap call each.
fn adjacent_runs<'a>(pages: impl Iterator<Item = (&'a u64, &'a Chunk)>) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (&at, c) in pages {
        let end = at + c.len as u64;
        match runs.last_mut() {
            Some(run) if run.1 == at => run.1 = end,
            _ => runs.push((at, end)),
        }
    }
    runs
}
