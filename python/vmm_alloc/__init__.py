"""PyTorch on vmm-alloc.

Route A, the whole process (before the first CUDA allocation)::

    import vmm_alloc
    vmm_alloc.install()

Route B, one pool next to PyTorch's own allocator::

    pool = vmm_alloc.pool()
    with torch.cuda.use_mem_pool(pool):
        model = build_model()

Statistics with PyTorch's names (`memory_stats`, `memory_allocated`, `memory_summary`, ...),
`dump_snapshot(path)` for pytorch.org/memory_viz, `record_memory_history()` + `write_trace(path)`
for `vmm-replay`, and `sleepable(tag)` / `sleep()` / `wake()` to give the physical memory of
tagged allocations back while their addresses stay valid.
"""
import contextlib
import threading

from . import _lib
from ._lib import OutOfMemoryError, VmmAllocError, library_path, shim_path
from ._summary import memory_summary as _format_summary

__all__ = [
    "install", "pool", "configure", "config", "memory_stats", "memory_allocated",
    "memory_reserved", "max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats",
    "memory_summary", "empty_cache", "patch_torch_stats", "unpatch_torch_stats", "dump_snapshot",
    "record_memory_history", "write_trace", "sleepable", "sleep", "wake", "cupy_malloc",
    "use_with_cupy", "is_out_of_memory", "OutOfMemoryError", "VmmAllocError", "library_path",
    "shim_path",
]

# PyTorch's hook setters and the functions they get. begin_allocate_to_pool is the C++ shim's
# (its type holds a std::function); the others are the Rust library's.
_HOOKS = [
    ("set_init_fn", "vmm_alloc_init", False),
    ("set_reset_fn", "vmm_alloc_reset", False),
    ("set_memory_fraction_fn", "vmm_alloc_set_memory_fraction", False),
    ("set_base_alloc_fn", "vmm_alloc_base_alloc", False),
    ("set_record_stream_fn", "vmm_alloc_record_stream", False),
    ("set_begin_allocate_to_pool", "vmm_alloc_begin_allocate_to_pool", True),
    ("set_end_allocate_to_pool_fn", "vmm_alloc_end_allocate_to_pool", False),
    ("set_release_pool", "vmm_alloc_release_pool", False),
]

_state = threading.local()
_installed = None
_patched = {}


def _device_index(device):
    if device is None:
        try:
            import torch

            return torch.cuda.current_device()
        except Exception:
            return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is not None:
        return index
    if isinstance(device, str):
        return int(device.split(":", 1)[1]) if ":" in device else 0
    return 0


def configure(conf=None, ours=None, backend=None):
    """Sets PYTORCH_CUDA_ALLOC_CONF-style `conf`, our own options `ours` (VMM_ALLOC_CONF
    grammar) and the backend ("cuda", "host", "sim"); None keeps the environment variable's
    value. Validated now; must come before the first allocation."""
    _lib.check(_lib.lib().vmm_alloc_configure(_lib.encode(conf), _lib.encode(ours), _lib.encode(backend)))


def config():
    """The settings in force, as a dict: the backend, the two configuration strings, and every
    field of our allocator's configuration by name (sizes in bytes), e.g. `va_fallback`."""
    return _lib.take_json(_lib.lib().vmm_alloc_config_json())


def _pluggable(torch, alloc_name, path):
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, alloc_name, "vmm_alloc_free")
    return alloc


def install(conf=None, ours=None, backend=None, patch_stats=True):
    """Route A: makes vmm_alloc PyTorch's CUDA allocator for the whole process, with every hook
    (init, empty_cache, memory fraction, record_stream, base allocation, pools). Must run before
    the first CUDA allocation. With `patch_stats`, torch.cuda.memory_stats() and friends report
    vmm_alloc's statistics (PyTorch's raise under a pluggable allocator). Returns the
    CUDAPluggableAllocator."""
    global _installed
    import ctypes

    import torch

    if _installed is not None:
        return _installed
    if conf is not None or ours is not None or backend is not None:
        configure(conf, ours, backend)
    else:
        config()  # validates the environment's settings now, with a clear message
    alloc = _pluggable(torch, "vmm_alloc_malloc", shim_path())
    raw = alloc._allocator
    shim = ctypes.CDLL(shim_path())
    for setter, symbol, in_shim in _HOOKS:
        source = shim if in_shim else _lib.lib()
        getattr(raw, setter)(ctypes.cast(getattr(source, symbol), ctypes.c_void_p).value)
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise VmmAllocError(
            "vmm_alloc.install() must run before the first CUDA allocation of the process "
            f"(PyTorch said: {e}). Call it at the top of your script, before creating CUDA "
            "tensors or importing libraries that do; or use vmm_alloc.pool() instead."
        ) from e
    _installed = alloc
    if patch_stats:
        patch_torch_stats()
    return alloc


def pool(conf=None, ours=None, backend=None, **mempool_kwargs):
    """Route B: a torch.cuda.MemPool whose segments come from vmm_alloc, for
    `with torch.cuda.use_mem_pool(pool):` (PyTorch >= 2.5). PyTorch's caching allocator still
    runs inside it: it splits, caches and frees the segments our allocator hands out (so its
    statistics count the pool), and an out-of-memory is PyTorch's torch.OutOfMemoryError."""
    import torch

    if conf is not None or ours is not None or backend is not None:
        configure(conf, ours, backend)
    alloc = _pluggable(torch, "vmm_alloc_malloc_nothrow", library_path())
    return torch.cuda.MemPool(alloc._allocator, **mempool_kwargs)


def memory_stats(device=None):
    """vmm_alloc's statistics for `device`, with the keys of torch.cuda.memory_stats() plus
    ours under `vmm.` (driver calls by kind, handles cached, remapped bytes, fragmentation,
    sleep pool)."""
    return _lib.take_json(_lib.lib().vmm_alloc_stats_json(_device_index(device)))


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    _lib.check(_lib.lib().vmm_alloc_reset_peak_stats(_device_index(device)))


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary's table, for vmm_alloc's statistics."""
    return _format_summary(memory_stats(device), _device_index(device), abbreviated)


def empty_cache(device=None):
    """Returns cached memory to the driver (every open device when `device` is None)."""
    _lib.check(_lib.lib().vmm_alloc_empty_cache(-1 if device is None else _device_index(device)))


_PATCHED_NAMES = {
    "memory_stats": memory_stats,
    "memory_allocated": memory_allocated,
    "memory_reserved": memory_reserved,
    "max_memory_allocated": max_memory_allocated,
    "max_memory_reserved": max_memory_reserved,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "memory_summary": memory_summary,
}


def patch_torch_stats():
    """Makes torch.cuda.memory_stats(), memory_allocated(), memory_reserved(), max_memory_*(),
    reset_peak_memory_stats() and memory_summary() report vmm_alloc's statistics."""
    import torch

    for module in (torch.cuda, torch.cuda.memory):
        for name, fn in _PATCHED_NAMES.items():
            if hasattr(module, name):
                _patched.setdefault((module, name), getattr(module, name))
                setattr(module, name, fn)


def unpatch_torch_stats():
    """Undoes patch_torch_stats()."""
    for (module, name), original in list(_patched.items()):
        setattr(module, name, original)
    _patched.clear()


def dump_snapshot(path, device=None):
    """Writes a PyTorch memory snapshot (state, plus history while recording) that
    pytorch.org/memory_viz opens."""
    _lib.check(_lib.lib().vmm_alloc_dump_snapshot(_device_index(device), _lib.encode(path)))


def record_memory_history(enabled=True, max_entries=2**63 - 1):
    """Starts (or with enabled=False stops) recording allocations and frees, for
    dump_snapshot() and write_trace()."""
    if enabled:
        _lib.check(_lib.lib().vmm_alloc_record_start(max_entries))
    else:
        _lib.check(_lib.lib().vmm_alloc_record_stop())


def write_trace(path, device=None):
    """Writes the recorded allocations of `device` in the format `vmm-replay` reads."""
    _lib.check(_lib.lib().vmm_alloc_record_write_trace(_device_index(device), _lib.encode(path)))


@contextlib.contextmanager
def sleepable(tag="default"):
    """This thread's allocations inside the block can later sleep() and wake() by `tag` (each
    gets its own physical memory, like vLLM's CuMemAllocator)."""
    previous = getattr(_state, "tag", None)
    _lib.check(_lib.lib().vmm_alloc_set_sleep_tag(_lib.encode(tag)))
    _state.tag = tag
    try:
        yield
    finally:
        _lib.check(_lib.lib().vmm_alloc_set_sleep_tag(_lib.encode(previous)))
        _state.tag = previous


def _synchronize():
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except ImportError:
        pass


def sleep(tag=None, keep_contents=True, device=None):
    """Releases the physical memory of the sleepable allocations with `tag` (all with None);
    their addresses stay reserved. With keep_contents, their bytes are copied to host memory
    and restored by wake(). Touching them while asleep is an illegal memory access."""
    _synchronize()
    _lib.check(_lib.lib().vmm_alloc_sleep(_device_index(device), _lib.encode(tag), int(bool(keep_contents))))


def wake(tag=None, device=None):
    """Maps physical memory back under the sleeping allocations with `tag` (all with None)."""
    _lib.check(_lib.lib().vmm_alloc_wake(_device_index(device), _lib.encode(tag)))


class _CupyAllocation:
    """One of our allocations lent to CuPy. CuPy's `UnownedMemory` keeps its `owner` alive for as
    long as CuPy uses the memory and takes no weak references, so the owner frees it on collection."""

    __slots__ = ("ptr", "size", "device")

    def __init__(self, ptr, size, device):
        self.ptr, self.size, self.device = ptr, size, device

    def __del__(self):
        if self.ptr:
            _lib.lib().vmm_alloc_free(self.ptr, self.size, self.device, None)
            self.ptr = 0


def cupy_malloc(size):
    """A CuPy allocator function: `cupy.cuda.set_allocator(vmm_alloc.cupy_malloc)`."""
    import cupy

    device = cupy.cuda.Device().id
    stream = cupy.cuda.get_current_stream().ptr
    ptr = _lib.lib().vmm_alloc_malloc_nothrow(size, device, stream)
    if size and not ptr:
        raise OutOfMemoryError(_lib.last_error())
    owner = _CupyAllocation(ptr or 0, size, device)
    mem = cupy.cuda.UnownedMemory(ptr or 0, size, owner, device_id=device)
    return cupy.cuda.MemoryPointer(mem, 0)


def use_with_cupy():
    """Routes CuPy's allocations to vmm_alloc."""
    import cupy

    cupy.cuda.set_allocator(cupy_malloc)


def is_out_of_memory(exc):
    """Whether `exc` (e.g. the RuntimeError a route-A allocation raised) is an out-of-memory."""
    return "CUDA out of memory" in str(exc)
