//! Builds the C++ shim `libvmm_alloc_torch.so` (`shim/torch_shim.cpp`): the allocation function
//! PyTorch calls, which throws a C++ exception on failure.
//!
//! It is a library of its own, not part of this crate's cdylib: rustc's version script exports
//! only Rust's `#[no_mangle]` functions from a cdylib, and the unwinding must stay in C++ frames.
//! The shim finds this crate's library beside itself at its first call. It is written to
//! `target/<profile>/` next to `libvmm_alloc_capi.so` (where tests and the Python build take it),
//! and its path is given to the crate as `VMM_ALLOC_SHIM_PATH`.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=shim/torch_shim.cpp");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let shim = out_dir.join("libvmm_alloc_torch.so");
    let compiler = cc::Build::new().cpp(true).get_compiler();
    let status = compiler
        .to_command()
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-o",
        ])
        .arg(&shim)
        .arg("shim/torch_shim.cpp")
        .arg("-ldl")
        .status()
        .expect("the C++ compiler runs");
    assert!(status.success(), "compiling shim/torch_shim.cpp failed");
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    if let Some(profile_dir) = out_dir.ancestors().nth(3) {
        let _ = std::fs::copy(&shim, profile_dir.join("libvmm_alloc_torch.so"));
    }
    println!("cargo:rustc-env=VMM_ALLOC_SHIM_PATH={}", shim.display());
}
