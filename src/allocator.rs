//! The contract both allocators meet: [`Allocator`] and [`Allocation`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use crate::backend::StreamId;
use crate::error::AllocError;
pub use crate::mechanism::owner::AllocatorId;
use crate::snapshot::Snapshot;
use crate::stats::MemoryStats;
use crate::units::DevAddr;

/// A live allocation. Move-only: give it back with [`Allocator::deallocate`], or take its address
/// with [`Allocation::into_ptr`] and free that with [`Allocator::deallocate_ptr`].
///
/// Dropping it otherwise loses the memory until the allocator is dropped: such a drop is counted
/// ([`leaked_allocations`]) and, in debug builds, reported once on stderr. For memory that frees
/// itself, use a buffer ([`crate::buffer::Buffer`], or `DeviceBuffer<T>` with cudarc).
#[derive(PartialEq, Eq, Debug)]
#[must_use = "dropping an Allocation leaks its memory until the allocator is dropped; give it back with Allocator::deallocate"]
pub struct Allocation {
    pub(crate) ptr: DevAddr,
    pub(crate) size: usize,
    pub(crate) requested: usize,
    pub(crate) stream: StreamId,
    /// The allocator that made it: any other refuses it ([`AllocError::ForeignAllocation`]).
    pub(crate) owner: AllocatorId,
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
    /// The allocator that made it: only that one takes it back.
    pub fn allocator(&self) -> AllocatorId {
        self.owner
    }

    /// Gives up the handle and returns the address: the caller now owns the memory and frees it
    /// with [`Allocator::deallocate_ptr`] (what a C caller or a pointer-keyed table does). Not
    /// counted as a leak.
    #[must_use = "the address is the only way left to free this memory"]
    pub fn into_ptr(self) -> DevAddr {
        let ptr = self.ptr;
        std::mem::forget(self);
        ptr
    }
}

/// Allocations dropped without being given back, in this process (see [`leaked_allocations`]).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Leaks {
    /// How many.
    pub allocations: u64,
    /// Their bytes (usable sizes).
    pub bytes: u64,
}

static LEAKED_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static LEAKED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Allocations dropped in this process without [`Allocator::deallocate`] or
/// [`Allocation::into_ptr`]: their memory stays allocated until its allocator is dropped. Counted
/// process-wide: an `Allocation` knows its allocator's id, not the allocator.
pub fn leaked_allocations() -> Leaks {
    Leaks {
        allocations: LEAKED_ALLOCATIONS.load(Ordering::Relaxed),
        bytes: LEAKED_BYTES.load(Ordering::Relaxed),
    }
}

/// Counts one leaked allocation of `bytes`.
pub(crate) fn count_leak(bytes: usize) {
    LEAKED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    LEAKED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

impl Drop for Allocation {
    fn drop(&mut self) {
        count_leak(self.size);
        // The one report a leak gets: a drop cannot return an error, and a silent leak is what
        // this exists to prevent. Debug builds only, once per process, never a panic.
        if cfg!(debug_assertions) {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "vmm-alloc: an Allocation of {} bytes at {} was dropped without \
                     Allocator::deallocate; its memory stays allocated (further leaks are counted \
                     in vmm_alloc::allocator::leaked_allocations(), not reported)",
                    self.size, self.ptr
                );
            });
        }
    }
}

/// A stream-ordered caching allocator of device memory. Thread-safe; one per device.
pub trait Allocator: Send + Sync {
    /// Allocates at least `size` bytes for use on `stream`.
    #[must_use = "the allocation's memory stays allocated until it is given back with deallocate"]
    fn allocate(&self, size: usize, stream: StreamId) -> Result<Allocation, AllocError>;

    /// Frees an allocation. Its memory is reused on its stream at once, and on other streams only
    /// after the work of every stream given to [`Allocator::record_stream`] completes. An
    /// allocation made by another allocator is refused ([`AllocError::ForeignAllocation`]) and
    /// nothing changes.
    fn deallocate(&self, allocation: Allocation) -> Result<(), AllocError>;

    /// Frees the allocation that starts at `ptr`. An address alone cannot tell two allocators
    /// apart: a pointer that is not live here is refused ([`AllocError::InvalidPointer`]), but
    /// one that another allocator handed out at an address live here too frees this one's block
    /// (prefer [`Allocator::deallocate`], which checks the allocator).
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
