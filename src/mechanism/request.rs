//! The checks every request passes before any policy runs, and its rounded size and pool.

use crate::config::{round_size, ONE_EXA_BYTES, ROUNDUP_INTERVALS, SMALL_SIZE};
use crate::error::AllocError;
use crate::stats::PoolKind;

/// A request that passed the checks: at least one byte, at most 1 EB (PyTorch's sanity bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// Bytes asked for.
    pub(crate) size: usize,
    /// `round_size(size)`: what a block for it holds.
    pub(crate) rounded: usize,
    /// The pool the rounded size belongs to (small: at most 1 MiB).
    pub(crate) pool: PoolKind,
}

impl Request {
    /// Checks `size` and rounds it with `roundup_power2_divisions`, as `malloc` does first.
    #[inline]
    pub(crate) fn new(
        size: usize,
        divisions: &[usize; ROUNDUP_INTERVALS],
    ) -> Result<Self, AllocError> {
        if size == 0 {
            return Err(AllocError::InvalidSize { size });
        }
        if size > ONE_EXA_BYTES {
            return Err(AllocError::TooLarge { size });
        }
        let rounded = round_size(size, divisions).ok_or(AllocError::TooLarge { size })?;
        Ok(Self {
            size,
            rounded,
            pool: pool_of(rounded),
        })
    }
}

/// The pool of a request rounded to `rounded` bytes: small up to `SMALL_SIZE` (1 MiB).
#[inline]
pub(crate) fn pool_of(rounded: usize) -> PoolKind {
    if rounded <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// Whether a request that needs at least `bytes` of device memory can never be served under
/// `limit` (the device's capacity, or the memory-fraction limit). The expandable policies then
/// fail at once with the out-of-memory report, before any cache is emptied or any page created
/// (issue 21: a 200 GiB request on an 80 GiB device made 24,584 driver calls before failing); the
/// classic allocator skips only the `cudaMalloc` the driver would refuse, and frees its cache and
/// retries first, as PyTorch does.
#[inline]
pub(crate) fn never_fits(bytes: usize, limit: usize) -> bool {
    bytes > limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_zero_and_more_than_one_exabyte_and_picks_the_pool_by_rounded_size() {
        let d = [0; ROUNDUP_INTERVALS];
        assert_eq!(
            Request::new(0, &d),
            Err(AllocError::InvalidSize { size: 0 })
        );
        let big = ONE_EXA_BYTES + 1;
        assert_eq!(
            Request::new(big, &d),
            Err(AllocError::TooLarge { size: big })
        );
        let r = Request::new(1, &d).unwrap();
        assert_eq!((r.rounded, r.pool), (512, PoolKind::Small));
        let r = Request::new(SMALL_SIZE, &d).unwrap();
        assert_eq!(r.pool, PoolKind::Small);
        assert_eq!(
            Request::new(SMALL_SIZE + 1, &d).unwrap().pool,
            PoolKind::Large
        );
    }
}
