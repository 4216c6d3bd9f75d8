"""Builds the Rust library (capi/) and the C++ shim with cargo during `pip install ./python`.

setuptools-rust is not used: the build makes two libraries (the crate's cdylib and the C++ shim
its build script compiles), and setuptools-rust knows only the first. Set
VMM_ALLOC_PREBUILT_DIR to a directory holding libvmm_alloc_capi.so and libvmm_alloc_torch.so to
skip cargo (the test suite does, with the libraries cargo just built).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
LIBS = ("libvmm_alloc_capi.so", "libvmm_alloc_torch.so")


def built_libraries():
    prebuilt = os.environ.get("VMM_ALLOC_PREBUILT_DIR")
    if prebuilt:
        return Path(prebuilt)
    manifest = HERE.parent / "capi" / "Cargo.toml"
    if not manifest.exists():
        sys.exit(f"vmm_alloc: {manifest} not found: install from the repository "
                 "(pip install ./python) or set VMM_ALLOC_PREBUILT_DIR")
    cmd = ["cargo", "build", "--release", "--manifest-path", str(manifest)]
    try:
        subprocess.run(cmd, check=True)
    except FileNotFoundError:
        sys.exit("vmm_alloc: cargo not found: install Rust (https://rustup.rs) to build from source")
    target = os.environ.get("CARGO_TARGET_DIR") or str(HERE.parent / "target")
    return Path(target) / "release"


class BuildWithCargo(build_py):
    def run(self):
        super().run()
        src = built_libraries()
        dest = Path(self.build_lib) / "vmm_alloc"
        dest.mkdir(parents=True, exist_ok=True)
        for name in LIBS:
            if not (src / name).exists():
                sys.exit(f"vmm_alloc: {src / name} was not built")
            shutil.copy2(src / name, dest / name)


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: the libraries are loaded with ctypes, any Python 3 works."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": BuildWithCargo, "bdist_wheel": PlatformWheel})
