//! The caller's current CUDA context is the same after every call: the Cuda backend binds its
//! device's primary context to the calling thread, so each exported call that may reach the
//! driver saves the current context first and puts it back when it returns.

/// Restores the saved context when dropped.
pub struct ContextGuard {
    #[cfg(feature = "cuda")]
    saved: Option<cudarc::driver::sys::CUcontext>,
}

impl ContextGuard {
    /// Saves the current context if `cuda` (the backend is Cuda and libcuda is loaded).
    #[inline]
    pub fn save(cuda: bool) -> Self {
        #[cfg(feature = "cuda")]
        {
            let saved = cuda.then(|| {
                let mut ctx = std::ptr::null_mut();
                // SAFETY: `ctx` is a valid place for one CUcontext; libcuda is loaded (a Cuda
                // device is open). On failure `ctx` stays null, which restores "no context".
                unsafe { cudarc::driver::sys::cuCtxGetCurrent(&mut ctx) };
                ctx
            });
            Self { saved }
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = cuda;
            Self {}
        }
    }
}

impl Drop for ContextGuard {
    #[inline]
    fn drop(&mut self) {
        #[cfg(feature = "cuda")]
        if let Some(saved) = self.saved {
            let mut now = std::ptr::null_mut();
            // SAFETY: as in `save`; `saved` was current on this thread a moment ago (or null).
            unsafe {
                cudarc::driver::sys::cuCtxGetCurrent(&mut now);
                if now != saved {
                    cudarc::driver::sys::cuCtxSetCurrent(saved);
                }
            }
        }
    }
}
