"""Fake torch.cuda.memory: CUDAPluggableAllocator, change_current_allocator, MemPool, stats."""
import contextlib
import ctypes
import threading

import torch


class _State:
    def __init__(self):
        self.current = None  # the pluggable allocator swapped in, if any
        self.native_initialized = False
        self.tls = threading.local()
        self.synchronized = 0


_state = _State()


class _CUDAAllocator:
    def __init__(self, allocator):
        self._allocator = allocator

    def allocator(self):
        return self._allocator


class CUDAPluggableAllocator(_CUDAAllocator):
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        allocator = ctypes.CDLL(path_to_so_file)
        alloc_fn = ctypes.cast(getattr(allocator, alloc_fn_name), ctypes.c_void_p).value
        free_fn = ctypes.cast(getattr(allocator, free_fn_name), ctypes.c_void_p).value
        assert alloc_fn is not None
        assert free_fn is not None
        self._allocator = torch._C._cuda_customAllocator(alloc_fn, free_fn)


def change_current_allocator(allocator):
    current = _state.current
    if _state.native_initialized or (current is not None and current.initialized):
        raise RuntimeError("Can't swap an already initialized allocator")
    _state.current = allocator.allocator()


def _get_current_allocator():
    return _state.current


def memory_stats(device=None):
    if _state.current is not None:
        raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats. "
                           "If you need it, please file an issue describing your use case.")
    return {}


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    if _state.current is not None:
        raise RuntimeError("CUDAPluggableAllocator does not yet support resetPeakStats.")


def memory_summary(device=None, abbreviated=False):
    memory_stats(device)
    return ""


def empty_cache():
    a = _state.current
    if a is not None and "reset" in a.hooks:
        a.hooks["reset"]()


class MemPool:
    """A private pool of the native allocator whose segments come from `allocator`."""

    _ids = iter(range(1, 1 << 30))

    def __init__(self, allocator=None, use_on_oom=False, no_split=False):
        self.allocator = allocator
        self.id = (0, next(MemPool._ids))
        self.segments = []

    def _alloc(self, size, device, stream):
        # The native allocator asks the pool's allocator for a segment of
        # get_allocation_size(size) bytes and treats NULL as cudaErrorMemoryAllocation.
        if size <= (1 << 20):
            seg = 2 << 20
        elif size < (10 << 20):
            seg = 20 << 20
        else:
            seg = (size + (2 << 20) - 1) // (2 << 20) * (2 << 20)
        a = self.allocator
        ptr = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(a.alloc_addr)(seg, device, stream)
        if not ptr:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {seg} bytes.")
        a.metadata[ptr] = (seg, device, stream)
        self.segments.append(ptr)
        from torch.cuda import Block

        return Block(ptr, size, lambda: None)

    def release(self):
        """The pool's destructor: its segments go back through free_fn."""
        for ptr in self.segments:
            self.allocator.raw_delete(ptr)
        self.segments.clear()


@contextlib.contextmanager
def use_mem_pool(pool, device=None):
    previous = getattr(_state.tls, "pool", None)
    _state.tls.pool = pool
    try:
        yield
    finally:
        _state.tls.pool = previous
