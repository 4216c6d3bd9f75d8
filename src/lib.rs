#![doc = include_str!("../README.md")]
//! # Glossary
//!
//! One word, one meaning, throughout the crate. The device's words first (the CUDA virtual
//! memory management API, which [`Backend`] speaks), then the allocators'.
//!
//! * **backend**: what an allocator stands on, the [`Backend`] trait: [`SimBackend`] (bookkeeping
//!   only), `HostBackend` (real bytes on the CPU, Linux only), `CudaBackend` (the driver, feature
//!   `cuda`).
//! * **granularity**: the device's allocation granule (`cuMemGetAllocationGranularity`, 2 MiB
//!   on an H100). Every mapped length, address and handle offset is a multiple of it.
//! * **reservation**: a range of virtual addresses reserved with `cuMemAddressReserve`
//!   ([`VaRange`]); nothing is mapped in it at first.
//! * **handle**: a piece of physical memory (`cuMemCreate`, [`backend::PhysHandle`]), mapped at
//!   zero or more addresses. **Released** (`cuMemRelease`), its memory lives on until its last
//!   mapping goes.
//! * **mapping**: one `cuMemMap` of (part of) a handle at an address inside a reservation; it has
//!   no **access** until `cuMemSetAccess` grants some.
//! * **stream**: an ordered queue of device work ([`StreamId`]). **event**: a marker recorded on a
//!   stream ([`backend::EventId`]) that completes when the work queued before it has;
//!   **synchronize**: wait until all of a stream's work has completed.
//! * **live resources** (the **ledger**): what a backend holds right now
//!   ([`backend::LiveResources`]): reservations, mappings, handles, events. After an allocator
//!   is dropped it is empty, or something leaked.
//! * **rule checker**: the one layer every backend runs each call through, so all three accept
//!   and reject the same calls ([`backend`]'s contract). A broken rule is a [`BackendError`].
//! * **page**: the allocator's unit of mapping, a multiple of the granularity (a policy, not a
//!   device constant): one handle per page.
//! * **segment**: the allocators' unit of device memory. In [`ExpandableAllocator`], one
//!   reservation grown in place by mapping pages into it (PyTorch's expandable segment); in
//!   [`ClassicAllocator`], one device allocation (`cudaMalloc`) of fixed size.
//! * **block**: a range of a segment handed to a user (**live**, an [`Allocation`]) or kept for
//!   reuse (**free**, or **inactive** in PyTorch's snapshots). Blocks are **split** from larger
//!   free ones and **merged** with free neighbours when freed.
//! * **pool**: the small pool (requests ≤ 1 MiB, [`config::SMALL_SIZE`]) and the large pool
//!   ([`stats::PoolKind`]) keep separate segments, as in PyTorch; each stream has its own.
//! * **reserved** bytes: mapped into segments (or, classic, allocated from the device);
//!   **allocated** bytes: in live blocks; **held** bytes: reserved plus the handle cache, what
//!   the device sees ([`Allocator::held_bytes`]).
//! * **stream use** (`record_stream`): a stream other than its own on which an allocation is also
//!   used. Freeing it records an **event** on each such stream; until they complete, the block
//!   is **pending free** (`active_pending_free`) and is not reused.
//! * **cache**: free blocks and mapped pages an allocator keeps instead of returning them to the
//!   device; **empty cache** ([`Allocator::empty_cache`]) returns every byte no allocation uses.
//! * **handle cache**: physical handles [`ExpandableAllocator`] keeps after unmapping pages, to map
//!   again without `cuMemCreate` (an improvement over PyTorch; [`ExpandableConfig`]).
//! * **remap** (**defrag**): moving free pages of one segment to where growth needs them (unmap,
//!   map elsewhere) instead of releasing and creating memory ([`ExpandableConfig`]).
//! * **rollback**: undoing a growth that failed half-way, so a failed call changes nothing.
//! * **retry**: what an allocator does when the device is out of memory: free cached memory
//!   (waiting for pending frees and synchronizing as needed) and try once more, as PyTorch's
//!   `release_cached_blocks`. Only then is it an **out-of-memory** error ([`AllocError`], with an
//!   [`OomReport`] giving PyTorch's message). Cleanup that fails (an unmap, an event release) is
//!   kept on a deferred list and retried later, never forgotten.
//! * **oversize**: a block larger than `max_split_size`, which PyTorch never splits.
//! * **alloc conf**: a `PYTORCH_CUDA_ALLOC_CONF` string, parsed into [`config::AllocConf`] with
//!   PyTorch's grammar and errors.
//! * **snapshot**: a picture of an allocator's segments and blocks ([`snapshot::Snapshot`]), with
//!   the names of PyTorch's memory snapshots.
//! * **stats**: [`MemoryStats`], PyTorch's counters and their names (`allocated_bytes`,
//!   `reserved_bytes`, `num_alloc_retries`, ...), each current, peak, allocated and freed.
//! * **fault plan**, **held stream**: test controls of the emulated backends (feature
//!   `testkit`): calls made to fail on purpose, and a stream whose events stay pending until the
//!   test completes them.
#![deny(unsafe_code)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod backend;
pub mod error;
mod sync;
pub mod units;

#[cfg(feature = "cuda")]
pub use backend::CudaBackend;
#[cfg(target_os = "linux")]
pub use backend::HostBackend;
pub use backend::{Backend, BackendError, BackendErrorKind, SimBackend};
/// The cudarc this crate is built against: name its types through this path (`vmm_alloc::cudarc`)
/// so they are the very ones [`DeviceBuffer`] implements cudarc's
/// traits for. Its CUDA version is the one any crate of the build asks cudarc for (yours:
/// `cudarc = { version = "0.19", features = ["cuda-12080"] }`), else `nvcc`'s, else 13.4.
#[cfg(feature = "cuda")]
pub use cudarc;
pub use units::{DevAddr, VaRange};
pub mod allocator;
pub mod buffer;
pub mod classic;
pub mod config;
pub mod expandable;
mod mechanism;
pub use mechanism::violation::InvariantViolation;
pub mod sleep;
pub mod snapshot;
pub mod stats;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use allocator::{Allocation, Allocator};
pub use backend::StreamId;
pub use buffer::Buffer;
#[cfg(feature = "cuda")]
pub use buffer::{CudaMemory, DeviceBuffer};
pub use classic::ClassicAllocator;
pub use config::ExpandableConfig;
pub use error::{AllocError, OomReport};
pub use expandable::ExpandableAllocator;
pub use stats::MemoryStats;
