//! Where the tests find the libraries cargo just built.

use std::path::PathBuf;
use std::sync::OnceLock;

/// target/<profile>/, holding this crate's cdylib (put there by [`fresh_libraries`]) and the C++
/// shim (put there by build.rs).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .to_path_buf()
}

/// The profile directory, with the cdylib this very test build made copied into it from `deps/`.
/// `cargo test` builds the cdylib there but only `cargo build` copies it up, so on a fresh clone the
/// file beside the shim is missing, and elsewhere it may be an older build's.
pub fn fresh_libraries() -> PathBuf {
    static COPIED: OnceLock<PathBuf> = OnceLock::new();
    COPIED
        .get_or_init(|| {
            let dir = profile_dir();
            let built = dir.join("deps/libvmm_alloc_capi.so");
            let partial = dir.join(format!("libvmm_alloc_capi.so.{}", std::process::id()));
            std::fs::copy(&built, &partial).unwrap_or_else(|e| {
                panic!(
                    "{}: {e}: cargo test builds the cdylib there with the tests",
                    built.display()
                )
            });
            std::fs::rename(&partial, dir.join("libvmm_alloc_capi.so")).unwrap();
            dir
        })
        .clone()
}
