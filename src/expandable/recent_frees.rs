//! The addresses freed most recently, to tell a double free from a foreign pointer.

/// Marks a slot that holds no address (no block starts at the last byte of the address space).
const EMPTY: u64 = u64::MAX;

/// A direct-mapped table of recently freed addresses: each address has one slot, chosen by a
/// multiplicative hash, and a later free landing in the same slot overwrites it. Every operation
/// is a hash and one load or store, so the hot path pays almost nothing for it (it took three
/// hash-map operations per allocate/free pair before). The price is precision, on an error path
/// only: a double free of an address whose slot was reused since is reported as an invalid
/// pointer, still an error that changes nothing. The latest free is always remembered.
#[derive(Debug)]
pub(crate) struct RecentFrees {
    slots: Box<[u64]>,
    /// `64 - log2(slots)`: the hash's top bits pick the slot.
    shift: u32,
}

impl RecentFrees {
    /// A table of `slots` entries, rounded up to a power of two (at least 2).
    pub(crate) fn new(slots: usize) -> Self {
        let slots = slots.max(2).next_power_of_two();
        Self {
            slots: vec![EMPTY; slots].into_boxed_slice(),
            shift: 64 - slots.trailing_zeros(),
        }
    }

    fn slot(&self, addr: u64) -> usize {
        // Fibonacci hashing; blocks are 512-byte aligned, so the low bits carry nothing.
        ((addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// `addr` was just freed.
    pub(crate) fn remember(&mut self, addr: u64) {
        let i = self.slot(addr);
        self.slots[i] = addr;
    }

    /// `addr` was allocated again: freeing it is no longer a double free.
    pub(crate) fn forget(&mut self, addr: u64) {
        let i = self.slot(addr);
        if self.slots[i] == addr {
            self.slots[i] = EMPTY;
        }
    }

    /// Whether `addr` was freed recently (and not allocated since).
    pub(crate) fn contains(&self, addr: u64) -> bool {
        addr != EMPTY && self.slots[self.slot(addr)] == addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_latest_free_and_forgets_a_reallocated_address() {
        let mut r = RecentFrees::new(4096);
        for i in 0..10_000u64 {
            let addr = 0x2_0000_0000 + i * 512;
            r.remember(addr);
            assert!(r.contains(addr));
            assert!(!r.contains(addr + 512), "never freed");
        }
        r.forget(0x2_0000_0000 + 9_999 * 512);
        assert!(!r.contains(0x2_0000_0000 + 9_999 * 512));
        assert!(!r.contains(EMPTY));
        // Consecutive block addresses spread over distinct slots: the last 2,000 are all kept.
        let kept = (8_000..10_000u64)
            .filter(|i| r.contains(0x2_0000_0000 + i * 512))
            .count();
        assert!(
            kept >= 1_500,
            "only {kept} of the last 2,000 frees remembered"
        );
    }
}
