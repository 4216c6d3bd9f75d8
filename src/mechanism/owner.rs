//! Which allocator made an [`Allocation`](crate::Allocation): an id per allocator, stamped on
//! every allocation it hands out and compared when one is given back.
//!
//! Two allocators can hand out the same address (two Sim backends start at the same base; two
//! devices' VA ranges may coincide), so an address alone cannot say whose block it is: freeing
//! A's allocation through B would free B's own block at that address and let B hand out memory
//! it still holds. The id is one integer compare on the free path.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::allocator::Allocation;
use crate::error::AllocError;
use crate::units::DevAddr;

/// An allocator's identity, unique in this process (never reused: 2^64 allocators would take
/// centuries to create).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct AllocatorId(NonZeroU64);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl AllocatorId {
    /// A fresh id: no other allocator of this process has it.
    pub(crate) fn fresh() -> Self {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        // `n` starts at 1 and would need 2^64 allocators to wrap to 0.
        Self(NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN))
    }

    /// The id as a number (what error messages show).
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl std::fmt::Display for AllocatorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Takes `allocation` back for the allocator `this`: its address when `this` made it, else the
/// [`AllocError::ForeignAllocation`] refusal (the handle is given up either way: the error
/// carries the address, to be freed through the allocator that made it).
#[inline]
pub(crate) fn take_back(this: AllocatorId, allocation: Allocation) -> Result<DevAddr, AllocError> {
    let owner = allocation.owner;
    let ptr = allocation.into_ptr();
    if owner == this {
        Ok(ptr)
    } else {
        Err(AllocError::ForeignAllocation {
            ptr,
            owner,
            allocator: this,
        })
    }
}
