"""Fake torch.cuda: one fake device, tensors as raw allocations (`_alloc`), the allocator switch."""
import contextlib
import itertools
import threading

from . import memory
from .memory import (  # noqa: F401
    MemPool, empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated,
    memory_reserved, memory_stats, memory_summary, reset_peak_memory_stats, use_mem_pool,
)


def is_available():
    return True


def device_count():
    return 1


def current_device():
    return 0


def synchronize(device=None):
    memory._state.synchronized += 1


def set_per_process_memory_fraction(fraction, device=None):
    a = memory._state.current
    if a is not None and "memory_fraction" in a.hooks:
        a.hooks["memory_fraction"](fraction, 0 if device is None else device)


class Block:
    """A tensor's storage: `ptr`, `size`; `free()` gives it back as PyTorch's deleter does."""

    def __init__(self, ptr, size, release):
        self.ptr, self.size, self._release = ptr, size, release

    def free(self):
        if self._release:
            self._release()
            self._release = None


_native_addr = itertools.count(0x7F0000000000, 1 << 21)


def _alloc(size, device=0, stream=0):
    """Allocates like at::empty on CUDA: the current allocator, or the thread's MemPool."""
    s = memory._state
    pool = getattr(s.tls, "pool", None)
    if pool is not None:
        return pool._alloc(size, device, stream)
    a = s.current
    if a is None:
        s.native_initialized = True
        ptr = next(_native_addr)
        return Block(ptr, size, None)
    if not a.initialized:
        a.init(device_count())
    ptr = a.malloc(size, device, stream)
    if size and not ptr:
        # What PyTorch does with a NULL from alloc_fn under change_current_allocator.
        return Block(0, size, None)
    return Block(ptr, size, (lambda: a.raw_delete(ptr)) if ptr else None)


def _record_stream(block, stream):
    a = memory._state.current
    if a is not None and "record_stream" in a.hooks:
        a.hooks["record_stream"](block.ptr, stream)


_lock = threading.Lock()


@contextlib.contextmanager
def graph_capture_pool(pool_id=(1, 0)):
    """What torch.cuda.graph's capture_begin does to the current allocator."""
    a = memory._state.current
    if a is not None:
        a.begin_allocate_to_pool(0, pool_id)
    yield
