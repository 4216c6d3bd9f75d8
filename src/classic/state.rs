//! The classic allocator's state and `malloc`, ported from PyTorch's `DeviceCachingAllocator`
//! (reference §1.3–1.9): names follow upstream so a diff against it reads line by line.

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::FxHashMap;

use crate::backend::{Access, Backend, EventId, StreamId};
use crate::classic::blocks::{Arena, Block, BlockId, Pool};
use crate::classic::device::{device_alloc, DeviceSegment};
use crate::config::{get_allocation_size, AllocConf, SMALL_SIZE};
use crate::error::{AllocError, BackendError};
use crate::mechanism::deferred::Deferred;
use crate::mechanism::oom::oom_report;
use crate::mechanism::request::{never_fits, Request};
use crate::stats::{MemoryStats, PoolKind};
use crate::units::DevAddr;

pub(crate) struct State<B: Backend> {
    pub(crate) backend: B,
    pub(crate) conf: AllocConf,
    pub(crate) access: Vec<Access>,
    pub(crate) device_total: usize,
    /// `allowed_memory_maximum`, when a memory fraction below 1 is set (`set_fraction`).
    pub(crate) allowed_memory_maximum: Option<usize>,
    /// `total_allocated_memory`: bytes of every segment.
    pub(crate) total_allocated_memory: usize,
    pub(crate) blocks: Arena,
    pub(crate) small: Pool,
    pub(crate) large: Pool,
    /// Allocated blocks by address (`active_blocks` and the pointer map in one).
    pub(crate) active: FxHashMap<u64, BlockId>,
    /// Device allocations by their first address.
    pub(crate) segments: BTreeMap<u64, DeviceSegment>,
    /// Per stream, FIFO: events of blocks used on that stream (`cuda_events`).
    pub(crate) events: BTreeMap<StreamId, VecDeque<(EventId, BlockId)>>,
    pub(crate) stats: MemoryStats,
    /// What failed `cudaMalloc` rollbacks, half-done `cudaFree`s and event releases could not
    /// give back yet (outside every segment and stat), retried by `release_cached_blocks` and
    /// at teardown (Note [Deferred releases]).
    pub(crate) deferred: Deferred,
    /// `oversize_allocations`, `oversize_segments` (current).
    pub(crate) oversize_allocations: u64,
    pub(crate) oversize_segments: u64,
    /// Successful `malloc`s so far.
    pub(crate) mallocs: u64,
    /// With [`ClassicAllocator::log_segments`](crate::ClassicAllocator::log_segments): every
    /// device allocation as (mallocs before it, size).
    pub(crate) segment_log: Option<Vec<(u64, usize)>>,
    /// `mallocs` when the log started: logged ordinals count from there.
    pub(crate) segment_log_base: u64,
    /// This allocator's id, stamped on every allocation.
    pub(crate) owner: crate::allocator::AllocatorId,
    /// Free blocks visited by the release walks so far (`release_walk_steps`).
    pub(crate) release_walk_steps: u64,
    /// The recorded `malloc` being replayed, if any (Note [Recorded mallocs]).
    pub(crate) replaying: Option<crate::classic::recorded::Replaying>,
}

/// `max_split_size` as PyTorch holds it: unlimited when unset.
fn max_split(conf: &AllocConf) -> usize {
    conf.max_split_size.unwrap_or(usize::MAX)
}

impl<B: Backend> State<B> {
    pub(crate) fn new(backend: B, conf: AllocConf) -> Result<Self, AllocError> {
        let info = backend.mem_info()?;
        let fraction = conf.per_process_memory_fraction;
        let allowed = (fraction < 1.0).then_some((info.total as f64 * fraction) as usize);
        Ok(Self {
            access: vec![Access::read_write(backend.device())],
            backend,
            conf,
            device_total: info.total,
            allowed_memory_maximum: allowed,
            total_allocated_memory: 0,
            blocks: Arena::default(),
            small: Pool::default(),
            large: Pool::default(),
            active: FxHashMap::default(),
            segments: BTreeMap::new(),
            events: BTreeMap::new(),
            stats: MemoryStats::default(),
            deferred: Deferred::default(),
            oversize_allocations: 0,
            oversize_segments: 0,
            mallocs: 0,
            segment_log: None,
            segment_log_base: 0,
            owner: crate::allocator::AllocatorId::fresh(),
            release_walk_steps: 0,
            replaying: None,
        })
    }

    /// The first block of each segment, by the segment's address: where a walk of its blocks
    /// starts.
    pub(crate) fn first_blocks(&self) -> FxHashMap<u64, BlockId> {
        self.blocks
            .iter()
            .filter(|(_, b)| b.prev.is_none())
            .map(|(id, b)| (b.ptr, id))
            .collect()
    }

    /// The free blocks of pool `kind`.
    pub(crate) fn pool_of(&self, kind: PoolKind) -> &Pool {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    pub(crate) fn pool(&mut self, kind: PoolKind) -> &mut Pool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    fn gc_enabled(&self) -> bool {
        self.allowed_memory_maximum.is_some() && self.conf.garbage_collection_threshold > 0.0
    }

    /// `malloc(size, stream)`, in PyTorch's order (reference §1.3).
    pub(crate) fn malloc(
        &mut self,
        orig_size: usize,
        stream: StreamId,
    ) -> Result<crate::Allocation, AllocError> {
        // `round_size` cannot fail below 1 EB, so checking before `process_events` (PyTorch
        // rounds after it) changes nothing.
        let Request {
            rounded: size,
            pool: kind,
            ..
        } = Request::new(orig_size, &self.conf.roundup_power2_divisions)?;
        self.process_events();
        let alloc_size = get_allocation_size(size, self.conf.large_segment_size)
            .ok_or(AllocError::TooLarge { size: orig_size })?;
        let mut found = self.get_free_block(kind, stream, size);
        if found.is_none() {
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks()?;
            }
            found = self.alloc_block(kind, stream, alloc_size, false)?;
            if found.is_none() && self.release_available_cached_blocks(kind, stream, size)? {
                found = self.alloc_block(kind, stream, alloc_size, false)?;
            }
            if found.is_none() {
                self.release_cached_blocks()?;
                found = self.alloc_block(kind, stream, alloc_size, true)?;
            }
        }
        let Some(id) = found else {
            self.stats.num_ooms += 1;
            return Err(self.oom(alloc_size));
        };
        let split = self.should_split(id, size);
        self.mallocs += 1;
        Ok(self.alloc_found_block(id, size, orig_size, split))
    }

    /// `get_free_block`: best fit on the stream, with the oversize rules of `max_split_size`.
    fn get_free_block(&mut self, kind: PoolKind, stream: StreamId, size: usize) -> Option<BlockId> {
        let gc = self.gc_enabled();
        let max_split = max_split(&self.conf);
        let rounding = self.conf.max_non_split_rounding;
        let pool = self.pool(kind);
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        let (len, id) = pool.lower_bound(stream, size)?;
        // Do not return an oversized block for a large request.
        if size < max_split && len >= max_split {
            return None;
        }
        // Allow an oversized block to be rounded up, but only within a limit.
        if size >= max_split && len >= size.saturating_add(rounding) {
            return None;
        }
        self.remove_from_pool(id);
        Some(id)
    }

    /// `should_split`: small pool, at least 512 bytes left; large pool, a request below
    /// `max_split_size` leaving more than 1 MiB.
    fn should_split(&self, id: BlockId, size: usize) -> bool {
        let b = self.blocks.at(id);
        let remaining = b.size - size;
        match b.pool {
            PoolKind::Small => remaining >= crate::config::MIN_BLOCK_SIZE,
            PoolKind::Large => size < max_split(&self.conf) && remaining > SMALL_SIZE,
        }
    }

    /// `alloc_found_block`: splits off the remainder (the new block keeps the front, as
    /// upstream) and marks the block allocated.
    fn alloc_found_block(
        &mut self,
        mut id: BlockId,
        size: usize,
        orig_size: usize,
        split: bool,
    ) -> crate::Allocation {
        let kind = self.blocks.at(id).pool;
        let already_split = self.blocks.at(id).is_split();
        if split {
            let remaining_id = id;
            let r = self.blocks.at(remaining_id);
            let prev = r.prev;
            let front = Block {
                prev,
                next: Some(remaining_id),
                ..Block::free(r.ptr, size, r.stream, r.pool)
            };
            id = self.blocks.insert(front);
            if let Some(p) = prev {
                self.blocks.at_mut(p).next = Some(id);
            }
            let rem = self.blocks.at_mut(remaining_id);
            rem.prev = Some(id);
            rem.ptr += size as u64;
            rem.size -= size;
            let rem_size = rem.size;
            self.insert_into_blocks(remaining_id);
            if already_split {
                self.stats.inactive_split_bytes.decrease(kind, size as u64);
            } else {
                self.stats
                    .inactive_split_bytes
                    .increase(kind, rem_size as u64);
                self.stats.inactive_split.increase(kind, 1);
            }
        } else if already_split {
            let len = self.blocks.at(id).size as u64;
            self.stats.inactive_split_bytes.decrease(kind, len);
            self.stats.inactive_split.decrease(kind, 1);
        }
        self.mark_allocated(id, orig_size)
    }

    /// Hands out block `id` for a request of `requested` bytes: marks it allocated and counts it
    /// (`alloc_found_block`'s bookkeeping, shared with seeding).
    pub(crate) fn mark_allocated(&mut self, id: BlockId, requested: usize) -> crate::Allocation {
        let b = self.blocks.at_mut(id);
        b.allocated = true;
        b.requested = requested;
        let (ptr, len, stream, kind) = (b.ptr, b.size, b.stream, b.pool);
        self.active.insert(ptr, id);
        self.stats.count_allocated(kind, len, requested);
        if len >= max_split(&self.conf) {
            self.oversize_allocations += 1;
        }
        crate::Allocation {
            ptr: DevAddr::new(ptr),
            size: len,
            requested,
            stream,
            owner: self.owner,
        }
    }

    /// Puts a free block into its pool, stamping its GC age.
    pub(crate) fn insert_into_blocks(&mut self, id: BlockId) {
        let kind = self.blocks.at(id).pool;
        let clock = self.pool(kind).get_free_blocks_call_count;
        let b = self.blocks.at_mut(id);
        b.gc_count_base = clock;
        let (key, whole) = (b.key(id), !b.is_split());
        self.pool(kind).insert(key, whole);
    }

    /// Takes a free block out of its pool.
    pub(crate) fn remove_from_pool(&mut self, id: BlockId) {
        let b = self.blocks.at(id);
        let (kind, key) = (b.pool, b.key(id));
        self.pool(kind).remove(&key);
    }

    /// `alloc_block`: a new segment of `alloc_size`, unless the memory fraction or the device
    /// says no (`None`). Errors other than out-of-memory are returned.
    fn alloc_block(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        alloc_size: usize,
        is_retry: bool,
    ) -> Result<Option<BlockId>, AllocError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        self.complete_pending()?;
        if self.refuse_device_alloc(is_retry) {
            return Ok(None);
        }
        if let Some(max) = self.allowed_memory_maximum {
            if self.total_allocated_memory.saturating_add(alloc_size) > max {
                return Ok(None);
            }
        }
        // A segment larger than the whole device: the driver would refuse the `cudaMalloc`, so
        // it is not made (issue 21: no driver work for a request that cannot fit). The caller
        // goes on as PyTorch does: it frees the cache, retries (counted) and reports the OOM.
        if never_fits(alloc_size, self.device_total) {
            return Ok(None);
        }
        let seg = match self.device_malloc(alloc_size) {
            Ok(seg) => seg,
            Err(e) if e.is_out_of_memory() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let ptr = seg.va.start.get();
        self.segments.insert(ptr, seg);
        self.total_allocated_memory += alloc_size;
        let id = self
            .blocks
            .insert(Block::free(ptr, alloc_size, stream, kind));
        self.stats.segment.increase(kind, 1);
        self.stats.reserved_bytes.increase(kind, alloc_size as u64);
        if alloc_size >= max_split(&self.conf) {
            self.oversize_segments += 1;
        }
        self.stats.num_device_alloc += 1;
        if let Some(log) = &mut self.segment_log {
            log.push((self.mallocs - self.segment_log_base, alloc_size));
        }
        Ok(Some(id))
    }

    /// A segment for [`State::seed_segment`]: `alloc_block` without a retry.
    pub(crate) fn alloc_block_for_seed(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        size: usize,
    ) -> Result<Option<BlockId>, AllocError> {
        self.alloc_block(kind, stream, size, false)
    }

    /// One `cudaMalloc`, its backend calls counted by kind.
    fn device_malloc(&mut self, size: usize) -> Result<DeviceSegment, BackendError> {
        device_alloc(
            &self.backend,
            &mut self.stats,
            size,
            &self.access,
            &mut self.deferred,
        )
    }

    pub(crate) fn oom(&mut self, alloc_size: usize) -> AllocError {
        let held = self.stats.reserved_bytes.all.current;
        let allowed = self.allowed_memory_maximum;
        oom_report(
            &self.backend,
            &mut self.stats,
            alloc_size,
            self.device_total,
            allowed,
            held,
            false,
        )
    }
}
