//! A classic segment on the device: the `cudaMalloc` / `cudaFree` of PyTorch's caching allocator.
//!
//! Built from the backend's VMM calls (reserve, create, map, set access; and back), which on a
//! GPU is what `cuMemAlloc` does inside the driver. Counted as one device allocation in the
//! stats (`num_device_alloc`), as PyTorch counts one `cudaMalloc`. A failure half-way gives back
//! what was taken, so a failed `cudaMalloc` changes nothing (what the backend refuses to take
//! back is kept as [`Debris`] and given back later).

use crate::backend::{Access, Backend, CallKind, PhysHandle};
use crate::error::BackendError;
use crate::expandable::track;
use crate::stats::MemoryStats;
use crate::units::{DevAddr, VaRange};

/// One device allocation backing a classic segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceSegment {
    pub(crate) va: VaRange,
    pub(crate) handle: PhysHandle,
    /// Bytes mapped: the segment's size rounded up to the backend's granularity.
    pub(crate) mapped: usize,
}

/// What a failed `cudaMalloc` rollback or a half-done `cudaFree` could not give back yet: a
/// mapping still to unmap, a handle still to release, a reservation still to free (each `None`
/// once done). It belongs to no segment, so no block can ever be carved from it; the allocator
/// keeps it and tries again on the next `empty_cache` and at teardown, so nothing is stranded in
/// the backend (a `cudaFree` that fails after its unmap must neither keep the unmapped segment in
/// the pool, where its blocks would be handed out, nor forget the handle and the reservation).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Debris {
    pub(crate) mapped: Option<(DevAddr, usize)>,
    pub(crate) handle: Option<PhysHandle>,
    pub(crate) va: Option<VaRange>,
}

impl Debris {
    /// Gives back what is left, in order (unmap, release, free the reservation), stopping at the
    /// first error; what was done is cleared, so a retry goes on from there.
    pub(crate) fn give_back<B: Backend>(
        &mut self,
        backend: &B,
        stats: &mut MemoryStats,
    ) -> Result<(), BackendError> {
        if let Some((at, len)) = self.mapped {
            track(stats, CallKind::Unmap, backend.unmap(at, len))?;
            self.mapped = None;
        }
        if let Some(h) = self.handle {
            track(stats, CallKind::Release, backend.release(h))?;
            self.handle = None;
        }
        if let Some(va) = self.va {
            track(
                stats,
                CallKind::FreeReservation,
                backend.free_reservation(va),
            )?;
            self.va = None;
        }
        Ok(())
    }
}

/// `cudaMalloc(size)`: `size` bytes, rounded up to the granularity behind the scenes. On failure
/// what was taken is given back; what cannot be is pushed to `debris`.
pub(crate) fn device_alloc<B: Backend>(
    backend: &B,
    stats: &mut MemoryStats,
    size: usize,
    access: &[Access],
    debris: &mut Vec<Debris>,
) -> Result<DeviceSegment, BackendError> {
    let mapped = size.next_multiple_of(backend.granularity());
    let va = track(stats, CallKind::Reserve, backend.reserve(mapped))?;
    let mut undo = |stats: &mut MemoryStats, handle: Option<PhysHandle>, mapped_yet: bool| {
        let mut left = Debris {
            mapped: mapped_yet.then_some((va.start, mapped)),
            handle,
            va: Some(va),
        };
        if left.give_back(backend, stats).is_err() {
            debris.push(left);
        }
    };
    let handle = match track(stats, CallKind::Create, backend.create(mapped)) {
        Ok(h) => h,
        Err(e) => {
            undo(stats, None, false);
            return Err(e);
        }
    };
    if let Err(e) = track(
        stats,
        CallKind::Map,
        backend.map(va.start, mapped, handle, 0),
    ) {
        undo(stats, Some(handle), false);
        return Err(e);
    }
    let access = backend.set_access(va.start, mapped, access);
    if let Err(e) = track(stats, CallKind::SetAccess, access) {
        undo(stats, Some(handle), true);
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
    /// keep this debris and try again later.
    Partly(BackendError, Box<Debris>),
}

/// `cudaFree`: gives the segment back: unmap, release, free the reservation.
pub(crate) fn device_free<B: Backend>(
    backend: &B,
    stats: &mut MemoryStats,
    seg: &DeviceSegment,
) -> Result<(), FreeFailed> {
    let mut left = Debris {
        mapped: Some((seg.va.start, seg.mapped)),
        handle: Some(seg.handle),
        va: Some(seg.va),
    };
    match left.give_back(backend, stats) {
        Ok(()) => Ok(()),
        Err(e) if left.mapped.is_some() => Err(FreeFailed::Untouched(e)),
        Err(e) => Err(FreeFailed::Partly(e, Box::new(left))),
    }
}
