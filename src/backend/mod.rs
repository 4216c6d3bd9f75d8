//! The seam between allocators and memory: the CUDA virtual-memory-management vocabulary.
//!
//! [`Backend`] is everything an allocator needs from the device, and nothing more. Three
//! implementations stand behind it:
//!
//! * [`SimBackend`]: bookkeeping only, no memory, fake but realistic addresses, call counters,
//!   fault injection, test-controlled events. Exact and fast: what the replay tool and the
//!   property tests run on.
//! * [`HostBackend`]: real bytes on the CPU (memfd + mmap), so data-integrity tests run on a
//!   machine without a GPU.
//! * `CudaBackend` (feature `cuda`): the driver's VMM calls through cudarc.
//!
//! All three run every call through one rule checker (`checked.rs`), so they accept and reject
//! exactly the same calls, count calls alike and account for leaks alike; only Sim and Host accept
//! fault plans.
//!
//! # The contract
//!
//! Callers must guarantee nothing for safety: every call is checked. For correct results, callers
//! must:
//! 1. pass lengths that are non-zero multiples of [`Backend::granularity`], and addresses and
//!    handle offsets aligned to it;
//! 2. map only inside a range returned by [`Backend::reserve`], never over an existing mapping,
//!    and only whole handles (offset 0, length = the handle's size: what an H100 accepts);
//! 3. unmap and set access on whole mappings (one call may cover several adjacent ones);
//! 4. unmap everything inside a reservation before freeing it, and release each handle once.
//!
//! A call that breaks a rule returns a [`BackendError`] naming the rule and changes nothing. Rules
//! 1 and 2 are what CUDA enforces; rules 3 and 4 catch what CUDA accepts silently but is always an
//! allocator bug, each with its own error: double unmap (`DoubleUnmap`), unmapping a never-mapped
//! range (`NotMapped`), double release, freeing a mapped reservation.
//!
//! Implementations guarantee: reservations are aligned to the granularity and never overlap;
//! a new mapping has no access until `set_access`; bytes written through a mapping stay readable
//! through every mapping of the same handle while any mapping of it exists; `mem_info` reports
//! physical memory; a failed call leaves the state as it was.

pub(crate) mod calls;
pub(crate) mod checked;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod emulated;
mod error;
mod events;
pub(crate) mod fault;
#[cfg(target_os = "linux")]
mod host;
mod ledger;
mod raw;
mod sim;
mod sim_va;
mod sim_window;

use std::fmt;

pub use calls::{CallCounts, CallKind, CallKinds};
#[cfg(feature = "cuda")]
pub use cuda::CudaBackend;
pub use error::{BackendError, BackendErrorKind};
#[cfg(target_os = "linux")]
pub use host::{HostBackend, HostConfig};
pub use sim::{SimBackend, SimConfig};

use crate::units::{DevAddr, VaRange};

/// A physical memory handle (`CUmemGenericAllocationHandle`). Opaque: handles are numbered by the
/// backend that created them, so a stale or foreign handle is an error, never a driver crash.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PhysHandle(pub(crate) u64);

impl fmt::Debug for PhysHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "handle#{}.{}", self.0 >> 48, self.0 & ((1 << 48) - 1))
    }
}

/// A stream (`CUstream`). Work on one stream runs in order; memory freed on one stream may be
/// reused on another only after an event recorded for it completes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub(crate) u64);

impl StreamId {
    /// The default (legacy null) stream, known to every backend.
    pub const DEFAULT: StreamId = StreamId(0);

    /// A stream of the simulated backends, numbered by the caller. (On Cuda, stream ids come from
    /// `CudaBackend::register_stream`; an id made here is unknown there unless it is 0.)
    pub const fn sim(n: u64) -> StreamId {
        StreamId(n)
    }

    /// The raw value: the stream's number on Sim and Host, the `CUstream` pointer on Cuda.
    pub const fn raw(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream#{:#x}", self.0)
    }
}

/// An event recorded on a stream (`CUevent`). Opaque and numbered by the backend.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(pub(crate) u64);

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "event#{}.{}", self.0 >> 48, self.0 & ((1 << 48) - 1))
    }
}

/// What a device may do with a mapped range (`CUmemAccess_flags`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub enum Protection {
    /// No access: the state of a fresh mapping.
    #[default]
    None,
    /// Read only.
    Read,
    /// Read and write.
    ReadWrite,
}

/// One entry of an access list: a device and what it may do.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Access {
    /// The device ordinal: the backend's own device or a peer.
    pub device: u32,
    /// What it may do.
    pub protection: Protection,
}

impl Access {
    /// Read-write access for `device`.
    pub const fn read_write(device: u32) -> Self {
        Self {
            device,
            protection: Protection::ReadWrite,
        }
    }
}

/// Device memory as the driver reports it (`cuMemGetInfo`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemInfo {
    /// Physical bytes not in use by anyone.
    pub free: usize,
    /// Physical bytes the device has.
    pub total: usize,
}

bitflags::bitflags! {
    /// What a backend can do beyond the common contract.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct Capabilities: u32 {
        /// Real memory: `write` and `read` move bytes.
        const BYTES = 1 << 0;
        /// Accepts a fault plan (feature `testkit`: `testkit::FaultPlan`).
        const FAULT_INJECTION = 1 << 1;
        /// A test decides when events complete (hold a stream's events pending).
        const HELD_EVENTS = 1 << 2;
        /// Backed by a GPU.
        const GPU = 1 << 3;
    }
}

/// What a backend holds right now: the leak ledger. After an allocator is torn down, everything
/// here is zero.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct LiveResources {
    /// Virtual-address reservations not yet freed.
    pub reservations: usize,
    /// Bytes of virtual address space reserved.
    pub reserved_va_bytes: usize,
    /// Mappings (one per successful `map` not yet unmapped).
    pub mappings: usize,
    /// Bytes mapped.
    pub mapped_bytes: usize,
    /// Physical handles not yet released.
    pub handles: usize,
    /// Physical bytes held (by unreleased handles, and by released handles still mapped).
    pub physical_bytes: usize,
    /// Events not yet released.
    pub events: usize,
}

impl LiveResources {
    /// Whether nothing at all is held.
    pub fn is_empty(&self) -> bool {
        *self == LiveResources::default()
    }
}

impl fmt::Display for LiveResources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} reservation(s) ({} B of VA), {} mapping(s) ({} B), {} handle(s) ({} B physical), {} event(s)",
            self.reservations,
            self.reserved_va_bytes,
            self.mappings,
            self.mapped_bytes,
            self.handles,
            self.physical_bytes,
            self.events
        )
    }
}

/// The CUDA virtual-memory-management surface an allocator stands on.
///
/// Methods take `&self`: a backend is shared (an allocator holds it, a test keeps a clone to
/// count calls) and does its own locking. See the module docs for the contract.
pub trait Backend: Send + Sync {
    /// A short name: "sim", "host" or "cuda".
    fn name(&self) -> &'static str;

    /// What this backend can do beyond the common contract.
    fn capabilities(&self) -> Capabilities;

    /// The allocation granularity (`cuMemGetAllocationGranularity`): every length, address and
    /// handle offset is a multiple of it. A power of two.
    fn granularity(&self) -> usize;

    /// The ordinal of the backend's own device.
    fn device(&self) -> u32;

    /// How many devices an access list may name (the own device and its peers).
    fn device_count(&self) -> u32;

    /// Reserves `len` bytes of virtual address space, aligned to the granularity, with nothing
    /// mapped in it (`cuMemAddressReserve`).
    fn reserve(&self, len: usize) -> Result<VaRange, BackendError>;

    /// Frees a reservation (`cuMemAddressFree`). `range` must be exactly what `reserve` returned,
    /// and nothing may be mapped inside it.
    fn free_reservation(&self, range: VaRange) -> Result<(), BackendError>;

    /// Creates a physical handle of `len` bytes on the own device (`cuMemCreate`).
    fn create(&self, len: usize) -> Result<PhysHandle, BackendError>;

    /// Releases a handle (`cuMemRelease`). Legal while mapped: the memory then lives until the
    /// last mapping of it goes.
    fn release(&self, handle: PhysHandle) -> Result<(), BackendError>;

    /// Maps `handle` at `at` (`cuMemMap`). The new mapping has no access until
    /// [`Backend::set_access`]. `len` must be the handle's size and `offset` zero: the driver maps
    /// only whole handles (`PartialHandle` otherwise); the arguments keep `cuMemMap`'s shape.
    fn map(
        &self,
        at: DevAddr,
        len: usize,
        handle: PhysHandle,
        offset: usize,
    ) -> Result<(), BackendError>;

    /// Unmaps `[at, at + len)`, which must be the union of whole, adjacent mappings
    /// (`cuMemUnmap`). The range stays reserved.
    fn unmap(&self, at: DevAddr, len: usize) -> Result<(), BackendError>;

    /// Sets the access of `[at, at + len)` (whole, adjacent mappings) for each listed device
    /// (`cuMemSetAccess`). One call may cover many mappings: allocators should make one call per
    /// contiguous run.
    fn set_access(&self, at: DevAddr, len: usize, access: &[Access]) -> Result<(), BackendError>;

    /// Free and total physical memory of the own device (`cuMemGetInfo`).
    fn mem_info(&self) -> Result<MemInfo, BackendError>;

    /// Records an event after the work queued so far on `stream`.
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError>;

    /// Whether the event's work has completed.
    fn query_event(&self, event: EventId) -> Result<bool, BackendError>;

    /// Releases an event.
    fn release_event(&self, event: EventId) -> Result<(), BackendError>;

    /// Waits until all work queued on `stream` has completed (its events then report complete).
    fn synchronize(&self, stream: StreamId) -> Result<(), BackendError>;

    /// Copies `data` to `at`, which must lie in mappings with read-write access
    /// (only with [`Capabilities::BYTES`]).
    fn write(&self, at: DevAddr, data: &[u8]) -> Result<(), BackendError>;

    /// Copies bytes from `at` into `out`; the range must lie in readable mappings
    /// (only with [`Capabilities::BYTES`]).
    fn read(&self, at: DevAddr, out: &mut [u8]) -> Result<(), BackendError>;

    /// Calls received so far, by kind.
    fn calls(&self) -> CallCounts;

    /// What the backend holds right now (reservations, mappings, handles, events).
    fn live(&self) -> LiveResources;
}

/// Implements [`Backend`] for a wrapper type by forwarding every call to its `inner`
/// [`checked::Checked`], and `Debug` showing what the backend holds.
macro_rules! forward_backend {
    ($ty:ty) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                use $crate::backend::Backend;
                f.debug_struct(stringify!($ty))
                    .field("device", &self.device())
                    .field("granularity", &self.granularity())
                    .field("live", &self.live())
                    .finish_non_exhaustive()
            }
        }

        impl $crate::backend::Backend for $ty {
            fn name(&self) -> &'static str {
                self.inner.name()
            }
            fn capabilities(&self) -> $crate::backend::Capabilities {
                self.inner.capabilities()
            }
            fn granularity(&self) -> usize {
                self.inner.granularity()
            }
            fn device(&self) -> u32 {
                self.inner.device()
            }
            fn device_count(&self) -> u32 {
                self.inner.device_count()
            }
            fn reserve(&self, len: usize) -> Result<$crate::VaRange, $crate::BackendError> {
                self.inner.reserve(len)
            }
            fn free_reservation(&self, range: $crate::VaRange) -> Result<(), $crate::BackendError> {
                self.inner.free_reservation(range)
            }
            fn create(
                &self,
                len: usize,
            ) -> Result<$crate::backend::PhysHandle, $crate::BackendError> {
                self.inner.create(len)
            }
            fn release(
                &self,
                handle: $crate::backend::PhysHandle,
            ) -> Result<(), $crate::BackendError> {
                self.inner.release(handle)
            }
            fn map(
                &self,
                at: $crate::DevAddr,
                len: usize,
                handle: $crate::backend::PhysHandle,
                offset: usize,
            ) -> Result<(), $crate::BackendError> {
                self.inner.map(at, len, handle, offset)
            }
            fn unmap(&self, at: $crate::DevAddr, len: usize) -> Result<(), $crate::BackendError> {
                self.inner.unmap(at, len)
            }
            fn set_access(
                &self,
                at: $crate::DevAddr,
                len: usize,
                access: &[$crate::backend::Access],
            ) -> Result<(), $crate::BackendError> {
                self.inner.set_access(at, len, access)
            }
            fn mem_info(&self) -> Result<$crate::backend::MemInfo, $crate::BackendError> {
                self.inner.mem_info()
            }
            fn record_event(
                &self,
                stream: $crate::backend::StreamId,
            ) -> Result<$crate::backend::EventId, $crate::BackendError> {
                self.inner.record_event(stream)
            }
            fn query_event(
                &self,
                event: $crate::backend::EventId,
            ) -> Result<bool, $crate::BackendError> {
                self.inner.query_event(event)
            }
            fn release_event(
                &self,
                event: $crate::backend::EventId,
            ) -> Result<(), $crate::BackendError> {
                self.inner.release_event(event)
            }
            fn synchronize(
                &self,
                stream: $crate::backend::StreamId,
            ) -> Result<(), $crate::BackendError> {
                self.inner.synchronize(stream)
            }
            fn write(&self, at: $crate::DevAddr, data: &[u8]) -> Result<(), $crate::BackendError> {
                self.inner.write(at, data)
            }
            fn read(
                &self,
                at: $crate::DevAddr,
                out: &mut [u8],
            ) -> Result<(), $crate::BackendError> {
                self.inner.read(at, out)
            }
            fn calls(&self) -> $crate::backend::CallCounts {
                self.inner.calls()
            }
            fn live(&self) -> $crate::backend::LiveResources {
                self.inner.live()
            }
        }
    };
}
pub(crate) use forward_backend;
