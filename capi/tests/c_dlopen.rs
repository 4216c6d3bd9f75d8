//! A C program loads the two libraries with `dlopen` and calls them through function pointers
//! of PyTorch's exact types, from several threads, on the Host backend
//! (`tests/c/dlopen_pytorch_types.c`). Needs a C compiler (`$CC`, else `cc`).

use std::path::PathBuf;
use std::process::Command;

mod common;
use common::{fresh_libraries, profile_dir};

/// Compiles `src` with `compiler` (plus `flags`) into target/<profile>/`name` and runs it with
/// `args` on the Host backend; asserts it printed "ok".
fn compile_and_run(compiler: &str, flags: &[&str], src: &str, name: &str, args: &[PathBuf]) {
    let dir = profile_dir();
    let exe = dir.join(name);
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(src);
    let status = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(["-ldl", "-lpthread"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run the compiler {compiler}: {e}"));
    assert!(status.success(), "compiling {} failed", src.display());
    let out = Command::new(&exe)
        .args(args)
        .env("VMM_ALLOC_BACKEND", "host")
        .env("VMM_ALLOC_CONF", "capacity_mb:1024")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} failed: {text}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{text}");
}

#[test]
fn out_of_memory_is_a_cpp_exception_carrying_the_report() {
    let shim = fresh_libraries().join("libvmm_alloc_torch.so");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    compile_and_run(
        &cxx,
        &["-std=c++17", "-Wall", "-Werror", "-O1"],
        "tests/c/oom_throws.cpp",
        "vmm_alloc_cpp_oom_test",
        &[shim],
    );
}

#[test]
fn c_program_calls_the_libraries_through_pytorch_types_from_threads() {
    let dir = fresh_libraries();
    let capi = dir.join("libvmm_alloc_capi.so");
    let shim = dir.join("libvmm_alloc_torch.so");
    assert!(
        capi.exists(),
        "{} missing: cargo builds the cdylib with the tests",
        capi.display()
    );
    assert!(
        shim.exists(),
        "{} missing: build.rs copies it there",
        shim.display()
    );
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    compile_and_run(
        &cc,
        &["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"],
        "tests/c/dlopen_pytorch_types.c",
        "vmm_alloc_c_dlopen_test",
        &[shim, capi],
    );
}
