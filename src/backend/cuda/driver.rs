//! The CUDA driver calls of the Cuda backend: the only module of it allowed `unsafe`.
//!
//! Mirrors the driver and holds no policy: the rule checker in front of this layer has already
//! validated every argument (alignment, reservation bounds, no overlap, live handles), so each call
//! here passes the driver only values it handed out itself.
//!
//! cudarc panics instead of returning an error when libcuda or one of its symbols is missing.
//! [`cu`] therefore runs every driver call under `catch_unwind`, and [`probe`] checks for the
//! library before the first call, so the backend reports those cases as error values.
//!
//! Note [Current context]: no call of this module leaves the calling thread's current context
//! changed. Each driver call runs between `cuCtxPushCurrent` of the device's context and
//! `cuCtxPopCurrent` ([`scoped`]); cudarc's own calls that bind a context (creating it, dropping
//! the last reference to it or to a stream) run inside [`keeping_current`], which puts the
//! caller's context back. So several devices' backends coexist in one thread, each call runs in
//! its own device's context, and a program's own context is never switched under it.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchArgs, PushKernelArg};

use crate::backend::error::{BackendError, BackendErrorKind as E};
use crate::backend::raw::{RawDevice, RawEvent, RawHandle, RawResult};
use crate::backend::{Access, MemInfo, Protection, StreamId};
use crate::buffer::DeviceBuffer;

impl super::CudaBackend {
    /// Makes a stream created outside cudarc known by its raw `CUstream` value (a host program's
    /// stream, e.g. PyTorch's `cudaStream_t`: the same handle) and returns its id. 0 is the legacy
    /// stream.
    ///
    /// # Safety
    ///
    /// `raw` must be 0 or a stream of this backend's context that stays alive as long as the
    /// backend may record events on it or synchronize it (an allocator does so until its memory
    /// freed on that stream is reused or released).
    // Here, in the FFI module, because it is `unsafe`: its contract is the caller's promise about
    // a pointer this crate cannot check (it makes no call itself).
    pub unsafe fn adopt_raw_stream(&self, raw: u64) -> Result<StreamId, BackendError> {
        Ok(self.inner.with_raw(|dev| dev.adopt_raw_stream(raw)))
    }
}

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

/// The names the driver library goes by, most specific last.
const DRIVER_LIBRARY_NAMES: &[&str] = if cfg!(windows) {
    &["nvcuda.dll"]
} else {
    &["libcuda.so", "libcuda.so.1"]
};

/// Whether the CUDA driver library (libcuda) can be loaded. Never panics. Our own probe rather
/// than cudarc's `is_culib_present`, which exists only when cudarc loads the library itself
/// (not when another crate of the build links it).
pub(super) fn library_present() -> bool {
    DRIVER_LIBRARY_NAMES.iter().any(|name| {
        // SAFETY: loading libcuda runs only its initializers, which have no preconditions; the
        // handle is dropped at once and no symbol of it is used.
        unsafe { libloading::Library::new(*name) }.is_ok()
    })
}

/// The calling thread's current context (null when none).
fn current_context() -> RawResult<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid place for the driver to write one context handle.
    cu(|| unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    Ok(ctx)
}

/// Runs `f` (cudarc code that may bind a context to the thread), then makes the context that was
/// current before it current again (Note [Current context]).
pub(super) fn keeping_current<T>(f: impl FnOnce() -> T) -> T {
    let before = current_context();
    let out = f();
    if let Ok(before) = before {
        // SAFETY: `before` is the context the driver reported current a moment ago (or null,
        // which unbinds); the caller keeps it alive, as it is the caller's.
        let _ = cu(|| unsafe { sys::cuCtxSetCurrent(before) });
    }
    out
}

/// Runs `f` with `ctx` current, then pops it so the caller's context is current again
/// (Note [Current context]). A failed pop is reported unless `f` failed first.
fn scoped<T>(ctx: sys::CUcontext, f: impl FnOnce() -> RawResult<T>) -> RawResult<T> {
    // SAFETY: `ctx` is the primary context this device retained; it lives as long as the device.
    cu(|| unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
    let out = f();
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above; `popped` is a valid out-pointer.
    let pop = cu(|| unsafe { sys::cuCtxPopCurrent_v2(&mut popped) });
    let out = out?;
    pop?;
    Ok(out)
}

/// A `CUmemLocation` naming device `ordinal`. The field `id` became a member of an anonymous
/// union in CUDA 13.2, so its Rust name depends on the cudarc version feature; its C offset
/// does not (the driver's ABI), so it is written by offset and any version feature builds.
fn device_location(ordinal: u32) -> sys::CUmemLocation {
    const _: () = assert!(
        std::mem::size_of::<sys::CUmemLocation>() == 8
            && std::mem::align_of::<sys::CUmemLocation>() == 4
            && std::mem::offset_of!(sys::CUmemLocation, type_) == 0
            && std::mem::size_of::<sys::CUmemLocationType>() == 4,
        "CUmemLocation is {{ int type; int id (or a union starting with it) }}"
    );
    // SAFETY: plain C data; all-zero is valid (type INVALID, id 0) and both fields are set below.
    let mut loc: sys::CUmemLocation = unsafe { std::mem::zeroed() };
    loc.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    // SAFETY: the assertion above pins the layout: an `int` at byte 4, inside the 8-byte struct,
    // 4-aligned; that int is `id` in every CUDA version (a plain field, or the union's first
    // member).
    unsafe {
        std::ptr::from_mut(&mut loc)
            .cast::<i32>()
            .add(1)
            .write(ordinal as i32)
    };
    loc
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
    prop.location = device_location(ordinal);
    prop
}

/// A recorded `CUevent`.
struct Event(sys::CUevent);

// SAFETY: a CUevent is a driver handle, usable from any thread that has the owning context bound,
// which every call of this module does first.
unsafe impl Send for Event {}

pub(crate) struct CudaDevice {
    /// Dropped by hand, inside [`keeping_current`] (cudarc binds it to release it).
    ctx: ManuallyDrop<Arc<CudaContext>>,
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
        // CudaContext::new binds the context to the thread: the caller's is put back.
        let ctx = keeping_current(|| catch_unwind(|| CudaContext::new(ordinal)))
            .map_err(|_| E::NoDevice("cudarc panicked while creating the context".into()))?
            .map_err(|e| driver_error(e.0))?;
        let prop = device_prop(ordinal as u32);
        let mut granularity = 0usize;
        let asked = scoped(ctx.cu_ctx(), || {
            // SAFETY: `granularity` is a valid place for one usize, `prop` a valid property struct.
            cu(|| unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut granularity,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            })
        });
        if let Err(e) = asked {
            keeping_current(|| drop(ctx));
            return Err(e);
        }
        if !granularity.is_power_of_two() {
            keeping_current(|| drop(ctx));
            return Err(E::NoDevice(format!(
                "the driver reports granularity {granularity}, not a power of two"
            )));
        }
        Ok(Self {
            ctx: ManuallyDrop::new(ctx),
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

    /// The id of `stream` if it is the legacy stream or was registered.
    pub(super) fn registered_stream(&self, stream: &CudaStream) -> Option<StreamId> {
        let raw = stream.cu_stream() as u64;
        (raw == 0 || self.streams.contains_key(&raw)).then_some(StreamId(raw))
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

    /// Runs `f` in this device's context (Note [Current context]).
    fn scoped<T>(&self, f: impl FnOnce() -> RawResult<T>) -> RawResult<T> {
        scoped(self.ctx.cu_ctx(), f)
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

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Dropping a stream or the context makes cudarc bind the context to this thread.
        keeping_current(|| {
            self.streams.clear();
            // SAFETY: `ctx` is dropped exactly once, here, and never used after.
            unsafe { ManuallyDrop::drop(&mut self.ctx) };
        });
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
        let mut ptr: sys::CUdeviceptr = 0;
        let align = self.granularity;
        self.scoped(|| {
            // SAFETY: `ptr` is a valid out-pointer; no fixed address is requested (0).
            cu(|| unsafe { sys::cuMemAddressReserve(&mut ptr, len, align, 0, 0) })
        })
        .map_err(|e| match e {
            E::Driver { ref name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY" => {
                E::AddressSpaceExhausted { requested: len }
            }
            e => e,
        })?;
        Ok(ptr)
    }

    fn free_reservation(&mut self, base: u64, len: usize) -> RawResult<()> {
        // SAFETY: `base, len` is exactly a reservation this device made (checked by the ledger).
        self.scoped(|| cu(|| unsafe { sys::cuMemAddressFree(base, len) }))
    }

    fn create(&mut self, len: usize) -> RawResult<RawHandle> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let prop = self.prop;
        // SAFETY: `handle` is a valid out-pointer and `prop` a valid property struct.
        let made = self.scoped(|| cu(|| unsafe { sys::cuMemCreate(&mut handle, len, &prop, 0) }));
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
        // SAFETY: `handle` came from cuMemCreate and was not released yet (ledger).
        self.scoped(|| cu(|| unsafe { sys::cuMemRelease(handle) }))
    }

    fn map(&mut self, at: u64, len: usize, handle: RawHandle, offset: usize) -> RawResult<()> {
        // SAFETY: the range lies in our reservation and is unmapped, the handle is live and
        // `offset + len` fits it (all checked by the ledger).
        self.scoped(|| cu(|| unsafe { sys::cuMemMap(at, len, offset, handle, 0) }))
    }

    fn unmap(&mut self, at: u64, len: usize) -> RawResult<()> {
        // SAFETY: the range is exactly a run of whole mappings we made (ledger).
        self.scoped(|| cu(|| unsafe { sys::cuMemUnmap(at, len) }))
    }

    fn set_access(&mut self, at: u64, len: usize, access: &[Access]) -> RawResult<()> {
        let descs: Vec<sys::CUmemAccessDesc> = access
            .iter()
            .map(|a| sys::CUmemAccessDesc {
                location: device_location(a.device),
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
        self.scoped(|| cu(|| unsafe { sys::cuMemSetAccess(at, len, descs.as_ptr(), descs.len()) }))
    }

    fn mem_info(&mut self) -> RawResult<Option<MemInfo>> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid places for one usize.
        self.scoped(|| cu(|| unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }))?;
        Ok(Some(MemInfo { free, total }))
    }

    fn knows_stream(&self, stream: StreamId) -> bool {
        stream == StreamId::DEFAULT
            || self.streams.contains_key(&stream.0)
            || self.adopted.contains(&stream.0)
    }

    fn record_event(&mut self, stream: StreamId) -> RawResult<RawEvent> {
        let stream_ptr = self.stream_ptr(stream);
        let event = self.scoped(|| {
            let mut event: sys::CUevent = std::ptr::null_mut();
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            // SAFETY: `event` is a valid out-pointer.
            cu(|| unsafe { sys::cuEventCreate(&mut event, flags) })?;
            // SAFETY: `event` was just created; `stream_ptr` is a registered live stream or null.
            if let Err(e) = cu(|| unsafe { sys::cuEventRecord(event, stream_ptr) }) {
                // SAFETY: the event was created above and is not used again.
                let _ = cu(|| unsafe { sys::cuEventDestroy_v2(event) });
                return Err(e);
            }
            Ok(event)
        })?;
        self.next_event += 1;
        self.events.insert(self.next_event, Event(event));
        Ok(self.next_event)
    }

    fn query_event(&mut self, event: RawEvent) -> RawResult<bool> {
        let ev = self
            .events
            .get(&event)
            .ok_or(E::Unsupported("an event of another backend"))?
            .0;
        // SAFETY: `ev` is a live event created by this device.
        self.scoped(|| match catch_unwind(|| unsafe { sys::cuEventQuery(ev) }) {
            Ok(CUresult::CUDA_SUCCESS) => Ok(true),
            Ok(CUresult::CUDA_ERROR_NOT_READY) => Ok(false),
            Ok(code) => Err(driver_error(code)),
            Err(_) => Err(E::NoDevice(
                "cuEventQuery is missing from the driver".into(),
            )),
        })
    }

    fn release_event(&mut self, event: RawEvent) -> RawResult<()> {
        let ev = self
            .events
            .get(&event)
            .ok_or(E::Unsupported("an event of another backend"))?
            .0;
        // SAFETY: `ev` is a live event created by this device; it is forgotten below on success.
        self.scoped(|| cu(|| unsafe { sys::cuEventDestroy_v2(ev) }))?;
        self.events.remove(&event);
        Ok(())
    }

    fn synchronize(&mut self, stream: StreamId) -> RawResult<()> {
        let stream_ptr = self.stream_ptr(stream);
        // SAFETY: a registered live stream, or null for the legacy stream.
        self.scoped(|| cu(|| unsafe { sys::cuStreamSynchronize(stream_ptr) }))
    }

    fn write(&mut self, at: u64, data: &[u8]) -> RawResult<()> {
        // SAFETY: `data` is valid for `data.len()` bytes; the destination is mapped read-write
        // device memory (ledger).
        self.scoped(|| cu(|| unsafe { sys::cuMemcpyHtoD_v2(at, data.as_ptr().cast(), data.len()) }))
    }

    fn read(&mut self, at: u64, out: &mut [u8]) -> RawResult<()> {
        self.scoped(|| {
            // SAFETY: `out` is valid for writes of `out.len()` bytes; the source is mapped
            // readable device memory (ledger).
            cu(|| unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), at, out.len()) })
        })
    }
}

/// Memory of this crate's allocator seen as a cudarc [`CudaSlice`], so that every cudarc call,
/// view and kernel argument, with cudarc's own cross-stream events, works on it unchanged.
/// cudarc never frees it: the drop hands the slice back with [`CudaSlice::leak`], which only makes
/// its stream wait for the slice's last reads and writes (on any stream) and releases its events;
/// the owner then frees the memory to the allocator, stream-ordered after those waits.
pub(crate) struct ForeignSlice<T>(ManuallyDrop<CudaSlice<T>>);

impl<T> ForeignSlice<T> {
    /// Wraps `len` elements of `T` at `ptr`, used on `stream`.
    ///
    /// The caller owns `ptr .. ptr + len * size_of::<T>()` (a live allocation of this crate on
    /// `stream`'s device) and keeps it allocated until this value is dropped.
    pub(crate) fn new(stream: &Arc<CudaStream>, ptr: u64, len: usize) -> RawResult<Self> {
        // cudarc binds the context (to create the slice's events) and unwraps their creation.
        let made = keeping_current(|| {
            catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: `ptr` is device memory of `stream`'s context, valid for `len` elements
                // until this value drops (the caller's contract above); cudarc never frees it
                // because `Drop` below leaks the slice instead of dropping it.
                unsafe { stream.upgrade_device_ptr::<T>(ptr, len) }
            }))
        });
        match made {
            Ok(slice) => Ok(Self(ManuallyDrop::new(slice))),
            Err(_) => Err(E::Driver {
                name: "cuEventCreate".into(),
                description: "cudarc could not create the buffer's read/write events".into(),
            }),
        }
    }
}

impl<T> std::ops::Deref for ForeignSlice<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.0
    }
}

impl<T> std::ops::DerefMut for ForeignSlice<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.0
    }
}

impl<T> Drop for ForeignSlice<T> {
    fn drop(&mut self) {
        // SAFETY: the slice is taken exactly once, here, and `self` is never used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.0) };
        // `leak` waits on the slice's events and drops them (binding the context): never frees.
        keeping_current(|| {
            let _address = slice.leak();
        });
    }
}

// SAFETY: forwards to cudarc's own impl for `&CudaSlice<T>`, which pushes the device pointer of
// exactly this buffer's memory (and cudarc's event waits and records), valid for the borrow `'b`.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b DeviceBuffer<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceBuffer<T>) -> &mut Self {
        self.arg(arg.as_cuda_slice())
    }
}

// SAFETY: as above, through cudarc's impl for `&mut CudaSlice<T>`.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b mut DeviceBuffer<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceBuffer<T>) -> &mut Self {
        self.arg(arg.cuda_slice_mut())
    }
}
