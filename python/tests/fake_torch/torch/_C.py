"""Fake torch._C: the pluggable allocator object and its hook setters (Module.cpp)."""
import ctypes
import os

_core = None


def core():
    """fake_torch_core.so: PyTorch's C++ call sites."""
    global _core
    if _core is None:
        _core = ctypes.CDLL(os.environ["FAKE_TORCH_CORE"])
        _core.fake_torch_call_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]
        _core.fake_torch_call_begin_pool.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_char_p, ctypes.c_size_t]
    return _core


class MempoolId(ctypes.Structure):
    _fields_ = [("first", ctypes.c_ulonglong), ("second", ctypes.c_ulonglong)]


_HOOK_TYPES = {
    "init": ctypes.CFUNCTYPE(None, ctypes.c_int),
    "reset": ctypes.CFUNCTYPE(None),
    "memory_fraction": ctypes.CFUNCTYPE(None, ctypes.c_double, ctypes.c_int),
    "base_alloc": ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)),
    "record_stream": ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p),
    "end_allocate_to_pool": ctypes.CFUNCTYPE(None, ctypes.c_int, MempoolId),
    "release_pool": ctypes.CFUNCTYPE(None, ctypes.c_int, MempoolId),
}
_FREE_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class _cuda_CUDAAllocator:
    pass


class _CUDAPluggableAllocator(_cuda_CUDAAllocator):
    """CUDAPluggableAllocator (C++): keeps ptr -> (size, device, stream) for free_fn."""

    def __init__(self, alloc_fn, free_fn):
        assert alloc_fn and free_fn
        self.alloc_addr = alloc_fn
        self.free_fn = _FREE_TYPE(free_fn)
        self.hooks = {}
        self.begin_pool_addr = None
        self.metadata = {}
        self.initialized = False

    def _set(self, name, ptr):
        assert isinstance(ptr, int) and ptr, f"{name}: a raw function address"
        self.hooks[name] = _HOOK_TYPES[name](ptr)

    def set_init_fn(self, ptr): self._set("init", ptr)
    def set_reset_fn(self, ptr): self._set("reset", ptr)
    def set_memory_fraction_fn(self, ptr): self._set("memory_fraction", ptr)
    def set_base_alloc_fn(self, ptr): self._set("base_alloc", ptr)
    def set_record_stream_fn(self, ptr): self._set("record_stream", ptr)
    def set_end_allocate_to_pool_fn(self, ptr): self._set("end_allocate_to_pool", ptr)
    def set_release_pool(self, ptr): self._set("release_pool", ptr)

    def set_begin_allocate_to_pool(self, ptr):
        assert isinstance(ptr, int) and ptr
        self.begin_pool_addr = ptr

    # --- what libtorch does with it ---
    def init(self, device_count):
        if "init" in self.hooks:
            self.hooks["init"](device_count)
        self.initialized = True

    def malloc(self, size, device, stream):
        """CUDAPluggableAllocator::malloc: alloc_fn from C++; an exception is a RuntimeError."""
        out = ctypes.c_void_p()
        err = ctypes.create_string_buffer(8192)
        rc = core().fake_torch_call_alloc(self.alloc_addr, size, device, stream, ctypes.byref(out), err, len(err))
        if rc != 0:
            raise RuntimeError(err.value.decode())
        if out.value:
            self.metadata[out.value] = (size, device, stream)
        return out.value or 0

    def raw_delete(self, ptr):
        size, device, stream = self.metadata.pop(ptr)
        self.free_fn(ptr, size, device, stream)

    def begin_allocate_to_pool(self, device, pool_id):
        if self.begin_pool_addr:
            err = ctypes.create_string_buffer(4096)
            if core().fake_torch_call_begin_pool(self.begin_pool_addr, device, pool_id[0], pool_id[1], err, len(err)):
                raise RuntimeError(err.value.decode())


def _cuda_customAllocator(alloc_fn, free_fn):
    return _CUDAPluggableAllocator(alloc_fn, free_fn)
