//! `SimBackend`: exact CUDA bookkeeping with no memory behind it.
//! (The whole description is on the type, which is what the docs show.)

use std::sync::Arc;

use crate::backend::checked::Checked;
use crate::backend::emulated::{emulated_controls, sim_event_methods};
use crate::backend::error::{BackendError, BackendErrorKind as E};
use crate::backend::events::SimEvents;
use crate::backend::raw::{RawDevice, RawEvent, RawHandle, RawResult};
use crate::backend::sim_va::VaMap;
use crate::backend::sim_window::{Window, SPACE_BASE};
use crate::backend::{forward_backend, Access, Capabilities, MemInfo};

/// Settings of a [`SimBackend`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SimConfig {
    /// Allocation granularity: a power of two, at least 512. Default 2 MiB (an H100's).
    pub granularity: usize,
    /// Physical memory, a multiple of the granularity. Default 80 GiB.
    pub capacity: usize,
    /// Virtual address space available to reservations. Default 128 TiB: what an x86-64 process
    /// has for CUDA's reservations (47-bit user addresses; PyTorch's expandable segments ran out
    /// at about 127.5 TiB reserved, `../shared/reference/reliability-tests.md`, bug 15), so that
    /// a replay of many streams runs out where a device would.
    pub va_limit: u64,
    /// Devices an access list may name (the own device is 0). Default 1.
    pub devices: u32,
    /// Where a reservation goes: false (the default), the best-fitting free range's lowest
    /// addresses, so reservations made one after another go up; true, the highest free
    /// addresses first, so they go down. A driver places reservations as it likes: tests replay
    /// with both to show that the expandable policies decide alike wherever the addresses fall.
    pub reserve_from_top: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            granularity: 2 << 20,
            capacity: 80 << 30,
            va_limit: 128 << 40,
            devices: 1,
            reserve_from_top: false,
        }
    }
}

impl SimConfig {
    fn validate(&self) -> Result<(), E> {
        if !self.granularity.is_power_of_two() || self.granularity < 512 {
            return Err(E::BadConfig(format!(
                "granularity {:#x} must be a power of two of at least 512",
                self.granularity
            )));
        }
        if !self.capacity.is_multiple_of(self.granularity) {
            return Err(E::BadConfig(format!(
                "capacity {:#x} must be a multiple of the granularity {:#x}",
                self.capacity, self.granularity
            )));
        }
        if self.devices == 0 {
            return Err(E::BadConfig("devices must be at least 1".into()));
        }
        if SPACE_BASE.checked_add(self.va_limit).is_none() {
            return Err(E::BadConfig(format!(
                "va_limit {:#x} overflows the address space",
                self.va_limit
            )));
        }
        Ok(())
    }
}

/// The raw simulated device: a best-fit address-space map, handle numbers and events.
pub(crate) struct SimDevice {
    config: SimConfig,
    /// Live reservations and the gaps between them (O(log n) per reserve and free), inside
    /// `window`.
    va: VaMap,
    /// This device's own part of the process's address space (given back on drop).
    _window: Window,
    next_handle: RawHandle,
    pub(crate) events: SimEvents,
}

impl RawDevice for SimDevice {
    const NAME: &'static str = "sim";

    fn granularity(&self) -> usize {
        self.config.granularity
    }
    fn ordinal(&self) -> u32 {
        0
    }
    fn device_count(&self) -> u32 {
        self.config.devices
    }
    fn capacity(&self) -> Option<usize> {
        Some(self.config.capacity)
    }
    fn has_bytes(&self) -> bool {
        false
    }

    fn reserve(&mut self, len: usize) -> RawResult<u64> {
        self.va
            .reserve(len as u64)
            .ok_or(E::AddressSpaceExhausted { requested: len })
    }
    fn free_reservation(&mut self, base: u64, _len: usize) -> RawResult<()> {
        self.va.free(base);
        Ok(())
    }
    fn create(&mut self, _len: usize) -> RawResult<RawHandle> {
        self.next_handle += 1;
        Ok(self.next_handle)
    }
    fn release(&mut self, _handle: RawHandle) -> RawResult<()> {
        Ok(())
    }
    fn map(&mut self, _at: u64, _len: usize, _handle: RawHandle, _offset: usize) -> RawResult<()> {
        Ok(())
    }
    fn unmap(&mut self, _at: u64, _len: usize) -> RawResult<()> {
        Ok(())
    }
    fn set_access(&mut self, _at: u64, _len: usize, _access: &[Access]) -> RawResult<()> {
        Ok(())
    }
    fn mem_info(&mut self) -> RawResult<Option<MemInfo>> {
        Ok(None)
    }
    sim_event_methods!();
    fn write(&mut self, _at: u64, _data: &[u8]) -> RawResult<()> {
        Err(E::Unsupported("moving bytes (Sim has no memory)"))
    }
    fn read(&mut self, _at: u64, _out: &mut [u8]) -> RawResult<()> {
        Err(E::Unsupported("moving bytes (Sim has no memory)"))
    }
}

/// `SimBackend`: exact CUDA bookkeeping with no memory behind it.
///
/// Addresses are fake but realistic (reservations start at `0x2_0000_0000`, aligned to the
/// granularity, one granule apart so that two reservations never look contiguous; a new one
/// takes the smallest hole that holds it, O(log n) in the live reservations). Like real device
/// addresses they are unique in the process: each backend draws them from its own window of
/// `va_limit` bytes, disjoint from every other live Sim backend's, so a pointer one allocator
/// handed out is never a live block of another (the first backend alive in a process starts at
/// `0x2_0000_0000`; see `sim_window.rs` for the limits). Physical capacity is enforced
/// exactly; events complete at once unless a test holds their stream.
///
/// Cloning is cheap and shares the state, so a test can keep a clone to count calls and check
/// for leaks while an allocator owns another.
///
/// ```
/// use vmm_alloc::backend::{Access, Backend, SimBackend};
/// let sim = SimBackend::new();
/// let g = sim.granularity();
/// let va = sim.reserve(4 * g).unwrap();
/// let h = sim.create(g).unwrap();
/// sim.map(va.start, g, h, 0).unwrap();
/// sim.set_access(va.start, g, &[Access::read_write(0)]).unwrap();
/// assert!(sim.unmap(va.start, 2 * g).is_err()); // half of it was never mapped
/// sim.unmap(va.start, g).unwrap();
/// sim.release(h).unwrap();
/// sim.free_reservation(va).unwrap();
/// assert!(sim.live().is_empty());
/// ```
#[derive(Clone)]
pub struct SimBackend {
    inner: Arc<Checked<SimDevice>>,
}

impl SimBackend {
    /// A simulated H100: 2 MiB granularity, 80 GiB.
    pub fn new() -> Self {
        Self::build(SimConfig::default())
    }

    /// A simulated device with these settings, or why they are invalid.
    pub fn with_config(config: SimConfig) -> Result<Self, BackendError> {
        config
            .validate()
            .map_err(|e| BackendError::new(crate::backend::CallKind::Init, e))?;
        Ok(Self::build(config))
    }

    fn build(config: SimConfig) -> Self {
        let window = Window::take(config.va_limit, config.granularity as u64);
        let base = window.base();
        let raw = SimDevice {
            config,
            va: VaMap::new(
                base,
                base.saturating_add(config.va_limit),
                config.granularity as u64,
            )
            .placing_from_top(config.reserve_from_top),
            _window: window,
            next_handle: 0,
            events: SimEvents::default(),
        };
        let caps = Capabilities::FAULT_INJECTION | Capabilities::HELD_EVENTS;
        Self {
            inner: Arc::new(Checked::new(raw, caps)),
        }
    }

    /// The settings this backend was built with.
    pub fn config(&self) -> SimConfig {
        self.inner.with_raw(|raw| raw.config)
    }
}

impl Default for SimBackend {
    fn default() -> Self {
        Self::new()
    }
}

forward_backend!(SimBackend);
emulated_controls!(SimBackend, SimConfig);
