//! A classic segment on the device: the `cudaMalloc` / `cudaFree` of PyTorch's caching allocator.
//!
//! Built from the backend's VMM calls (reserve, create, map, set access; and back), which on a
//! GPU is what `cuMemAlloc` does inside the driver. Counted as one device allocation in the
//! stats (`num_device_alloc`), as PyTorch counts one `cudaMalloc`. A failure half-way gives back
//! what was taken, so a failed `cudaMalloc` changes nothing (what the backend refuses to take
//! back is deferred and given back later: Note [Deferred releases] in `mechanism/deferred.rs`).

use crate::backend::{Access, Backend, CallKind, PhysHandle};
use crate::error::BackendError;
use crate::mechanism::counters::track;
use crate::mechanism::deferred::{release_handle, Deferred, Leftover};
use crate::stats::MemoryStats;
use crate::units::VaRange;

/// One device allocation backing a classic segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceSegment {
    pub(crate) va: VaRange,
    pub(crate) handle: PhysHandle,
    /// Bytes mapped: the segment's size rounded up to the backend's granularity.
    pub(crate) mapped: usize,
}

/// `cudaMalloc(size)`: `size` bytes, rounded up to the granularity behind the scenes. On failure
/// what was taken is given back; what cannot be is kept in `deferred` (Note [Deferred releases]).
pub(crate) fn device_alloc<B: Backend>(
    backend: &B,
    stats: &mut MemoryStats,
    size: usize,
    access: &[Access],
    deferred: &mut Deferred,
) -> Result<DeviceSegment, BackendError> {
    let mapped = size.next_multiple_of(backend.granularity());
    let va = track(stats, CallKind::Reserve, backend.reserve(mapped))?;
    let mut undo = |stats: &mut MemoryStats, left: Leftover| {
        deferred.give_back_or_keep(backend, stats, left, &mut release_handle);
    };
    let handle = match track(stats, CallKind::Create, backend.create(mapped)) {
        Ok(h) => h,
        Err(e) => {
            undo(stats, Leftover::reservation(va));
            return Err(e);
        }
    };
    if let Err(e) = track(
        stats,
        CallKind::Map,
        backend.map(va.start, mapped, handle, 0),
    ) {
        undo(stats, Leftover::reservation(va).with_handle(handle, mapped));
        return Err(e);
    }
    let access = backend.set_access(va.start, mapped, access);
    if let Err(e) = track(stats, CallKind::SetAccess, access) {
        undo(
            stats,
            Leftover::reservation(va).with_mapping(va.start, mapped, handle),
        );
        return Err(e);
    }
    stats.bytes_created += mapped as u64;
    Ok(DeviceSegment { va, handle, mapped })
}

/// How a `cudaFree` failed.
pub(crate) enum FreeFailed {
    /// The unmap failed: nothing changed, the segment is still whole and usable.
    Untouched(BackendError),
    /// The segment is unmapped (gone for the allocator) but the rest could not be given back:
    /// keep what is left and try again later.
    Partly(BackendError, Box<Leftover>),
}

/// `cudaFree`: gives the segment back: unmap, release, free the reservation.
pub(crate) fn device_free<B: Backend>(
    backend: &B,
    stats: &mut MemoryStats,
    seg: &DeviceSegment,
) -> Result<(), FreeFailed> {
    let mut left = Leftover::reservation(seg.va).with_mapping(seg.va.start, seg.mapped, seg.handle);
    match left.give_back(backend, stats, &mut release_handle) {
        Ok(()) => Ok(()),
        Err(e) if left.is_mapped() => Err(FreeFailed::Untouched(e)),
        Err(e) => Err(FreeFailed::Partly(e, Box::new(left))),
    }
}
