//! `DeviceBuffer<T>`: memory of our allocator that cudarc takes wherever it takes its own.
//!
//! ```no_run
//! use vmm_alloc::cudarc::driver::CudaContext;
//! use vmm_alloc::CudaMemory;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let memory = CudaMemory::expandable(0)?; // one per device
//! let stream = memory.context().default_stream();
//! let mut buf = memory.alloc::<f32>(1 << 20, &stream)?;
//! stream.memcpy_htod(&vec![1.0f32; 1 << 20], &mut buf)?;
//! let back = stream.clone_dtoh(&buf)?;
//! drop(buf); // back to the allocator, stream-ordered: no synchronization
//! # Ok(()) }
//! ```
//!
//! A buffer is a [`Buffer`] (the backend-generic owner, Note [Stream-ordered drop]) plus a cudarc
//! `CudaSlice` over the same address that cudarc never frees (`ForeignSlice`). Every cudarc trait
//! and view therefore behaves exactly as for cudarc's own memory, cross-stream read/write events
//! included; the drop first makes the home stream wait for the buffer's last uses on every stream
//! (cudarc's events), then frees to the allocator on the home stream. With cudarc's event
//! tracking turned off, uses on other streams are declared as in PyTorch: automatically for
//! copies on a registered stream, by [`DeviceBuffer::record_stream`] for kernels.

use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr,
    DeviceSlice, DriverError, SyncOnDrop, ValidAsZeroBits,
};

use super::Buffer;
use crate::allocator::{Allocation, Allocator};
use crate::backend::cuda::ForeignSlice;
use crate::backend::{Backend, CallKind, StreamId};
use crate::config::ExpandableConfig;
use crate::error::{AllocError, BackendError};
use crate::expandable::ExpandableAllocator;
use crate::snapshot::Snapshot;
use crate::stats::MemoryStats;
use crate::units::DevAddr;
use crate::CudaBackend;

/// Why a device buffer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DeviceBufferError {
    /// The allocator refused (out of memory, zero size, a backend failure).
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The stream belongs to another device's context than this memory's: allocate from the
    /// `CudaMemory` of the stream's device.
    #[error("the stream belongs to another context than this memory's (device {device}): use the CudaMemory of the stream's device")]
    WrongContext {
        /// This memory's device ordinal.
        device: usize,
    },
    /// `len` elements of the type would not fit in the address space.
    #[error("{len} elements of {size} bytes overflow the address space")]
    TooLong {
        /// Elements asked for.
        len: usize,
        /// Bytes per element.
        size: usize,
    },
    /// A cudarc call on the new buffer failed (the memset of `alloc_zeros`).
    #[error("cudarc call failed: {0}")]
    Driver(#[from] DriverError),
}

/// One device's memory, handed out as [`DeviceBuffer`]s by one allocator. Shared between threads
/// (`Arc`); every buffer keeps it alive. Allocators for several devices coexist: make one
/// `CudaMemory` per device. It is itself an [`Allocator`] (the one it wraps).
pub struct CudaMemory {
    backend: CudaBackend,
    allocator: Arc<dyn Allocator>,
}

impl std::fmt::Debug for CudaMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMemory")
            .field("backend", &self.backend)
            .field("held_bytes", &self.allocator.held_bytes())
            .finish()
    }
}

impl CudaMemory {
    /// Device `ordinal` with an [`ExpandableAllocator`] of the default configuration.
    pub fn expandable(ordinal: usize) -> Result<Arc<Self>, AllocError> {
        Self::expandable_with(ordinal, ExpandableConfig::default())
    }

    /// Device `ordinal` with an [`ExpandableAllocator`] of configuration `config`.
    pub fn expandable_with(
        ordinal: usize,
        config: ExpandableConfig,
    ) -> Result<Arc<Self>, AllocError> {
        let backend = CudaBackend::new(ordinal)?;
        Self::new(backend, |b| ExpandableAllocator::new(b, config))
    }

    /// `backend`'s device with the allocator `make` builds on (a clone of) it, e.g.
    /// `|b| ClassicAllocator::new(b, ..)`.
    pub fn new<A: Allocator + 'static>(
        backend: CudaBackend,
        make: impl FnOnce(CudaBackend) -> Result<A, AllocError>,
    ) -> Result<Arc<Self>, AllocError> {
        let allocator = Arc::new(make(backend.clone())?);
        Ok(Arc::new(Self { backend, allocator }))
    }

    /// The device's primary context: create streams from it.
    pub fn context(&self) -> Arc<CudaContext> {
        self.backend.context()
    }

    /// The backend under the allocator.
    pub fn backend(&self) -> &CudaBackend {
        &self.backend
    }

    /// Makes `stream` known (kept alive until this memory drops), so that buffers used on it are
    /// reused only after its work completes without synchronizing it. Done by
    /// [`alloc`](Self::alloc) for a buffer's own stream.
    pub fn register_stream(&self, stream: &Arc<CudaStream>) -> Result<StreamId, DeviceBufferError> {
        if !self.backend.owns_stream(stream) {
            return Err(DeviceBufferError::WrongContext {
                device: self.backend.device() as usize,
            });
        }
        match self.backend.stream_id(stream) {
            Some(id) => Ok(id),
            None => Ok(self
                .backend
                .register_stream(stream)
                .map_err(AllocError::from)?),
        }
    }

    /// `len` elements of `T` for use on `stream` (uninitialized device memory, as cudarc's
    /// `alloc`). Errors when `stream` is of another device, and for `len == 0`.
    pub fn alloc<T: DeviceRepr>(
        self: &Arc<Self>,
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceBuffer<T>, DeviceBufferError> {
        let size = std::mem::size_of::<T>();
        let bytes = len
            .checked_mul(size)
            .ok_or(DeviceBufferError::TooLong { len, size })?;
        let home = self.register_stream(stream)?;
        let buf = Buffer::new(self, bytes, home)?;
        let slice = ForeignSlice::new(stream, buf.ptr().get(), len)
            .map_err(|e| AllocError::from(BackendError::new(CallKind::Init, e)))?;
        Ok(DeviceBuffer {
            slice,
            buf,
            _element: PhantomData,
        })
    }

    /// `len` zeroed elements of `T` for use on `stream` (queued `memset` on it).
    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        self: &Arc<Self>,
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceBuffer<T>, DeviceBufferError> {
        let mut buf = self.alloc(len, stream)?;
        stream.memset_zeros(&mut buf)?;
        Ok(buf)
    }
}

impl Allocator for CudaMemory {
    fn allocate(&self, size: usize, stream: StreamId) -> Result<Allocation, AllocError> {
        self.allocator.allocate(size, stream)
    }
    fn deallocate(&self, allocation: Allocation) -> Result<(), AllocError> {
        self.allocator.deallocate(allocation)
    }
    fn deallocate_ptr(&self, ptr: DevAddr) -> Result<(), AllocError> {
        self.allocator.deallocate_ptr(ptr)
    }
    fn record_stream(&self, ptr: DevAddr, stream: StreamId) -> Result<(), AllocError> {
        self.allocator.record_stream(ptr, stream)
    }
    fn empty_cache(&self) -> Result<(), AllocError> {
        self.allocator.empty_cache()
    }
    fn stats(&self) -> MemoryStats {
        self.allocator.stats()
    }
    fn held_bytes(&self) -> u64 {
        self.allocator.held_bytes()
    }
    fn reset_peak_stats(&self) {
        self.allocator.reset_peak_stats()
    }
    fn snapshot(&self) -> Snapshot {
        self.allocator.snapshot()
    }
}

/// `len` elements of `T` in device memory of a [`CudaMemory`], usable wherever cudarc takes its
/// `CudaSlice<T>`: `memcpy_htod`, `memcpy_dtoh`, `clone_dtoh`, `memset_zeros`, kernel arguments
/// (`launch_builder(..).arg(&mut buf)`, impls in `backend/cuda/driver.rs`, the only
/// place allowed `unsafe`), views by [`slice`](Self::slice). Dropping it returns the
/// memory to the allocator stream-ordered, never synchronizing (module docs).
pub struct DeviceBuffer<T> {
    // Field order is drop order: the slice hands back cudarc's events (and makes the home stream
    // wait for every use) before the buffer frees the memory.
    slice: ForeignSlice<T>,
    buf: Buffer<CudaMemory>,
    _element: PhantomData<fn() -> T>,
}

impl<T> DeviceBuffer<T> {
    /// The device address.
    pub fn device_address(&self) -> CUdeviceptr {
        self.buf.ptr().get()
    }

    /// The memory (and allocator) the buffer returns to.
    pub fn memory(&self) -> &Arc<CudaMemory> {
        self.buf.allocator()
    }

    /// The buffer as cudarc's own slice type, for APIs that name `CudaSlice<T>` itself.
    pub fn as_cuda_slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// The slice for cudarc calls that write. Crate-only: with a `&mut CudaSlice` a caller
    /// could swap in a slice of its own, and cudarc would then free our address.
    pub(crate) fn cuda_slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }

    /// A view of elements `range` (cudarc's `CudaView`), or `None` when out of bounds (cudarc's
    /// own `slice` panics there; this library never panics on user input).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Option<CudaView<'_, T>> {
        self.slice.try_slice(range)
    }

    /// A mutable view of elements `range`, or `None` when out of bounds.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Option<CudaViewMut<'_, T>> {
        self.slice.try_slice_mut(range)
    }

    /// Declares that work on `stream` uses the buffer (PyTorch's `record_stream`): its memory is
    /// not reused before that work completes. Needed only for kernels launched on a stream other
    /// than the buffer's own with cudarc's event tracking off; registers `stream`.
    pub fn record_stream(&self, stream: &Arc<CudaStream>) -> Result<(), DeviceBufferError> {
        let id = self.memory().register_stream(stream)?;
        Ok(self.buf.record_stream(id)?)
    }

    /// What a use on `stream` needs beyond cudarc's own events: nothing on the home stream or
    /// while cudarc tracks events; else the stream is declared if it is registered, and an
    /// unknown stream is synchronized after the operation (always correct, only slower).
    fn note_use<'s>(&self, stream: &'s CudaStream) -> Option<SyncOnDrop<'s>> {
        let home = DeviceSlice::stream(&*self.slice);
        if stream.cu_stream() == home.cu_stream() || home.context().is_event_tracking() {
            return None;
        }
        match self.memory().backend().stream_id(stream) {
            Some(id) if self.buf.record_stream(id).is_ok() => None,
            _ => Some(SyncOnDrop::sync_stream(stream)),
        }
    }
}

impl<T> DeviceSlice<T> for DeviceBuffer<T> {
    fn len(&self) -> usize {
        self.slice.len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(&*self.slice)
    }
}

impl<T> DevicePtr<T> for DeviceBuffer<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        match self.note_use(stream) {
            Some(sync) => (self.device_address(), sync),
            None => self.slice.device_ptr(stream),
        }
    }
}

impl<T> DevicePtrMut<T> for DeviceBuffer<T> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        match self.note_use(stream) {
            Some(sync) => (self.device_address(), sync),
            None => self.slice.device_ptr_mut(stream),
        }
    }
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.buf.ptr())
            .field("len", &self.slice.len())
            .finish()
    }
}
