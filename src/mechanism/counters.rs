//! The counters both allocators keep: backend calls by kind, and the block counters with
//! PyTorch's names (`allocation`, `allocated_bytes`, `active`, `active_bytes`,
//! `requested_bytes`), changed at the same three moments in both.

use crate::backend::CallKind;
use crate::error::BackendError;
use crate::stats::{MemoryStats, PoolKind};

/// Counts one backend call of `kind` (and its failure) in the allocator's own call counters.
#[inline]
pub(crate) fn track<T>(
    stats: &mut MemoryStats,
    kind: CallKind,
    result: Result<T, BackendError>,
) -> Result<T, BackendError> {
    stats.calls.count_call(kind);
    if result.is_err() {
        stats.calls.count_failure(kind);
    }
    result
}

impl MemoryStats {
    /// A block of `size` bytes was handed out for a request of `requested` bytes: it is live and
    /// active (`alloc_found_block`'s stat updates).
    #[inline]
    pub(crate) fn count_allocated(&mut self, pool: PoolKind, size: usize, requested: usize) {
        self.allocation.increase(pool, 1);
        self.allocated_bytes.increase(pool, size as u64);
        self.active.increase(pool, 1);
        self.active_bytes.increase(pool, size as u64);
        self.requested_bytes.increase(pool, requested as u64);
    }

    /// The user freed a block of `size` bytes: no longer live, still active until its events
    /// complete (`free`'s stat updates).
    #[inline]
    pub(crate) fn count_deallocated(&mut self, pool: PoolKind, size: usize) {
        self.allocation.decrease(pool, 1);
        self.allocated_bytes.decrease(pool, size as u64);
    }

    /// A freed block became reusable (`free_block`'s stat updates): no longer active.
    #[inline]
    pub(crate) fn count_inactive(&mut self, pool: PoolKind, size: usize, requested: usize) {
        self.active.decrease(pool, 1);
        self.active_bytes.decrease(pool, size as u64);
        self.requested_bytes.decrease(pool, requested as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BackendErrorKind;

    #[test]
    fn a_block_counted_through_its_life_leaves_every_current_at_zero() {
        let mut s = MemoryStats::default();
        s.count_allocated(PoolKind::Large, 4096, 4000);
        assert_eq!(s.allocated_bytes.large_pool.current, 4096);
        assert_eq!(s.requested_bytes.all.current, 4000);
        s.count_deallocated(PoolKind::Large, 4096);
        assert_eq!((s.allocation.all.current, s.active.all.current), (0, 1));
        s.count_inactive(PoolKind::Large, 4096, 4000);
        assert_eq!(
            s.active_bytes.all.current + s.requested_bytes.all.current,
            0
        );
        assert_eq!(s.active_bytes.all.peak, 4096);
    }

    #[test]
    fn track_counts_calls_and_failures() {
        let mut s = MemoryStats::default();
        let ok: Result<(), BackendError> = Ok(());
        let _ = track(&mut s, CallKind::Map, ok);
        let err = BackendError::new(CallKind::Map, BackendErrorKind::NoDevice("test".into()));
        let _ = track(&mut s, CallKind::Map, Err::<(), _>(err));
        assert_eq!(s.calls.calls(CallKind::Map), 2);
        assert_eq!(s.calls.failures(CallKind::Map), 1);
    }
}
