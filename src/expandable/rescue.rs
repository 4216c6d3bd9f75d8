//! Note [Alias rescue]: where PyTorch's last resort (wait for every pending free, give every
//! free page back, grow again) still cannot serve a request, the free ends of partly used pages
//! often could, if they were contiguous. A handle is mapped whole, but it may be mapped at
//! several addresses at once (`cuMemMap` of one handle twice: the driver allows it, and the
//! alias costs its physical memory once; `../shared/reference/cudarc-and-vmm.md`). So the free
//! tail of a page whose front holds a live block, mapped again at the start of a new
//! reservation, is contiguous with new memory mapped after it and with the free head of another
//! partly used page mapped after that:
//!
//! ```text
//!  home A:  ├─ live ─┬─ free tail t ─┤        home B:  ├─ free head h ─┬─ live ─┤
//!  rescue:  ├ (A's live: never used) ┬─ t ─┬── new ──┬─ h ─┬ (B's live: never used) ┤
//!                                    └────── the block ────┘
//! ```
//!
//! The block is `[t][new][h]`; the aliased bytes that hold other blocks are never handed out;
//! `t` and `h` are lent: carved out of their homes' free ranges (used pieces that belong to no
//! block) until the block is freed. The freed rescue then waits, dead, until the next allocation
//! that would grow, `empty_cache` or the last resort synchronizes its stream, unmaps the
//! reservation and gives its handles back (to the handle cache), and `t` and `h` are free at
//! home again. It runs only where the request would otherwise fail with an OOM, so no run that
//! fits without it changes (a run at a capacity where the defaults succeed never reaches it); a
//! rescue costs a reservation, a map per alias and per handle of its new bytes (Note [Rescue
//! from the cache]), at most one create and an access call, and a synchronization of each home
//! stream other than the request's with frees since its last one (lent bytes must be quiet,
//! Note [Syncs]; on the request's own stream they are, as for any reuse of a free range) and of
//! the block's stream before its reservation is unmapped. Only large-pool requests, from
//! large-pool pages (the snapshot shows the lent bytes in the rescue's segment, so both must be
//! of one pool).
//!
//! Paused after an OOM: an OOM the rescue could not prevent (one raised to the caller) pauses
//! it until the next `empty_cache` (`rescue_after_oom` keeps it on). Its worth is the OOM it
//! prevents, which usually ends a run; a program that catches OOMs and goes on at a full
//! device's edge gets little from it there and pays for it: a rescued block pins the two pages
//! whose ends it borrows, the requests after it find less whole-page memory and reach the last
//! resort more often, and rescues beget rescues (the 64 MiB churn on a 16 GiB device: about 60
//! rescues live at a time, 4 × the last resorts, 7 × the time, for 25 % fewer failures; at 256
//! MiB more failures than without it). `empty_cache`, what such programs call after catching
//! one before trying again, re-arms it. A run with no OOM is the same run either way.
//!
//! Note [Rescue revived]: a program that needed a rescue once needs it again on its next step,
//! for the same request, and the freed rescue is still there: its reservation mapped, its ends
//! lent, its block the request's size. So the next allocation that would grow first looks for a
//! freed rescue whose block is exactly the request's length and whose stream is the request's
//! (its queued work then runs before the new block's, as for any free range of a stream), and
//! serves the request from it: no call, no synchronization, where tearing it down and rescuing
//! anew costs a synchronization, an unmap, a release and a freed reservation, then a
//! reservation, a create, up to three maps and an access. It holds no byte more than the new
//! rescue would (the block is the request's length; the aliases cost nothing), and it exists
//! only where a rescue already ran, so a run that fits without the rescue is unchanged.
//!
//! Note [Rescue from the cache]: a rescue runs right after the last resort, which unmapped the
//! free pages into the handle cache, and the growth after it could not use them (too few for
//! the hole). The rescue's new bytes are those handles first, mapped side by side (the largest
//! that fits what is left, each a map call), and only the rest is created, once the other
//! cached handles are released for its room; it used to release them all and create the new
//! bytes as one handle, so that a run that needed a rescue created its last free pages' bytes
//! twice. It needs no more room (cached handles count as held), so a rescue that succeeded
//! still does. On the shared traces at min capacity (Sim): bytes created ≤ 1.1 × the peak on
//! 20 of 23 instead of 19 (`attention-peak-test-tiny` 1.15 → 1.00, `bert-validate` 1.13 →
//! 1.00, `nca2d-wholeslide-inference` 1.47 → 1.00, `nca2d-peso-inference` 4.99 → 2.98;
//! `nca2d-forward-cuda-notebook` and `nca2d-update-notebook-warm` now fit in 18 and 40 MiB
//! less, where they create 1.19 and 1.64 ×); the generated programs (`qlora`,
//! `unet3d-training`, `empty-cache-training`, seeds 1–18) over 1.1 × on 18 of 54 instead of 32
//! (POLICY.md, "A rescue's new bytes from the handle cache").
//!
//! Note [Parked rescue] (with `park_remaps`, as Note [Parked pages] in `parked.rs`): the
//! teardown of a freed rescue before a growth synchronizes the block's stream, because its
//! queued work may still use the lent bytes and the reservation's addresses. Where every end is
//! lent by a page of that same stream, the lent bytes' next users are queued on it, after the
//! rescued block's work, as for any free range reused on its stream: the ends go home with no
//! synchronization, and only the unmap must wait. So the rescue is *parked*: its ends free at
//! home, its reservation still mapped (its aliases counted as parked mappings, its new bytes
//! still reserved but counted as room by every decision, as once given back), never revived. If
//! the request that retired it then fits a free range (the ends it had borrowed, usually) nothing
//! more happens; if it must grow, the parked rescues are torn down first (the stream
//! synchronized then, as before), as are they by the last resort, `empty_cache` and teardown. A
//! rescue with pages of the last resort's to put back home (Note [Pages put back]) is torn down
//! as before.
//!
//! Only where no other stream ever took large-pool memory: there the synchronization at the
//! teardown also made the stream's free pages quiet, and the other streams' growths, which take
//! quiet pages before any that need a synchronization, took them; deferred, they went elsewhere
//! and synchronized other streams (`inference-server-32` seed 6 at its smallest capacity: 245
//! synchronizations instead of 218, where 3 other server cases saved 1–3). On
//! `cs336-2.7b-forward-compiled` at its smallest capacity (Sim) parking removed its one
//! synchronization, the only one PyTorch's policy did not make there (and 4 calls: 4,143 →
//! 4,139); no other shared trace and no generated case (seeds 1–18) moved.
//!
//! Note [Rescue space]: a rescue's range need not be a reservation of its own. A large-pool
//! segment reserves an eighth more addresses than its own (`va_factor` × the device; three pages
//! at least, as a rescue maps two pages' ends), after them and outside its tiling, so no growth
//! ever maps there; the first rescue that fits takes the space of the earliest segment that has
//! it free, and gives it back at its teardown. A rescue then costs no `cuMemAddressReserve` and
//! no `cuMemAddressFree`: the one driver call by which ours exceeded PyTorch's policy on the
//! shared traces at its smallest capacity was that reservation (`cs336-forward-bf16-ctx128-e`:
//! 133 calls against 132, now 132). Only addresses: no decision reads where a rescue lies, so
//! every placement, capacity and synchronization is as before. A segment whose space holds a
//! rescue is not freed while it does (its reservation holds the rescue's mappings), even with no
//! chunk left; a space whose mappings the driver would not remove (deferred, Note [Deferred
//! releases]) stays taken for the segment's life. Where the driver refuses the larger reservation
//! (addresses running out) the segment, and every later one, is reserved without a space, and
//! rescues reserve their own as before.
//!
//! Accounting: `reserved_bytes` counts each physical byte once: the homes' chunks (lent bytes
//! included) and each rescue's own handles. The snapshot shows each rescue as a segment of its
//! own (its aliased ends unmapped, the block in the middle), and the lent bytes at home as
//! unmapped, so its mapped bytes still sum to `reserved_bytes`. A dead rescue keeps its memory
//! counted until it is torn down; one whose teardown the driver refuses (the synchronization or
//! the unmap) stays dead for the next try.

use rustc_hash::FxHashSet;

use crate::backend::{Backend, CallKind, PhysHandle, StreamId};
use crate::error::BackendError;
use crate::expandable::growth::Source;
use crate::expandable::pieces::{Kind, PieceId};
use crate::expandable::put_back::Unmapped;
use crate::expandable::segment::{Chunk, SegmentKey};
use crate::expandable::size_index::StreamPool;
use crate::expandable::state::{Block, State};
use crate::mechanism::counters::track;
use crate::mechanism::deferred::Leftover;
use crate::stats::PoolKind;
use crate::units::{DevAddr, VaRange};

/// A block served by an alias rescue (Note [Alias rescue]): what freeing it undoes.
#[derive(Debug)]
pub(crate) struct Rescue {
    /// The rescue's reservation, mapped whole: `[alias of A][new][alias of B]`.
    pub(crate) va: VaRange,
    /// The last piece of the reservation's tiling: gap, used block, gap.
    pub(crate) tail: PieceId,
    /// The block's piece.
    pub(crate) block: PieceId,
    /// The handles mapped between the aliases, in address order: cached ones first, then at
    /// most one created (Note [Rescue from the cache]).
    pub(crate) owned: Vec<Chunk>,
    /// (home slot, lent piece) of each end.
    pub(crate) lent: Vec<(u32, PieceId)>,
    /// Where the owned handles the last resort unmapped were mapped before it: put back there
    /// when the rescue is torn down before a growth (Note [Pages put back] in `put_back.rs`).
    pub(crate) homes: Vec<Unmapped>,
    /// The length of each alias (the lent ends' chunks, mapped a second time here).
    pub(crate) aliased: Vec<usize>,
    /// The block's stream, synchronized before the reservation is unmapped.
    pub(crate) stream: StreamId,
    /// Dead and its ends given back home already, its reservation still mapped until its stream
    /// is synchronized for a growth (Note [Parked rescue]); never revived.
    pub(crate) parked: bool,
    /// The segment whose rescue space `va` lies in (Note [Rescue space]), or `None` where `va`
    /// is a reservation of its own.
    pub(crate) space: Option<SegmentKey>,
}

/// A free end of a partly used chunk.
#[derive(Clone, Copy)]
struct End {
    slot: u32,
    chunk_at: u64,
    chunk: Chunk,
    piece: PieceId,
    /// Free bytes at the chunk's end (a tail) or start (a head).
    free: usize,
    stream: StreamId,
}

/// The plan of a rescue: which ends, how many of their bytes, how many new.
struct Plan {
    tail: Option<(End, usize)>,
    head: Option<(End, usize)>,
    new: usize,
}

impl<B: Backend> State<B> {
    /// Serves `rounded` bytes of `pool` on `stream` by an alias rescue (Note [Alias rescue]),
    /// if the free ends of two partly used pages and the device's room hold it; returns the
    /// block's slot and piece (a used piece, already carved). On any driver error the blocks and
    /// free ranges are as before (what the driver would not take back is deferred; streams it
    /// synchronized and cached handles it released stay so) and `None` is returned.
    pub(super) fn try_rescue(
        &mut self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
    ) -> Option<(u32, PieceId)> {
        if pool != PoolKind::Large {
            return None;
        }
        let plan = self.rescue_plan(rounded)?;
        // Bytes freed on another stream may still be in use by its queued work (Note [Syncs]);
        // on the request's own stream, its later work is ordered after it, as for any reuse of
        // a free range.
        let ends = [plan.tail.map(|t| t.0.stream), plan.head.map(|h| h.0.stream)];
        for s in ends.into_iter().flatten().filter(|&s| s != stream) {
            self.sync_before_unmap(s).ok()?;
        }
        let (va, space, owned) = self.map_rescue(&plan)?;
        Some(self.commit_rescue(stream, pool, rounded, plan, (va, space), owned))
    }

    /// The largest free tail and the largest free head of partly used large-pool chunks (of
    /// two chunks), and the new bytes the device must still give; `None` if the ends and the
    /// room cannot hold `rounded` bytes.
    fn rescue_plan(&self, rounded: usize) -> Option<Plan> {
        let (mut tail, mut head): (Option<End>, Option<End>) = (None, None);
        // An end beside a lent end is not lent: a chunk whose two ends are lent to rescues would
        // hold no byte of its own (the snapshot would show it all unmapped, as a parked page).
        let lent: rustc_hash::FxHashSet<PieceId> = self
            .rescues
            .values()
            .chain(&self.dead_rescues)
            .flat_map(|r| r.lent.iter().map(|&(_, p)| p))
            .collect();
        for seg in self.segments.values().filter(|s| s.pool == PoolKind::Large) {
            for (s, len, piece) in self.free_pieces(seg) {
                let e = s + len as u64;
                let p = self.pieces.get(piece);
                let (before_lent, after_lent) = (lent.contains(&p.prev), lent.contains(&p.next));
                let end = |chunk_at, chunk: Chunk, free| End {
                    slot: seg.slot,
                    chunk_at,
                    chunk,
                    piece,
                    free,
                    stream: seg.stream,
                };
                // The chunk the free piece starts inside: a tail if the piece reaches its end.
                if let Some((&cs, &chunk)) = seg.chunks.range(..=s).next_back() {
                    let ce = cs + chunk.len as u64;
                    let free = ce.saturating_sub(s) as usize;
                    if cs < s && ce <= e && !before_lent && tail.is_none_or(|t| free > t.free) {
                        tail = Some(end(cs, chunk, free));
                    }
                }
                // The chunk the free piece ends inside: a head if the piece covers its start.
                if let Some((&cs, &chunk)) = seg.chunks.range(..e).next_back() {
                    let ce = cs + chunk.len as u64;
                    let free = e.saturating_sub(cs) as usize;
                    if ce > e && cs >= s && !after_lent && head.is_none_or(|h| free > h.free) {
                        head = Some(end(cs, chunk, free));
                    }
                }
            }
        }
        if let (Some(t), Some(h)) = (tail, head) {
            if t.chunk_at == h.chunk_at {
                // One chunk's two ends: the larger (the chunk would be mapped twice more).
                if t.free >= h.free {
                    head = None;
                } else {
                    tail = None;
                }
            }
        }
        // New bytes come in whole granules; the ends give the rest, the tail first, so that
        // the block ends inside the head's alias or exactly at the new handle's end (no byte of
        // the reservation is mapped memory outside the block but the aliases' other blocks).
        let (t_free, h_free) = (tail.map_or(0, |t| t.free), head.map_or(0, |h| h.free));
        let new = rounded
            .saturating_sub(t_free + h_free)
            .next_multiple_of(self.granularity);
        let rest = rounded.checked_sub(new)?;
        let t_used = rest.min(t_free);
        let h_used = rest - t_used;
        let held = self.stats.reserved_bytes.all.current as usize + self.deferred.mapped_bytes();
        if rest == 0 || h_used > h_free || new > self.limit.saturating_sub(held) {
            return None;
        }
        Some(Plan {
            tail: tail.filter(|_| t_used > 0).map(|t| (t, t_used)),
            head: head.filter(|_| h_used > 0).map(|h| (h, h_used)),
            new,
        })
    }

    /// Takes the rescue's range (a segment's rescue space, Note [Rescue space], else a
    /// reservation of its own) and maps it: the tail's chunk, the new bytes (Note [Rescue from
    /// the cache]), the head's chunk, then access on the whole. Returns the range, the segment
    /// whose space it is, and the handles of the new bytes, in address order; on an error,
    /// gives back what it did (deferring what the driver refuses) and returns `None`.
    fn map_rescue(&mut self, plan: &Plan) -> Option<(VaRange, Option<SegmentKey>, Vec<Chunk>)> {
        let (t_len, h_len) = (
            plan.tail.map_or(0, |t| t.0.chunk.len),
            plan.head.map_or(0, |h| h.0.chunk.len),
        );
        let total = t_len + plan.new + h_len;
        let space = self.take_rescue_space(total);
        let va = match space {
            Some(key) => VaRange {
                start: DevAddr::new(self.segments[&key].end()),
                len: total,
            },
            None => track(
                &mut self.stats,
                CallKind::Reserve,
                self.backend.reserve(total),
            )
            .ok()?,
        };
        let x = va.start.get();
        let mut left = rescue_leftover(va, space);
        let mut owned = Vec::new();
        let mapped = self.map_rescue_parts(plan, x, &mut left, &mut owned);
        if mapped.is_some() {
            let set = self.backend.set_access(va.start, total, &self.access);
            if track(&mut self.stats, CallKind::SetAccess, set).is_ok() {
                return Some((va, space, owned));
            }
        }
        self.give_back_rescue_range(left, space);
        None
    }

    /// The free rescue space of at least `len` bytes of the earliest segment that has one
    /// (Note [Rescue space]), now taken; `None` if no segment has one free.
    fn take_rescue_space(&mut self, len: usize) -> Option<SegmentKey> {
        let key = self
            .segments
            .iter()
            .filter(|(_, s)| !s.rescue_space_busy && s.rescue_space >= len)
            .min_by_key(|(_, s)| s.seq)
            .map(|(&key, _)| key)?;
        self.segments.get_mut(&key)?.rescue_space_busy = true;
        Some(key)
    }

    /// Gives back `left`, what is left of a rescue's range (`rescue_leftover`), and frees the
    /// rescue space it lay in, if any, once all of it is given back; the release index then
    /// looks at the segment again (with no chunk, it may go now). A space the driver would not
    /// empty stays taken: nothing may be mapped over what it still holds there, and its
    /// segment's reservation is not freed around it.
    fn give_back_rescue_range(&mut self, left: Leftover, space: Option<SegmentKey>) {
        if !self.give_back_or_defer(left) {
            return;
        }
        if let Some(s) = space.and_then(|key| self.segments.get_mut(&key)) {
            s.rescue_space_busy = false;
            self.releasable.touch(s.slot);
        }
    }

    /// Maps the rescue's parts from `x`, recording each in `left` (and the new bytes' handles
    /// in `owned`); `None` at the first call that fails.
    fn map_rescue_parts(
        &mut self,
        plan: &Plan,
        x: u64,
        left: &mut Leftover,
        owned: &mut Vec<Chunk>,
    ) -> Option<()> {
        let mut at = x;
        if let Some((t, _)) = plan.tail {
            self.map_alias(at, t.chunk, left)?;
            at += t.chunk.len as u64;
        }
        // Note [Rescue from the cache]: cached handles first, the largest that fits what is
        // left; the rest created, the other cached handles released first for its room.
        let mut rest = plan.new;
        while rest > 0 {
            let Some((handle, len)) = self.cache.take(rest, rest) else {
                break;
            };
            self.map_owned(at, Chunk { handle, len }, left, owned)?;
            self.stats.handle_reuses += 1;
            (at, rest) = (at + len as u64, rest - len);
        }
        if rest > 0 {
            self.trim_cache(0).ok()?;
            // Note [Kept pages]: the cached handles it mapped are held, not yet reserved.
            let (handle, source) = self.new_handle(plan.new - rest, rest).ok()?;
            if source == Source::Kept {
                self.stats.handle_reuses += 1;
            }
            self.map_owned(at, Chunk { handle, len: rest }, left, owned)?;
            at += rest as u64;
        }
        if let Some((h, _)) = plan.head {
            self.map_alias(at, h.chunk, left)?;
        }
        Some(())
    }

    /// Maps a second mapping of `chunk` (a lent end's) at `at`.
    fn map_alias(&mut self, at: u64, chunk: Chunk, left: &mut Leftover) -> Option<()> {
        let mapped = self
            .backend
            .map(DevAddr::new(at), chunk.len, chunk.handle, 0);
        track(&mut self.stats, CallKind::Map, mapped).ok()?;
        *left = std::mem::take(left).with_alias(DevAddr::new(at), chunk.len);
        Some(())
    }

    /// Maps `chunk`, the rescue's own, at `at`; one that will not map is given back with the
    /// rest.
    fn map_owned(
        &mut self,
        at: u64,
        chunk: Chunk,
        left: &mut Leftover,
        owned: &mut Vec<Chunk>,
    ) -> Option<()> {
        let mapped = self
            .backend
            .map(DevAddr::new(at), chunk.len, chunk.handle, 0);
        if track(&mut self.stats, CallKind::Map, mapped).is_err() {
            *left = std::mem::take(left).with_handle(chunk.handle, chunk.len);
            return None;
        }
        *left = std::mem::take(left).with_mapping(DevAddr::new(at), chunk.len, chunk.handle);
        owned.push(chunk);
        Some(())
    }

    /// The bookkeeping of a mapped rescue: the reservation's tiling, the lent ends, the
    /// statistics; returns the block's slot and piece.
    fn commit_rescue(
        &mut self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
        plan: Plan,
        (va, space): (VaRange, Option<SegmentKey>),
        owned: Vec<Chunk>,
    ) -> (u32, PieceId) {
        let x = va.start.get();
        let start = x + plan.tail.map_or(0, |(t, used)| (t.chunk.len - used) as u64);
        let end = start + rounded as u64;
        let last = self.pieces.new_tiling(x, va.len);
        if start > x {
            self.pieces.split_front(last, start);
        }
        let block = if end < x + va.len as u64 {
            self.pieces.split_front(last, end)
        } else {
            last
        };
        self.pieces.set_kind(block, Kind::Used);
        let aliased = [
            plan.tail.map(|t| t.0.chunk.len),
            plan.head.map(|h| h.0.chunk.len),
        ];
        let aliased: Vec<usize> = aliased.into_iter().flatten().collect();
        let mut lent = Vec::with_capacity(2);
        if let Some((t, used)) = plan.tail {
            let at = t.chunk_at + (t.chunk.len - used) as u64;
            lent.push((t.slot, self.take_at(t.slot, t.piece, at, used)));
        }
        if let Some((h, used)) = plan.head {
            lent.push((h.slot, self.take_at(h.slot, h.piece, h.chunk_at, used)));
        }
        let new: usize = owned.iter().map(|c| c.len).sum();
        debug_assert_eq!(new, plan.new);
        self.stats.reserved_bytes.increase(pool, new as u64);
        self.stats.num_device_alloc += owned.len() as u64;
        self.stats.segment.increase(pool, 1);
        self.stats.alias_rescues += 1;
        let slot = self.index.slot(StreamPool { stream, pool });
        let rescue = Rescue {
            va,
            tail: last,
            block,
            owned,
            lent,
            homes: Vec::new(),
            aliased,
            stream,
            parked: false,
            space,
        };
        self.rescues.insert(start, rescue);
        (slot, block)
    }

    /// Serves `rounded` bytes of `key`'s stream and pool from a freed rescue whose block is that
    /// long and was on that stream (Note [Rescue revived]); returns its slot and (used) piece.
    /// Rescues hold large-pool blocks only.
    pub(super) fn revive_rescue(
        &mut self,
        key: StreamPool,
        rounded: usize,
    ) -> Option<(u32, PieceId)> {
        if key.pool != PoolKind::Large {
            return None;
        }
        let fits = |r: &Rescue| {
            !r.parked && r.stream == key.stream && self.pieces.get(r.block).len == rounded
        };
        let i = self.dead_rescues.iter().position(fits)?;
        let r = self.dead_rescues.swap_remove(i);
        let block = r.block;
        self.rescues.insert(self.pieces.get(block).start, r);
        self.stats.alias_revivals += 1;
        Some((self.index.slot(key), block))
    }

    /// Frees a rescued block (Note [Alias rescue]): its statistics now, its memory once its
    /// stream's queued work is done: the rescue waits, dead, until the next allocation that
    /// would grow, `empty_cache` or the last resort synchronizes the stream and tears it down.
    /// No synchronization at the free itself, which may run inside the event processing that
    /// completes a pending free (a synchronization there would complete other events in the
    /// middle of it).
    pub(super) fn end_rescue(&mut self, r: Rescue, block: &Block) {
        let size = self.size_of(block);
        self.stats
            .count_inactive(PoolKind::Large, size, block.requested);
        self.dead_rescues.push(r);
    }

    /// Before a request that found no free range grows: gives every dead rescue's ends back
    /// home, parking the rescues whose teardown would synchronize a stream that the lent bytes'
    /// next users are ordered after anyway (Note [Parked rescue]) and tearing the others down
    /// (with `put_back`, their owned handles' pages mapped back home). Returns whether any
    /// rescue is parked.
    pub(super) fn retire_dead_rescues(&mut self, put_back: bool) -> bool {
        let mut parked = false;
        for mut r in std::mem::take(&mut self.dead_rescues) {
            if r.parked || self.may_park_rescue(&r) {
                if !r.parked {
                    self.last_free = None;
                    for (slot, piece) in std::mem::take(&mut r.lent) {
                        self.make_free(slot, piece);
                    }
                    r.parked = true;
                }
                parked = true;
                self.dead_rescues.push(r);
                continue;
            }
            let stream = r.stream;
            match self.tear_down_rescue(r) {
                Ok(homes) if put_back => self.put_back(&homes, stream),
                _ => {}
            }
        }
        parked
    }

    /// Whether dead rescue `r` may give its ends back home without a synchronization (Note
    /// [Parked rescue]): its stream has frees its teardown would wait for, every end is lent by a
    /// segment of that stream, no other stream ever took large-pool memory, and it has no page of
    /// the last resort's to put back.
    fn may_park_rescue(&self, r: &Rescue) -> bool {
        self.config.park_remaps
            && self.index.large_streams() <= 1
            && r.homes.is_empty()
            && self.needs_sync(r.stream)
            && r.lent
                .iter()
                .all(|&(slot, _)| self.index.key(slot).stream == r.stream)
    }

    /// The new bytes of the parked rescues (Note [Parked rescue]): reserved, but room for every
    /// decision, as they would be once given back. Rescues are few and rarely parked.
    pub(crate) fn parked_rescue_bytes(&self) -> usize {
        let parked = self.dead_rescues.iter().filter(|r| r.parked);
        parked.flat_map(|r| r.owned.iter().map(|c| c.len)).sum()
    }

    /// Tears down every dead rescue, synchronizing streams as needed; returns the first error.
    /// With `put_back`, the owned handles that were free pages before the last resort that made
    /// the rescue are mapped back where they were (Note [Pages put back] in `put_back.rs`).
    pub(super) fn retry_dead_rescues(&mut self, put_back: bool) -> Result<(), BackendError> {
        let mut first = Ok(());
        for r in std::mem::take(&mut self.dead_rescues) {
            let stream = r.stream;
            match self.tear_down_rescue(r) {
                Ok(homes) if put_back => self.put_back(&homes, stream),
                Ok(_) => {}
                Err(e) => first = first.and(Err(e)),
            }
        }
        first
    }

    /// Keeps with the rescue whose block is `block` the pages of `unmapped` (the last resort's)
    /// whose handles it took from the cache (Note [Pages put back] in `put_back.rs`).
    pub(super) fn keep_rescue_homes(&mut self, block: PieceId, unmapped: &[Unmapped]) {
        let start = self.pieces.get(block).start;
        let Some(r) = self.rescues.get_mut(&start) else {
            return;
        };
        let owned: FxHashSet<PhysHandle> = r.owned.iter().map(|c| c.handle).collect();
        r.homes = unmapped
            .iter()
            .filter(|u| owned.contains(&u.handle()))
            .copied()
            .collect();
    }

    /// Synchronizes the rescue's stream, unmaps its reservation (one call: its mappings are
    /// whole and adjacent, Note [Unmap runs]) and gives its parts back; returns its owned
    /// handles' homes (Note [Pages put back]). On an error, keeps the rescue, untouched, among
    /// the dead ones.
    fn tear_down_rescue(&mut self, r: Rescue) -> Result<Vec<Unmapped>, BackendError> {
        let unmapped = self.sync_before_unmap(r.stream).and_then(|()| {
            let unmapped = self.backend.unmap(r.va.start, r.va.len);
            track(&mut self.stats, CallKind::Unmap, unmapped)
        });
        if let Err(e) = unmapped {
            self.dead_rescues.push(r);
            return Err(e);
        }
        // Unmapped whole: a rescue space is free again once its handles are handed on.
        let mut left = rescue_leftover(r.va, r.space);
        for c in r.owned {
            self.stats
                .reserved_bytes
                .decrease(PoolKind::Large, c.len as u64);
            left = left.with_handle(c.handle, c.len);
        }
        self.give_back_rescue_range(left, r.space);
        self.stats.segment.decrease(PoolKind::Large, 1);
        self.pieces.release_tiling(r.tail);
        // A lent end merges with its free neighbours, which may hold the last free (Note [Last
        // free]): forgotten, as wherever free ranges change outside a free.
        self.last_free = None;
        for (slot, piece) in r.lent {
            self.make_free(slot, piece);
        }
        Ok(r.homes)
    }

    /// Gives every rescue's memory back, ignoring errors (teardown).
    pub(super) fn abandon_rescues(&mut self) {
        let all = std::mem::take(&mut self.rescues).into_values();
        for r in all.chain(std::mem::take(&mut self.dead_rescues)) {
            let _ = self.backend.unmap(r.va.start, r.va.len);
            for c in r.owned {
                let _ = self.backend.release(c.handle);
            }
            // A rescue space goes with its segment's reservation.
            if r.space.is_none() {
                let _ = self.backend.free_reservation(r.va);
            }
        }
    }
}

/// What giving back a rescue's range `va` starts from: its reservation, to be freed, unless it
/// lies in a segment's rescue space (Note [Rescue space]), which goes with the segment.
fn rescue_leftover(va: VaRange, space: Option<SegmentKey>) -> Leftover {
    match space {
        Some(_) => Leftover::default(),
        None => Leftover::reservation(va),
    }
}
