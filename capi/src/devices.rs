//! One allocator per device, created on first use with the settings frozen at that moment.

use std::sync::OnceLock;

use parking_lot::Mutex;
use vmm_alloc::sleep::{SleepOutcome, SleepPool, SleepTotals};
use vmm_alloc::snapshot::Snapshot;
use vmm_alloc::{
    AllocError, Allocation, Allocator, Backend, DevAddr, ExpandableAllocator, HostBackend,
    MemoryStats, SimBackend, StreamId,
};

use crate::boundary::{CallError, E_FAILED, E_INVALID};
use crate::settings::{BackendKind, Settings};

/// Devices the library can address: PyTorch's device indices are small.
pub const MAX_DEVICES: usize = 64;

/// What the exported functions do with one device, whatever its backend.
pub trait DeviceOps: Send + Sync {
    /// The caching allocator.
    fn allocator(&self) -> &dyn Allocator;
    /// The stream id for a raw `cudaStream_t` value (adopted on Cuda).
    fn stream(&self, raw: u64) -> Result<StreamId, CallError>;
    /// Allocates from the sleep pool under `tag`.
    fn sleep_allocate(&self, size: usize, tag: &str) -> Result<DevAddr, AllocError>;
    /// Frees `ptr` if the sleep pool has it; `None` if not the pool's.
    fn sleep_free(&self, ptr: DevAddr) -> Option<Result<(), AllocError>>;
    /// Puts tagged allocations to sleep.
    fn sleep(&self, tag: Option<&str>, keep: bool) -> Result<SleepOutcome, AllocError>;
    /// Wakes tagged allocations.
    fn wake(&self, tag: Option<&str>) -> Result<SleepOutcome, AllocError>;
    /// The sleep pool's totals.
    fn sleep_totals(&self) -> SleepTotals;
    /// Device memory (total, free) as the backend reports it.
    fn mem_info(&self) -> Option<(u64, u64)>;
    /// The backend's name.
    fn backend_name(&self) -> &'static str;
}

struct Device<B: Backend + Clone> {
    backend: B,
    alloc: ExpandableAllocator<B>,
    sleep: Mutex<SleepPool<B>>,
    adopt: fn(&B, u64) -> Result<StreamId, CallError>,
}

impl<B: Backend + Clone + 'static> DeviceOps for Device<B> {
    fn allocator(&self) -> &dyn Allocator {
        &self.alloc
    }
    fn stream(&self, raw: u64) -> Result<StreamId, CallError> {
        (self.adopt)(&self.backend, raw)
    }
    fn sleep_allocate(&self, size: usize, tag: &str) -> Result<DevAddr, AllocError> {
        self.sleep.lock().allocate(size, tag)
    }
    fn sleep_free(&self, ptr: DevAddr) -> Option<Result<(), AllocError>> {
        let mut pool = self.sleep.lock();
        pool.contains(ptr).then(|| pool.free(ptr))
    }
    fn sleep(&self, tag: Option<&str>, keep: bool) -> Result<SleepOutcome, AllocError> {
        self.sleep.lock().sleep(tag, keep)
    }
    fn wake(&self, tag: Option<&str>) -> Result<SleepOutcome, AllocError> {
        self.sleep.lock().wake(tag)
    }
    fn sleep_totals(&self) -> SleepTotals {
        self.sleep.lock().totals()
    }
    fn mem_info(&self) -> Option<(u64, u64)> {
        self.backend
            .mem_info()
            .ok()
            .map(|m| (m.total as u64, m.free as u64))
    }
    fn backend_name(&self) -> &'static str {
        self.backend.name()
    }
}

/// Streams of the simulated backends are their raw values.
fn raw_stream<B>(_: &B, raw: u64) -> Result<StreamId, CallError> {
    Ok(StreamId::sim(raw))
}

fn open<B: Backend + Clone + 'static>(
    backend: B,
    settings: &Settings,
    adopt: fn(&B, u64) -> Result<StreamId, CallError>,
) -> Result<Box<dyn DeviceOps>, CallError> {
    let alloc = ExpandableAllocator::new(backend.clone(), settings.config.clone())
        .map_err(|e| CallError::new(E_FAILED, e.to_string()))?;
    let sleep = Mutex::new(SleepPool::new(
        backend.clone(),
        settings.config.peers.clone(),
    ));
    Ok(Box::new(Device {
        backend,
        alloc,
        sleep,
        adopt,
    }))
}

fn open_device(index: u32, settings: &Settings) -> Result<Box<dyn DeviceOps>, CallError> {
    let failed = |e: vmm_alloc::BackendError| {
        CallError::new(
            E_FAILED,
            format!(
                "vmm_alloc: cannot open device {index} on the {} backend: {e}",
                settings.backend.name()
            ),
        )
    };
    match settings.backend {
        BackendKind::Sim => {
            let mut cfg = vmm_alloc::backend::SimConfig::default();
            if let Some(c) = settings.capacity {
                cfg.capacity = c;
            }
            open(
                SimBackend::with_config(cfg).map_err(failed)?,
                settings,
                raw_stream,
            )
        }
        BackendKind::Host => {
            let mut cfg = vmm_alloc::backend::HostConfig::default();
            if let Some(c) = settings.capacity {
                cfg.capacity = c;
            }
            open(
                HostBackend::with_config(cfg).map_err(failed)?,
                settings,
                raw_stream,
            )
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            // The Cuda backend leaves the caller's current context as it was, in every call
            // (opening included): nothing to save here.
            let backend = vmm_alloc::CudaBackend::new(index as usize).map_err(failed)?;
            open(backend, settings, |b, raw| {
                // SAFETY: `raw` is a cudaStream_t PyTorch passed for this device; PyTorch keeps
                // its streams alive for the life of the process (its stream pools never destroy
                // them), and user streams outlive the allocations made on them.
                unsafe { b.adopt_raw_stream(raw) }
                    .map_err(|e| CallError::new(E_FAILED, e.to_string()))
            })
        }
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => Err(CallError::new(
            E_FAILED,
            "vmm_alloc was built without the cuda feature: set VMM_ALLOC_BACKEND=host or sim",
        )),
    }
}

/// The settings (fixed once the first device opens) and the devices.
pub struct Registry {
    pending: Mutex<Option<Settings>>,
    frozen: OnceLock<Settings>,
    devices: [OnceLock<Box<dyn DeviceOps>>; MAX_DEVICES],
    open_lock: Mutex<()>,
}

/// The process's registry.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        pending: Mutex::new(None),
        frozen: OnceLock::new(),
        devices: [const { OnceLock::new() }; MAX_DEVICES],
        open_lock: Mutex::new(()),
    })
}

impl Registry {
    /// Replaces the settings; refused once a device is open (its allocator already uses them).
    pub fn configure(&self, settings: Settings) -> Result<(), CallError> {
        let _g = self.open_lock.lock();
        if self.frozen.get().is_some() {
            return Err(CallError::new(
                E_INVALID,
                "vmm_alloc: configure() must come before the first allocation: a device \
                 allocator already runs with the settings it had",
            ));
        }
        *self.pending.lock() = Some(settings);
        Ok(())
    }

    /// The settings in force (or that will be), from the environment if none were given.
    pub fn settings(&self) -> Result<Settings, CallError> {
        if let Some(s) = self.frozen.get() {
            return Ok(s.clone());
        }
        match &*self.pending.lock() {
            Some(s) => Ok(s.clone()),
            None => Settings::from_env().map_err(|m| CallError::new(E_INVALID, m)),
        }
    }

    /// Device `index`, opened now if needed.
    #[inline]
    pub fn device(&self, index: i32) -> Result<&dyn DeviceOps, CallError> {
        let slot = usize::try_from(index)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or_else(|| {
                CallError::new(
                    E_INVALID,
                    format!("vmm_alloc: device {index} is out of range 0..{MAX_DEVICES}"),
                )
            })?;
        if let Some(d) = slot.get() {
            return Ok(&**d);
        }
        self.open_slot(index as u32, slot)
    }

    #[cold]
    fn open_slot<'a>(
        &'a self,
        index: u32,
        slot: &'a OnceLock<Box<dyn DeviceOps>>,
    ) -> Result<&'a dyn DeviceOps, CallError> {
        let _g = self.open_lock.lock();
        if let Some(d) = slot.get() {
            return Ok(&**d);
        }
        let settings = match self.frozen.get() {
            Some(s) => s.clone(),
            None => {
                let s = match self.pending.lock().clone() {
                    Some(s) => s,
                    None => Settings::from_env().map_err(|m| CallError::new(E_INVALID, m))?,
                };
                let _ = self.frozen.set(s.clone());
                s
            }
        };
        let device = open_device(index, &settings)?;
        Ok(&**slot.get_or_init(|| device))
    }

    /// Devices opened so far.
    pub fn open_devices(&self) -> impl Iterator<Item = (u32, &dyn DeviceOps)> {
        self.devices
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.get().map(|d| (i as u32, &**d)))
    }
}

/// Frees `ptr` on `dev`'s allocator.
#[inline]
pub fn free_on(dev: &dyn DeviceOps, ptr: DevAddr) -> Result<(), AllocError> {
    dev.allocator().deallocate_ptr(ptr)
}

/// Allocates on `dev`'s allocator.
#[inline]
pub fn allocate_on(
    dev: &dyn DeviceOps,
    size: usize,
    stream: StreamId,
) -> Result<Allocation, AllocError> {
    dev.allocator().allocate(size, stream)
}

/// The state of `dev`'s allocator.
pub fn snapshot_of(dev: &dyn DeviceOps) -> Snapshot {
    dev.allocator().snapshot()
}

/// The statistics of `dev`'s allocator.
pub fn stats_of(dev: &dyn DeviceOps) -> MemoryStats {
    dev.allocator().stats()
}
