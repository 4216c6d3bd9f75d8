//! `allocate`: the block freed just before if the request is its exact fit (Note [Last free] in
//! `last_free.rs`), else best fit from the free ranges of the request's (stream, pool), else growth, else
//! PyTorch's last resort (give every free page back and retry), else the OOM report.

use crate::backend::{Backend, StreamId};
use crate::error::AllocError;
use crate::expandable::growth::GrowFail;
use crate::expandable::pieces::{Kind, PieceId};
use crate::expandable::put_back::Unmapped;
use crate::expandable::size_index::{FreeRange, StreamPool};
use crate::expandable::state::{Block, State};
use crate::mechanism::oom::oom_report;
use crate::mechanism::request::{never_fits, Request};
use crate::mechanism::stream_uses::StreamUses;
use crate::stats::PoolKind;
use crate::units::DevAddr;

impl<B: Backend> State<B> {
    pub(crate) fn allocate(
        &mut self,
        size: usize,
        stream: StreamId,
    ) -> Result<crate::Allocation, AllocError> {
        let Request {
            size,
            rounded,
            pool,
        } = Request::new(size, &self.config.roundup_power2_divisions)?;
        if never_fits(rounded, self.limit) {
            self.stats.num_ooms += 1;
            return Err(self.oom_report(rounded, false));
        }
        // Without sync only queries run, and a failing query just leaves its block pending.
        let _ = self.process_events(false);
        // The pool whose memory holds the block: a borrowed one's is the large pool's.
        // Note [Last free]: the block freed just before, if this request is its exact fit.
        let own = self.index.find(StreamPool { stream, pool });
        let last = self.take_last_free(own, rounded);
        let fit = match (own, last) {
            (Some(slot), Some(piece)) => Some((slot, piece)),
            _ => self.find_free(own, rounded),
        };
        let (slot, free, held_by) = match fit {
            Some((slot, free)) => (slot, free, pool),
            None => match self.borrow_free(stream, pool, rounded) {
                Some((slot, free)) => (slot, free, PoolKind::Large),
                None => return self.allocate_by_growth((size, rounded), pool, stream),
            },
        };
        let at = self.pieces.get(free).start;
        debug_assert!(
            self.pieces.get(free).len >= rounded,
            "growth returns a free range that fits"
        );
        let piece = self.take_front(slot, free, rounded);
        Ok(self.record_block(slot, piece, (at, rounded, size), held_by, stream))
    }

    /// `allocate` where no free range holds the request: growth, the last resort, the rescue.
    /// Out of line: the slow path kept apart from the cached pair's.
    #[inline(never)]
    fn allocate_by_growth(
        &mut self,
        (size, rounded): (usize, usize),
        pool: PoolKind,
        stream: StreamId,
    ) -> Result<crate::Allocation, AllocError> {
        let mut unmapped = Vec::new();
        let grown = self.grow_or_oom(stream, pool, rounded, &mut unmapped);
        let served = grown.map(|(slot, free)| {
            if self.pieces.kind(free) == Some(Kind::Used) {
                // A rescued block, already carved (Note [Alias rescue]).
                let p = self.pieces.get(free);
                let (at, len) = (p.start, p.len);
                return self.record_block(slot, free, (at, len, size), pool, stream);
            }
            let at = self.pieces.get(free).start;
            let piece = self.take_front(slot, free, rounded);
            self.record_block(slot, piece, (at, rounded, size), pool, stream)
        });
        // Note [Pages put back]: once the block is carved, so that no free piece the retry
        // returned is merged away under it.
        if served.is_ok() {
            self.put_back(&unmapped, stream);
            self.keep_after_retry(&unmapped, stream);
        }
        self.trim_to_bound();
        served
    }

    /// Records the block `[at, at + rounded)` of used piece `piece` as live for a request of
    /// `size` on `stream`, counted in pool `held_by`, and returns the allocation.
    #[inline(always)]
    fn record_block(
        &mut self,
        slot: u32,
        piece: PieceId,
        (at, rounded, size): (u64, usize, usize),
        held_by: PoolKind,
        stream: StreamId,
    ) -> crate::Allocation {
        self.live.insert(
            at,
            Block {
                piece,
                slot,
                requested: size,
                uses: StreamUses::default(),
            },
        );
        self.recent_frees.forget(at);
        // A borrowed block (Note [Borrowing]) counts in the pool whose memory holds it.
        self.stats.count_allocated(held_by, rounded, size);
        crate::Allocation {
            ptr: DevAddr::new(at),
            size: rounded,
            requested: size,
            stream,
            owner: self.owner,
        }
    }

    /// Records block `[at, at + rounded)` for a request of `requested`, carved out of free piece
    /// `free` of index slot `slot` (the block counts in `pool`): an allocation a front arena
    /// made without the lock, told to the core when the arena is settled (Note [Front arena] in
    /// `front/arena.rs`). Returns the free piece after the block, if the range goes on past it.
    pub(crate) fn allocate_at(
        &mut self,
        slot: u32,
        free: PieceId,
        at: u64,
        (rounded, requested): (usize, usize),
        pool: PoolKind,
    ) -> Option<PieceId> {
        let end = self.pieces.get(free).end();
        let piece = self.take_at(slot, free, at, rounded);
        self.live.insert(
            at,
            Block {
                piece,
                slot,
                requested,
                uses: StreamUses::default(),
            },
        );
        self.recent_frees.forget(at);
        self.stats.count_allocated(pool, rounded, requested);
        (at + (rounded as u64) < end).then_some(free)
    }

    /// Whether `allocate` would serve a request of `rounded` bytes of `pool` on `stream` from a
    /// free range of the stream's own segment: no growth, no borrowing (the front cache's slow
    /// allocation then leaves its stash alone: Note [Front cache]). A check before `allocate`
    /// rather than a no-growth variant of it: splitting `allocate` into pieces both could share
    /// cost the default hot path 30 instructions a cached pair (callgrind, 1,456 → 1,486 M per
    /// million pairs: the compiler stopped inlining `take_front`), where this costs the front
    /// cache's slow path one more best-fit lookup.
    pub(crate) fn fits_free(&self, stream: StreamId, pool: PoolKind, rounded: usize) -> bool {
        self.find_free(self.index.find(StreamPool { stream, pool }), rounded)
            .is_some()
    }

    /// Whether live block `addr` has a free range beside it: freed, it would merge with it (the
    /// front cache gives such a stashed block back: Note [Stash age]).
    pub(crate) fn borders_free(&self, addr: u64) -> bool {
        let Some(b) = self.live.get(&addr) else {
            return false;
        };
        let piece = self.pieces.get(b.piece);
        [piece.prev, piece.next]
            .into_iter()
            .any(|p| self.pieces.kind(p) == Some(Kind::Free))
    }

    /// Best fit: the smallest free range of a (stream, pool) that holds `rounded`, lowest address
    /// on ties. With `faithful_oversize`, PyTorch's `max_split_size` rules apply.
    /// `slot`: the (stream, pool)'s index slot, if it has one. Returns the slot and the range's
    /// piece.
    fn find_free(&self, slot: Option<u32>, rounded: usize) -> Option<(u32, PieceId)> {
        let slot = slot?;
        let FreeRange { len, piece: id, .. } = self.index.at(slot).best_fit(rounded)?;
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

    /// Note [Borrowing]: a small request that finds no free range in its own pool, when a new
    /// small page would reach into the headroom (Note [Headroom] in `growth.rs`), takes the best
    /// fit of the large pool's free ranges on its stream instead. The large pool's free ranges
    /// are where a segment of 20 MiB pages wastes memory: free bytes of chunks that also hold
    /// live blocks, which no remap can take. On `bert-validate` at 2324 MiB the 1 MiB request
    /// that ran out found 27.6 MiB free in 5 ranges (the largest 14.8 MiB), all but 1.6 MiB in
    /// the large pool. The block is the large pool's: its statistics count there (as its memory
    /// does) and it goes back to the large pool's ranges when freed. No driver call, no
    /// synchronization.
    fn borrow_free(
        &self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
    ) -> Option<(u32, PieceId)> {
        let pressured = || self.pressured(0, self.page_for(pool));
        if !self.config.borrow_across_pools || pool != PoolKind::Small || !pressured() {
            return None;
        }
        let large = self.index.find(StreamPool {
            stream,
            pool: PoolKind::Large,
        });
        self.find_free(large, rounded)
    }

    /// Grows a segment so that a free piece holds `rounded`, retrying once after giving every
    /// free page back; returns the index slot and the piece. `unmapped` receives the pages the
    /// last resort unmapped, with `put_back_after_retry` (Note [Pages put back]).
    fn grow_or_oom(
        &mut self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
        unmapped: &mut Vec<Unmapped>,
    ) -> Result<(u32, PieceId), AllocError> {
        if !self.dead_rescues.is_empty() {
            // Note [Rescue revived]: a freed rescue of this very request serves it again.
            if let Some(found) = self.revive_rescue(StreamPool { stream, pool }, rounded) {
                return Ok(found);
            }
            // Freed rescues give their ends back before anything grows (Note [Alias rescue]);
            // one the driver refuses waits for the next try. Parked ones (Note [Parked rescue])
            // are torn down only if the request still needs to grow.
            let put_back = self.config.put_back_after_retry;
            let parked = self.retire_dead_rescues(put_back);
            let slot = self.index.find(StreamPool { stream, pool });
            if let Some(found) = self.find_free(slot, rounded) {
                return Ok(found);
            }
            if parked {
                // The synchronization may complete pending frees: look again.
                let _ = self.retry_dead_rescues(put_back);
                let slot = self.index.find(StreamPool { stream, pool });
                if let Some(found) = self.find_free(slot, rounded) {
                    return Ok(found);
                }
            }
        }
        match self.grow(stream, pool, rounded) {
            Ok(at) => return Ok(at),
            Err(GrowFail::Backend(e)) => return Err(e.into()),
            Err(GrowFail::OutOfMemory | GrowFail::OutOfAddresses) => {}
        }
        // Last resort, as PyTorch: wait for every pending free, give every free page back, retry.
        self.stats.num_alloc_retries += 1;
        let record = self.config.put_back_after_retry.then_some(&mut *unmapped);
        self.release_cached(false, record)?;
        self.order_cached(unmapped, stream);
        let slot = self.index.find(StreamPool { stream, pool });
        if let Some(found) = self.find_free(slot, rounded) {
            return Ok(found);
        }
        match self.grow(stream, pool, rounded) {
            Ok(at) => Ok(at),
            Err(GrowFail::Backend(e)) => Err(e.into()),
            Err(fail) => {
                // Note [Alias rescue]: the free ends of two partly used pages, mapped again.
                // Paused by an OOM raised since the last `empty_cache`: rescues at a full
                // device's edge pin pages and beget rescues.
                let armed = !self.rescue_paused || self.config.rescue_after_oom;
                if self.config.alias_rescue && armed && matches!(fail, GrowFail::OutOfMemory) {
                    if let Some(found) = self.try_rescue(stream, pool, rounded) {
                        self.keep_rescue_homes(found.1, unmapped);
                        return Ok(found);
                    }
                }
                self.rescue_paused = true;
                self.stats.num_ooms += 1;
                Err(self.oom_report(rounded, matches!(fail, GrowFail::OutOfAddresses)))
            }
        }
    }

    fn oom_report(&mut self, tried: usize, address_space_exhausted: bool) -> AllocError {
        // A program that catches the OOM expects every free byte given back (Note [Kept pages]).
        self.release_kept();
        let held = self.stats.reserved_bytes.all.current + self.cache.bytes() as u64;
        let allowed = (self.config.memory_fraction < 1.0).then_some(self.limit);
        oom_report(
            &self.backend,
            &mut self.stats,
            tried,
            self.device_total,
            allowed,
            held,
            address_space_exhausted,
        )
    }
}
