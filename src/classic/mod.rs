//! `ClassicAllocator`: a faithful port of PyTorch's native CUDA caching allocator
//! (`DeviceCachingAllocator`, expandable segments off), the baseline users run today.
//!
//! A *segment* is one device allocation (`cudaMalloc`): 2 MiB for small requests (≤ 1 MiB),
//! 20 MiB (`large_segment_size`) for requests below 10 MiB, else the request rounded to 2 MiB.
//! Free blocks are found best-fit by (stream, size, address), split when enough is left
//! (`should_split`), and merged only with free neighbours of the same segment, so memory freed in
//! one segment never serves a request larger than the segment's largest free run: that is the
//! fragmentation expandable segments remove. `max_split_size`, `roundup_power2_divisions`,
//! `garbage_collection_threshold` and `per_process_memory_fraction` act as in PyTorch; on a failed
//! `cudaMalloc` it frees oversize blocks, then every free segment, and retries, as upstream
//! (reference `pytorch-allocator.md` §1).

mod blocks;
mod check;
mod device;
mod recorded;
mod release;
mod seed;
mod state;

pub use seed::SeedBlock;

use crate::sync::Mutex;

use crate::allocator::{Allocation, Allocator, AllocatorId};
use crate::backend::{Backend, StreamId};
use crate::config::{parse_alloc_conf, AllocConf};
use crate::error::AllocError;
use crate::mechanism::owner::take_back;
use crate::snapshot::{BlockInfo, BlockState, SegmentInfo, Snapshot};
use crate::stats::MemoryStats;
use crate::units::DevAddr;

use blocks::BlockId;
use state::State;

/// PyTorch's classic caching allocator: see the [module docs](self).
///
/// ```
/// use vmm_alloc::{Allocator, SimBackend, StreamId};
/// use vmm_alloc::classic::ClassicAllocator;
/// let alloc = ClassicAllocator::with_alloc_conf(SimBackend::new(), "").unwrap();
/// let a = alloc.allocate(3 << 20, StreamId::DEFAULT).unwrap();
/// assert_eq!(alloc.stats().reserved_bytes.all.current, 20 << 20); // one 20 MiB segment
/// alloc.deallocate(a).unwrap();
/// alloc.empty_cache().unwrap();
/// assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
/// ```
pub struct ClassicAllocator<B: Backend> {
    state: Mutex<State<B>>,
    /// Stamped on every allocation; checked outside the lock when one is given back.
    owner: AllocatorId,
}

impl<B: Backend> ClassicAllocator<B> {
    /// An allocator over `backend` configured as PyTorch by `conf`.
    pub fn new(backend: B, conf: AllocConf) -> Result<Self, AllocError> {
        let state = State::new(backend, conf)?;
        Ok(Self {
            owner: state.owner,
            state: Mutex::new(state),
        })
    }

    /// An allocator configured by a `PYTORCH_CUDA_ALLOC_CONF` string (errors as PyTorch's).
    pub fn with_alloc_conf(backend: B, conf: &str) -> Result<Self, AllocError> {
        Self::new(backend, parse_alloc_conf(conf)?)
    }

    /// The configuration in force.
    pub fn alloc_conf(&self) -> AllocConf {
        self.state.lock().conf.clone()
    }

    /// Starts (or restarts) logging every device allocation (`cudaMalloc`): what a recorded
    /// trace's `segment_alloc` entries are compared with.
    pub fn log_segments(&self) {
        let mut s = self.state.lock();
        s.segment_log = Some(Vec::new());
        s.segment_log_base = s.mallocs;
    }

    /// Starts from a recorded state: one device allocation of `size` bytes on `stream` in the
    /// small or large pool, with `blocks` (sorted by offset, disjoint, multiples of 512)
    /// allocated in it and the gaps cached as free blocks, as a traced program's
    /// allocator had them. Returns the allocations in the order given; on error nothing changed.
    pub fn seed_segment(
        &self,
        size: usize,
        stream: StreamId,
        small: bool,
        blocks: &[SeedBlock],
    ) -> Result<Vec<Allocation>, AllocError> {
        let kind = if small {
            crate::stats::PoolKind::Small
        } else {
            crate::stats::PoolKind::Large
        };
        self.state.lock().seed_segment(size, stream, kind, blocks)
    }

    /// `malloc(size, stream)` as a PyTorch memory snapshot recorded it, for a faithful replay
    /// of a call that needed a new segment: `frees` (allocations the trace freed since the
    /// previous call, some of them pending blocks PyTorch completed only inside this call)
    /// are freed after the search for a cached block, and the device refuses every allocation
    /// but the final retry until the call has released `released_segments` segments, as the
    /// recording GPU did. The port's own `malloc` decides what to release (oversize blocks
    /// first with `max_split_size`, old blocks with the garbage collector, else every free
    /// segment). The frees happen whatever the outcome. See `classic/recorded.rs`.
    pub fn allocate_as_recorded(
        &self,
        size: usize,
        stream: StreamId,
        frees: Vec<Allocation>,
        released_segments: usize,
    ) -> Result<Allocation, AllocError> {
        let pending = frees
            .into_iter()
            .map(|a| take_back(self.owner, a))
            .collect::<Result<Vec<_>, _>>()?;
        self.state
            .lock()
            .malloc_as_recorded(size, stream, pending, released_segments)
    }

    /// The device allocations logged since [`ClassicAllocator::log_segments`], each as
    /// (successful allocations since the log started before it, its size); empty when not
    /// logging.
    pub fn segment_log(&self) -> Vec<(u64, usize)> {
        self.state.lock().segment_log.clone().unwrap_or_default()
    }

    /// Checks every internal invariant (segments tiled by their blocks, free blocks filed in
    /// their pool and merged, pending blocks and their events, stats equal to the sums) and
    /// returns the first violation. Walks the whole state: for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), crate::InvariantViolation> {
        self.state.lock().check()
    }

    /// Free blocks the release walks (`release_cached_blocks`, the garbage collector) have
    /// visited so far: work that must grow with what they free, not with every free block
    /// (issue 21). A test kit counter.
    #[cfg(feature = "testkit")]
    pub fn release_walk_steps(&self) -> u64 {
        self.state.lock().release_walk_steps
    }

    /// `oversize_allocations` and `oversize_segments` (current): blocks and segments of at least
    /// `max_split_size` bytes.
    pub fn oversize(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.oversize_allocations, s.oversize_segments)
    }
}

impl<B: Backend> std::fmt::Debug for ClassicAllocator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = self.state.lock().backend.name();
        f.debug_struct("ClassicAllocator")
            .field("backend", &backend)
            .field("held_bytes", &self.held_bytes())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Allocator for ClassicAllocator<B> {
    fn allocate(&self, size: usize, stream: StreamId) -> Result<Allocation, AllocError> {
        self.state.lock().malloc(size, stream)
    }

    fn deallocate(&self, allocation: Allocation) -> Result<(), AllocError> {
        self.deallocate_ptr(take_back(self.owner, allocation)?)
    }

    fn deallocate_ptr(&self, ptr: DevAddr) -> Result<(), AllocError> {
        let mut s = self.state.lock();
        s.free(ptr).map_err(|e| match e {
            // A pointer that starts a free (or pending) block was freed already.
            AllocError::InvalidPointer(p)
                if s.blocks
                    .iter()
                    .any(|(_, b)| b.ptr == p.get() && !b.allocated) =>
            {
                AllocError::DoubleFree(p)
            }
            other => other,
        })
    }

    fn record_stream(&self, ptr: DevAddr, stream: StreamId) -> Result<(), AllocError> {
        self.state.lock().record_stream(ptr, stream)
    }

    fn empty_cache(&self) -> Result<(), AllocError> {
        self.state.lock().release_cached_blocks()
    }

    fn stats(&self) -> MemoryStats {
        self.state.lock().stats
    }

    fn held_bytes(&self) -> u64 {
        let s = &self.state.lock().stats;
        s.reserved_bytes.all.current + s.handle_cache_bytes
    }

    fn reset_peak_stats(&self) {
        self.state.lock().stats.reset_peak();
    }

    fn snapshot(&self) -> Snapshot {
        let s = self.state.lock();
        let pending: std::collections::HashSet<BlockId> = s
            .events
            .values()
            .flat_map(|q| q.iter().map(|&(_, id)| id))
            .collect();
        let first = s.first_blocks();
        let mut segments = Vec::new();
        for (&base, seg) in &s.segments {
            let mut blocks = Vec::new();
            let mut cursor = first.get(&base).copied();
            let (mut total, mut allocated, mut stream, mut pool) =
                (0, 0, StreamId::DEFAULT, crate::stats::PoolKind::Large);
            while let Some(id) = cursor {
                let Some(b) = s.blocks.get(id) else { break };
                let state = if b.allocated {
                    allocated += b.size;
                    BlockState::ActiveAllocated
                } else if pending.contains(&id) {
                    BlockState::ActivePendingFree
                } else {
                    BlockState::Inactive
                };
                let live = state != BlockState::Inactive;
                blocks.push(BlockInfo {
                    address: DevAddr::new(b.ptr),
                    size: b.size,
                    requested_size: if live { b.requested } else { 0 },
                    state,
                });
                total += b.size;
                (stream, pool) = (b.stream, b.pool);
                cursor = b.next;
            }
            segments.push(SegmentInfo {
                address: seg.va.start,
                total_size: total,
                mapped_size: total,
                allocated_size: allocated,
                stream,
                pool,
                blocks,
            });
        }
        Snapshot { segments }
    }
}

impl<B: Backend> Drop for ClassicAllocator<B> {
    /// Gives every segment and event back to the backend, live blocks included; errors are
    /// ignored (there is no one to report them to).
    fn drop(&mut self) {
        let s = self.state.get_mut();
        for (_, queue) in std::mem::take(&mut s.events) {
            for (e, _) in queue {
                let _ = s.backend.release_event(e);
            }
        }
        for (_, seg) in std::mem::take(&mut s.segments) {
            if let Err(device::FreeFailed::Partly(_, left)) =
                device::device_free(&s.backend, &mut s.stats, &seg)
            {
                s.deferred.keep(*left);
            }
        }
        s.deferred.abandon_all(&s.backend);
    }
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ClassicAllocator<crate::SimBackend>>();
};
