//! Growing a segment: find where, get physical memory, map it, set access once, or roll back.
//!
//! Note [Growth]: new memory goes where the request fits once a hole is mapped, counting the free
//! ranges that end where the hole begins and begin where it ends: of those places, the one whose
//! span (free before, hole, free after) is smallest, the lowest address among equals
//! (`best_fit_growth`), as best fit chooses among free blocks. PyTorch maps "at the lowest
//! address at which we can fit" (`best_fit_growth: false`). The two differ only where a segment
//! has holes inside it (pages released or remapped under pressure, `empty_cache`); there the
//! lowest address splits a large hole for a small request, and a later large request must
//! remap pages to the segment's end. On a full 16 GiB device with random sizes up to 256 MiB
//! (the churn bench), best fit fails 1,123 requests of 100,000 instead of 1,329 and makes 3,388
//! synchronizations instead of 3,588 (fewer failures on each of seeds 1–5, up to 64 MiB too);
//! summed over the 23 shared traces, min capacity 290.455 → 290.451 GiB.
//! Physical memory for each chunk comes, in order, from the handle cache, from `create`, and,
//! when the device is full, from remap-defrag (Note [Remap]). All chunks of one
//! growth form one contiguous run, so access is set with one call. If anything fails half-way,
//! every chunk this growth mapped is unmapped again, handles it created are released, handles it
//! took from the cache go back, and a segment it reserved is freed: the allocator is exactly as
//! before (pytorch#188008 terminates the process there).
//!
//! Note [Headroom]: physical memory beyond `soft_limit` (the limit less the configured headroom)
//! is the device's last free memory, wanted by what lives outside the allocator. A growth whose
//! next page would reach into it is *under pressure*: it first remaps fully-free chunks it
//! already holds whose stream needs no synchronization (Note [Remap]), and creates new memory only when none is left, up to the hard
//! limit. With `pressure_tail`, a growth whose whole page would not fit in the device (the hard
//! limit, not the headroom) maps a last handle only as large as the request needs (rounded to
//! the granularity), so no growth at the device's end fails for a page's unused tail. Large
//! pages keep growth cheap while memory is plentiful; exact tails at the end and remapping keep
//! the capacity a trace needs within a granule of its live bytes per segment when it is not.
//! Why the end and not the headroom: an exact tail saves capacity only where a whole page
//! would not fit, and everywhere else it costs a growth more (the next request finds no page
//! tail to land in). Cutting tails from the headroom on, as this policy first did, made more
//! driver calls at minimum capacity than PyTorch on 8 of the 23 shared traces, and saved 2 MiB
//! of capacity summed over all of them (measured in the README's results). With
//! `tail_takes_rest`, where only the growing stream holds memory, the tail handle takes all the
//! device has left (less than a page) rather than the request's need: exact tails there made
//! one growth per request at the device's end (`cs336-forward-fp32-ctx128-e` at its minimum:
//! 4, 6 and 6 MiB, three growths and six calls more than PyTorch's one 20 MiB page), and the
//! rest could only ever go to that stream. With other streams holding memory the tail stays
//! exact, so the rest stays free for any of them (taking it there put 5 more several-streams
//! cases above PyTorch's policy, seeds 1–18).
//!
//! Note [Free holes]: a segment grows at its end when no free range holds the request, however
//! much free memory its interior holds. On `nca2d-peso-inference` at 80 GiB, the 7012 MiB
//! request that set the peak found 14.78 GiB mapped and free in 5 ranges, the largest 5479 MiB,
//! and grew the segment by 4600 MiB more: 29.65 GiB reserved for 17.23 GiB live (classic, whose
//! segments never merge, 25.14). With `remap_before_create` the growth takes the fully-free
//! chunks of those ranges first (Note [Remap]), paying a stream synchronization where blocks
//! were freed since the last one, so reserved memory tracks live memory plus partly used pages.
//!
//! Note [Drain after sync] (`drain_after_sync`, off by default): once a remap has synchronized
//! another stream, every fully-free page of that stream is unmapped at once into the handle
//! cache (what this growth does not use is released when it ends, as every remap's leftovers
//! are), so later growths find the memory free on the device instead of synchronizing that
//! stream again. On the 12 generated several-streams cases: 38 % fewer synchronizations
//! (3,387 against 5,498) and none more than pytorch-expandable's on any case (3 with the
//! default), for 2–3 % more capacity summed (17,686 MiB against 17,290). With ten streams it
//! pays more and saves less: 9–17 % fewer synchronizations for 2–8 % more capacity, which is
//! above pytorch-expandable's on 2 of the 6 seeds (2264 and 2378 MiB against 2250 and 2370).
//! Off by default because capacity comes first. Single-stream programs never see it (a
//! stream's own pages are parked).
//!
//! Note [Harvest order] (`harvest_lowest_first`, default on): when every fully-free page a
//! pressured growth could take belongs to its own stream (one stream, or the others hold none),
//! the lowest-addressed page goes first; otherwise the highest, as before. A stream's segments
//! grow upward, so its large blocks come and go near the top, and free pages left mapped far
//! below are where later mid-sized blocks land (best fit), splitting them into ranges whose
//! partly used pages no remap can take. Traced on the `qlora` workload (seed 2, 8300 MiB): a
//! 184 MiB free range far below, kept mapped by the highest-first order, was split by the next
//! steps' checkpoints into four ranges of 24–63 MiB, and the last step's 989 MiB request found
//! 66 MiB less to remap than it needed; PyTorch's policy, which gives every free page back,
//! fitted in 8262 MiB where ours needed 8300. Taking the lowest first: 8258 MiB, and
//! `qlora` 4 8282 → 8252, `unet3d-training` 4 and 5 −20 and −14 MiB (2 and 6 +30 and +14),
//! the shared traces 290.414 → 290.406 GiB summed, churn on a full 16 GiB device 1,623 →
//! 1,592 and 1,123 → 1,116 failed requests. Across streams the address says nothing about
//! which stream's memory to take: lowest-first there cost 134 MiB summed over the 12
//! several-streams cases and 2–62 MiB on each ten-streams seed, so it applies to one stream's
//! own pages only.
//!
//! Note [Give back before foreign sync] (`give_back_before_foreign_sync`, off by default): when
//! the only free pages a pressured growth could still remap belong to another stream that would
//! first need a synchronization, the growth takes none of them and fails, and `allocate`'s last
//! resort gives every free page of every stream back (one synchronization each) and retries, as
//! PyTorch's policy does whenever it runs out. The growing stream's own pages are still remapped
//! first, parked (no synchronization). Why: on an inference server (a stream per client, each
//! request growing its own KV cache a token at a time) every stream's segment is a mosaic of KV
//! tensors a few MiB apart, and taking another stream's pages one growth at a time synchronizes
//! that stream again and again and leaves holes that the next requests must grow around; a fresh
//! layout after one give-back serves the following requests in place. Measured on the generated
//! `inference-server` and `inference-server-4` workloads, seeds 1–18 (Sim): min capacity summed
//! 253,594 MiB against the default's 254,644 and PyTorch's policy's 253,824, above PyTorch's on
//! 11 of 36 cases (the default: 20, by up to 160 MiB; this: up to 50), more synchronizations than
//! PyTorch's on none (the default: 24). On streams of large transient blocks (`multi-stream`,
//! `two-streams`, `ten-streams`, 48 cases) it needs 3 % more summed than the default and more
//! than classic on 11 (the default: 3): taking the other stream's pages is what wins there. So it
//! stays a setting, which `vmm-replay advise` tries on every trace with several streams.
//! By default the give-back applies to one stream at a time (`give_back_below_free_pages`,
//! 5 %): when the stream that would be synchronized holds fewer whole free pages than 5 % of its
//! mapped memory, its free bytes lie in pages it also uses (a server's mosaic), and the few
//! whole pages a synchronization would buy are not worth it; a stream with more (a pipeline's
//! freed activations) is synchronized and its pages remapped. Measured (Sim, min capacity,
//! ours against PyTorch's policy): on the servers, seeds 1–12, the synchronizations above
//! PyTorch's fall from 17 cases of 24 to 11, the capacity above it stays at 9; held out, seeds
//! 13–18, 11 of 12 cases above it become 8 (the largest excess 160 → 64 MiB) and the
//! synchronizations above it 7 → 5; on the several-streams workloads no case crosses either
//! bar or classic's, for 0.4–0.6 % more memory summed; one stream never meets it. Fractions
//! of 10 and 30 % save more on the servers and lose `ten-streams` cases to classic.
//! The same measure over every stream comes first (`give_back_below_all_free_pages`, 15 %):
//! when the whole free pages of all streams together are fewer than 15 % of the memory mapped,
//! the device is a mosaic wherever a growth would look, and it gives back rather than
//! synchronizing any other stream. Logged at the synchronizations the per-stream rule let
//! through (Sim, each case at ours' minimum capacity), that share lies at 3–27 % on the
//! servers (quartiles over `inference-server` seeds 2, 8, 9 and `inference-server-4` 1, 8)
//! and 43–79 % on the several-streams workloads (`multi-stream` 1, 3, `ten-streams` 1, 4,
//! `two-streams` 2), where the per-stream share overlaps more (7–77 % against 60–99 %).
//! Measured over seeds 1–18 (Sim, min capacity, against PyTorch's policy): servers 17 of 36
//! cases above it → 13 (the largest excess 92 → 68 MiB), synchronizations above it 17 → 7,
//! 464 MiB less summed; several streams 3 of 54 above it, 6 above classic and 8 → 7 with more
//! synchronizations, 46 MiB more summed (0.05 %). At 10 % the servers gain less, at 20–30 % the
//! several-streams cases lose to classic (7 at 30 %, seeds 1–12, against 4).
//!
//! Note [Fine pages] (`fine_pages_above`, off by default): a large-pool growth that takes the
//! allocator's physical memory above that fraction of its limit maps 2 MiB pages (the
//! granularity) instead of 20 MiB ones. Under pressure only fully-free pages can be remapped, so
//! the free bytes of a 20 MiB page that also holds a live block are lost to every request that
//! does not fit in them; with fine pages, the memory mapped near the device's end can be taken
//! back 2 MiB at a time. The pages below the fraction stay large, so a program that never comes
//! near its device's end makes the calls it made before. Measured at 0.75 (POLICY.md,
//! "Finer pages near the device's end"): no several-streams case needs more than PyTorch's
//! policy (4 of 48 with the defaults), the shared traces 290.27 GiB summed instead of 290.41,
//! but about twice PyTorch's driver calls at minimum capacity, so a setting, not the default.
//!
//! Note [Stream pages] (`stream_page_share`, default 3 %, and `stream_page_floor`, 8 MiB): the
//! large page a growth maps shrinks once one page per stream that took large-pool memory would
//! pass that share of the limit: 3 % of the limit ÷ the streams, a multiple of the
//! granularity, never below the floor nor above the page. Each stream's segment keeps its own
//! partly used pages (a block's ends share pages with other blocks of that stream; its tail
//! page is usually half used), and under pressure no remap can take a page that is partly
//! used, so the memory that pages pin grows with the streams × the page, where classic's
//! segments, sized to each request of 10 MiB or more and given back whole, pin none of it. On
//! an 80 GiB device the page stays 20 MiB up to 122 streams, and a program of one stream never
//! sees it; it acts where many streams share a device that is small for them, the case the
//! generated workloads of 10 and 32 streams showed losing to classic (POLICY.md, "Many
//! streams": at a device's minimum, 32 streams of churn took ours above classic on 18 of 18
//! cases, by up to 12 %). Why a share and a floor: smaller pages pin less and cost a map per
//! page, so the page is as large as the pinned memory allows, and no smaller than 8 MiB,
//! where the 32-stream churn still makes fewer driver calls than PyTorch's policy (at 6 MiB
//! it makes more). Measured (seeds 1–18, min capacity, Sim, against the previous default; the
//! shared traces and the single-stream programs do not change): several streams 6 → 0 cases
//! above classic and 3 → 1 above PyTorch's policy, 2.1 % less memory summed, driver calls
//! above PyTorch's on none; 32 streams 18 → 11 above classic and 13 → 11 above PyTorch's
//! policy, 1.5 % less summed, calls above it on 1 of 36; synchronizations above it 7 → 9 and
//! 2 → 3 cases; the servers unchanged but for −8 MiB. The count of streams only grows (a
//! stream that took large-pool memory once still counts), so a program that once ran many
//! streams keeps the smaller page.
//!
//! Note [Remap]: when `create` reports out-of-memory, a fully-free chunk of any segment (any
//! stream, after that stream's queued work is done: Note [Syncs] in `free.rs`) is unmapped and
//! its handle mapped where the growth needs it. A chunk of the growing stream's own segments
//! needs no wait: its old mapping is parked instead of unmapped (Note [Parked pages] in
//! `parked.rs`), and parked pages count as a hole where a growth needs fewer new bytes by
//! mapping over them (`choose_target`), after unparking them. Live blocks never move, so every
//! address handed out stays valid; waste is bounded by partially used pages, not by where live
//! blocks happen to sit.
//!
//! Note [Harvest unmap runs] (with `batch_unmaps`, the default): a page harvested from a quiet
//! stream (synchronized for it, or with nothing freed since its last synchronization) is not
//! unmapped when it is taken but parked (Note [Parked pages] in `parked.rs`: its handle may be
//! mapped where the growth needs it while the old mapping stays), and at the growth's end, success
//! or rollback, each run of adjacent such pages is unmapped with one call (page by page where
//! the driver refuses the run; a page it refuses stays parked, unmapped at its stream's next
//! synchronization). Nothing decides differently: the growth maps only into the hole it chose
//! before harvesting, never over a harvested page, and a parked handle is never a candidate
//! again within the growth; only the unmap calls are fewer (on a full device the pages a growth
//! takes mostly lie together: the churn bench's and the shared traces' figures in the README).
//! A handle already parked elsewhere is unmapped at once, as before: one parked mapping per
//! handle.
//!
//! Note [Address space budget] (`va_fallback`, default on; PyTorch's preset off): a segment reserves `va_factor` (1.125) × the device's memory
//! of virtual addresses, as PyTorch's does, so that pages unmapped early in it can be mapped
//! again at its end. The process's address space is shared by every segment of every (stream,
//! pool) and device (128 TiB on x86-64: about 830 segments of an H200's), and PyTorch's
//! expandable segments fail a request for want of it while the device is nearly empty (its PR
//! #192269: GPUs × streams × 1.125; reliability bug 15). Where the reservation is refused, ours
//! reserves the request alone, in pages: that segment fills at once and the stream's next
//! growth reserves another, so while addresses are short each reservation is about what it
//! maps (classic's way) and no stream starves the next. Halving the length until the driver
//! accepts (measured: 6 streams on an 8 GiB device with 24 GiB of addresses) gave each new
//! stream half of what was left, so the sixth got its request alone and its next growth failed.
//! Only when the request alone is refused does it fail, and its out-of-memory message says that
//! the address space, not the device's memory, ran out. A refused reservation is a driver call
//! (counted, and failed).
//!
//! Note [Segment order]: where ours orders pages or holes of different segments (the page a
//! pressured growth remaps first, the segment of a stream whose hole a growth takes among equal
//! ones), it orders them by when their segment was reserved (`Segment::seq`), then by address
//! within the segment, never by the segments' addresses: where the driver places a reservation
//! is its own choice (a freed reservation's range may be handed out again, lower than older
//! ones), so ordering by address made ours decide differently on a device that placed them
//! differently, and the Sim's replay would not predict the GPU's. With reservations placed
//! bottom up and none freed, as the Sim does by default, both orders are the same. Tests replay
//! the several-streams workloads and the shared traces on a Sim that reserves from the top down
//! (`SimConfig::reserve_from_top`) and require ours' figures unchanged. What still follows
//! addresses: the best-fit index orders free ranges of equal length by address, so two equal
//! ranges in two segments of one (stream, pool), which exist only once a segment's address
//! space ran out, are taken lower address first (no trace or workload measured decides on it).

use crate::backend::{Backend, CallKind, PhysHandle, StreamId};
use crate::error::BackendError;
use crate::expandable::pieces::PieceId;
use crate::expandable::segment::{Chunk, FreeChunk, Segment, SegmentKey};
use crate::expandable::size_index::StreamPool;
use crate::expandable::state::State;
use crate::expandable::target::Target;
use crate::mechanism::counters::track;
use crate::mechanism::deferred::Leftover;
use crate::stats::PoolKind;
use crate::units::{DevAddr, VaRange};

/// What a harvest must respect: the growing stream (its own pages may be parked, Note
/// [Parked pages] in `parked.rs`) and the range the growth relies on (segment, from, to), whose
/// chunks must not be harvested.
#[derive(Clone, Copy)]
pub(super) struct Harvester {
    pub(super) stream: StreamId,
    pub(super) seg: SegmentKey,
    pub(super) from: u64,
    pub(super) to: u64,
}

/// A growth's remap candidates, listed on its first harvest (Note [Harvest list]), and the
/// streams of the segments they were listed from (a stream may have none left).
pub(super) struct HarvestList {
    pub(super) cands: Vec<(SegmentKey, FreeChunk)>,
    streams: Vec<StreamId>,
}

/// How `best_candidate` ranks a page: taken without a synchronization, exactly the size
/// wanted, then its place (as is, or reversed for the lowest first): its segment's `seq`, then
/// its address in the segment (Note [Segment order]).
type HarvestKey<A> = (bool, bool, A);

/// A page's place among the candidates: its segment's `seq`, then its address.
type Place = (u64, u64);

/// One chunk mapped by the growth in progress, and where its handle came from.
pub(crate) struct Grown {
    pub(crate) at: u64,
    pub(crate) handle: PhysHandle,
    pub(crate) len: usize,
    pub(crate) source: Source,
}

/// Where a growth's handle came from: where a rollback returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Created by the growth: released.
    Created,
    /// The handle cache: back to it.
    Cached,
    /// The kept pages (Note [Kept pages] in `kept.rs`): kept again, as the room a created
    /// handle released would give back.
    Kept,
}

impl<B: Backend> State<B> {
    pub(crate) fn page_for(&self, pool: PoolKind) -> usize {
        let page = match pool {
            PoolKind::Small => self.config.small_page,
            PoolKind::Large => self.config.large_page,
        };
        page.max(1).next_multiple_of(self.granularity)
    }

    /// The page a growth of `rounded` bytes maps: the pool's, or the granularity for a
    /// large-pool growth that takes the allocator above `fine_pages_above` of its limit
    /// (Note [Fine pages]), or for the large pool a page shrunk by the number of streams
    /// (Note [Stream pages]).
    fn growth_page(&self, stream: StreamId, pool: PoolKind, rounded: usize) -> usize {
        let above = self.config.fine_pages_above;
        let fine = pool == PoolKind::Large
            && above < 1.0
            && self.in_use(0).saturating_add(rounded) as f64 > above * self.limit as f64;
        if fine {
            self.granularity
        } else if pool == PoolKind::Large {
            self.stream_page(stream, self.page_for(pool))
        } else {
            self.page_for(pool)
        }
    }

    /// The large page, shrunk so that one page per stream that took large-pool memory (the
    /// growing `stream` among them) stays within `stream_page_share` of the limit, never below
    /// `stream_page_floor` (Note [Stream pages]).
    fn stream_page(&self, stream: StreamId, page: usize) -> usize {
        let share = self.config.stream_page_share;
        if share <= 0.0 {
            return page;
        }
        let first = self
            .index
            .find(StreamPool {
                stream,
                pool: PoolKind::Large,
            })
            .is_none();
        let streams = self.index.large_streams() + u32::from(first);
        if streams < 2 {
            return page;
        }
        let cap = (share * self.limit as f64 / f64::from(streams)) as usize;
        let cap = cap - cap % self.granularity;
        let floor = self
            .config
            .stream_page_floor
            .next_multiple_of(self.granularity)
            .clamp(self.granularity, page);
        cap.clamp(floor, page)
    }

    /// Grows a segment of (stream, pool) so that the returned free piece (and the slot of the
    /// index that holds it) holds `rounded` bytes. The pages it harvested from quiet streams are
    /// unmapped at its end, whether it succeeded or not (Note [Harvest unmap runs]).
    pub(crate) fn grow(
        &mut self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
    ) -> Result<(u32, PieceId), GrowFail> {
        let grown = self.grow_mapping(stream, pool, rounded);
        self.unmap_harvested();
        grown
    }

    /// [`grow`](Self::grow) but for the unmaps it defers.
    fn grow_mapping(
        &mut self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
    ) -> Result<(u32, PieceId), GrowFail> {
        let page = self.growth_page(stream, pool, rounded);
        let g = self.granularity as u64;
        let mut harvest = None;
        let target = match self.choose_target(stream, pool, rounded) {
            Some(t) => t,
            None => {
                // Note [Hopeless growth]: a new segment's reservation only if it can be mapped
                // (it holds no chunk the growth relies on: nothing is excluded).
                let need = rounded.next_multiple_of(self.granularity);
                let nothing = Harvester {
                    stream,
                    seg: SegmentKey::MIN,
                    from: 0,
                    to: 0,
                };
                if self.hopeless(need, nothing, &mut harvest) {
                    return Err(GrowFail::OutOfMemory);
                }
                self.new_segment(stream, pool, rounded, page)?
            }
        };
        let need_end = (target.start + rounded as u64).next_multiple_of(g);
        let target = self.clear_parked(target, need_end)?;
        let map_end = need_end.min(target.hole_end);
        let slot = self.segments[&target.seg].slot;
        // The growth relies on every free byte from the block's start to its end, beyond the hole too.
        let exclude = Harvester {
            stream,
            seg: target.seg,
            from: target.start,
            to: need_end,
        };
        if !target.new_segment {
            let need = map_end.saturating_sub(target.hole_start) as usize;
            if self.hopeless(need, exclude, &mut harvest) {
                return Err(GrowFail::OutOfMemory);
            }
        }
        if map_end <= target.hole_start {
            // The free piece before the hole holds the block without mapping (possible when
            // `faithful_oversize` made the best-fit search pass it over).
            if let Some(before) = target.before {
                return Ok((slot, before));
            }
        }
        // A page per step, unless harvested chunks are smaller.
        let mut grown: Vec<Grown> =
            Vec::with_capacity((map_end - target.hole_start) as usize / page + 1);
        let mut cursor = target.hole_start;
        while cursor < map_end {
            let room = (target.hole_end - cursor) as usize;
            let mut want = page.min(room);
            let held: usize = grown.iter().map(|c| c.len).sum();
            let pressured = self.pressured(held, want);
            if self.config.pressure_tail && self.beyond_device(held, want) {
                // Note [Headroom]: where a whole page would not fit in the device, the last
                // handle covers only what is needed, or, for a stream alone, all that is left.
                want = want.min(self.tail_len(stream, held, (need_end - cursor) as usize));
            }
            let got = match self.acquire(want, room, exclude, held, pressured, &mut harvest) {
                Ok(got) => got,
                Err(e) => return Err(self.rollback(&target, grown, e)),
            };
            let (handle, len, source) = got;
            let mapped = track(
                &mut self.stats,
                CallKind::Map,
                self.backend.map(DevAddr::new(cursor), len, handle, 0),
            );
            if let Err(e) = mapped {
                self.give_back(handle, len, source);
                return Err(self.rollback(&target, grown, e.into()));
            }
            grown.push(Grown {
                at: cursor,
                handle,
                len,
                source,
            });
            cursor += len as u64;
        }
        let run = (cursor - target.hole_start) as usize;
        let set = track(
            &mut self.stats,
            CallKind::SetAccess,
            self.backend
                .set_access(DevAddr::new(target.hole_start), run, &self.access),
        );
        if let Err(e) = set {
            return Err(self.rollback(&target, grown, e.into()));
        }
        // Commit: the run becomes free mapped memory, merged with its free neighbours.
        let seg = self
            .segments
            .get_mut(&target.seg)
            .expect("target segment is live");
        for c in &grown {
            seg.add_chunk(
                c.at,
                Chunk {
                    handle: c.handle,
                    len: c.len,
                },
            );
        }
        seg.mapped_bytes += run;
        self.stats.reserved_bytes.increase(pool, run as u64);
        self.stats.num_device_alloc += grown.len() as u64;
        self.stats.handle_reuses +=
            grown.iter().filter(|c| c.source != Source::Created).count() as u64;
        let free = self.gap_to_free(target.seg, target.hole_start, run);
        let free = free.expect("the grown run lies in a gap of a live segment");
        debug_assert_eq!(self.pieces.get(free).start, target.start);
        if let Some(list) = harvest {
            self.harvest_spare = list.cands;
        }
        Ok((slot, free))
    }

    /// Makes the target's hole mappable (Note [Parked pages] in `parked.rs`): parked pages
    /// where the request needs memory are unmapped (synchronizing the stream first if work
    /// queued on it may still touch them); the hole ends before the first parked page beyond.
    fn clear_parked(&mut self, mut target: Target, need_end: u64) -> Result<Target, GrowFail> {
        let seg = &self.segments[&target.seg];
        if seg.parked_in(target.hole_start, need_end) {
            self.sync_before_unmap(seg.stream)?;
            self.unpark_segment(target.seg)?;
        }
        let seg = &self.segments[&target.seg];
        if let Some((&first, _)) = seg.parked.range(target.hole_start..target.hole_end).next() {
            if need_end > first {
                // A parked page the driver would not unmap is in the way.
                return Err(GrowFail::OutOfMemory);
            }
            target.hole_end = first;
        }
        Ok(target)
    }

    /// Reserves a new segment: `va_factor ×` device memory, at least the request, in pages;
    /// less where the address space is short (Note [Address space budget]).
    fn new_segment(
        &mut self,
        stream: StreamId,
        pool: PoolKind,
        rounded: usize,
        page: usize,
    ) -> Result<Target, GrowFail> {
        let least = rounded
            .checked_next_multiple_of(page)
            .ok_or(GrowFail::OutOfMemory)?;
        let mut va_len = ((self.device_total as f64 * self.config.va_factor) as usize)
            .checked_next_multiple_of(page)
            .ok_or(GrowFail::OutOfMemory)?
            .max(least);
        // Note [Rescue space]: a large-pool segment's reservation holds an eighth more (three
        // pages at least: a rescue maps two pages' ends), after the segment's own addresses,
        // where an alias rescue maps without a reservation of its own; given up first where the
        // driver refuses the addresses.
        let mut space =
            if pool == PoolKind::Large && self.config.alias_rescue && !self.rescue_space_refused {
                // Absurd page sizes overflow: no space then.
                page.checked_mul(3)
                    .map(|least| (va_len / 8).max(least))
                    .and_then(|s| s.checked_next_multiple_of(self.granularity))
                    .filter(|s| va_len.checked_add(*s).is_some())
                    .unwrap_or(0)
            } else {
                0
            };
        let va = loop {
            match track(
                &mut self.stats,
                CallKind::Reserve,
                self.backend.reserve(va_len + space),
            ) {
                Ok(va) => break va,
                Err(e) if e.is_out_of_memory() && space > 0 => {
                    (space, self.rescue_space_refused) = (0, true)
                }
                Err(e) if self.config.va_fallback && e.is_out_of_memory() && va_len > least => {
                    va_len = least
                }
                Err(e) if e.is_out_of_memory() => return Err(GrowFail::OutOfAddresses),
                Err(e) => return Err(GrowFail::Backend(e)),
            }
        };
        let va = VaRange {
            start: va.start,
            len: va.len - space,
        };
        let va_len = va.len;
        let key = SegmentKey::of(&va);
        let slot = self.index.slot(StreamPool { stream, pool });
        let tail = self.pieces.new_tiling(key.start(), va.len);
        let mut segment = Segment::new(va, stream, pool, slot, tail, self.next_segment_seq);
        segment.rescue_space = space;
        self.segments.insert(key, segment);
        self.segments_by_slot
            .insert((slot, self.next_segment_seq, key));
        self.next_segment_seq += 1;
        self.releasable.touch(slot);
        self.stats.segment.increase(pool, 1);
        Ok(Target {
            seg: key,
            start: key.start(),
            before: None,
            hole_start: key.start(),
            hole_end: key.start() + va_len as u64,
            new_segment: true,
        })
    }

    /// Physical bytes the allocator may hold before it reaches into the headroom
    /// (Note [Headroom]).
    fn soft_limit(&self) -> usize {
        let fraction = (self.device_total as f64 * self.config.headroom_fraction) as usize;
        let headroom = self.config.headroom_bytes.max(fraction);
        self.limit.saturating_sub(headroom)
    }

    /// Whether taking `want` more bytes, with `held` bytes already taken by the growth in
    /// progress, reaches into the headroom (Note [Headroom]).
    pub(crate) fn pressured(&self, held: usize, want: usize) -> bool {
        self.in_use(held).saturating_add(want) > self.soft_limit()
    }

    /// Physical bytes the allocator holds (mapped and cached) plus `held`, those the growth in
    /// progress already took. The parked rescues' new bytes count as room, as they would once
    /// given back at their teardown (Note [Parked rescue] in `rescue.rs`); no growth sees one:
    /// a request that must grow tears them down first.
    pub(crate) fn in_use(&self, held: usize) -> usize {
        let reserved = self.stats.reserved_bytes.all.current as usize;
        reserved - self.parked_rescue_bytes() + self.cache.bytes() + held
    }

    /// Whether taking `want` more bytes, with `held` bytes already taken by the growth in
    /// progress, would pass the device's (or the memory fraction's) limit.
    fn beyond_device(&self, held: usize, want: usize) -> bool {
        self.in_use(held).saturating_add(want) > self.limit
    }

    /// The last handle of a growth on `stream` that needs `need` more bytes where a whole page
    /// would not fit in the device, `held` bytes already taken (Note [Headroom]): `need`, or with
    /// `tail_takes_rest` and no other stream holding memory, all the device has left if more.
    fn tail_len(&self, stream: StreamId, held: usize, need: usize) -> usize {
        if !self.config.tail_takes_rest || self.segments.values().any(|s| s.stream != stream) {
            return need;
        }
        let g = self.granularity;
        let rest = self.limit.saturating_sub(self.in_use(held)) / g * g;
        need.max(rest)
    }

    /// A handle of about `want` bytes (at most `room`) for the growth in progress.
    /// `exclude`: the growing stream, and chunks that must not be harvested (the growth relies
    /// on them); `held` = bytes this growth already holds, for the memory-fraction limit;
    /// `pressured`: the growth reaches into the headroom, so free chunks are remapped before
    /// anything is created (Note [Headroom]);
    /// `harvest` = the growth's remap candidates, listed on its first harvest.
    fn acquire(
        &mut self,
        want: usize,
        room: usize,
        exclude: Harvester,
        held: usize,
        pressured: bool,
        harvest: &mut Option<HarvestList>,
    ) -> Result<(PhysHandle, usize, Source), GrowFail> {
        loop {
            if let Some((h, len)) = self.cache.take(want, room) {
                return Ok((h, len, Source::Cached));
            }
            // In the headroom, free chunks that need no synchronization are remapped first.
            if pressured
                && self.config.remap_defrag
                && self.harvest_one(exclude, want, true, harvest)?
            {
                continue;
            }
            // Note [Free holes]: with `remap_before_create`, any fully-free chunk, after a sync.
            if self.config.remap_before_create
                && self.config.remap_defrag
                && self.harvest_one(exclude, want, false, harvest)?
            {
                continue;
            }
            if !self.beyond_device(held, want) {
                // Note [Kept pages]: a kept page of the length the growth would create instead.
                match self.new_handle(held, want) {
                    Ok((h, source)) => return Ok((h, want, source)),
                    Err(e) if !e.is_out_of_memory() => return Err(GrowFail::Backend(e)),
                    Err(_) => {}
                }
            }
            // Out of memory. Cached handles that did not fit the hole hold memory: release one.
            if self.cache.count() > 0 {
                self.trim_cache(self.cache.bytes().saturating_sub(1))?;
                continue;
            }
            if self.config.remap_defrag && self.harvest_one(exclude, want, false, harvest)? {
                continue;
            }
            return Err(GrowFail::OutOfMemory);
        }
    }

    /// Unmaps one fully-free chunk outside `exclude` into the handle cache (Note [Remap]).
    /// Prefers a chunk whose stream needs no synchronization (none was freed on since its last
    /// one: taking it costs no sync, and once a growth has synchronized a stream the rest of that
    /// stream's chunks come first), then a chunk of exactly `want` bytes, then the highest
    /// address. False if none exists. On one stream the first key never decides (the shared
    /// traces' figures did not move); on the `multi-stream` workload (4 streams) it took ours
    /// from more synchronizations than PyTorch's policy at minimum capacity on 5 of seeds 1–6
    /// to 2 (figures: POLICY.md, "Several streams").
    ///
    /// Note [Harvest list]: the fully-free chunks are listed once per growth, on its first
    /// harvest, not once per page harvested (listing sorts every segment's free ranges, which
    /// made a full device's churn many times slower than classic's); the chunks of the free
    /// pieces unchanged since the last listing come from the chunk cache (Note [Chunk cache]). The list stays exact for
    /// the growth's length: harvesting only takes chunks away, and nothing else changes free
    /// ranges until the growth ends. Unmapping a chunk splits its free piece, whose index stays
    /// with the part after the chunk (Note [Pieces]); the chunks listed before it in the same
    /// piece are moved to the piece that holds the part before.
    /// With `quiet_only`, only chunks whose stream needs no synchronization are taken.
    fn harvest_one(
        &mut self,
        exclude: Harvester,
        want: usize,
        quiet_only: bool,
        listed: &mut Option<HarvestList>,
    ) -> Result<bool, GrowFail> {
        let list = match listed {
            Some(c) => c,
            None => listed.insert(self.harvest_candidates(exclude)),
        };
        let Some(best) = self.best_candidate(list, want, quiet_only, exclude.stream) else {
            return Ok(false);
        };
        let cands = &mut list.cands;
        let (seg, free) = cands[best];
        let stream = self.segments[&seg].stream;
        let needs_sync = self.needs_sync(stream);
        let park = needs_sync && self.may_park(stream, exclude.stream, &free);
        let synced = needs_sync && !park;
        if synced && stream != exclude.stream && self.gives_back_before(stream, cands) {
            // Note [Give back before foreign sync]: the growth fails here, and the caller's last
            // resort gives every free page back and retries.
            return Ok(false);
        }
        if !park {
            self.sync_before_unmap(stream)?;
        }
        self.take_candidate(cands, best, park)?;
        if synced && stream != exclude.stream && self.config.drain_after_sync {
            // Note [Drain after sync]: the other stream's free pages are quiet now; take them all.
            // From the end down: `take_candidate`'s swap_remove brings an entry already visited.
            for i in (0..cands.len()).rev() {
                if self.segments[&cands[i].0].stream == stream {
                    self.take_candidate(cands, i, false)?;
                }
            }
        }
        Ok(true)
    }

    /// Whether a growth that could go on only by synchronizing `stream` (another stream) gives
    /// every free page back instead (Note [Give back before foreign sync]): always with
    /// `give_back_before_foreign_sync`, else when every stream's whole free pages (`cands` lists
    /// them) are fewer than `give_back_below_all_free_pages` of the memory mapped, or `stream`'s
    /// fewer than `give_back_below_free_pages` of its own. Asked only before a synchronization,
    /// so its walks cost nothing beside it.
    fn gives_back_before(&self, stream: StreamId, cands: &[(SegmentKey, FreeChunk)]) -> bool {
        if self.config.give_back_before_foreign_sync {
            return true;
        }
        let overall = self.config.give_back_below_all_free_pages;
        if overall > 0.0 {
            let free: usize = cands.iter().map(|(_, c)| c.chunk.len).sum();
            // Every segment's mapped bytes: what `check` holds `reserved_bytes` to.
            let mapped = self.stats.reserved_bytes.all.current;
            if (free as f64) < overall * mapped as f64 {
                return true;
            }
        }
        let fraction = self.config.give_back_below_free_pages;
        if fraction <= 0.0 {
            return false;
        }
        let on_stream = |seg: &SegmentKey| self.segments[seg].stream == stream;
        let free: usize = cands
            .iter()
            .filter(|(seg, _)| on_stream(seg))
            .map(|(_, c)| c.chunk.len)
            .sum();
        let mapped: usize = self
            .segments
            .values()
            .filter(|s| s.stream == stream)
            .map(|s| s.mapped_bytes)
            .sum();
        (free as f64) < fraction * mapped as f64
    }

    /// Takes candidate `i` out of `cands` into the handle cache: parked (Note [Parked pages]) or
    /// unmapped (its stream is quiet: the caller synchronized it if needed). The candidates
    /// listed before it in the same free piece move to the piece that now holds them.
    fn take_candidate(
        &mut self,
        cands: &mut Vec<(SegmentKey, FreeChunk)>,
        i: usize,
        park: bool,
    ) -> Result<(), GrowFail> {
        let (seg, free) = cands[i];
        // Note [Harvest unmap runs]: a quiet page's unmap waits for the growth's end.
        let defer = !park
            && self.config.batch_unmaps
            && !self.parked_handles.contains_key(&free.chunk.handle);
        let front = if park || defer {
            self.park_chunk(seg, free)
        } else {
            self.unmap_chunk(seg, free)?
        };
        if defer {
            self.harvest_unmaps.push((seg, free.at));
        }
        cands.swap_remove(i);
        if let Some(front) = front {
            for (s, c) in cands.iter_mut() {
                if *s == seg && c.piece == free.piece && c.at < free.at {
                    c.piece = front;
                }
            }
        }
        let chunk = free.chunk;
        self.stats.remapped_bytes += chunk.len as u64;
        self.cache.put(chunk.handle, chunk.len);
        Ok(())
    }

    /// The candidate `harvest_one` takes for a growth on `stream`: the greatest (taken without
    /// a synchronization, exactly `want` bytes, address), or, with `harvest_lowest_first` and
    /// every candidate on `stream`, the lowest address instead (Note [Harvest order]); with
    /// `quiet_only` (in the headroom),
    /// among those on a stream that needs no synchronization and no larger than `want`
    /// (remapping there never maps a page's unused tail). Without it, a page that can be parked
    /// (Note [Parked pages] in `parked.rs`) is taken without a synchronization too. Addresses
    /// are unique, so the list's order never decides.
    ///
    /// One pass, and a segment's stream looked up once per run of its chunks (a piece's are
    /// listed together), not twice per chunk: the search over the segments' map per candidate was
    /// most of a harvest's selection on the churn bench's full device. Two shortcuts that decide
    /// nothing: with `quiet_only`, no pass at all when every stream listed needs a
    /// synchronization (none qualifies: on one stream with blocks freed since its last one,
    /// every growth's first look), and whether a page can be parked (a search of the parked
    /// handles) is asked only of a page that would rank first by either order if it could.
    fn best_candidate(
        &self,
        list: &HarvestList,
        want: usize,
        quiet_only: bool,
        stream: StreamId,
    ) -> Option<usize> {
        if quiet_only && list.streams.iter().all(|&s| self.needs_sync(s)) {
            return None;
        }
        let mut seg_quiet: Option<(SegmentKey, StreamId, bool, u64)> = None;
        // The best by the highest place and by the lowest, chosen between at the end: which
        // applies depends on every candidate's stream (Note [Harvest order]).
        let mut high: Option<(usize, HarvestKey<Place>)> = None;
        let mut low: Option<(usize, HarvestKey<std::cmp::Reverse<Place>>)> = None;
        let mut own_only = true;
        // Which order decides is known before the pass when the lowest-first order is off, or
        // when every stream listed is the growing one (`own_only` then holds): only that
        // order's best is kept.
        let lowest_first = self.config.harvest_lowest_first;
        let low_only = lowest_first && list.streams.iter().all(|&s| s == stream);
        for (i, (seg, c)) in list.cands.iter().enumerate() {
            let (seg_stream, quiet, seq) = match seg_quiet {
                Some((s, st, q, n)) if s == *seg => (st, q, n),
                _ => {
                    let s = &self.segments[seg];
                    let (st, n) = (s.stream, s.seq);
                    let q = !self.needs_sync(st);
                    seg_quiet = Some((*seg, st, q, n));
                    (st, q, n)
                }
            };
            let place = (seq, c.at);
            own_only &= seg_stream == stream;
            if quiet_only && !(quiet && c.chunk.len <= want) {
                continue;
            }
            let exact = c.chunk.len == want;
            // A key only grows with `quiet`: a page that would not rank first by either order
            // if it were quiet does not rank first as it is.
            let beats_high = !low_only && high.is_none_or(|(_, k)| (true, exact, place) > k);
            let beats_low = lowest_first
                && low.is_none_or(|(_, k)| (true, exact, std::cmp::Reverse(place)) > k);
            if !beats_high && !beats_low {
                continue;
            }
            // Parked only on the way to an out-of-memory, not in the headroom (Note [Parked
            // pages]).
            let quiet = quiet || (!quiet_only && self.may_park(seg_stream, stream, c));
            let key = (quiet, exact, place);
            if !low_only && high.is_none_or(|(_, k)| key > k) {
                high = Some((i, key));
            }
            let key = (quiet, exact, std::cmp::Reverse(place));
            if lowest_first && low.is_none_or(|(_, k)| key > k) {
                low = Some((i, key));
            }
        }
        if lowest_first && own_only {
            low.map(|(i, _)| i)
        } else {
            high.map(|(i, _)| i)
        }
    }

    /// Every fully-free chunk of every segment, outside `exclude`'s range. Only
    /// the segments of the release index can hold one (Note [Release index]); the segments of
    /// the slots touched since it was last brought up to date are brought up to date from the
    /// same listing (the index's own update walked each of them first to find one free chunk,
    /// then this walk went over it again: a tenth of the churn bench's full-device time). Each
    /// slot's chunks are found from its best-fit index, not by a walk of every piece (Note
    /// [Indexed chunk listing] in `chunk_cache.rs`), in the bins' order; with
    /// `drain_after_sync`, whose drain takes them in the list's order, grouped by segment in the
    /// order the release index brings them up (the touched slots' segments by `seq`, then the
    /// untouched filed ones by address), each segment's chunks in address order.
    pub(super) fn harvest_candidates(&mut self, exclude: Harvester) -> HarvestList {
        let (ex_seg, ex_from, ex_to) = (exclude.seg, exclude.from, exclude.to);
        // The last growth's list, for its allocation (one list grown anew per growth was a
        // twentieth of a listing's cost).
        let mut out = std::mem::take(&mut self.harvest_spare);
        out.clear();
        let mut visited = 0;
        let touched = self.releasable.take_touched();
        // Only Note [Drain after sync] takes the candidates in the list's order; every other
        // choice is the greatest of a key that no two share (`best_candidate`) or a sum.
        let ordered = self.config.drain_after_sync;
        let mut listed = Vec::new();
        let mut with_chunk = Vec::new();
        for &slot in &touched {
            listed.clear();
            self.slot_free_chunks(slot, &mut listed);
            if ordered {
                // The slot's segments in `segments_by_slot`'s order, chunks by address.
                listed.sort_unstable_by_key(|&(seq, key, c)| (seq, key, c.at));
            }
            // Its segments, filed or not, with their chunks just listed (excluded ones too).
            visited += self.file_slot(slot, &listed, &mut with_chunk);
            out.extend(listed.iter().map(|&(_, key, c)| (key, c)));
        }
        // An untouched slot's segments with a chunk are all filed (Note [Release index]): its
        // listing is theirs.
        let mut touched_sorted = touched;
        touched_sorted.sort_unstable();
        let mut untouched: Vec<u32> = Vec::new();
        for key in self.releasable.segments() {
            let slot = self.segments[&key].slot;
            if touched_sorted.binary_search(&slot).is_err() {
                visited += 1;
                if !untouched.contains(&slot) {
                    untouched.push(slot);
                }
            }
        }
        listed.clear();
        for &slot in &untouched {
            self.slot_free_chunks(slot, &mut listed);
        }
        if ordered {
            // The filed segments' order: by address.
            listed.sort_unstable_by_key(|&(_, key, c)| (key, c.at));
        }
        out.extend(listed.iter().map(|&(_, key, c)| (key, c)));
        self.releasable.visits += visited;
        out.retain(|&(seg, c)| {
            seg != ex_seg || c.at >= ex_to || c.at + c.chunk.len as u64 <= ex_from
        });
        // The streams listed, each segment's looked up once per run of its chunks.
        let mut streams: Vec<StreamId> = Vec::new();
        let mut last = None;
        for &(seg, _) in &out {
            if last != Some(seg) {
                last = Some(seg);
                let st = self.segments[&seg].stream;
                if !streams.contains(&st) {
                    streams.push(st);
                }
            }
        }
        HarvestList {
            cands: out,
            streams,
        }
    }

    /// Returns a handle the growth did not get to use.
    fn give_back(&mut self, handle: PhysHandle, len: usize, source: Source) {
        match source {
            Source::Cached => self.cache.put(handle, len),
            Source::Kept => self.kept.put(handle, len),
            Source::Created => {
                let _ = self.release_or_keep(handle, len);
            }
        }
    }

    /// Undoes a growth: unmaps its chunks, returns their handles (to the cache if they came from
    /// it), frees a segment it reserved.
    fn rollback(&mut self, target: &Target, grown: Vec<Grown>, cause: GrowFail) -> GrowFail {
        for c in self.unmap_grown(grown) {
            self.give_back(c.handle, c.len, c.source);
        }
        if target.new_segment {
            // The segment this growth reserved goes, whatever happens: a failed call must leave
            // the allocator as it was. What the driver will not give back yet (the reservation,
            // chunks it would not unmap) is deferred (Note [Deferred releases]): no segment any
            // more, nothing can be allocated in it, no statistic but `stuck_bytes` counts it.
            if let Some(seg) = self.segments.remove(&target.seg) {
                self.segments_by_slot
                    .remove(&(seg.slot, seg.seq, target.seg));
                self.releasable.set(target.seg, false);
                self.pieces.release_tiling(seg.tail);
                self.stats.segment.decrease(seg.pool, 1);
                let mut left = Leftover::reservation(seg.reservation());
                for (at, c) in seg.stuck {
                    left = left.with_mapping(DevAddr::new(at), c.len, c.handle);
                }
                self.give_back_or_defer(left);
            }
        }
        cause
    }

    /// Unmaps the chunks of a failed growth and returns those now unmapped.
    ///
    /// Note [Stuck chunks]: one call covers the whole run (the chunks are adjacent whole
    /// mappings); if it fails, each chunk is tried alone. A chunk that still cannot be unmapped
    /// must not be released or cached (its handle is mapped) nor handed out (its access may be
    /// unset), and growth must not map over it: it is recorded in its segment's `stuck` map,
    /// which `holes` treats as occupied, and is unmapped again by `empty_cache` and teardown.
    /// It is not counted in `reserved_bytes`: no allocation can use it.
    pub(crate) fn unmap_grown(&mut self, grown: Vec<Grown>) -> Vec<Grown> {
        let (Some(first), Some(last)) = (grown.first(), grown.last()) else {
            return grown;
        };
        let len = (last.at + last.len as u64 - first.at) as usize;
        let at = DevAddr::new(first.at);
        if track(
            &mut self.stats,
            CallKind::Unmap,
            self.backend.unmap(at, len),
        )
        .is_ok()
        {
            return grown;
        }
        let mut unmapped = Vec::new();
        for c in grown {
            let one = self.backend.unmap(DevAddr::new(c.at), c.len);
            if track(&mut self.stats, CallKind::Unmap, one).is_ok() {
                unmapped.push(c);
                continue;
            }
            if let Some(seg) = self.segment_of(c.at) {
                let chunk = Chunk {
                    handle: c.handle,
                    len: c.len,
                };
                let s = self.segments.get_mut(&seg).expect("segment_of found it");
                s.add_stuck(c.at, chunk);
                self.releasable.touch(s.slot);
            }
        }
        unmapped
    }
}

/// Why a growth failed.
pub(crate) enum GrowFail {
    /// No physical memory could be found: try harder, or report OOM.
    OutOfMemory,
    /// The driver refused even the request's own length of addresses for a new segment (Note
    /// [Address space budget]): try harder, or report OOM saying so.
    OutOfAddresses,
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
