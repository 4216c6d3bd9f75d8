//! PyTorch's out-of-memory report, as both allocators fill it.

use crate::backend::{Backend, CallKind};
use crate::error::{AllocError, OomReport};
use crate::mechanism::counters::track;
use crate::stats::MemoryStats;

/// The error for a request of `tried` bytes that could not be served after every retry: asks the
/// device what is free (a failed query reports 0) and says what the allocator holds. `held` is
/// what it holds from the device (reserved bytes, plus cached handles where it keeps them);
/// `allowed` its limit when a memory fraction below 1 is set; `address_space_exhausted` whether
/// the last reservation the request needed was refused for want of addresses.
pub(crate) fn oom_report<B: Backend>(
    backend: &B,
    stats: &mut MemoryStats,
    tried: usize,
    device_total: usize,
    allowed: Option<usize>,
    held: u64,
    address_space_exhausted: bool,
) -> AllocError {
    let free = track(stats, CallKind::MemInfo, backend.mem_info())
        .map(|i| i.free as u64)
        .unwrap_or(0);
    let allocated = stats.allocated_bytes.all.current;
    AllocError::OutOfMemory(Box::new(OomReport {
        device: backend.device(),
        tried: tried as u64,
        total: device_total as u64,
        free,
        allowed: allowed.map(|m| m as u64),
        allocated,
        reserved_unallocated: held.saturating_sub(allocated),
        address_space_exhausted,
    }))
}
