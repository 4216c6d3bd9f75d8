"""Each test runs its scenario in a fresh Python process (the library's allocators and PyTorch's
allocator switch are per process), with the fake torch of tests/fake_torch first on the path
and the Host backend (real bytes in host memory, no GPU)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FAKE_TORCH = Path(__file__).resolve().parent / "fake_torch"


@pytest.fixture
def run():
    def run(code, backend="host", ours="capacity_mb:256", conf=None, expect_ok=True):
        env = dict(os.environ)
        env["PYTHONPATH"] = str(FAKE_TORCH) + os.pathsep + env.get("PYTHONPATH", "")
        env["VMM_ALLOC_BACKEND"] = backend
        env["VMM_ALLOC_CONF"] = ours
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf is not None:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        assert "FAKE_TORCH_CORE" in env, "FAKE_TORCH_CORE: path of fake_torch_core.so (capi/tests/python.rs builds it)"
        prelude = "import ctypes, torch, vmm_alloc\nassert torch.FAKE\n"
        p = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], env=env,
                           capture_output=True, text=True, timeout=120)
        if expect_ok:
            assert p.returncode == 0, f"scenario failed:\n{p.stdout}\n{p.stderr}"
        return p
    return run
