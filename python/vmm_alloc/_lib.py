"""The Rust library, loaded with ctypes: function signatures and error handling."""
import ctypes
import json
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent

E_OOM = 2


def library_path():
    """Path of libvmm_alloc_capi.so (the Rust library): $VMM_ALLOC_LIBRARY or the package's."""
    return os.environ.get("VMM_ALLOC_LIBRARY") or str(_HERE / "libvmm_alloc_capi.so")


def shim_path():
    """Path of libvmm_alloc_torch.so, the C++ library PyTorch's CUDAPluggableAllocator loads."""
    return os.environ.get("VMM_ALLOC_SHIM") or str(_HERE / "libvmm_alloc_torch.so")


class VmmAllocError(RuntimeError):
    """A vmm_alloc call failed; the message says what happened and what to do."""


class OutOfMemoryError(VmmAllocError):
    """Out of device memory; the message is vmm_alloc's report."""


_SIGNATURES = {
    "vmm_alloc_try_malloc": (ctypes.c_int, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]),
    "vmm_alloc_malloc_nothrow": (ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "vmm_alloc_free": (None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "vmm_alloc_try_free": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
    "vmm_alloc_init": (None, [ctypes.c_int]),
    "vmm_alloc_reset": (None, []),
    "vmm_alloc_empty_cache": (ctypes.c_int, [ctypes.c_int]),
    "vmm_alloc_set_memory_fraction": (None, [ctypes.c_double, ctypes.c_int]),
    "vmm_alloc_record_stream": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "vmm_alloc_last_error": (ctypes.c_char_p, []),
    "vmm_alloc_string_free": (None, [ctypes.c_void_p]),
    "vmm_alloc_configure": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]),
    "vmm_alloc_config_json": (ctypes.c_void_p, []),
    "vmm_alloc_stats_json": (ctypes.c_void_p, [ctypes.c_int]),
    "vmm_alloc_reset_peak_stats": (ctypes.c_int, [ctypes.c_int]),
    "vmm_alloc_record_start": (ctypes.c_int, [ctypes.c_uint64]),
    "vmm_alloc_record_stop": (ctypes.c_int, []),
    "vmm_alloc_record_write_trace": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p]),
    "vmm_alloc_dump_snapshot": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p]),
    "vmm_alloc_set_sleep_tag": (ctypes.c_int, [ctypes.c_char_p]),
    "vmm_alloc_sleep": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]),
    "vmm_alloc_wake": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p]),
}

_lib = None


def lib():
    """The loaded library (loaded on first use)."""
    global _lib
    if _lib is None:
        path = library_path()
        try:
            loaded = ctypes.CDLL(path)
        except OSError as e:
            raise VmmAllocError(f"vmm_alloc: cannot load {path}: {e}; reinstall the package") from e
        for name, (restype, argtypes) in _SIGNATURES.items():
            f = getattr(loaded, name)
            f.restype = restype
            f.argtypes = argtypes
        _lib = loaded
    return _lib


def address(name):
    """The address of exported function `name` (for PyTorch's hook setters)."""
    return ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value


def last_error():
    """This thread's last error text from the library."""
    raw = lib().vmm_alloc_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def check(rc):
    """Raises the matching exception for a non-zero return code."""
    if rc == 0:
        return
    message = last_error()
    if rc == E_OOM:
        raise OutOfMemoryError(message)
    raise VmmAllocError(message)


def take_json(ptr):
    """Decodes and frees a JSON string the library returned (NULL = error)."""
    if not ptr:
        raise VmmAllocError(last_error())
    try:
        return json.loads(ctypes.string_at(ptr).decode("utf-8"))
    finally:
        lib().vmm_alloc_string_free(ptr)


def encode(s):
    return None if s is None else str(s).encode("utf-8")
