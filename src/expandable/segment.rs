//! One segment: a reserved VA range that grows in place by mapping pages.
//!
//! ```text
//!  va.start                                                                va.start + va.len
//!  ├── chunk ──┬── chunk ──┬── chunk ──┤  unmapped hole  ├── chunk ──┤  unmapped tail ...  │
//!  │ live │ free range     │ live │fr.│                  │ free      │                      │
//! ```
//!
//! A *chunk* is one physical handle mapped whole with one `map` call (a page, or a larger or
//! smaller handle harvested from elsewhere); it can only be unmapped whole. Free ranges lie in
//! mapped memory only, never span a hole, and are always coalesced with their neighbours, so two
//! free ranges never touch. Invariants (checked by `check`):
//! * chunks do not overlap and lie inside `va`; `mapped_bytes == Σ chunk.len`;
//! * every free range and every live block lies inside contiguous chunks;
//! * `Σ free + Σ live + Σ pending == mapped_bytes`.

use std::collections::BTreeMap;

use crate::backend::{PhysHandle, StreamId};
use crate::stats::PoolKind;
use crate::units::VaRange;

/// A handle mapped whole at one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) handle: PhysHandle,
    pub(crate) len: usize,
}

#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) va: VaRange,
    pub(crate) stream: StreamId,
    pub(crate) pool: PoolKind,
    /// start address -> chunk
    pub(crate) chunks: BTreeMap<u64, Chunk>,
    /// start address -> length of each free range
    pub(crate) free: BTreeMap<u64, usize>,
    pub(crate) mapped_bytes: usize,
    /// Chunks a rolled-back growth could not unmap (Note [Stuck chunks] in `growth.rs`): still
    /// mapped in the backend, never handed out, not counted in `mapped_bytes`.
    pub(crate) stuck: BTreeMap<u64, Chunk>,
}

impl Segment {
    pub(crate) fn new(va: VaRange, stream: StreamId, pool: PoolKind) -> Self {
        Self {
            va,
            stream,
            pool,
            chunks: BTreeMap::new(),
            free: BTreeMap::new(),
            mapped_bytes: 0,
            stuck: BTreeMap::new(),
        }
    }

    pub(crate) fn start(&self) -> u64 {
        self.va.start.get()
    }

    pub(crate) fn end(&self) -> u64 {
        self.va.start.get() + self.va.len as u64
    }

    /// The unmapped holes, in address order, as `(start, end)`. Stuck chunks are no hole: they
    /// are still mapped, and mapping over them would fail.
    pub(crate) fn holes(&self) -> Vec<(u64, u64)> {
        let mut holes = Vec::new();
        let mut cursor = self.start();
        let mut taken: Vec<(&u64, &Chunk)> = self.chunks.iter().chain(&self.stuck).collect();
        if !self.stuck.is_empty() {
            taken.sort_unstable_by_key(|&(&at, _)| at);
        }
        for (&at, c) in taken {
            if at > cursor {
                holes.push((cursor, at));
            }
            cursor = at + c.len as u64;
        }
        if cursor < self.end() {
            holes.push((cursor, self.end()));
        }
        holes
    }

    /// The free range that ends exactly at `at`, if any.
    pub(crate) fn free_ending_at(&self, at: u64) -> Option<(u64, usize)> {
        self.free
            .range(..at)
            .next_back()
            .filter(|(&s, &l)| s + l as u64 == at)
            .map(|(&s, &l)| (s, l))
    }

    /// The free range that contains `[at, at + len)`, if any.
    pub(crate) fn free_containing(&self, at: u64, len: usize) -> Option<(u64, usize)> {
        self.free
            .range(..=at)
            .next_back()
            .filter(|(&s, &l)| s + l as u64 >= at + len as u64)
            .map(|(&s, &l)| (s, l))
    }

    /// Chunks lying wholly inside free ranges: their pages hold nothing and can be unmapped.
    pub(crate) fn free_chunks(&self) -> Vec<(u64, Chunk)> {
        self.chunks
            .iter()
            .filter(|(&at, c)| self.free_containing(at, c.len).is_some())
            .map(|(&at, &c)| (at, c))
            .collect()
    }

    /// Whether `[at, at + len)` lies in contiguous chunks.
    pub(crate) fn is_mapped(&self, at: u64, len: usize) -> bool {
        let end = at + len as u64;
        let mut cursor = at;
        let first = self.chunks.range(..=at).next_back();
        for (&s, c) in first.into_iter().chain(self.chunks.range(at + 1..end)) {
            let c_end = s + c.len as u64;
            if c_end <= cursor {
                continue;
            }
            if s > cursor {
                return false;
            }
            cursor = c_end;
            if cursor >= end {
                return true;
            }
        }
        cursor >= end
    }
}
