//! Note [Pages put back] (`put_back_after_retry`, default on; PyTorch's preset off): the last
//! resort unmaps every free page of every segment into the handle cache so that the retried
//! growth has room, and the call's end released whatever the retry did not use. Where the retry
//! then served the request (a growth, or the alias rescue, which maps the cached handles first:
//! Note [Rescue from the cache] in `rescue.rs`), most of those pages were not needed: a request
//! that reaches the last resort on a nearly full device is usually one large block, served by
//! a few of them. The rest were free pages of the program's working set, and the growths after
//! the call created them again: on `nca2d-peso-inference` at its smallest capacity (Sim) the
//! program's 6.85 GiB request reached the last resort 9 times, and 1,747 pages released at
//! those calls' ends were created again, 51 GiB created in all for a 17.3 GiB program.
//!
//! So a call the retry served maps back, where it was, each page of the request's stream the
//! last resort unmapped whose handle is still cached and whose address is still an unmapped hole
//! of the same segment: the state before the last resort, less what the request took. The
//! rescue takes most of those handles (its new bytes, Note [Rescue from the cache]), and keeps
//! their homes: when the freed rescue is torn down before a growth, they are put back there
//! (only there: at `empty_cache` and at the last resort, which want the memory given back, they
//! go as before). On `nca2d-peso-inference` at its smallest capacity this took the bytes created
//! from 51.4 to 17.3 GiB and the driver calls from 12,145 to 8,543.
//!
//! Only the request's own stream's pages: another stream's page put back is that stream's free
//! memory, which the next growth of the request's stream takes only after synchronizing it,
//! where the page released is created again without a synchronization. Putting back every
//! stream's pages made ours need more than pytorch-expandable on 11 of the 36 inference-server
//! cases (seeds 1–18) instead of 1, with more synchronizations on 30 instead of 19.
//!
//! Those other streams' pages are not put back; without `keep_after_retry` they are released
//! at the call's end and created again by those streams' next growths. With it (the default)
//! they are kept for the growths that would create a page of their length (Note [Kept pages]
//! in `kept.rs`).
//!
//! A page costs a map call, as it would have cost a create (and the map after it) when a later
//! growth needed it; each run of adjacent pages one access call. It holds no byte the allocator did not hold before the call
//! (`reserved` is what it was, less what was given back to serve the request), and the pages are
//! quiet (the last resort synchronized their streams). A call that raises an OOM gives them all
//! back, as before: a program that catches the error expects the memory freed. Pages of a
//! segment the last resort freed, or whose hole the retry mapped, are released as before; so is
//! a page whose map or access call fails (what the driver will not unmap again stays stuck,
//! Note [Stuck chunks] in `growth.rs`).

use rustc_hash::FxHashSet;

use crate::backend::{Backend, CallKind, PhysHandle, StreamId};
use crate::expandable::growth::{Grown, Source};
use crate::expandable::segment::{Chunk, FreeChunk, SegmentKey};
use crate::expandable::state::State;
use crate::mechanism::counters::track;
use crate::units::DevAddr;

/// A page the last resort unmapped: its segment (key and `seq`, so that a segment reserved
/// later at the same address is not taken for it), its address and its handle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unmapped {
    seg: SegmentKey,
    seq: u64,
    stream: StreamId,
    at: u64,
    chunk: Chunk,
}

impl Unmapped {
    /// The page's handle.
    pub(crate) fn handle(&self) -> PhysHandle {
        self.chunk.handle
    }
}

impl<B: Backend> State<B> {
    /// The pages of `chunks` (free chunks of `seg`, just unmapped by the last resort) as
    /// [`Unmapped`] records.
    pub(crate) fn record_unmapped(
        &self,
        seg: SegmentKey,
        chunks: &[FreeChunk],
        out: &mut Vec<Unmapped>,
    ) {
        let (seq, stream) = (self.segments[&seg].seq, self.segments[&seg].stream);
        out.extend(chunks.iter().map(|c| Unmapped {
            seg,
            seq,
            stream,
            at: c.at,
            chunk: c.chunk,
        }));
    }

    /// Puts the cached handles of `unmapped` back into the cache in an order that does not depend
    /// on where the driver placed the segments (Note [Segment order] in `growth.rs`): other
    /// streams' pages first, then `stream`'s, each by segment age and address. The cache hands
    /// out the last handle put of a length, so a rescue right after takes `stream`'s pages
    /// first: those it can put back when it is torn down.
    pub(crate) fn order_cached(&mut self, unmapped: &[Unmapped], stream: StreamId) {
        if unmapped.is_empty() {
            return;
        }
        let wanted: FxHashSet<PhysHandle> = unmapped.iter().map(|u| u.chunk.handle).collect();
        let taken = self.cache.take_these(&wanted);
        let mut order: Vec<&Unmapped> = unmapped
            .iter()
            .filter(|u| taken.contains(&u.chunk.handle))
            .collect();
        order.sort_unstable_by_key(|u| (u.stream == stream, u.seq, u.at));
        for u in order {
            self.cache.put(u.chunk.handle, u.chunk.len);
        }
    }

    /// Keeps, past the call's end, the handles of other streams' pages in `unmapped` still
    /// cached (Note [Kept pages] in `kept.rs`).
    pub(crate) fn keep_after_retry(&mut self, unmapped: &[Unmapped], stream: StreamId) {
        if !self.config.keep_after_retry {
            return;
        }
        let other = unmapped.iter().filter(|u| u.stream != stream);
        let wanted: FxHashSet<PhysHandle> = other.clone().map(|u| u.chunk.handle).collect();
        if wanted.is_empty() {
            return;
        }
        let taken = self.cache.take_these(&wanted);
        for u in other.filter(|u| taken.contains(&u.chunk.handle)) {
            self.kept.put(u.chunk.handle, u.chunk.len);
        }
    }

    /// Maps back the pages of `unmapped` (in the last resort's order: by segment, then address)
    /// that nothing used (Note [Pages put back]). Driver errors are not the caller's: the call
    /// has served its request; a page that cannot be mapped back stays cached and is released
    /// by the call's trim, as without the setting.
    /// Only the pages of `stream`'s segments: another stream's page, put back, would be its
    /// free memory, which `stream` could take again only after synchronizing it.
    pub(crate) fn put_back(&mut self, unmapped: &[Unmapped], stream: StreamId) {
        if unmapped.is_empty() {
            return;
        }
        // A handle with a parked mapping belongs where it was remapped (Note [Parked pages]).
        let wanted: FxHashSet<PhysHandle> = unmapped
            .iter()
            .filter(|u| u.stream == stream)
            .map(|u| u.chunk.handle)
            .filter(|h| !self.parked_handles.contains_key(h))
            .collect();
        let cached = self.cache.take_these(&wanted);
        let mut rest = unmapped;
        while let Some(first) = rest.first() {
            // A run: adjacent pages of one segment, each still cached.
            let mut n = 0;
            while n < rest.len()
                && cached.contains(&rest[n].chunk.handle)
                && rest[n].seg == first.seg
                && (n == 0 || rest[n - 1].at + rest[n - 1].chunk.len as u64 == rest[n].at)
            {
                n += 1;
            }
            let (run, after) = rest.split_at(n.max(1));
            rest = after;
            if n == 0 {
                continue;
            }
            self.map_back(run);
        }
    }

    /// Maps `run` (adjacent pages of one segment, their handles taken out of the cache) back at
    /// their addresses, as free memory. Where the segment or the hole is gone or the driver
    /// refuses, nothing stays mapped and the handles go back to the cache (but one the driver
    /// would not unmap again: that one stays stuck, Note [Stuck chunks] in `growth.rs`).
    fn map_back(&mut self, run: &[Unmapped]) {
        let (first, last) = (run[0], run[run.len() - 1]);
        let (at, end) = (first.at, last.at + last.chunk.len as u64);
        let hole = self.segments.get(&first.seg).is_some_and(|s| {
            s.seq == first.seq
                && s.gap_before(at).is_some_and(|gap| {
                    let p = self.pieces.get(gap);
                    s.gap_holes(p.start, p.end(), false)
                        .any(|(from, to)| from <= at && end <= to)
                })
        });
        if !hole {
            self.recache(run, Vec::new());
            return;
        }
        let mut grown = Vec::with_capacity(run.len());
        for u in run {
            let mapped = self
                .backend
                .map(DevAddr::new(u.at), u.chunk.len, u.chunk.handle, 0);
            if track(&mut self.stats, CallKind::Map, mapped).is_err() {
                self.recache(run, grown);
                return;
            }
            grown.push(Grown {
                at: u.at,
                handle: u.chunk.handle,
                len: u.chunk.len,
                source: Source::Cached,
            });
        }
        let len = (end - at) as usize;
        let set = self.backend.set_access(DevAddr::new(at), len, &self.access);
        if track(&mut self.stats, CallKind::SetAccess, set).is_err() {
            self.recache(run, grown);
            return;
        }
        let s = self.segments.get_mut(&first.seg).expect("checked above");
        for u in run {
            s.add_chunk(u.at, u.chunk);
        }
        s.mapped_bytes += len;
        let pool = s.pool;
        self.stats.reserved_bytes.increase(pool, len as u64);
        self.stats.num_device_alloc += run.len() as u64;
        self.stats.handle_reuses += run.len() as u64;
        let free = self.gap_to_free(first.seg, at, len);
        debug_assert!(free.is_some(), "the hole lies in a gap of a live segment");
    }

    /// Gives `run`'s handles back to the cache after a failed [`map_back`](Self::map_back):
    /// `mapped`, those it had mapped, are unmapped first; one the driver will not unmap stays
    /// stuck in its segment, mapped, and is not cached.
    fn recache(&mut self, run: &[Unmapped], mapped: Vec<Grown>) {
        let tried: FxHashSet<PhysHandle> = mapped.iter().map(|g| g.handle).collect();
        for g in self.unmap_grown(mapped) {
            self.cache.put(g.handle, g.len);
        }
        for u in run.iter().filter(|u| !tried.contains(&u.chunk.handle)) {
            self.cache.put(u.chunk.handle, u.chunk.len);
        }
    }
}
