//! Note [Deferred releases]: what the backend refused to take back, kept until it does.
//!
//! Giving memory back can fail half-way: an event whose release fails, a rolled-back growth whose
//! chunk will not unmap, a device allocation whose handle will not release after its unmap. None
//! of it may be forgotten (it would stay live in the backend for good), and none of it may be
//! handed out again (it belongs to no segment any more, and no statistic counts it). Both
//! allocators keep it in one [`Deferred`] list, try again when they give memory back
//! (`empty_cache`), and give everything back at teardown.

use crate::backend::{Backend, CallKind, EventId, PhysHandle};
use crate::error::BackendError;
use crate::mechanism::counters::track;
use crate::stats::MemoryStats;
use crate::units::{DevAddr, VaRange};

/// What becomes of a handle a leftover unmapped: released, or kept for reuse (the policy's
/// choice); an error stops the give-back, keeping the handle for the next try.
pub(crate) type Dispose<'a, B> =
    dyn FnMut(&B, &mut MemoryStats, PhysHandle, usize) -> Result<(), BackendError> + 'a;

/// A handle mapped whole at one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub(crate) at: DevAddr,
    pub(crate) len: usize,
    pub(crate) handle: PhysHandle,
}

/// What is left of one reservation the allocator gave up: mappings still to unmap, handles
/// unmapped but still to release, and the reservation itself, given back in that order. Each
/// step done is forgotten, so a retry goes on from where the last one stopped.
#[derive(Debug, Default)]
pub(crate) struct Leftover {
    /// Second mappings of handles that belong elsewhere (Note [Alias rescue] in
    /// `expandable/rescue.rs`): unmapped first, their handles left alone.
    aliases: Vec<(DevAddr, usize)>,
    mapped: Vec<Mapping>,
    unmapped: Vec<(PhysHandle, usize)>,
    va: Option<VaRange>,
}

impl Leftover {
    /// The reservation `va`, with nothing in it yet.
    pub(crate) fn reservation(va: VaRange) -> Self {
        Self {
            aliases: Vec::new(),
            mapped: Vec::new(),
            unmapped: Vec::new(),
            va: Some(va),
        }
    }

    /// Adds a handle of `len` bytes that is mapped nowhere.
    pub(crate) fn with_handle(mut self, handle: PhysHandle, len: usize) -> Self {
        self.unmapped.push((handle, len));
        self
    }

    /// Adds a handle mapped whole at `at` (given back after the mappings added before it).
    pub(crate) fn with_mapping(mut self, at: DevAddr, len: usize, handle: PhysHandle) -> Self {
        self.mapped.push(Mapping { at, len, handle });
        self
    }

    /// Adds a second mapping, at `at`, of a handle that belongs elsewhere: only unmapped.
    pub(crate) fn with_alias(mut self, at: DevAddr, len: usize) -> Self {
        self.aliases.push((at, len));
        self
    }

    /// Whether some mapping is still to unmap.
    pub(crate) fn is_mapped(&self) -> bool {
        !self.mapped.is_empty() || !self.aliases.is_empty()
    }

    /// Second mappings still to unmap: how many, and their bytes.
    pub(crate) fn aliases(&self) -> (usize, usize) {
        (self.aliases.len(), self.aliases.iter().map(|a| a.1).sum())
    }

    /// Bytes still mapped (aliases aside: no memory of their own).
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.mapped.iter().map(|m| m.len).sum()
    }

    /// Gives back what is left, in order (unmap, hand each unmapped handle to `dispose`, free
    /// the reservation), counting each call; stops at the first error, keeping the rest.
    /// `dispose` releases a handle, or keeps it for reuse: the policy's choice.
    pub(crate) fn give_back<B: Backend>(
        &mut self,
        backend: &B,
        stats: &mut MemoryStats,
        dispose: &mut Dispose<'_, B>,
    ) -> Result<(), BackendError> {
        while let Some(&(at, len)) = self.aliases.last() {
            track(stats, CallKind::Unmap, backend.unmap(at, len))?;
            self.aliases.pop();
        }
        while let Some(&m) = self.mapped.last() {
            track(stats, CallKind::Unmap, backend.unmap(m.at, m.len))?;
            self.mapped.pop();
            self.unmapped.push((m.handle, m.len));
        }
        while let Some(&(h, len)) = self.unmapped.last() {
            dispose(backend, stats, h, len)?;
            self.unmapped.pop();
        }
        if let Some(va) = self.va {
            track(
                stats,
                CallKind::FreeReservation,
                backend.free_reservation(va),
            )?;
            self.va = None;
        }
        Ok(())
    }

    /// Gives back everything, uncounted, ignoring errors: for teardown, where no one is left to
    /// report them to.
    fn abandon<B: Backend>(self, backend: &B) {
        for &(at, len) in self.aliases.iter().rev() {
            let _ = backend.unmap(at, len);
        }
        for m in self.mapped.iter().rev() {
            let _ = backend.unmap(m.at, m.len);
            let _ = backend.release(m.handle);
        }
        for &(h, _) in self.unmapped.iter().rev() {
            let _ = backend.release(h);
        }
        if let Some(va) = self.va {
            let _ = backend.free_reservation(va);
        }
    }
}

/// Releases `handle` (counted): the plain way to dispose of an unmapped handle.
pub(crate) fn release_handle<B: Backend>(
    backend: &B,
    stats: &mut MemoryStats,
    handle: PhysHandle,
    _len: usize,
) -> Result<(), BackendError> {
    track(stats, CallKind::Release, backend.release(handle))
}

/// Everything given up but not yet given back (Note [Deferred releases]).
#[derive(Debug, Default)]
pub(crate) struct Deferred {
    /// Events whose release failed.
    events: Vec<EventId>,
    leftovers: Vec<Leftover>,
}

impl Deferred {
    /// Whether an event's release waits to be tried again (by the next `process_events`).
    #[inline]
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Releases `event` (counted); one the backend refuses is kept and retried later.
    pub(crate) fn release_event<B: Backend>(
        &mut self,
        backend: &B,
        stats: &mut MemoryStats,
        event: EventId,
    ) {
        if track(stats, CallKind::ReleaseEvent, backend.release_event(event)).is_err() {
            self.events.push(event);
        }
    }

    /// Gives back `left` now if the backend takes it (handles disposed of by `dispose`), else
    /// keeps what is left for later. Returns whether all of it was given back.
    pub(crate) fn give_back_or_keep<B: Backend>(
        &mut self,
        backend: &B,
        stats: &mut MemoryStats,
        mut left: Leftover,
        dispose: &mut Dispose<'_, B>,
    ) -> bool {
        if left.give_back(backend, stats, dispose).is_err() {
            self.leftovers.push(left);
            return false;
        }
        true
    }

    /// Keeps `left` for later.
    pub(crate) fn keep(&mut self, left: Leftover) {
        self.leftovers.push(left);
    }

    /// Tries again to release the kept events, each once; keeps those refused again and
    /// returns the first error.
    #[inline]
    pub(crate) fn retry_events<B: Backend>(
        &mut self,
        backend: &B,
        stats: &mut MemoryStats,
    ) -> Result<(), BackendError> {
        if self.events.is_empty() {
            return Ok(());
        }
        let mut first = Ok(());
        for e in std::mem::take(&mut self.events) {
            let released = track(stats, CallKind::ReleaseEvent, backend.release_event(e));
            if let Err(err) = released {
                self.events.push(e);
                first = first.and(Err(err));
            }
        }
        first
    }

    /// Tries again to give back the kept leftovers, each once; keeps what is refused again and
    /// returns the first error.
    pub(crate) fn retry_leftovers<B: Backend>(
        &mut self,
        backend: &B,
        stats: &mut MemoryStats,
        dispose: &mut Dispose<'_, B>,
    ) -> Result<(), BackendError> {
        let mut first = Ok(());
        for mut left in std::mem::take(&mut self.leftovers) {
            if let Err(err) = left.give_back(backend, stats, dispose) {
                self.leftovers.push(left);
                first = first.and(Err(err));
            }
        }
        first
    }

    /// Bytes still mapped in the kept leftovers.
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.leftovers.iter().map(Leftover::mapped_bytes).sum()
    }

    /// Second mappings (of handles that belong elsewhere) still to unmap in the kept leftovers:
    /// how many, and their bytes.
    pub(crate) fn aliases(&self) -> (usize, usize) {
        let each = self.leftovers.iter().map(Leftover::aliases);
        each.fold((0, 0), |(n, b), (m, c)| (n + m, b + c))
    }

    /// Gives everything back, uncounted, ignoring errors (teardown).
    pub(crate) fn abandon_all<B: Backend>(&mut self, backend: &B) {
        for e in std::mem::take(&mut self.events) {
            let _ = backend.release_event(e);
        }
        for left in std::mem::take(&mut self.leftovers) {
            left.abandon(backend);
        }
    }
}
