//! The contract both allocators meet: [`Allocator`] and [`Allocation`].

use crate::backend::StreamId;
use crate::error::AllocError;
use crate::snapshot::Snapshot;
use crate::stats::MemoryStats;
use crate::units::DevAddr;

/// A live allocation. Move-only: give it back with [`Allocator::deallocate`] (or free it by address
/// with [`Allocator::deallocate_ptr`]). Dropping it frees nothing: its memory stays allocated
/// until the allocator itself is dropped.
#[derive(PartialEq, Eq, Debug)]
#[must_use = "dropping an Allocation leaks its memory until the allocator is dropped; give it back with Allocator::deallocate"]
pub struct Allocation {
    pub(crate) ptr: DevAddr,
    pub(crate) size: usize,
    pub(crate) requested: usize,
    pub(crate) stream: StreamId,
}

impl Allocation {
    /// The device address: at least 512-byte aligned.
    pub fn ptr(&self) -> DevAddr {
        self.ptr
    }
    /// Usable bytes: the rounded size, at least [`Allocation::requested`].
    pub fn size(&self) -> usize {
        self.size
    }
    /// Bytes asked for.
    pub fn requested(&self) -> usize {
        self.requested
    }
    /// The stream it was allocated on: it may be reused on that stream as soon as it is freed.
    pub fn stream(&self) -> StreamId {
        self.stream
    }
}

/// A stream-ordered caching allocator of device memory. Thread-safe; one per device.
pub trait Allocator: Send + Sync {
    /// Allocates at least `size` bytes for use on `stream`.
    #[must_use = "the allocation's memory stays allocated until it is given back with deallocate"]
    fn allocate(&self, size: usize, stream: StreamId) -> Result<Allocation, AllocError>;

    /// Frees an allocation. Its memory is reused on its stream at once, and on other streams only
    /// after the work of every stream given to [`Allocator::record_stream`] completes.
    fn deallocate(&self, allocation: Allocation) -> Result<(), AllocError> {
        self.deallocate_ptr(allocation.ptr)
    }

    /// Frees the allocation that starts at `ptr`.
    fn deallocate_ptr(&self, ptr: DevAddr) -> Result<(), AllocError>;

    /// Declares that the allocation at `ptr` is also used by work on `stream`: when it is freed,
    /// its memory is not reused before that work completes.
    fn record_stream(&self, ptr: DevAddr, stream: StreamId) -> Result<(), AllocError>;

    /// Returns every cached byte that no allocation uses to the device.
    fn empty_cache(&self) -> Result<(), AllocError>;

    /// Statistics, with PyTorch's names.
    fn stats(&self) -> MemoryStats;

    /// Device memory the allocator holds right now: `reserved_bytes` plus cached physical
    /// handles (`handle_cache_bytes`), what `nvidia-smi` would show. The same figure as from
    /// [`stats`](Self::stats), without copying every statistic: a replay asks after every event.
    fn held_bytes(&self) -> u64 {
        let s = self.stats();
        s.reserved_bytes.all.current + s.handle_cache_bytes
    }

    /// Sets every peak statistic to its current value.
    fn reset_peak_stats(&self);

    /// Segments and blocks right now, enough to draw the state.
    fn snapshot(&self) -> Snapshot;
}
