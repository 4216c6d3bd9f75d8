//! The allocator's core: `&mut self` only, no locks (the public type wraps it in a mutex).
//!
//! Blocks are carved best-fit (smallest free range that fits, lowest address on ties) from the free
//! ranges of the request's (stream, pool); when none fits, a segment grows (`growth.rs`).

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use crate::backend::{Access, Backend, CallKind, EventId, PhysHandle, StreamId};
use crate::config::{round_size, ConfigError, ExpandableConfig, ONE_EXA_BYTES, SMALL_SIZE};
use crate::error::{AllocError, BackendError, OomReport};
use crate::expandable::growth::Abandoned;
use crate::expandable::handle_cache::HandleCache;
use crate::expandable::pieces::{Kind, PieceId, Pieces, NIL};
use crate::expandable::recent_frees::RecentFrees;
use crate::expandable::segment::{Chunk, FreeChunk, Segment};
use crate::expandable::size_index::{Entry, Indexes};
use crate::stats::{MemoryStats, PoolKind};
use crate::units::DevAddr;

/// Slots of the table of recent frees that tells a double free from a foreign pointer.
const RECENT_FREES: usize = 4096;

/// A live or pending block, as small as it can be (the live map moves it on every allocate and
/// free): its size is its piece's length, its stream and pool its index's key.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    /// Its piece of the segment's tiling (Note [Pieces]).
    pub(crate) piece: PieceId,
    /// The slot of its (stream, pool)'s best-fit index.
    pub(crate) slot: u32,
    pub(crate) requested: usize,
    /// Other streams that used it (`record_stream`): empty, and unallocated, for most blocks.
    pub(crate) uses: Box<[StreamId]>,
}

#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) addr: u64,
    pub(crate) block: Block,
    pub(crate) events: Vec<(StreamId, EventId)>,
}

/// Counts one backend call of `kind` (and its failure) in the allocator's own call counters.
pub(crate) fn track<T>(
    stats: &mut MemoryStats,
    kind: CallKind,
    result: Result<T, BackendError>,
) -> Result<T, BackendError> {
    stats.calls.count_call(kind);
    if result.is_err() {
        stats.calls.count_failure(kind);
    }
    result
}

pub(crate) struct State<B: Backend> {
    pub(crate) backend: B,
    pub(crate) config: ExpandableConfig,
    pub(crate) granularity: usize,
    pub(crate) device_total: usize,
    /// `per_process_memory_fraction × device_total`: physical bytes we may hold.
    pub(crate) limit: usize,
    pub(crate) access: Vec<Access>,
    /// va start -> segment
    pub(crate) segments: BTreeMap<u64, Segment>,
    /// (stream, pool) -> every free range by (len, start): the best-fit index.
    pub(crate) index: Indexes,
    /// Every segment's pieces (Note [Pieces]).
    pub(crate) pieces: Pieces,
    pub(crate) live: FxHashMap<u64, Block>,
    pub(crate) pending: Vec<Pending>,
    pub(crate) cache: HandleCache,
    pub(crate) stats: MemoryStats,
    recent_frees: RecentFrees,
    /// Streams on which a block was freed since the stream was last synchronized: only their free
    /// pages may still be touched by queued work (Note [Syncs]). A handful of streams at most.
    unsynced_frees: Vec<StreamId>,
    /// Events whose release failed: tried again by the next `process_events` and at teardown,
    /// so a driver hiccup does not leak them.
    pub(crate) unreleased_events: Vec<EventId>,
    /// New segments of rolled-back growths the driver would not fully give back yet
    /// (Note [Abandoned] in `growth.rs`).
    pub(crate) abandoned: Vec<Abandoned>,
}

impl<B: Backend> State<B> {
    pub(crate) fn new(backend: B, config: ExpandableConfig) -> Result<Self, AllocError> {
        config.validate()?;
        let granularity = backend.granularity();
        let info = backend.mem_info()?;
        let mut access = vec![Access::read_write(backend.device())];
        let devices = backend.device_count();
        if let Some(&bad) = config.peers.iter().find(|&&p| p >= devices) {
            return Err(ConfigError {
                message: format!("peer device {bad} does not exist: the backend has {devices}"),
                token: None,
            }
            .into());
        }
        for &peer in &config.peers {
            if peer != backend.device() && !access.iter().any(|a| a.device == peer) {
                access.push(Access::read_write(peer));
            }
        }
        let limit = (info.total as f64 * config.memory_fraction) as usize;
        let mut stats = MemoryStats::default();
        stats.calls.count_call(CallKind::MemInfo);
        Ok(Self {
            backend,
            config,
            granularity,
            device_total: info.total,
            limit,
            access,
            segments: BTreeMap::new(),
            index: Indexes::default(),
            pieces: Pieces::default(),
            live: FxHashMap::default(),
            pending: Vec::new(),
            cache: HandleCache::default(),
            stats,
            recent_frees: RecentFrees::new(RECENT_FREES),
            unsynced_frees: Vec::new(),
            unreleased_events: Vec::new(),
            abandoned: Vec::new(),
        })
    }

    // ---- free ranges ----------------------------------------------------------------------
    //
    // Every free range is a free piece of its segment's tiling (Note [Pieces] in `pieces.rs`)
    // and an entry of its (stream, pool)'s best-fit index, keyed (length, start, piece). These
    // functions are the only ones that change either.

    fn entry(&self, id: PieceId) -> Entry {
        let p = self.pieces.get(id);
        (p.len, p.start, id)
    }

    /// Carves `take` bytes from the front of free piece `id` (indexed in `slot`) into a used
    /// piece, which is returned: what every allocation does.
    fn take_front(&mut self, slot: u32, id: PieceId, take: usize) -> PieceId {
        let old = self.entry(id);
        if take == old.0 {
            self.index.at_mut(slot).remove(old);
            self.pieces.set_kind(id, Kind::Used);
            return id;
        }
        let used = self.pieces.split_front(id, old.1 + take as u64);
        self.pieces.set_kind(used, Kind::Used);
        self.index
            .at_mut(slot)
            .replace(old, (old.0 - take, old.1 + take as u64, id));
        used
    }

    /// Makes piece `id` (a block's, or a gap just mapped) free, merged with the free pieces
    /// around it; returns the merged piece. What every free does: no lookup, the neighbours are
    /// linked (Note [Pieces]).
    pub(crate) fn make_free(&mut self, slot: u32, id: PieceId) -> PieceId {
        self.pieces.set_kind(id, Kind::Free);
        let (mut cur, mut replaced) = (id, None);
        let next = self.pieces.get(id).next;
        if self.pieces.kind(next) == Some(Kind::Free) {
            replaced = Some(self.entry(next));
            cur = self.pieces.merge_into_next(id);
        }
        let prev = self.pieces.get(cur).prev;
        if self.pieces.kind(prev) == Some(Kind::Free) {
            let e = self.entry(prev);
            match replaced {
                None => replaced = Some(e),
                Some(_) => {
                    self.index.at_mut(slot).remove(e);
                }
            }
            cur = self.pieces.merge_into_next(prev);
        }
        let merged = self.entry(cur);
        let ix = self.index.at_mut(slot);
        match replaced {
            Some(old) => ix.replace(old, merged),
            None => ix.insert(merged),
        }
        cur
    }

    /// Maps the tiling of `seg` over `[at, at + len)`, which lies in one gap piece: the range
    /// becomes free (merged with its free neighbours), and the merged free piece is returned.
    pub(crate) fn gap_to_free(&mut self, seg: u64, at: u64, len: usize) -> Option<PieceId> {
        let s = self.segments.get_mut(&seg)?;
        let slot = s.slot;
        let g = s.gap_before(at)?;
        let p = *self.pieces.get(g);
        let end = at + len as u64;
        debug_assert!(p.kind == Kind::Gap && p.start <= at && end <= p.end());
        if p.start < at {
            let front = self.pieces.split_front(g, at);
            s.gaps.insert(p.start, front);
        } else {
            s.gaps.remove(&p.start);
        }
        let mapped = if end < p.end() {
            s.gaps.insert(end, g);
            self.pieces.split_front(g, end)
        } else {
            g
        };
        Some(self.make_free(slot, mapped))
    }

    /// Takes `[at, at + len)` out of free piece `id` of `seg` (unmapped: it becomes a gap,
    /// merged with the gaps around it). The piece keeps what follows the range, under its index;
    /// what precedes it, if anything, becomes a new free piece, returned.
    pub(crate) fn free_to_gap(
        &mut self,
        seg: u64,
        id: PieceId,
        at: u64,
        len: usize,
    ) -> Option<PieceId> {
        let s = self.segments.get_mut(&seg)?;
        let p = *self.pieces.get(id);
        let end = at + len as u64;
        debug_assert!(p.kind == Kind::Free && p.start <= at && end <= p.end());
        let ix = self.index.at_mut(s.slot);
        ix.remove((p.len, p.start, id));
        let mut front = None;
        if p.start < at {
            let f = self.pieces.split_front(id, at);
            ix.insert(((at - p.start) as usize, p.start, f));
            front = Some(f);
        }
        let mut gap = if end < p.end() {
            ix.insert(((p.end() - end) as usize, end, id));
            self.pieces.split_front(id, end)
        } else {
            id
        };
        // The same merge as `make_free`'s, for gaps and the gap map. One helper for both cost
        // the hot allocate + free pair about 8 ns (measured), so each keeps its own.
        self.pieces.set_kind(gap, Kind::Gap);
        let next = self.pieces.get(gap).next;
        if self.pieces.kind(next) == Some(Kind::Gap) {
            s.gaps.remove(&self.pieces.get(next).start);
            gap = self.pieces.merge_into_next(gap);
        }
        let prev = self.pieces.get(gap).prev;
        if self.pieces.kind(prev) == Some(Kind::Gap) {
            s.gaps.remove(&self.pieces.get(prev).start);
            gap = self.pieces.merge_into_next(prev);
        }
        s.gaps.insert(self.pieces.get(gap).start, gap);
        front
    }

    /// The free pieces of `seg` as (start, length, piece), in address order: a walk of its
    /// tiling, no search and no sort.
    pub(crate) fn free_pieces(&self, seg: &Segment) -> Vec<(u64, usize, PieceId)> {
        self.pieces
            .tiling(seg.tail)
            .into_iter()
            .map(|id| (id, self.pieces.get(id)))
            .filter(|(_, p)| p.kind == Kind::Free)
            .map(|(id, p)| (p.start, p.len, id))
            .collect()
    }

    /// Chunks of `seg` lying wholly inside free pieces: their pages hold nothing and can be
    /// unmapped. In address order: unmapping chunks in that order leaves each next one in a piece
    /// of the same index (Note [Pieces]). One walk down the tiling and the chunks together.
    pub(crate) fn free_chunks(&self, seg: &Segment) -> Vec<FreeChunk> {
        let mut out = Vec::new();
        let mut chunks = seg.chunks.iter().rev().peekable();
        let mut id = seg.tail;
        while id != NIL {
            let (cur, p) = (id, *self.pieces.get(id));
            id = p.prev;
            if p.kind != Kind::Free {
                continue;
            }
            while let Some((&at, &chunk)) = chunks.peek() {
                if at < p.start {
                    break;
                }
                if at + chunk.len as u64 <= p.end() {
                    out.push(FreeChunk {
                        at,
                        chunk,
                        piece: cur,
                    });
                }
                chunks.next();
            }
        }
        out.reverse();
        out
    }

    pub(crate) fn segment_of(&self, addr: u64) -> Option<u64> {
        self.segments
            .range(..=addr)
            .next_back()
            .filter(|(_, s)| addr < s.end())
            .map(|(&k, _)| k)
    }

    // ---- allocate -------------------------------------------------------------------------

    pub(crate) fn allocate(
        &mut self,
        size: usize,
        stream: StreamId,
    ) -> Result<crate::Allocation, AllocError> {
        if size == 0 {
            return Err(AllocError::InvalidSize { size });
        }
        if size > ONE_EXA_BYTES {
            return Err(AllocError::TooLarge { size });
        }
        let rounded = round_size(size, &self.config.roundup_power2_divisions)
            .ok_or(AllocError::TooLarge { size })?;
        let pool = if rounded <= SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        // Without sync only queries run, and a failing query just leaves its block pending.
        let _ = self.process_events(false);
        let (slot, free) = match self.find_free(stream, pool, rounded) {
            Some(found) => found,
            None => {
                let grown = self.grow_or_oom(stream, pool, rounded);
                self.trim_to_bound();
                grown?
            }
        };
        let at = self.pieces.get(free).start;
        debug_assert!(
            self.pieces.get(free).len >= rounded,
            "growth returns a free range that fits"
        );
        let piece = self.take_front(slot, free, rounded);
        self.live.insert(
            at,
            Block {
                piece,
                slot,
                requested: size,
                uses: Box::default(),
            },
        );
        self.recent_frees.forget(at);
        let (r, s) = (rounded as u64, &mut self.stats);
        s.allocation.increase(pool, 1);
        s.allocated_bytes.increase(pool, r);
        s.active.increase(pool, 1);
        s.active_bytes.increase(pool, r);
        s.requested_bytes.increase(pool, size as u64);
        Ok(crate::Allocation {
            ptr: DevAddr::new(at),
            size: rounded,
            requested: size,
            stream,
        })
    }

    /// Best fit: the smallest free range of (stream, pool) that holds `rounded`, lowest address
    /// on ties. With `faithful_oversize`, PyTorch's `max_split_size` rules apply.
    /// Returns the index's slot and the range's piece.
    fn find_free(
        &self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
    ) -> Option<(u32, PieceId)> {
        let slot = self.index.find((stream, pool))?;
        let (len, _, id) = self.index.at(slot).best_fit(rounded)?;
        if self.config.faithful_oversize {
            if let Some(max_split) = self.config.max_split_size {
                if rounded < max_split && len >= max_split {
                    return None;
                }
                if rounded >= max_split
                    && len >= rounded.saturating_add(self.config.max_non_split_rounding)
                {
                    return None;
                }
            }
        }
        Some((slot, id))
    }

    /// Grows a segment so that a free piece holds `rounded`, retrying once after giving every
    /// free page back; returns the index slot and the piece.
    fn grow_or_oom(
        &mut self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
    ) -> Result<(u32, PieceId), AllocError> {
        match self.grow(stream, pool, rounded) {
            Ok(at) => return Ok(at),
            Err(GrowFail::Backend(e)) => return Err(e.into()),
            Err(GrowFail::OutOfMemory) => {}
        }
        // Last resort, as PyTorch: wait for every pending free, give every free page back, retry.
        self.stats.num_alloc_retries += 1;
        self.release_cached(false)?;
        if let Some(found) = self.find_free(stream, pool, rounded) {
            return Ok(found);
        }
        match self.grow(stream, pool, rounded) {
            Ok(at) => Ok(at),
            Err(GrowFail::Backend(e)) => Err(e.into()),
            Err(GrowFail::OutOfMemory) => {
                self.stats.num_ooms += 1;
                Err(self.oom_report(rounded))
            }
        }
    }

    fn oom_report(&mut self, tried: usize) -> AllocError {
        let free = track(&mut self.stats, CallKind::MemInfo, self.backend.mem_info())
            .map(|i| i.free as u64)
            .unwrap_or(0);
        let allocated = self.stats.allocated_bytes.all.current;
        let held = self.stats.reserved_bytes.all.current + self.cache.bytes() as u64;
        AllocError::OutOfMemory(Box::new(OomReport {
            device: self.backend.device(),
            tried: tried as u64,
            total: self.device_total as u64,
            free,
            allowed: (self.config.memory_fraction < 1.0).then_some(self.limit as u64),
            allocated,
            reserved_unallocated: held.saturating_sub(allocated),
        }))
    }

    // ---- free -----------------------------------------------------------------------------

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
        let mut events = Vec::new();
        for &s in &block.uses {
            match track(
                &mut self.stats,
                CallKind::RecordEvent,
                self.backend.record_event(s),
            ) {
                Ok(e) => events.push((s, e)),
                Err(err) => {
                    for (_, e) in events {
                        self.release_event(e);
                    }
                    self.live.insert(addr, block);
                    return Err(err.into());
                }
            }
        }
        let (pool, size) = (self.index.key(block.slot).1, self.size_of(&block));
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size as u64);
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
        let (stream, pool) = self.index.key(block.slot);
        if !self.unsynced_frees.contains(&stream) {
            self.unsynced_frees.push(stream);
        }
        let size = self.size_of(block);
        self.make_free(block.slot, block.piece);
        let s = &mut self.stats;
        s.active.decrease(pool, 1);
        s.active_bytes.decrease(pool, size as u64);
        s.requested_bytes.decrease(pool, block.requested as u64);
    }

    /// Waits for `stream`'s queued work before its free pages are unmapped (Note [Syncs]).
    ///
    /// Note [Syncs]: unmapping does not wait for the GPU, so a page freed on a stream whose
    /// kernels may still run must not be unmapped before the stream is synchronized; PyTorch
    /// synchronizes before every unmap. Work queued after a block was freed cannot legally touch
    /// it, so once a stream was synchronized after its latest free, every page free on it is
    /// quiet: with `sync_only_after_frees` we skip the call then. Under memory pressure that
    /// turns one synchronization per harvested page into one per stream per burst of frees.
    pub(crate) fn sync_before_unmap(&mut self, stream: StreamId) -> Result<(), BackendError> {
        if self.config.sync_only_after_frees && !self.unsynced_frees.contains(&stream) {
            return Ok(());
        }
        track(
            &mut self.stats,
            CallKind::Synchronize,
            self.backend.synchronize(stream),
        )?;
        self.unsynced_frees.retain(|&s| s != stream);
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
        if stream != self.index.key(block.slot).0 && !block.uses.contains(&stream) {
            let mut uses = std::mem::take(&mut block.uses).into_vec();
            uses.push(stream);
            block.uses = uses.into_boxed_slice();
        }
        Ok(())
    }

    /// Frees the pending blocks whose events have all completed; with `sync`, first waits for
    /// every stream they wait on. Returns the first backend error met while syncing.
    pub(crate) fn process_events(&mut self, sync: bool) -> Result<(), BackendError> {
        if !self.unreleased_events.is_empty() {
            for e in std::mem::take(&mut self.unreleased_events) {
                self.release_event(e);
            }
        }
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
                track(
                    &mut self.stats,
                    CallKind::Synchronize,
                    self.backend.synchronize(s),
                )?;
                self.unsynced_frees.retain(|&u| u != s);
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

    /// Releases an event no pending block waits for any more; one whose release fails is kept
    /// and tried again later (`unreleased_events`).
    fn release_event(&mut self, e: EventId) {
        let released = self.backend.release_event(e);
        if track(&mut self.stats, CallKind::ReleaseEvent, released).is_err() {
            self.unreleased_events.push(e);
        }
    }

    // ---- empty_cache ----------------------------------------------------------------------

    pub(crate) fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.release_cached(true)
    }

    /// PyTorch's `release_cached_blocks`: waits for pending frees, unmaps every fully-free page of
    /// every segment, frees segments left with no page, and (with `trim`) releases cached handles
    /// beyond the cache limit.
    pub(crate) fn release_cached(&mut self, trim: bool) -> Result<(), AllocError> {
        self.process_events(true)?;
        for a in std::mem::take(&mut self.abandoned) {
            if let Err(left) = self.give_back_abandoned(a) {
                self.abandoned.push(left);
            }
        }
        let keys: Vec<u64> = self.segments.keys().copied().collect();
        for seg in keys {
            self.unmap_stuck(seg)?;
            let chunks = self.free_chunks(&self.segments[&seg]);
            if !chunks.is_empty() {
                self.sync_before_unmap(self.segments[&seg].stream)?;
            }
            for c in chunks {
                self.unmap_chunk(seg, c)?;
                self.unmapped_handle(c.chunk)?;
            }
            let s = &self.segments[&seg];
            if s.chunks.is_empty() && s.stuck.is_empty() {
                self.free_segment(seg)?;
            }
        }
        if trim {
            self.trim_cache(self.cache_bound())?;
        }
        Ok(())
    }

    /// Keeps the handle of an unmapped chunk in the cache, or releases it without the cache.
    pub(crate) fn unmapped_handle(&mut self, chunk: Chunk) -> Result<(), BackendError> {
        if self.config.handle_cache {
            self.cache.put(chunk.handle, chunk.len);
            return Ok(());
        }
        self.release_or_keep(chunk.handle, chunk.len)
    }

    /// Releases a handle the allocator no longer needs. One whose release fails goes to the
    /// cache, whatever the config, so it is never lost: the next trim (`trim_to_bound` keeps
    /// none without the cache) releases it again.
    pub(crate) fn release_or_keep(
        &mut self,
        h: PhysHandle,
        len: usize,
    ) -> Result<(), BackendError> {
        let released = self.backend.release(h);
        let result = track(&mut self.stats, CallKind::Release, released);
        if result.is_err() {
            self.cache.put(h, len);
        }
        result
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
    fn unmap_stuck(&mut self, seg: u64) -> Result<(), BackendError> {
        while let Some((&at, &chunk)) = self.segments[&seg].stuck.first_key_value() {
            let unmapped = self.backend.unmap(DevAddr::new(at), chunk.len);
            track(&mut self.stats, CallKind::Unmap, unmapped)?;
            if let Some(s) = self.segments.get_mut(&seg) {
                s.remove_stuck(at);
            }
            self.unmapped_handle(chunk)?;
        }
        Ok(())
    }

    /// Releases cached handles beyond the bound (`handle_cache_limit`, 0 without the cache).
    /// The OOM retry and remap put handles in the cache in the middle of an allocation; this
    /// runs at its end, so the bound holds between calls. A failed release leaves the handle
    /// cached (consistent; tried again next time): the allocation's result stands.
    fn trim_to_bound(&mut self) {
        let _ = self.trim_cache(self.cache_bound());
    }

    /// Unmaps one free chunk and takes it out of the free ranges; the handle is the caller's.
    /// Returns the new free piece before the chunk, if its piece was split (`free_to_gap`).
    pub(crate) fn unmap_chunk(
        &mut self,
        seg: u64,
        free: FreeChunk,
    ) -> Result<Option<PieceId>, BackendError> {
        let FreeChunk { at, chunk, piece } = free;
        track(
            &mut self.stats,
            CallKind::Unmap,
            self.backend.unmap(DevAddr::new(at), chunk.len),
        )?;
        let front = self.free_to_gap(seg, piece, at, chunk.len);
        let s = self.segments.get_mut(&seg).expect("live segment");
        s.remove_chunk(at);
        s.mapped_bytes -= chunk.len;
        let pool = s.pool;
        self.stats.reserved_bytes.decrease(pool, chunk.len as u64);
        self.stats.num_device_free += 1;
        Ok(front)
    }

    fn free_segment(&mut self, seg: u64) -> Result<(), BackendError> {
        let va = self.segments[&seg].va;
        track(
            &mut self.stats,
            CallKind::FreeReservation,
            self.backend.free_reservation(va),
        )?;
        if let Some(s) = self.segments.remove(&seg) {
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
            self.release_or_keep(h, len)?;
        }
        Ok(())
    }

    /// The statistics, with the handle cache's figures read from the cache itself and the stuck
    /// chunks' from the segments: derived, not kept in step, so no error path can leave them
    /// stale.
    pub(crate) fn stats_now(&self) -> MemoryStats {
        let mut stats = self.stats;
        stats.handles_cached = self.cache.count() as u64;
        stats.handle_cache_bytes = self.cache.bytes() as u64;
        let stuck = self.segments.values().flat_map(|s| s.stuck.values());
        let abandoned = self
            .abandoned
            .iter()
            .flat_map(|a| a.stuck.iter().map(|(_, c)| c));
        stats.stuck_bytes = stuck.chain(abandoned).map(|c| c.len as u64).sum();
        stats
    }
}

/// Why a growth failed.
pub(crate) enum GrowFail {
    /// No physical memory (or address space) could be found: try harder, or report OOM.
    OutOfMemory,
    /// The backend failed for another reason: report it.
    Backend(BackendError),
}

impl From<BackendError> for GrowFail {
    fn from(e: BackendError) -> Self {
        if e.is_out_of_memory() {
            GrowFail::OutOfMemory
        } else {
            GrowFail::Backend(e)
        }
    }
}
