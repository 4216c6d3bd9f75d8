"""A fake of the parts of CuPy that `vmm_alloc.use_with_cupy` touches, faithful where it matters:
CuPy's `UnownedMemory` is a Cython class that keeps `owner` alive and takes no weak references
(`cupy/cuda/memory.pyx`), and an allocator set by `set_allocator` gets the size and returns a
`MemoryPointer`. Arrays are host buffers at the allocator's addresses (the Host backend)."""
import ctypes

FAKE = True


class _Cuda:
    pass


cuda = _Cuda()
_allocator = [None]


class UnownedMemory:
    __slots__ = ("ptr", "size", "device_id", "_owner")  # no __weakref__, as the real one

    def __init__(self, ptr, size, owner, device_id=-1):
        if device_id < 0 and ptr == 0:
            raise RuntimeError("UnownedMemory requires explicit device ID for a null pointer.")
        self.ptr, self.size, self.device_id, self._owner = ptr, size, device_id, owner


class MemoryPointer:
    __slots__ = ("mem", "ptr")

    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset


class Device:
    def __init__(self, device=0):
        self.id = device

    def synchronize(self):
        pass


class _Stream:
    ptr = 0


def get_current_stream():
    return _Stream()


def set_allocator(allocator=None):
    _allocator[0] = allocator


class ndarray:
    """A float64 vector in memory from the allocator set, as CuPy's arrays get theirs."""

    def __init__(self, n):
        self.n = n
        self.data = _allocator[0](8 * n)

    def view(self):
        return (ctypes.c_double * self.n).from_address(self.data.ptr)


def arange(n, dtype=None):
    a = ndarray(n)
    a.view()[:] = [float(i) for i in range(n)]
    return a


float64 = "float64"
cuda.UnownedMemory, cuda.MemoryPointer, cuda.Device = UnownedMemory, MemoryPointer, Device
cuda.get_current_stream, cuda.set_allocator = get_current_stream, set_allocator
