//! PyTorch's request rounding, ported from `CUDACachingAllocator.cpp` (`round_size`,
//! `roundup_power2_next_division`, `get_allocation_size`), names kept so upstream diffs port over.

use crate::config::alloc_conf::ROUNDUP_INTERVALS;

/// `kMinBlockSize`: every size is rounded to a multiple of 512 bytes, at least 512.
pub const MIN_BLOCK_SIZE: usize = 512;
/// `kSmallSize`: the largest "small" request (≤ is small).
pub const SMALL_SIZE: usize = 1 << 20;
/// `kSmallBuffer`: small requests are packed into 2 MiB segments.
pub(crate) const SMALL_BUFFER: usize = 2 << 20;
/// `kMinLargeAlloc`: requests below 10 MiB may share a `large_segment_size` segment.
pub(crate) const MIN_LARGE_ALLOC: usize = 10 << 20;
/// `kRoundLarge`: larger segments are rounded to 2 MiB.
pub(crate) const ROUND_LARGE: usize = 2 << 20;
/// PyTorch's guard: requests above 1 EB fail before anything else is tried.
pub const ONE_EXA_BYTES: usize = 1 << 60;

/// `roundup_power2_divisions(size)`: the divisions configured for `size`'s interval.
pub(crate) fn divisions_for(size: usize, divisions: &[usize; ROUNDUP_INTERVALS]) -> usize {
    let log = if size == 0 { 0 } else { size.ilog2() as usize };
    let index = log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1);
    divisions[index]
}

/// `roundup_power2_next_division(size, divisions)`: `size` rounded up to the next of `divisions`
/// equal steps between two powers of two. `None` on overflow.
pub(crate) fn roundup_power2_next_division(size: usize, divisions: usize) -> Option<usize> {
    if size.is_power_of_two() {
        return Some(size);
    }
    let floor = 1usize << size.ilog2();
    let mut step = floor >> divisions.max(1).ilog2();
    if step == 0 {
        step = floor << 1;
    }
    size.checked_next_multiple_of(step)
}

/// `round_size(size)`: what a request of `size` bytes occupies. `None` when rounding overflows.
///
/// Ports the code, not the comment: division rounding applies only above `512 × divisions`.
/// ```
/// use vmm_alloc::config::{round_size, ROUNDUP_INTERVALS};
/// let none = [0; ROUNDUP_INTERVALS];
/// assert_eq!(round_size(1, &none), Some(512));
/// assert_eq!(round_size(1200, &[4; ROUNDUP_INTERVALS]), Some(1536));
/// assert_eq!(round_size(5000, &[4; ROUNDUP_INTERVALS]), Some(5120));
/// ```
pub fn round_size(size: usize, divisions: &[usize; ROUNDUP_INTERVALS]) -> Option<usize> {
    if size < MIN_BLOCK_SIZE {
        return Some(MIN_BLOCK_SIZE);
    }
    let d = divisions_for(size, divisions);
    if d > 1 && size > MIN_BLOCK_SIZE * d {
        roundup_power2_next_division(size, d)
    } else {
        size.checked_next_multiple_of(MIN_BLOCK_SIZE)
    }
}

/// `get_allocation_size(size)`: the size of a new classic segment for a rounded request.
pub fn get_allocation_size(size: usize, large_segment_size: usize) -> Option<usize> {
    if size <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if size < MIN_LARGE_ALLOC {
        Some(large_segment_size)
    } else {
        size.checked_next_multiple_of(ROUND_LARGE)
    }
}
