//! Error values. Every message says what went wrong and what to do about it.

pub use crate::backend::{BackendError, BackendErrorKind};

/// PyTorch's `format_size`: bytes, KiB, MiB or GiB with two decimals.
pub fn format_size(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= 1 << 20 {
        format!("{:.2} KiB", b / 1024.0)
    } else if bytes <= 1 << 30 {
        format!("{:.2} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    }
}

/// What PyTorch's out-of-memory message carries.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OomReport {
    /// The device ordinal.
    pub device: u32,
    /// Bytes the allocator tried to obtain (the rounded request, or more than 1 EB).
    pub tried: u64,
    /// Device capacity.
    pub total: u64,
    /// Device memory free, as the driver reports it.
    pub free: u64,
    /// The allocator's limit when `per_process_memory_fraction` < 1.
    pub allowed: Option<u64>,
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes mapped (or held as cached handles) but not allocated.
    pub reserved_unallocated: u64,
    /// Whether the process's virtual address space, not the device's memory, ran out: the driver
    /// refused to reserve addresses even for the request alone (Note [Address space budget] in
    /// `expandable/growth.rs`).
    pub address_space_exhausted: bool,
}

/// An allocator call failed. The allocator's state is unchanged by the failed call.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// Not enough device memory even after freeing every cached byte. Free allocations, or
    /// lower the batch size, and retry.
    #[error("CUDA out of memory. Tried to allocate {tried}. GPU {device} has a total capacity of {total} of which {free} is free. {allowed}Of the allocated memory {allocated} is allocated by vmm-alloc, and {unalloc} is reserved by vmm-alloc but unallocated.{va}",
        tried = format_size(.0.tried), device = .0.device, total = format_size(.0.total), free = format_size(.0.free),
        allowed = .0.allowed.map(|a| format!("This process is allowed {} (per_process_memory_fraction). ", format_size(a))).unwrap_or_default(),
        allocated = format_size(.0.allocated), unalloc = format_size(.0.reserved_unallocated),
        va = if .0.address_space_exhausted { " The process's virtual address space ran out, not the device's memory: the driver refused to reserve addresses for the request alone. Free memory this process holds on other streams or devices (empty_cache), or use fewer streams or devices in one process." } else { "" })]
    OutOfMemory(Box<OomReport>),
    /// A request larger than 1 EB, PyTorch's sanity bound; always a caller bug.
    #[error("CUDA out of memory. Tried to allocate more than 1EB memory.")]
    TooLarge {
        /// The size asked for.
        size: usize,
    },
    /// A zero-byte request: there is nothing to allocate. Ask for at least one byte.
    #[error("invalid size {size}: allocations must be at least 1 byte")]
    InvalidSize {
        /// The size asked for.
        size: usize,
    },
    /// The pointer is not the start of a live allocation of this allocator (foreign, interior
    /// or never allocated). Never retry.
    #[error("invalid device pointer: {0} is not the start of a live allocation of this allocator")]
    InvalidPointer(crate::DevAddr),
    /// The allocation was made by another allocator (two allocators may hand out the same
    /// address, so freeing it here would free this allocator's own block). Nothing changed: free
    /// `ptr` through the allocator that made it, with `deallocate_ptr`.
    #[error("foreign allocation: {ptr} was made by allocator {owner}, not by this allocator {allocator}; nothing was freed: free it through the allocator that made it (deallocate_ptr({ptr}))")]
    ForeignAllocation {
        /// The allocation's address.
        ptr: crate::DevAddr,
        /// The allocator that made it.
        owner: crate::allocator::AllocatorId,
        /// The allocator it was given to.
        allocator: crate::allocator::AllocatorId,
    },
    /// The pointer was freed already and not allocated again since.
    #[error("double free: {0} was already freed")]
    DoubleFree(crate::DevAddr),
    /// The configuration is invalid.
    #[error("invalid allocator configuration: {0}")]
    InvalidConfig(#[from] crate::config::ConfigError),
    /// The backend failed in a way that is not out-of-memory (a driver error, a broken rule).
    #[error("backend failure: {0}")]
    Backend(#[from] BackendError),
}

impl AllocError {
    /// Whether freeing memory and retrying may succeed.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, AllocError::OutOfMemory(_))
    }
}
