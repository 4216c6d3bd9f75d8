//! Note [Handle cache]: physical handles that were unmapped but not released, by size.
//!
//! PyTorch releases a handle on every unmap and creates a new one on every map (pytorch#166116),
//! and `cuMemCreate` is most of the cost of mapping a fresh page (193 µs of ~231 µs on an A100).
//! Unmapped handles therefore come here and are mapped again before any new one is created.
//! A handle can be mapped anywhere, so a cached handle serves any segment whose hole it fits.

use rustc_hash::FxHashSet;

use crate::backend::{Backend, CallKind, PhysHandle};
use crate::error::BackendError;
use crate::mechanism::counters::track;
use crate::mechanism::violation::InvariantViolation;
use crate::stats::MemoryStats;

/// The cached handles by length: a sorted vector, not a tree. A handful of lengths is cached at a
/// time (pages and exact tails), and on a full device every remapped page passes through here
/// (put by the harvest, taken at once by the growth): the tree's searches, node inserts and
/// removals and a fresh list per length were 5.5 % of the churn bench's full-device time.
#[derive(Default, Debug)]
pub(crate) struct HandleCache {
    /// (length, handles of that length), by length; no list empty.
    by_len: Vec<(usize, Vec<PhysHandle>)>,
    /// Lists emptied, kept for their allocation.
    spare: Vec<Vec<PhysHandle>>,
    bytes: usize,
    count: usize,
}

impl HandleCache {
    /// What becomes of a handle unmapped for good: kept here when `cached` (the handle cache is
    /// on), else released; one whose release fails is kept here all the same, so it is never
    /// lost (the next trim releases it again).
    pub(crate) fn keep_or_release<B: Backend>(
        &mut self,
        cached: bool,
        backend: &B,
        stats: &mut MemoryStats,
        handle: PhysHandle,
        len: usize,
    ) -> Result<(), BackendError> {
        if cached {
            self.put(handle, len);
            return Ok(());
        }
        let result = track(stats, CallKind::Release, backend.release(handle));
        if result.is_err() {
            self.put(handle, len);
        }
        result
    }

    pub(crate) fn put(&mut self, handle: PhysHandle, len: usize) {
        match self.by_len.binary_search_by_key(&len, |e| e.0) {
            Ok(i) => self.by_len[i].1.push(handle),
            Err(i) => {
                let mut list = self.spare.pop().unwrap_or_default();
                list.push(handle);
                self.by_len.insert(i, (len, list));
            }
        }
        self.bytes += len;
        self.count += 1;
    }

    /// A handle for a chunk of preferably `want` bytes that must fit in `room` bytes: exactly
    /// `want` if cached, else the largest that fits both, else the largest that fits `room`.
    pub(crate) fn take(&mut self, want: usize, room: usize) -> Option<(PhysHandle, usize)> {
        // The last length at or below `limit`.
        let at_most = |limit: usize| self.by_len.partition_point(|e| e.0 <= limit).checked_sub(1);
        let i = match self.by_len.binary_search_by_key(&want, |e| e.0) {
            Ok(i) => i,
            Err(_) => at_most(want.min(room)).or_else(|| at_most(room))?,
        };
        self.take_at(i)
    }

    /// A handle of exactly `len` bytes, if one is cached.
    pub(crate) fn take_exact(&mut self, len: usize) -> Option<PhysHandle> {
        let i = self.by_len.binary_search_by_key(&len, |e| e.0).ok()?;
        self.take_at(i).map(|(h, _)| h)
    }

    /// Takes out of the cache every handle of `wanted` it holds; returns those taken (the caller
    /// knows their lengths).
    pub(crate) fn take_these(&mut self, wanted: &FxHashSet<PhysHandle>) -> FxHashSet<PhysHandle> {
        let mut taken = FxHashSet::default();
        for (len, list) in &mut self.by_len {
            let before = list.len();
            list.retain(|h| !(wanted.contains(h) && taken.insert(*h)));
            let gone = before - list.len();
            self.bytes -= gone * *len;
            self.count -= gone;
        }
        for (_, list) in self.by_len.extract_if(.., |e| e.1.is_empty()) {
            self.spare.push(list);
        }
        taken
    }

    /// The largest cached handle, to release.
    pub(crate) fn take_largest(&mut self) -> Option<(PhysHandle, usize)> {
        let last = self.by_len.len().checked_sub(1)?;
        self.take_at(last)
    }

    /// A handle of the `i`-th length cached.
    fn take_at(&mut self, i: usize) -> Option<(PhysHandle, usize)> {
        let (len, list) = self.by_len.get_mut(i)?;
        let (len, handle) = (*len, list.pop()?);
        if list.is_empty() {
            let (_, list) = self.by_len.remove(i);
            self.spare.push(list);
        }
        self.bytes -= len;
        self.count -= 1;
        Some((handle, len))
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Checks that the running totals equal the lists' sums and that no list is empty.
    pub(crate) fn check(&self) -> Result<(), InvariantViolation> {
        let count: usize = self.by_len.iter().map(|(_, v)| v.len()).sum();
        let bytes: usize = self.by_len.iter().map(|(len, v)| len * v.len()).sum();
        let what = "handle cache: handles kept, against its lists (no list empty, lengths sorted)";
        let sorted = self.by_len.windows(2).all(|w| w[0].0 < w[1].0);
        if count != self.count || !sorted || self.by_len.iter().any(|(_, v)| v.is_empty()) {
            return Err(InvariantViolation::Count {
                what,
                kept: self.count,
                found: count,
            });
        }
        if bytes != self.bytes {
            return Err(InvariantViolation::Count {
                what: "handle cache: bytes kept, against its lists",
                kept: self.bytes,
                found: bytes,
            });
        }
        Ok(())
    }
}
