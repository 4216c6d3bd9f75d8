//! `HostBackend`: the CUDA VMM model over real CPU memory, so data-integrity tests run without a GPU.
//! (The whole description is on the type, which is what the docs show.)

mod sys;

use std::sync::Arc;

use crate::backend::checked::Checked;
use crate::backend::emulated::emulated_controls;
use crate::backend::error::{BackendError, BackendErrorKind as E};
use crate::backend::{forward_backend, CallKind, Capabilities};

use sys::HostDevice;

/// Settings of a [`HostBackend`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HostConfig {
    /// Allocation granularity: a power of two and a multiple of the OS page size. Default 2 MiB.
    pub granularity: usize,
    /// Physical memory the backend will hand out, a multiple of the granularity. Memory is only
    /// used when written, so this may exceed what the machine has. Default 16 GiB.
    pub capacity: usize,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            granularity: 2 << 20,
            capacity: 16 << 30,
        }
    }
}

impl HostConfig {
    fn validate(&self) -> Result<(), E> {
        let page = rustix::param::page_size();
        if !self.granularity.is_power_of_two() || !self.granularity.is_multiple_of(page) {
            return Err(E::BadConfig(format!(
                "granularity {:#x} must be a power of two and a multiple of the OS page size {page:#x}",
                self.granularity
            )));
        }
        if self.capacity == 0 || !self.capacity.is_multiple_of(self.granularity) {
            return Err(E::BadConfig(format!(
                "capacity {:#x} must be a non-zero multiple of the granularity {:#x}",
                self.capacity, self.granularity
            )));
        }
        Ok(())
    }
}

/// `HostBackend`: the CUDA VMM model over real CPU memory, so data-integrity tests run without a GPU.
///
/// **Linux only** (memfd, `MAP_FIXED` remapping, hole punching): on other platforms the type
/// does not exist; use [`SimBackend`](crate::SimBackend) for bookkeeping without memory.
///
/// ```text
///  reservation  mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE), aligned to the granularity
///  ┌──────────┬──────────┬──────────────────────┬──────────┐
///  │ mapped   │ mapped   │ reserved, unmapped    │ mapped   │  ← mmap(MAP_SHARED|MAP_FIXED, pool, off)
///  └────┬─────┴────┬─────┴──────────────────────┴────┬─────┘     unmap = mmap(PROT_NONE, MAP_FIXED)
///       │          │                                  │           over the range again
///  pool memfd (one file, sparse, 2^60 bytes of offsets):
///  [handle 1][handle 2][ hole punched: released ][handle 4] ...
/// ```
///
/// Note \[Host pool\]: a physical handle is a range of one large sparse memfd rather than a memfd of
/// its own, because one fd per handle would cap live handles at `RLIMIT_NOFILE` (20,000 here,
/// ~39 GiB of 2 MiB handles). Offsets are handed out in increasing order and never reused: the
/// file is 2^60 bytes long, so they cannot run out, and the pool can never fragment. When a handle
/// is released and its last mapping goes, its range is hole-punched (`fallocate`), returning the
/// memory to the OS. Pages cost memory only once written.
///
/// Mappings are created `PROT_NONE` and made accessible by `set_access` (`mprotect`), as CUDA
/// mappings are inaccessible until `cuMemSetAccess`. Each mapping is at least one kernel VMA, and
/// a process may hold 65,530 (`vm.max_map_count`): about 64 GiB of scattered 2 MiB mappings, far
/// more than tests need; tests must still not leak mappings across cases.
///
/// Cloning is cheap and shares the state.
///
/// ```
/// use vmm_alloc::backend::{Access, Backend, HostBackend};
/// let host = HostBackend::new().unwrap();
/// let g = host.granularity();
/// let va = host.reserve(2 * g).unwrap();
/// let h = host.create(g).unwrap();
/// // One handle mapped at two addresses: a write through one is read through the other.
/// host.map(va.start, g, h, 0).unwrap();
/// let second = va.start.checked_add(g).unwrap();
/// host.map(second, g, h, 0).unwrap();
/// host.set_access(va.start, 2 * g, &[Access::read_write(0)]).unwrap();
/// host.write(va.start, b"hello").unwrap();
/// let mut out = [0u8; 5];
/// host.read(second, &mut out).unwrap();
/// assert_eq!(&out, b"hello");
/// host.unmap(va.start, 2 * g).unwrap();
/// host.release(h).unwrap();
/// host.free_reservation(va).unwrap();
/// assert!(host.live().is_empty());
/// ```
#[derive(Clone)]
pub struct HostBackend {
    inner: Arc<Checked<HostDevice>>,
}

impl HostBackend {
    /// A host backend with 2 MiB granularity and 16 GiB of capacity.
    pub fn new() -> Result<Self, BackendError> {
        Self::with_config(HostConfig::default())
    }

    /// A host backend with these settings, or why they are invalid or the OS refused.
    pub fn with_config(config: HostConfig) -> Result<Self, BackendError> {
        let init = |e| BackendError::new(CallKind::Init, e);
        config.validate().map_err(init)?;
        let raw = HostDevice::open(config.granularity, config.capacity).map_err(init)?;
        let caps = Capabilities::BYTES | Capabilities::FAULT_INJECTION | Capabilities::HELD_EVENTS;
        Ok(Self {
            inner: Arc::new(Checked::new(raw, caps)),
        })
    }

    /// Bytes of the pool memfd that hold memory right now (written and not hole-punched), as the
    /// kernel counts them: shows that released handles really give their memory back.
    pub fn resident_pool_bytes(&self) -> Result<u64, BackendError> {
        self.inner
            .with_raw(|raw| raw.resident_bytes())
            .map_err(|e| BackendError::new(CallKind::MemInfo, e))
    }
}

forward_backend!(HostBackend);
emulated_controls!(HostBackend, HostConfig);
