//! Buffers: device memory that gives itself back to its allocator when dropped, stream-ordered.
//!
//! [`Buffer`] is the backend-generic core: it owns one allocation of an allocator it keeps alive
//! (`Arc`), remembers the stream it was allocated on (its *home* stream) and the other streams it
//! was used on, and frees itself on drop. `DeviceBuffer<T>` (feature `cuda`, [`cuda`]) is a thin
//! typed layer over it that cudarc accepts wherever it accepts its own device memory.
//!
//! Note [Stream-ordered drop]: dropping a buffer never waits for the device. The memory goes back
//! to the allocator at once, as in PyTorch's caching allocator:
//! * on the home stream it may be handed out again immediately: whatever uses it next on that
//!   stream is queued after the work already queued there, so a kernel still running on the old
//!   contents finishes first;
//! * for every other stream the buffer was used on ([`Buffer::record_stream`], PyTorch's
//!   `Tensor.record_stream`), the allocator records an event on that stream at the free and reuses
//!   the memory only after the event completes;
//! * pages are unmapped only after the streams that freed blocks on them are synchronized (both
//!   allocators do that before giving memory back to the device).
//!
//! So a buffer may be dropped while a kernel using it still runs, on any stream, provided every
//! stream other than the home one was declared. A drop whose free fails (its events could not be
//! recorded: a driver error) cannot report it; the memory then stays allocated and is counted as a
//! leak ([`crate::allocator::leaked_allocations`]). [`Buffer::free`] reports that error instead.

#[cfg(feature = "cuda")]
pub mod cuda;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[cfg(feature = "cuda")]
pub use cuda::{CudaMemory, DeviceBuffer, DeviceBufferError};

use crate::allocator::{count_leak, Allocation, Allocator, AllocatorId};
use crate::backend::StreamId;
use crate::error::AllocError;
use crate::units::DevAddr;

/// No foreign stream recorded yet (stream ids are stored `+ 1` so that 0 can mean "none").
const NO_STREAM: u64 = 0;

/// Bytes of device memory owned by one allocation of an allocator, returned to it on drop
/// (Note [Stream-ordered drop]). `Send + Sync`: a buffer may be used and dropped on any thread.
pub struct Buffer<A: Allocator + ?Sized> {
    allocator: Arc<A>,
    ptr: DevAddr,
    /// Bytes asked for (the allocation may be larger).
    len: usize,
    /// Bytes of the allocation (its rounded size) and the allocator that made it: with the
    /// address, the stream and `len`, the allocation itself, given back whole on drop so that an
    /// allocator's front cache can stash it without its lock (Note [Front cache]).
    size: usize,
    owner: AllocatorId,
    home: StreamId,
    /// The last stream other than `home` declared with `record_stream`, `+ 1` (0: none): a buffer
    /// used over and over on one side stream tells the allocator once, not per use.
    last_recorded: AtomicU64,
}

impl<A: Allocator + ?Sized> Buffer<A> {
    /// Allocates `len` bytes from `allocator` for use on `stream`.
    pub fn new(allocator: &Arc<A>, len: usize, stream: StreamId) -> Result<Self, AllocError> {
        let allocation = allocator.allocate(len, stream)?;
        Ok(Self::adopt(allocator.clone(), allocation))
    }

    /// Takes ownership of an allocation made by `allocator`: it is freed when the buffer drops.
    /// Giving an allocation of another allocator makes that free fail (counted as a leak).
    pub fn adopt(allocator: Arc<A>, allocation: Allocation) -> Self {
        let len = allocation.requested();
        let home = allocation.stream();
        let size = allocation.size();
        let owner = allocation.allocator();
        let ptr = allocation.into_ptr();
        Self {
            allocator,
            ptr,
            len,
            size,
            owner,
            home,
            last_recorded: AtomicU64::new(NO_STREAM),
        }
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> DevAddr {
        self.ptr
    }

    /// Bytes owned (as asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes (never true: allocations are at least 1 byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stream the buffer was allocated on.
    pub fn stream(&self) -> StreamId {
        self.home
    }

    /// The allocator the memory returns to.
    pub fn allocator(&self) -> &Arc<A> {
        &self.allocator
    }

    /// The address and length of bytes `range` of the buffer, or `None` when the range is empty,
    /// reversed or reaches past the end.
    pub fn range(&self, range: Range<usize>) -> Option<(DevAddr, usize)> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        Some((self.ptr.checked_add(range.start)?, range.end - range.start))
    }

    /// Declares that work on `stream` uses this buffer (PyTorch's `record_stream`): when it is
    /// dropped, its memory is not reused before the work queued on `stream` until then completes.
    /// Nothing to do for the home stream; a repeat of the last declared stream skips the
    /// allocator.
    pub fn record_stream(&self, stream: StreamId) -> Result<(), AllocError> {
        if stream == self.home {
            return Ok(());
        }
        let tagged = stream.raw().wrapping_add(1);
        if self.last_recorded.load(Ordering::Relaxed) == tagged {
            return Ok(());
        }
        self.allocator.record_stream(self.ptr, stream)?;
        self.last_recorded.store(tagged, Ordering::Relaxed);
        Ok(())
    }

    /// Frees the buffer now, reporting a failure the drop could only count (the memory then
    /// stays allocated and is counted as a leak, as on drop).
    pub fn free(mut self) -> Result<(), AllocError> {
        let freed = self.give_back();
        if freed.is_err() {
            count_leak(self.len);
        }
        freed
    }

    /// Returns the memory to the allocator as the allocation it was; the buffer holds nothing
    /// after.
    fn give_back(&mut self) -> Result<(), AllocError> {
        let allocation = Allocation {
            ptr: self.ptr,
            size: self.size,
            requested: self.len,
            stream: self.home,
            owner: self.owner,
        };
        self.ptr = FREED;
        self.allocator.deallocate(allocation)
    }
}

/// The address of a buffer already given back by [`Buffer::free`] (no allocation starts at 0).
const FREED: DevAddr = DevAddr::new(0);

impl<A: Allocator + ?Sized> Drop for Buffer<A> {
    fn drop(&mut self) {
        if self.ptr != FREED && self.give_back().is_err() {
            count_leak(self.len);
        }
    }
}

impl<A: Allocator + ?Sized> std::fmt::Debug for Buffer<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("stream", &self.home)
            .finish()
    }
}
