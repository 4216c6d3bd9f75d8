//! vmm-alloc as a shared library: PyTorch's pluggable-allocator C ABI
//! (`torch.cuda.memory.CUDAPluggableAllocator`, `torch.cuda.MemPool`) and the calls the
//! `vmm_alloc` Python package makes (statistics, snapshots, trace recording, sleep/wake,
//! configuration). The C declarations are in `include/vmm_alloc.h`.
//!
//! `vmm_alloc_malloc`, the allocation function PyTorch calls, is C++, in its own small library
//! `libvmm_alloc_torch.so` (`shim/torch_shim.cpp`, built by `build.rs`): it calls
//! [`vmm_alloc_try_malloc`] of this library and throws on failure, so that an out-of-memory
//! reaches Python as an exception carrying our report; the Rust side never unwinds. PyTorch is
//! given the shim's path, whose `vmm_alloc_free` forwards here.
//!
//! Backend by `VMM_ALLOC_BACKEND` (`cuda`, the default; `host`: real bytes in host memory, no
//! GPU needed; `sim`), configuration by `PYTORCH_CUDA_ALLOC_CONF` and `VMM_ALLOC_CONF` (or
//! [`vmm_alloc_configure`]), one allocator per device created on its first use.
// The configuration JSON of `exports.rs` is one `serde_json::json!` of every setting, past the
// macro's default recursion limit of 128.
#![recursion_limit = "256"]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

mod boundary;
mod devices;
mod exports;
mod recording;
mod report;
mod settings;

pub use boundary::{E_FAILED, E_INVALID, E_OOM, E_PANIC, OK};
pub use exports::*;
pub use settings::{BackendKind, Settings};

/// The path of the C++ shim library built with this crate (`libvmm_alloc_torch.so`).
pub const SHIM_PATH: &str = env!("VMM_ALLOC_SHIM_PATH");
