//! `CudaBackend`: the CUDA driver's virtual-memory-management calls, through cudarc.
//!
//! cudarc loads libcuda at run time (unless the build links it), so this builds on machines without
//! CUDA; there, [`CudaBackend::new`] returns an error saying so (it never panics). Every call
//! pushes the backend's context for its duration and pops it after, so a backend can be used from
//! any thread, backends of several devices coexist, and the caller's current context is never
//! changed (Note [Current context] in `driver.rs`).
//! The rule checker in front of the driver rejects what CUDA would silently accept but is an
//! allocator bug (double unmap, unmapping a never-mapped range), and driver errors keep the
//! `CUresult` name (e.g. `CUDA_ERROR_OUT_OF_MEMORY`).

mod driver;

pub(crate) use driver::ForeignSlice;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use crate::backend::checked::Checked;
use crate::backend::error::BackendError;
use crate::backend::{forward_backend, CallKind, Capabilities, StreamId};

use driver::CudaDevice;

/// The CUDA driver behind the [`Backend`](crate::Backend) contract. Cloning is cheap and shares
/// the state.
#[derive(Clone)]
pub struct CudaBackend {
    inner: Arc<Checked<CudaDevice>>,
}

impl CudaBackend {
    /// Opens device `ordinal` (its primary context). Returns
    /// [`BackendErrorKind::NoDevice`](crate::BackendErrorKind::NoDevice) when libcuda is absent,
    /// the driver fails to start, or the device does not exist.
    pub fn new(ordinal: usize) -> Result<Self, BackendError> {
        let raw = CudaDevice::open(ordinal).map_err(|e| BackendError::new(CallKind::Init, e))?;
        Ok(Self {
            inner: Arc::new(Checked::new(raw, Capabilities::BYTES | Capabilities::GPU)),
        })
    }

    /// Whether the CUDA driver library (libcuda) can be loaded on this machine, without calling
    /// into it (so it never panics). False means [`CudaBackend::new`] will report that libcuda is
    /// missing; true says nothing yet about devices.
    pub fn driver_present() -> bool {
        driver::library_present()
    }

    /// The context this backend works in (device `ordinal`'s primary context), to create streams
    /// and launch work with cudarc.
    pub fn context(&self) -> Arc<CudaContext> {
        self.inner.with_raw(|raw| raw.context().clone())
    }

    /// Whether `stream` belongs to this backend's context: only such streams may be registered,
    /// and only memory of this backend may be used on them.
    pub fn owns_stream(&self, stream: &CudaStream) -> bool {
        self.inner
            .with_raw(|raw| raw.context().cu_ctx() == stream.context().cu_ctx())
    }

    /// Makes `stream` known to the backend (it keeps the stream alive) and returns its id, for
    /// `record_event` and `synchronize`. [`StreamId::DEFAULT`] (the legacy stream) needs no
    /// registration.
    pub fn register_stream(&self, stream: &Arc<CudaStream>) -> Result<StreamId, BackendError> {
        self.inner
            .with_raw(|raw| raw.register_stream(stream))
            .map_err(|e| BackendError::new(CallKind::Init, e))
    }

    /// The id of `stream` if it is the legacy stream or was registered with
    /// [`register_stream`](Self::register_stream); `None` otherwise.
    pub fn stream_id(&self, stream: &CudaStream) -> Option<StreamId> {
        self.inner.with_raw(|raw| raw.registered_stream(stream))
    }
}

forward_backend!(CudaBackend);
