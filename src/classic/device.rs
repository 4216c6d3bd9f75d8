//! A classic segment on the device: the `cudaMalloc` / `cudaFree` of PyTorch's caching allocator.
//!
//! Built from the backend's VMM calls (reserve, create, map, set access; and back), which on a
//! GPU is what `cuMemAlloc` does inside the driver. Counted as one device allocation in the
//! stats (`num_device_alloc`), as PyTorch counts one `cudaMalloc`. A failure half-way gives back
//! what was taken, so a failed `cudaMalloc` changes nothing.

use crate::backend::{Access, Backend, CallKind, PhysHandle};
use crate::error::BackendError;
use crate::expandable::track;
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

/// `cudaMalloc(size)`: `size` bytes, rounded up to the granularity behind the scenes.
pub(crate) fn device_alloc<B: Backend>(
    backend: &B,
    stats: &mut MemoryStats,
    size: usize,
    access: &[Access],
) -> Result<DeviceSegment, BackendError> {
    let mapped = size.next_multiple_of(backend.granularity());
    let va = track(stats, CallKind::Reserve, backend.reserve(mapped))?;
    let handle = match track(stats, CallKind::Create, backend.create(mapped)) {
        Ok(h) => h,
        Err(e) => {
            let _ = track(
                stats,
                CallKind::FreeReservation,
                backend.free_reservation(va),
            );
            return Err(e);
        }
    };
    let undo = |stats: &mut MemoryStats, mapped_yet: bool| {
        if mapped_yet {
            let _ = track(stats, CallKind::Unmap, backend.unmap(va.start, mapped));
        }
        let _ = track(stats, CallKind::Release, backend.release(handle));
        let _ = track(
            stats,
            CallKind::FreeReservation,
            backend.free_reservation(va),
        );
    };
    if let Err(e) = track(
        stats,
        CallKind::Map,
        backend.map(va.start, mapped, handle, 0),
    ) {
        undo(stats, false);
        return Err(e);
    }
    let access = backend.set_access(va.start, mapped, access);
    if let Err(e) = track(stats, CallKind::SetAccess, access) {
        undo(stats, true);
        return Err(e);
    }
    stats.bytes_created += mapped as u64;
    Ok(DeviceSegment { va, handle, mapped })
}

/// `cudaFree`: gives the segment back. Stops at the first error (the segment then stays
/// accounted for by the caller, and teardown tries again).
pub(crate) fn device_free<B: Backend>(
    backend: &B,
    stats: &mut MemoryStats,
    seg: &DeviceSegment,
) -> Result<(), BackendError> {
    track(
        stats,
        CallKind::Unmap,
        backend.unmap(seg.va.start, seg.mapped),
    )?;
    track(stats, CallKind::Release, backend.release(seg.handle))?;
    track(
        stats,
        CallKind::FreeReservation,
        backend.free_reservation(seg.va),
    )
}
