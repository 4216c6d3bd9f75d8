//! Sleep and wake: allocations whose physical memory can be given back to the device while their
//! addresses stay valid, and mapped again later, contents restored if asked (what vLLM's
//! `CuMemAllocator` does for RLHF weight swapping).
//!
//! Each allocation of a [`SleepPool`] has its own reservation and its own physical handle, apart
//! from any caching allocator's segments: sleeping one is `unmap` + `release` of its handle (after
//! copying its bytes out, if asked), waking it is `create` + `map` + `set_access` at the same
//! address (and copying the bytes back). Nothing else shares its pages, so no other allocation
//! is touched. Touching an allocation while it sleeps faults (its range has nothing mapped).
//!
//! ```
//! use vmm_alloc::sleep::SleepPool;
//! use vmm_alloc::{Backend, HostBackend};
//! let host = HostBackend::new().unwrap();
//! let mut pool = SleepPool::new(host.clone(), Vec::new());
//! let p = pool.allocate(3000, "weights").unwrap();
//! host.write(p, b"kept").unwrap();
//! let slept = pool.sleep(Some("weights"), true).unwrap();
//! assert_eq!(slept.released_bytes, host.granularity() as u64);
//! pool.wake(Some("weights")).unwrap();
//! let mut back = [0u8; 4];
//! host.read(p, &mut back).unwrap();
//! assert_eq!(&back, b"kept");
//! pool.free(p).unwrap();
//! assert!(host.live().is_empty());
//! ```

use rustc_hash::FxHashMap;

use crate::backend::{Access, Backend, PhysHandle};
use crate::error::AllocError;
use crate::units::{DevAddr, VaRange};

/// One allocation of the pool.
struct Entry {
    range: VaRange,
    requested: usize,
    tag: String,
    /// `None` while asleep.
    handle: Option<PhysHandle>,
    /// The bytes copied out by a sleep that kept contents, written back on wake.
    saved: Option<Vec<u8>>,
}

/// What a [`SleepPool::sleep`] or [`SleepPool::wake`] did.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct SleepOutcome {
    /// Allocations that changed state.
    pub allocations: u64,
    /// Physical bytes given back to the device (sleep) or taken from it (wake).
    pub released_bytes: u64,
    /// Bytes copied out (sleep) or back in (wake).
    pub copied_bytes: u64,
}

/// Totals of a pool, for statistics.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct SleepTotals {
    /// Live allocations.
    pub allocations: u64,
    /// Bytes requested by them.
    pub requested_bytes: u64,
    /// Physical bytes mapped now (awake allocations).
    pub mapped_bytes: u64,
    /// Physical bytes given back while asleep.
    pub asleep_bytes: u64,
    /// Bytes held in host memory for asleep allocations that kept contents.
    pub saved_bytes: u64,
}

/// Allocations that can sleep and wake: see the [module docs](self).
pub struct SleepPool<B: Backend> {
    backend: B,
    access: Vec<Access>,
    entries: FxHashMap<u64, Entry>,
}

impl<B: Backend> std::fmt::Debug for SleepPool<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SleepPool")
            .field("allocations", &self.entries.len())
            .field("peers", &self.access.len().saturating_sub(1))
            .finish_non_exhaustive()
    }
}

impl<B: Backend> SleepPool<B> {
    /// A pool over `backend`; every mapping gets read-write access for the backend's device and
    /// for `peers`.
    pub fn new(backend: B, peers: Vec<u32>) -> Self {
        let mut access = vec![Access::read_write(backend.device())];
        access.extend(peers.into_iter().map(Access::read_write));
        Self {
            backend,
            access,
            entries: FxHashMap::default(),
        }
    }

    /// Allocates `size` bytes (rounded up to the granularity) under `tag`, awake. On failure
    /// nothing is left behind.
    pub fn allocate(&mut self, size: usize, tag: &str) -> Result<DevAddr, AllocError> {
        if size == 0 {
            return Err(AllocError::InvalidSize { size });
        }
        let g = self.backend.granularity();
        let len = size
            .checked_next_multiple_of(g)
            .ok_or(AllocError::TooLarge { size })?;
        let range = self.backend.reserve(len)?;
        let handle = match self.map_new(range.start, len) {
            Ok(h) => h,
            Err(e) => {
                let _ = self.backend.free_reservation(range);
                return Err(e);
            }
        };
        self.entries.insert(
            range.start.get(),
            Entry {
                range,
                requested: size,
                tag: tag.to_owned(),
                handle: Some(handle),
                saved: None,
            },
        );
        Ok(range.start)
    }

    /// Creates a handle of `len` bytes, maps it at `at` and sets access; undoes what it did on
    /// failure.
    fn map_new(&self, at: DevAddr, len: usize) -> Result<PhysHandle, AllocError> {
        let handle = self.backend.create(len)?;
        if let Err(e) = self.backend.map(at, len, handle, 0) {
            let _ = self.backend.release(handle);
            return Err(e.into());
        }
        if let Err(e) = self.backend.set_access(at, len, &self.access) {
            let _ = self.backend.unmap(at, len);
            let _ = self.backend.release(handle);
            return Err(e.into());
        }
        Ok(handle)
    }

    /// Whether `ptr` is the start of one of the pool's allocations.
    pub fn contains(&self, ptr: DevAddr) -> bool {
        self.entries.contains_key(&ptr.get())
    }

    /// The usable size of the allocation at `ptr`.
    pub fn size_of(&self, ptr: DevAddr) -> Option<usize> {
        self.entries.get(&ptr.get()).map(|e| e.range.len)
    }

    /// Frees the allocation at `ptr`, asleep or awake.
    pub fn free(&mut self, ptr: DevAddr) -> Result<(), AllocError> {
        let entry = self
            .entries
            .get(&ptr.get())
            .ok_or(AllocError::InvalidPointer(ptr))?;
        let range = entry.range;
        if let Some(handle) = entry.handle {
            self.backend.unmap(range.start, range.len)?;
            if let Err(e) = self.backend.release(handle) {
                // Keep the entry consistent: it is now asleep without saved bytes.
                if let Some(e) = self.entries.get_mut(&ptr.get()) {
                    e.handle = None;
                }
                return Err(e.into());
            }
        }
        self.entries.remove(&ptr.get());
        self.backend.free_reservation(range)?;
        Ok(())
    }

    /// Puts to sleep every awake allocation with `tag` (all of them with `None`): copies its bytes
    /// to host memory if `keep_contents`, unmaps it and releases its handle. The caller makes sure
    /// no device work still uses them (synchronize first). Stops at the first failure; the
    /// allocations done before it stay asleep, the failing one stays awake.
    pub fn sleep(
        &mut self,
        tag: Option<&str>,
        keep_contents: bool,
    ) -> Result<SleepOutcome, AllocError> {
        let mut out = SleepOutcome::default();
        let backend = &self.backend;
        for e in self.entries.values_mut() {
            let Some(handle) = e.handle else { continue };
            if tag.is_some_and(|t| t != e.tag) {
                continue;
            }
            let saved = if keep_contents {
                let mut bytes = vec![0u8; e.requested];
                backend.read(e.range.start, &mut bytes)?;
                Some(bytes)
            } else {
                None
            };
            backend.unmap(e.range.start, e.range.len)?;
            e.handle = None;
            // Unmapped: the handle's memory is unreachable whether or not release succeeds.
            backend.release(handle)?;
            out.allocations += 1;
            out.released_bytes += e.range.len as u64;
            out.copied_bytes += saved.as_ref().map_or(0, |b| b.len() as u64);
            e.saved = saved;
        }
        Ok(out)
    }

    /// Wakes every asleep allocation with `tag` (all with `None`): new physical memory mapped at
    /// the same addresses, the saved bytes written back (others read as whatever the new memory
    /// holds). Stops at the first failure (e.g. out of memory); the failing allocation stays
    /// asleep with its saved bytes, so waking can be retried after freeing memory.
    pub fn wake(&mut self, tag: Option<&str>) -> Result<SleepOutcome, AllocError> {
        let mut out = SleepOutcome::default();
        let keys: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.handle.is_none() && tag.is_none_or(|t| t == e.tag))
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            let (start, len) = {
                let e = &self.entries[&k];
                (e.range.start, e.range.len)
            };
            let handle = self.map_new(start, len)?;
            let Some(e) = self.entries.get_mut(&k) else {
                continue; // collected above: always there
            };
            e.handle = Some(handle);
            out.allocations += 1;
            out.released_bytes += len as u64;
            if let Some(bytes) = e.saved.take() {
                if let Err(err) = self.backend.write(start, &bytes) {
                    e.saved = Some(bytes);
                    return Err(err.into());
                }
                out.copied_bytes += bytes.len() as u64;
            }
        }
        Ok(out)
    }

    /// Totals over the pool's allocations.
    pub fn totals(&self) -> SleepTotals {
        let mut t = SleepTotals::default();
        for e in self.entries.values() {
            t.allocations += 1;
            t.requested_bytes += e.requested as u64;
            if e.handle.is_some() {
                t.mapped_bytes += e.range.len as u64;
            } else {
                t.asleep_bytes += e.range.len as u64;
            }
            t.saved_bytes += e.saved.as_ref().map_or(0, |b| b.len() as u64);
        }
        t
    }
}

impl<B: Backend> Drop for SleepPool<B> {
    /// Gives every mapping, handle and reservation back. Errors are ignored: there is no one to
    /// report them to.
    fn drop(&mut self) {
        let ptrs: Vec<u64> = self.entries.keys().copied().collect();
        for p in ptrs {
            let _ = self.free(DevAddr::new(p));
        }
    }
}
