//! Backend errors: a failed call ([`BackendError`]) and what went wrong ([`BackendErrorKind`]).
//! Every message says what went wrong and what to do about it.

use crate::backend::{CallKind, EventId, PhysHandle, StreamId};
use crate::units::{human_bytes, DevAddr};

/// A backend call failed. The backend's state is unchanged by the failed call.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("{op} failed: {kind}")]
pub struct BackendError {
    /// The call that failed.
    pub op: CallKind,
    /// What went wrong.
    pub kind: BackendErrorKind,
}

impl BackendError {
    /// Builds an error for call `op`.
    pub fn new(op: CallKind, kind: BackendErrorKind) -> Self {
        Self { op, kind }
    }

    /// Whether retrying after freeing memory may succeed (physical memory or address space ran
    /// out, for real or by fault injection).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self.kind,
            BackendErrorKind::OutOfMemory { .. } | BackendErrorKind::AddressSpaceExhausted { .. }
        ) || matches!(&self.kind, BackendErrorKind::Driver { name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY")
    }

    /// Whether this error reports a call that CUDA itself would accept silently but that is
    /// always a bug in the caller (double unmap, double release, ...).
    pub fn is_caller_bug(&self) -> bool {
        matches!(
            self.kind,
            BackendErrorKind::NotMapped { .. }
                | BackendErrorKind::DoubleUnmap { .. }
                | BackendErrorKind::HandleAlreadyReleased(_)
                | BackendErrorKind::ReservationStillMapped { .. }
                | BackendErrorKind::EventAlreadyReleased(_)
        )
    }
}

/// What went wrong in a backend call.
///
/// The first group is what CUDA itself rejects; the second is what CUDA accepts silently but is
/// always a bug in an allocator (the backends reject it with these distinct errors); the last
/// group comes from the environment.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// A length was zero or not a multiple of the granularity.
    #[error("length {len:#x} is not a non-zero multiple of the allocation granularity {granularity:#x}; round sizes up to the granularity")]
    BadLength {
        /// The length passed.
        len: usize,
        /// The backend's granularity.
        granularity: usize,
    },
    /// An address or offset was not aligned to the granularity.
    #[error("{what} {value:#x} is not aligned to the allocation granularity {granularity:#x}")]
    Misaligned {
        /// Which argument: "address" or "offset".
        what: &'static str,
        /// Its value.
        value: u64,
        /// The backend's granularity.
        granularity: usize,
    },
    /// `[addr, addr + len)` wraps around the end of the address space.
    #[error("range at {addr} of length {len:#x} overflows the address space")]
    RangeOverflow {
        /// Start of the range.
        addr: DevAddr,
        /// Its length.
        len: usize,
    },
    /// Physical memory is exhausted: free cached memory and retry, or ask for less.
    #[error("out of physical memory: asked for {}, {} free of {}; free cached memory and retry, or ask for less", human_bytes(*requested as u64), human_bytes(*free as u64), human_bytes(*total as u64))]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
        /// Bytes free on the device.
        free: usize,
        /// Device capacity.
        total: usize,
    },
    /// No virtual-address range of this size is left: free reservations or reserve less.
    #[error("no virtual address range of {} is left; free reservations or reserve less", human_bytes(*requested as u64))]
    AddressSpaceExhausted {
        /// Bytes asked for.
        requested: usize,
    },
    /// The range is not (wholly) inside one live reservation.
    #[error("range at {addr} of length {len:#x} is not inside one reserved range; map only into ranges returned by reserve")]
    NotReserved {
        /// Start of the range.
        addr: DevAddr,
        /// Its length.
        len: usize,
    },
    /// `free_reservation` was given a range that is not exactly one live reservation.
    #[error("{addr} (length {len:#x}) is not a live reservation; pass exactly the range reserve returned")]
    UnknownReservation {
        /// Start of the range.
        addr: DevAddr,
        /// Its length.
        len: usize,
    },
    /// The range overlaps a mapping that already exists.
    #[error(
        "range at {addr} of length {len:#x} overlaps the mapping at {existing}; unmap it first"
    )]
    AlreadyMapped {
        /// Start of the range.
        addr: DevAddr,
        /// Its length.
        len: usize,
        /// Start of the mapping it overlaps.
        existing: DevAddr,
    },
    /// `offset + len` runs past the end of the handle.
    #[error("offset {offset:#x} + length {len:#x} runs past the end of the {handle_size:#x}-byte handle")]
    PastHandleEnd {
        /// Offset into the handle.
        offset: usize,
        /// Length mapped.
        len: usize,
        /// Size of the handle.
        handle_size: usize,
    },
    /// A map asked for part of a handle. CUDA maps only whole handles: `cuMemMap` on an H100
    /// (driver 580, CUDA 13) returns `CUDA_ERROR_NOT_SUPPORTED` for a non-zero offset or a length
    /// shorter than the handle, so every backend refuses it alike.
    #[error("offset {offset:#x}, length {len:#x} maps part of a {handle_size:#x}-byte handle; CUDA maps only whole handles (offset 0, length = the handle's size): create handles of the size you map")]
    PartialHandle {
        /// Offset into the handle.
        offset: usize,
        /// Length mapped.
        len: usize,
        /// Size of the handle.
        handle_size: usize,
    },
    /// The handle was never created by this backend.
    #[error("{0:?} was not created by this backend")]
    UnknownHandle(PhysHandle),
    /// A device ordinal in an access list does not exist, or is listed twice.
    #[error("device {ordinal} cannot be given access: the backend has {devices} device(s) and each may appear once")]
    BadDevice {
        /// The ordinal passed.
        ordinal: u32,
        /// How many devices the backend has.
        devices: u32,
    },
    /// An access list was empty.
    #[error("the access list is empty; name at least the owning device")]
    EmptyAccessList,
    /// Access was set or bytes were moved over a range that is not wholly mapped, or a range that
    /// cuts a mapping in two.
    #[error("range at {addr} of length {len:#x} does not cover whole mappings; act on exactly the ranges that were mapped")]
    PartialMapping {
        /// Start of the range.
        addr: DevAddr,
        /// Its length.
        len: usize,
    },
    /// Bytes were moved through a mapping whose access does not allow it.
    #[error("range at {addr} is mapped without {needed} access; call set_access first")]
    NoAccess {
        /// Where the access was denied.
        addr: DevAddr,
        /// "read" or "read-write".
        needed: &'static str,
    },
    /// The stream is not known to the backend (Cuda: register it first).
    #[error("{0:?} is not known to this backend; register the stream first")]
    UnknownStream(StreamId),
    /// The event was never recorded by this backend.
    #[error("{0:?} was not recorded by this backend")]
    UnknownEvent(EventId),

    /// Unmapping a range in which nothing has been mapped since its reservation was made (or that
    /// no reservation holds). CUDA returns success; it is always an allocator bug.
    #[error("range at {addr} of length {len:#x} was never mapped; CUDA would accept this unmap silently, so the caller's bookkeeping is wrong")]
    NotMapped {
        /// Start of the range.
        addr: DevAddr,
        /// Its length.
        len: usize,
    },
    /// Unmapping a range that has no mapping now but was (at least in part) mapped and then
    /// unmapped already: a double unmap. CUDA returns success; it is always an allocator bug.
    #[error("range at {addr} of length {len:#x} was already unmapped (double unmap); CUDA would accept this silently, so the caller's bookkeeping is wrong")]
    DoubleUnmap {
        /// Start of the range.
        addr: DevAddr,
        /// Its length.
        len: usize,
    },
    /// Releasing a handle that was already released.
    #[error("{0:?} was already released (double release)")]
    HandleAlreadyReleased(PhysHandle),
    /// Freeing a reservation that still has mappings inside it.
    #[error("reservation at {addr} still has {mappings} mapping(s); unmap them before freeing it")]
    ReservationStillMapped {
        /// Start of the reservation.
        addr: DevAddr,
        /// Mappings still inside it.
        mappings: usize,
    },
    /// Querying or releasing an event that was already released.
    #[error("{0:?} was already released")]
    EventAlreadyReleased(EventId),

    /// A fault injected by a test's fault plan (Sim and Host only).
    #[error("injected fault (test fault plan)")]
    Injected,
    /// This backend cannot do that (e.g. moving bytes on Sim, which has no memory).
    #[error("{0} is not supported by this backend")]
    Unsupported(&'static str),
    /// The CUDA driver returned an error.
    #[error("driver error {name}: {description}")]
    Driver {
        /// The `CUresult` name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// What the driver says it means.
        description: String,
    },
    /// The operating system refused a call (Host backend).
    #[error("{call} failed with errno {errno} ({message})")]
    Os {
        /// The system call.
        call: &'static str,
        /// `errno`.
        errno: i32,
        /// `strerror` of it.
        message: String,
    },
    /// No CUDA driver or device is usable on this machine.
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    /// A backend configuration value is invalid.
    #[error("invalid backend configuration: {0}")]
    BadConfig(String),
}
