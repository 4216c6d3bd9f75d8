//! The addresses freed most recently, to tell a double free from a foreign pointer.

use std::collections::{HashMap, VecDeque};

/// Remembers up to `limit` of the latest frees; every operation is O(1) amortized, so a replay of
/// millions of frees does not pay for the memory of the last thousands.
#[derive(Debug)]
pub(crate) struct RecentFrees {
    limit: usize,
    /// Address → the stamp of its latest free.
    stamps: HashMap<u64, u64>,
    /// Frees in order; an entry whose stamp is no longer the address's current one is stale.
    order: VecDeque<(u64, u64)>,
    next: u64,
}

impl RecentFrees {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            stamps: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
        }
    }

    /// `addr` was just freed.
    pub(crate) fn remember(&mut self, addr: u64) {
        self.next += 1;
        self.stamps.insert(addr, self.next);
        self.order.push_back((addr, self.next));
        while self.order.len() > self.limit {
            if let Some((old, stamp)) = self.order.pop_front() {
                if self.stamps.get(&old) == Some(&stamp) {
                    self.stamps.remove(&old);
                }
            }
        }
    }

    /// `addr` was allocated again: freeing it is no longer a double free.
    pub(crate) fn forget(&mut self, addr: u64) {
        self.stamps.remove(&addr);
    }

    /// Whether `addr` was freed recently (and not allocated since).
    pub(crate) fn contains(&self, addr: u64) -> bool {
        self.stamps.contains_key(&addr)
    }
}
