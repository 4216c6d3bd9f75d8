#![doc = include_str!("../README.md")]
//! # Glossary
//!
//! One word, one meaning, throughout the crate:
//!
//! * **granularity**: the device's allocation granule (`cuMemGetAllocationGranularity`, 2 MiB
//!   on an H100). Every mapped length, address and handle offset is a multiple of it.
//! * **reservation**: a range of virtual addresses reserved with `cuMemAddressReserve`; nothing is
//!   mapped in it at first.
//! * **handle**: a piece of physical memory (`cuMemCreate`), mapped at zero or more addresses.
//! * **mapping**: one `cuMemMap` of (part of) a handle at an address inside a reservation.
//! * **page**: the allocator's unit of mapping, a multiple of the granularity (a policy, not a
//!   device constant).
//! * **segment**: one reservation an allocator grows in place by mapping pages into it.
//! * **block**: a range of a segment handed to a user (live) or kept for reuse (free).
//! * **stream**: an ordered queue of device work; **event**: a marker recorded on a stream that
//!   completes when the work before it has.
#![deny(unsafe_code)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]
#![warn(missing_docs)]

pub mod backend;
pub mod error;
mod sync;
pub mod units;

#[cfg(feature = "cuda")]
pub use backend::CudaBackend;
pub use backend::{Backend, HostBackend, SimBackend};
/// The cudarc this crate is built against: name its types through this path (`vmm_alloc::cudarc`)
/// so they are the very ones [`DeviceBuffer`](crate::buffer::DeviceBuffer) implements cudarc's
/// traits for.
#[cfg(feature = "cuda")]
pub use cudarc;
pub use error::{BackendError, BackendErrorKind};
pub use units::{DevAddr, VaRange};
pub mod allocator;
pub mod buffer;
pub mod classic;
pub mod config;
pub mod expandable;
pub mod snapshot;
pub mod stats;
pub mod trace;

pub use allocator::{Allocation, Allocator};
pub use backend::StreamId;
pub use buffer::Buffer;
#[cfg(feature = "cuda")]
pub use buffer::{CudaMemory, DeviceBuffer};
pub use classic::ClassicAllocator;
pub use error::{AllocError, OomReport};
pub use expandable::ExpandableAllocator;
pub use stats::MemoryStats;
