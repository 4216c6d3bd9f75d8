"""A fake `torch` for testing vmm_alloc without PyTorch or a GPU: the parts vmm_alloc uses, with
PyTorch's behaviour (see torch/csrc/cuda/CUDAPluggableAllocator.cpp and torch/cuda/memory.py):
CUDAPluggableAllocator loads the library with ctypes, its hooks take raw function addresses,
alloc_fn is called from C++ (fake_torch_core.cpp) so a C++ exception becomes a RuntimeError, and
MemPool segments come from the pool's allocator, NULL meaning out of memory."""
from . import _C, cuda  # noqa: F401


class OutOfMemoryError(RuntimeError):
    pass


FAKE = True
