//! `CudaBackend`: the CUDA driver's virtual-memory-management calls, through cudarc.
//!
//! cudarc loads libcuda at run time, so this builds on machines without CUDA; there,
//! [`CudaBackend::new`] returns an error saying so (it never panics). Every call binds the
//! backend's context to the calling thread first, so a backend can be used from any thread.
//! The rule checker in front of the driver rejects what CUDA would silently accept but is an
//! allocator bug (double unmap, unmapping a never-mapped range), and driver errors keep the
//! `CUresult` name (e.g. `CUDA_ERROR_OUT_OF_MEMORY`).

mod driver;

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
    ctx: Arc<CudaContext>,
}

impl CudaBackend {
    /// Opens device `ordinal` (its primary context). Returns
    /// [`BackendErrorKind::NoDevice`](crate::BackendErrorKind::NoDevice) when libcuda is absent,
    /// the driver fails to start, or the device does not exist.
    pub fn new(ordinal: usize) -> Result<Self, BackendError> {
        let raw = CudaDevice::open(ordinal).map_err(|e| BackendError::new(CallKind::Init, e))?;
        let ctx = raw.context().clone();
        Ok(Self {
            inner: Arc::new(Checked::new(raw, Capabilities::BYTES | Capabilities::GPU)),
            ctx,
        })
    }

    /// Whether the CUDA driver library (libcuda) can be loaded on this machine, without calling
    /// into it (so it never panics). False means [`CudaBackend::new`] will report that libcuda is
    /// missing; true says nothing yet about devices.
    pub fn driver_present() -> bool {
        driver::library_present()
    }

    /// The context this backend works in, to create streams and launch work with cudarc.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Makes `stream` known to the backend (it keeps the stream alive) and returns its id, for
    /// `record_event` and `synchronize`. [`StreamId::DEFAULT`] (the legacy stream) needs no
    /// registration.
    pub fn register_stream(&self, stream: &Arc<CudaStream>) -> Result<StreamId, BackendError> {
        self.inner
            .with_raw(|raw| raw.register_stream(stream))
            .map_err(|e| BackendError::new(CallKind::Init, e))
    }

    /// Makes a stream created outside cudarc known by its raw `CUstream` value (a host program's
    /// stream, e.g. PyTorch's `cudaStream_t`: the same handle) and returns its id. 0 is the legacy
    /// stream.
    ///
    /// # Safety
    ///
    /// `raw` must be 0 or a stream of this backend's context that stays alive as long as the
    /// backend may record events on it or synchronize it (an allocator does so until its memory
    /// freed on that stream is reused or released).
    // The one unsafe item outside the FFI module: its contract is the caller's promise about a
    // pointer this crate cannot check.
    #[allow(unsafe_code)]
    pub unsafe fn adopt_raw_stream(&self, raw: u64) -> Result<StreamId, BackendError> {
        Ok(self.inner.with_raw(|dev| dev.adopt_raw_stream(raw)))
    }
}

forward_backend!(CudaBackend);
