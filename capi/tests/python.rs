//! The Python package's tests (`python/tests`, pytest) against the real libraries just built:
//! creates a virtual environment under target/, installs the package from `python/` (with
//! `VMM_ALLOC_PREBUILT_DIR` pointing at these libraries, so no nested cargo build) and pytest,
//! builds the fake torch's C++ part, and runs pytest. Fails loudly when python3, pip (network to
//! PyPI for pytest, setuptools and wheel) or a C++ compiler is missing.

use std::path::Path;
use std::process::Command;

mod common;
use common::fresh_libraries;

fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn python_package_tests_pass_against_the_real_library() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = fresh_libraries();
    let venv = dir.join("python-venv");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    if !venv.join("bin/python").exists() {
        run(
            Command::new(&python).args(["-m", "venv"]).arg(&venv),
            "creating the virtual environment (python3 -m venv)",
        );
    }
    let vpy = venv.join("bin/python");
    run(
        Command::new(&vpy).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "pytest>=7",
            "setuptools>=61",
            "wheel",
        ]),
        "pip install pytest setuptools wheel",
    );
    run(
        Command::new(&vpy)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--force-reinstall",
                "--no-deps",
                "--no-build-isolation",
            ])
            .arg(repo.join("python"))
            .env("VMM_ALLOC_PREBUILT_DIR", &dir),
        "pip install ./python",
    );
    let core = dir.join("libfake_torch_core.so");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    run(
        Command::new(&cxx)
            .args(["-shared", "-fPIC", "-O1", "-std=c++17", "-o"])
            .arg(&core)
            .arg(repo.join("python/tests/fake_torch/fake_torch_core.cpp")),
        "compiling the fake torch's C++ part",
    );
    let out = Command::new(&vpy)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(repo.join("python/tests"))
        .env("FAKE_TORCH_CORE", &core)
        .current_dir(&dir)
        .output()
        .expect("pytest runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "pytest failed:\n{text}");
    assert!(text.contains(" passed"), "pytest ran no test:\n{text}");
}
