//! The CUDA driver calls of the Cuda backend: the only module of it allowed `unsafe`.
//!
//! Mirrors the driver and holds no policy: the rule checker in front of this layer has already
//! validated every argument (alignment, reservation bounds, no overlap, live handles), so each call
//! here passes the driver only values it handed out itself.
//!
//! cudarc panics instead of returning an error when libcuda or one of its symbols is missing.
//! [`cu`] therefore runs every driver call under `catch_unwind`, and [`probe`] checks for the
//! library before the first call, so the backend reports those cases as error values.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaStream};

use crate::backend::error::BackendErrorKind as E;
use crate::backend::raw::{RawDevice, RawEvent, RawHandle, RawResult};
use crate::backend::{Access, MemInfo, Protection, StreamId};

/// Turns a `CUresult` into our error, keeping the driver's name for it.
fn driver_error(code: CUresult) -> E {
    let description = DriverError(code)
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    E::Driver {
        name: format!("{code:?}"),
        description,
    }
}

/// Runs one driver call, turning a cudarc panic (missing library or symbol) into an error.
fn cu(call: impl FnOnce() -> CUresult) -> RawResult<()> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(CUresult::CUDA_SUCCESS) => Ok(()),
        Ok(code) => Err(driver_error(code)),
        Err(_) => Err(E::NoDevice(
            "the CUDA driver library lacks a function this backend needs (driver too old?)".into(),
        )),
    }
}

/// Whether the CUDA driver library (libcuda) can be loaded. Never panics.
pub(super) fn library_present() -> bool {
    // SAFETY: only tries to dlopen the library names cudarc knows; never calls into it.
    unsafe { sys::is_culib_present() }
}

/// Checks that libcuda loads, initializes and has device `ordinal`; returns the device count.
pub(super) fn probe(ordinal: usize) -> RawResult<u32> {
    if !library_present() {
        return Err(E::NoDevice(
            "libcuda was not found (no NVIDIA driver on this machine); use the Host or Sim backend"
                .into(),
        ));
    }
    // SAFETY: cuInit takes flags by value; 0 is the only valid value.
    cu(|| unsafe { sys::cuInit(0) }).map_err(|e| E::NoDevice(format!("cuInit failed: {e}")))?;
    let mut count = 0;
    // SAFETY: `count` is a valid place for the driver to write one int.
    cu(|| unsafe { sys::cuDeviceGetCount(&mut count) })?;
    if count <= 0 {
        return Err(E::NoDevice(
            "the driver is installed but reports no CUDA device".into(),
        ));
    }
    if ordinal >= count as usize {
        return Err(E::NoDevice(format!(
            "device {ordinal} does not exist: the driver reports {count} device(s)"
        )));
    }
    Ok(count as u32)
}

/// The allocation properties of pinned device memory on `ordinal`, as `cuMemCreate` takes them.
fn device_prop(ordinal: u32) -> sys::CUmemAllocationProp {
    // SAFETY: CUmemAllocationProp is plain C data; all-zero is valid (INVALID enums, null pointer,
    // no flags) and the fields that matter are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal as i32;
    prop
}

/// A recorded `CUevent`.
struct Event(sys::CUevent);

// SAFETY: a CUevent is a driver handle, usable from any thread that has the owning context bound,
// which every call of this module does first.
unsafe impl Send for Event {}

pub(crate) struct CudaDevice {
    ctx: Arc<CudaContext>,
    ordinal: u32,
    devices: u32,
    granularity: usize,
    prop: sys::CUmemAllocationProp,
    /// Registered streams by their raw `CUstream` value; kept alive here.
    streams: HashMap<u64, Arc<CudaStream>>,
    /// Streams adopted by their raw `CUstream` value (a host program's, e.g. PyTorch's): their
    /// owner keeps them alive.
    adopted: std::collections::HashSet<u64>,
    events: HashMap<RawEvent, Event>,
    next_event: RawEvent,
}

// SAFETY: the only non-Send field is `prop.win32HandleMetaData`, a pointer that is always null.
unsafe impl Send for CudaDevice {}

impl CudaDevice {
    pub(super) fn open(ordinal: usize) -> RawResult<Self> {
        let devices = probe(ordinal)?;
        let ctx = catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|_| E::NoDevice("cudarc panicked while creating the context".into()))?
            .map_err(|e| driver_error(e.0))?;
        let prop = device_prop(ordinal as u32);
        let mut granularity = 0usize;
        ctx.bind_to_thread().map_err(|e| driver_error(e.0))?;
        // SAFETY: `granularity` is a valid place for one usize and `prop` a valid property struct.
        cu(|| unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        if !granularity.is_power_of_two() {
            return Err(E::NoDevice(format!(
                "the driver reports granularity {granularity}, not a power of two"
            )));
        }
        Ok(Self {
            ctx,
            ordinal: ordinal as u32,
            devices,
            granularity,
            prop,
            streams: HashMap::new(),
            adopted: std::collections::HashSet::new(),
            events: HashMap::new(),
            next_event: 0,
        })
    }

    pub(super) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub(super) fn register_stream(&mut self, stream: &Arc<CudaStream>) -> RawResult<StreamId> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(E::Unsupported("a stream of another context"));
        }
        let raw = stream.cu_stream() as u64;
        if raw != 0 {
            self.streams.insert(raw, stream.clone());
        }
        Ok(StreamId(raw))
    }

    pub(super) fn adopt_raw_stream(&mut self, raw: u64) -> StreamId {
        if raw != 0 && !self.streams.contains_key(&raw) {
            self.adopted.insert(raw);
        }
        StreamId(raw)
    }

    fn bind(&self) -> RawResult<()> {
        self.ctx.bind_to_thread().map_err(|e| driver_error(e.0))
    }

    fn stream_ptr(&self, stream: StreamId) -> sys::CUstream {
        match self.streams.get(&stream.0) {
            Some(s) => s.cu_stream(),
            // An adopted stream is its raw value; anything else is StreamId::DEFAULT, the legacy
            // stream (the rule checker refuses unknown streams before they get here).
            None if self.adopted.contains(&stream.0) => stream.0 as sys::CUstream,
            None => std::ptr::null_mut(),
        }
    }
}

impl RawDevice for CudaDevice {
    const NAME: &'static str = "cuda";

    fn granularity(&self) -> usize {
        self.granularity
    }
    fn ordinal(&self) -> u32 {
        self.ordinal
    }
    fn device_count(&self) -> u32 {
        self.devices
    }
    fn capacity(&self) -> Option<usize> {
        None
    }
    fn has_bytes(&self) -> bool {
        true
    }

    fn reserve(&mut self, len: usize) -> RawResult<u64> {
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        let align = self.granularity;
        // SAFETY: `ptr` is a valid out-pointer; no fixed address is requested (0).
        cu(|| unsafe { sys::cuMemAddressReserve(&mut ptr, len, align, 0, 0) }).map_err(
            |e| match e {
                E::Driver { ref name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY" => {
                    E::AddressSpaceExhausted { requested: len }
                }
                e => e,
            },
        )?;
        Ok(ptr)
    }

    fn free_reservation(&mut self, base: u64, len: usize) -> RawResult<()> {
        self.bind()?;
        // SAFETY: `base, len` is exactly a reservation this device made (checked by the ledger).
        cu(|| unsafe { sys::cuMemAddressFree(base, len) })
    }

    fn create(&mut self, len: usize) -> RawResult<RawHandle> {
        self.bind()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let prop = self.prop;
        // SAFETY: `handle` is a valid out-pointer and `prop` a valid property struct.
        let made = cu(|| unsafe { sys::cuMemCreate(&mut handle, len, &prop, 0) });
        match made {
            Err(E::Driver { ref name, .. }) if name == "CUDA_ERROR_OUT_OF_MEMORY" => {
                let info = self.mem_info()?.unwrap_or(MemInfo { free: 0, total: 0 });
                Err(E::OutOfMemory {
                    requested: len,
                    free: info.free,
                    total: info.total,
                })
            }
            other => other.map(|()| handle),
        }
    }

    fn release(&mut self, handle: RawHandle) -> RawResult<()> {
        self.bind()?;
        // SAFETY: `handle` came from cuMemCreate and was not released yet (ledger).
        cu(|| unsafe { sys::cuMemRelease(handle) })
    }

    fn map(&mut self, at: u64, len: usize, handle: RawHandle, offset: usize) -> RawResult<()> {
        self.bind()?;
        // SAFETY: the range lies in our reservation and is unmapped, the handle is live and
        // `offset + len` fits it (all checked by the ledger).
        cu(|| unsafe { sys::cuMemMap(at, len, offset, handle, 0) })
    }

    fn unmap(&mut self, at: u64, len: usize) -> RawResult<()> {
        self.bind()?;
        // SAFETY: the range is exactly a run of whole mappings we made (ledger).
        cu(|| unsafe { sys::cuMemUnmap(at, len) })
    }

    fn set_access(&mut self, at: u64, len: usize, access: &[Access]) -> RawResult<()> {
        self.bind()?;
        let descs: Vec<sys::CUmemAccessDesc> = access
            .iter()
            .map(|a| sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: a.device as i32,
                },
                flags: match a.protection {
                    Protection::None => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
                    Protection::Read => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
                    Protection::ReadWrite => {
                        sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                    }
                },
            })
            .collect();
        // SAFETY: `descs` holds `descs.len()` valid entries for the duration of the call; the
        // range is a run of whole mappings (ledger).
        cu(|| unsafe { sys::cuMemSetAccess(at, len, descs.as_ptr(), descs.len()) })
    }

    fn mem_info(&mut self) -> RawResult<Option<MemInfo>> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid places for one usize.
        cu(|| unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok(Some(MemInfo { free, total }))
    }

    fn knows_stream(&self, stream: StreamId) -> bool {
        stream == StreamId::DEFAULT
            || self.streams.contains_key(&stream.0)
            || self.adopted.contains(&stream.0)
    }

    fn record_event(&mut self, stream: StreamId) -> RawResult<RawEvent> {
        self.bind()?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: `event` is a valid out-pointer.
        cu(|| unsafe { sys::cuEventCreate(&mut event, flags) })?;
        let stream_ptr = self.stream_ptr(stream);
        // SAFETY: `event` was just created; `stream_ptr` is a registered live stream or null.
        if let Err(e) = cu(|| unsafe { sys::cuEventRecord(event, stream_ptr) }) {
            // SAFETY: the event was created above and is not used again.
            let _ = cu(|| unsafe { sys::cuEventDestroy_v2(event) });
            return Err(e);
        }
        self.next_event += 1;
        self.events.insert(self.next_event, Event(event));
        Ok(self.next_event)
    }

    fn query_event(&mut self, event: RawEvent) -> RawResult<bool> {
        self.bind()?;
        let ev = self
            .events
            .get(&event)
            .ok_or(E::Unsupported("an event of another backend"))?
            .0;
        // SAFETY: `ev` is a live event created by this device.
        match catch_unwind(|| unsafe { sys::cuEventQuery(ev) }) {
            Ok(CUresult::CUDA_SUCCESS) => Ok(true),
            Ok(CUresult::CUDA_ERROR_NOT_READY) => Ok(false),
            Ok(code) => Err(driver_error(code)),
            Err(_) => Err(E::NoDevice(
                "cuEventQuery is missing from the driver".into(),
            )),
        }
    }

    fn release_event(&mut self, event: RawEvent) -> RawResult<()> {
        self.bind()?;
        let ev = self
            .events
            .get(&event)
            .ok_or(E::Unsupported("an event of another backend"))?
            .0;
        // SAFETY: `ev` is a live event created by this device; it is forgotten below on success.
        cu(|| unsafe { sys::cuEventDestroy_v2(ev) })?;
        self.events.remove(&event);
        Ok(())
    }

    fn synchronize(&mut self, stream: StreamId) -> RawResult<()> {
        self.bind()?;
        let stream_ptr = self.stream_ptr(stream);
        // SAFETY: a registered live stream, or null for the legacy stream.
        cu(|| unsafe { sys::cuStreamSynchronize(stream_ptr) })
    }

    fn write(&mut self, at: u64, data: &[u8]) -> RawResult<()> {
        self.bind()?;
        // SAFETY: `data` is valid for `data.len()` bytes; the destination is mapped read-write
        // device memory (ledger).
        cu(|| unsafe { sys::cuMemcpyHtoD_v2(at, data.as_ptr().cast(), data.len()) })
    }

    fn read(&mut self, at: u64, out: &mut [u8]) -> RawResult<()> {
        self.bind()?;
        // SAFETY: `out` is valid for writes of `out.len()` bytes; the source is mapped readable
        // device memory (ledger).
        cu(|| unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), at, out.len()) })
    }
}
