//! The allocator's core: `&mut self` only, no locks (the public type wraps it in a mutex).
//!
//! Blocks are carved best-fit (smallest free range that fits, lowest address on ties; the block
//! freed just before among exact fits, Note [Last free] in `last_free.rs`) from the free ranges of
//! the request's (stream, pool); when none fits, a segment grows (`growth.rs`). This file
//! holds the state and its small queries; what changes it lives by responsibility beside it:
//! `free_ranges.rs` (the only code that changes the tiling and the index), `allocate.rs`,
//! `free.rs` (frees, stream uses, pending events), `release.rs` (unmapping and giving back),
//! `growth.rs` (mapping more).

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::backend::{Access, Backend, CallKind, EventId, PhysHandle, StreamId};
use crate::config::{ConfigError, ExpandableConfig};
use crate::error::AllocError;
use crate::expandable::chunk_cache::ChunkCache;
use crate::expandable::handle_cache::HandleCache;
use crate::expandable::last_free::LastFree;
use crate::expandable::pieces::{PieceId, Pieces};
use crate::expandable::recent_frees::RecentFrees;
use crate::expandable::releasable::ReleaseIndex;
use crate::expandable::segment::{FreeChunk, Segment, SegmentKey};
use crate::expandable::size_index::Indexes;
use crate::mechanism::deferred::Deferred;
use crate::mechanism::stream_uses::StreamUses;
use crate::stats::MemoryStats;

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
    pub(crate) uses: StreamUses,
}

#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) addr: u64,
    pub(crate) block: Block,
    pub(crate) events: Vec<(StreamId, EventId)>,
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
    pub(crate) segments: BTreeMap<SegmentKey, Segment>,
    /// (index slot, `seq`, va start) of every segment: the segments of one (stream, pool) in the
    /// order they were reserved (Note [Segment order] in `growth.rs`), so growth looks at its own
    /// and not at every stream's (issue 21).
    pub(crate) segments_by_slot: BTreeSet<(u32, u64, SegmentKey)>,
    /// (stream, pool) -> every free range by (len, start): the best-fit index.
    pub(crate) index: Indexes,
    /// Every segment's pieces (Note [Pieces]).
    pub(crate) pieces: Pieces,
    /// The segments with something to give back (Note [Release index]).
    pub(crate) releasable: ReleaseIndex,
    /// Chunks the free-chunk walks have examined so far (Note [Free chunk walk] in
    /// `free_ranges.rs`; a test kit counter). A `Cell`: the walks only read the state.
    pub(crate) chunk_walk_steps: std::cell::Cell<u64>,
    /// Free pieces the chunk listings have examined so far (Note [Indexed chunk listing] in
    /// `chunk_cache.rs`; a test kit counter).
    pub(crate) listed_pieces: u64,
    /// The fully-free chunks of free pieces, kept between pressured growths (Note [Chunk cache]).
    pub(crate) chunk_cache: ChunkCache,
    /// The last pressured growth's remap candidates, emptied: kept for its allocation.
    pub(crate) harvest_spare: Vec<(SegmentKey, FreeChunk)>,
    pub(crate) live: FxHashMap<u64, Block>,
    /// The latest free, until the next allocation (Note [Last free] in `last_free.rs`).
    pub(crate) last_free: Option<LastFree>,
    pub(crate) pending: Vec<Pending>,
    pub(crate) cache: HandleCache,
    pub(crate) stats: MemoryStats,
    pub(super) recent_frees: RecentFrees,
    /// Streams on which a block was freed since the stream was last synchronized: only their free
    /// pages may still be touched by queued work (Note [Syncs]). A handful of streams at most.
    pub(super) unsynced_frees: FxHashSet<StreamId>,
    /// The stream `free_block` last put in `unsynced_frees`, while it is still there: a cache
    /// that spares the hot path the set's hashing.
    pub(super) last_unsynced: Option<StreamId>,
    /// handle -> (segment, address) of its parked mapping (Note [Parked pages] in `parked.rs`):
    /// at most one per handle. Empty unless a growth remapped a page without a synchronization.
    pub(crate) parked_handles: FxHashMap<PhysHandle, (SegmentKey, u64)>,
    /// (segment, address) of the pages the growth in progress harvested from quiet streams and
    /// parked until its end, when each run of adjacent ones is unmapped with one call (Note
    /// [Harvest unmap runs] in `growth.rs`). Empty between calls.
    pub(crate) harvest_unmaps: Vec<(SegmentKey, u64)>,
    /// The `seq` the next segment reserved gets (Note [Segment order] in `growth.rs`).
    pub(crate) next_segment_seq: u64,
    /// Whether the driver refused a segment's reservation with its rescue space (Note [Rescue
    /// space] in `rescue.rs`): later segments are reserved without one, at no failed call more.
    pub(crate) rescue_space_refused: bool,
    /// What the driver would not take back yet (Note [Deferred releases]): events whose
    /// release failed (tried again by the next `process_events`), new segments of rolled-back
    /// growths (tried again by `empty_cache`); all given back at teardown.
    pub(crate) deferred: Deferred,
    /// This allocator's id, stamped on every allocation.
    pub(crate) owner: crate::allocator::AllocatorId,
    /// Blocks served by an alias rescue, by address (Note [Alias rescue] in `rescue.rs`).
    pub(crate) rescues: FxHashMap<u64, crate::expandable::rescue::Rescue>,
    /// Rescues whose block was freed, waiting for their teardown (Note [Alias rescue]): by the
    /// next allocation that would grow, `empty_cache` or the last resort.
    pub(crate) dead_rescues: Vec<crate::expandable::rescue::Rescue>,
    /// An OOM was raised since the last `empty_cache`: no rescue until then, unless
    /// `rescue_after_oom` (Note [Alias rescue]).
    pub(crate) rescue_paused: bool,
    /// Other streams' pages a served last resort unmapped, kept with `keep_after_retry` for the
    /// growths that would create pages of their length (Note [Kept pages] in `kept.rs`).
    pub(crate) kept: HandleCache,
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
            segments_by_slot: BTreeSet::new(),
            index: Indexes::default(),
            pieces: Pieces::default(),
            releasable: ReleaseIndex::default(),
            chunk_walk_steps: std::cell::Cell::new(0),
            listed_pieces: 0,
            chunk_cache: ChunkCache::default(),
            harvest_spare: Vec::new(),
            live: FxHashMap::default(),
            last_free: None,
            pending: Vec::new(),
            cache: HandleCache::default(),
            stats,
            recent_frees: RecentFrees::new(RECENT_FREES),
            unsynced_frees: FxHashSet::default(),
            last_unsynced: None,
            parked_handles: FxHashMap::default(),
            harvest_unmaps: Vec::new(),
            next_segment_seq: 0,
            rescue_space_refused: false,
            rescues: FxHashMap::default(),
            dead_rescues: Vec::new(),
            rescue_paused: false,
            kept: HandleCache::default(),
            deferred: Deferred::default(),
            owner: crate::allocator::AllocatorId::fresh(),
        })
    }

    /// The segments of index slot `slot`, in the order they were reserved.
    pub(crate) fn segments_of_slot(&self, slot: u32) -> Vec<SegmentKey> {
        let range = (slot, 0, SegmentKey::MIN)..=(slot, u64::MAX, SegmentKey::MAX);
        self.segments_by_slot
            .range(range)
            .map(|&(_, _, k)| k)
            .collect()
    }

    pub(crate) fn segment_of(&self, addr: u64) -> Option<SegmentKey> {
        self.segments
            .range(..=SegmentKey::search(addr))
            .next_back()
            .filter(|(_, s)| addr < s.end())
            .map(|(&k, _)| k)
    }
    /// The statistics, with the handle cache's figures read from the cache itself and the stuck
    /// chunks' from the segments: derived, not kept in step, so no error path can leave them
    /// stale.
    pub(crate) fn stats_now(&self) -> MemoryStats {
        let mut stats = self.stats;
        stats.handles_cached = (self.cache.count() + self.kept.count()) as u64;
        stats.handle_cache_bytes = (self.cache.bytes() + self.kept.bytes()) as u64;
        let stuck = self.segments.values().flat_map(|s| s.stuck.values());
        let stuck: usize = stuck.map(|c| c.len).sum();
        stats.stuck_bytes = (stuck + self.deferred.mapped_bytes()) as u64;
        stats.parked_bytes = self.segments.values().map(|s| s.parked_bytes as u64).sum();
        stats.parked_pages = self.parked_handles.len() as u64;
        let (n, bytes) = self.deferred.aliases();
        (stats.alias_mappings, stats.alias_bytes) = (n as u64, bytes as u64);
        for r in self.rescues.values().chain(&self.dead_rescues) {
            stats.rescues_in_space += u64::from(r.space.is_some());
            let (bytes, n) = (
                r.aliased.iter().sum::<usize>() as u64,
                r.aliased.len() as u64,
            );
            // A parked rescue's aliases hold no byte of a block any more: parked mappings
            // (Note [Parked rescue] in `rescue.rs`).
            if r.parked {
                (stats.parked_bytes, stats.parked_pages) =
                    (stats.parked_bytes + bytes, stats.parked_pages + n);
            } else {
                (stats.alias_bytes, stats.alias_mappings) =
                    (stats.alias_bytes + bytes, stats.alias_mappings + n);
            }
        }
        stats
    }
}
