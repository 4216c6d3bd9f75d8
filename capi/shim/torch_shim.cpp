// libvmm_alloc_torch.so: the C++ half of vmm_alloc's PyTorch ABI, the library whose path is given
// to torch.cuda.memory.CUDAPluggableAllocator (alloc_fn "vmm_alloc_malloc", free_fn
// "vmm_alloc_free").
//
// PyTorch uses what `alloc_fn` returns: a NULL becomes a tensor at address 0 (under
// change_current_allocator) instead of an error. So this malloc asks the Rust library (which
// never unwinds) and, on failure, throws here: the unwinding starts in this C++ frame and runs
// only through PyTorch's C++ frames, which turn a std::exception into a Python RuntimeError whose
// text is our out-of-memory report.
//
// c10::OutOfMemoryError (torch.OutOfMemoryError in Python) is not thrown: constructing it needs
// libtorch's headers and ABI at build time, and the wheel is built where torch is absent. The
// message starts with "CUDA out of memory." as PyTorch's does (vmm_alloc.is_out_of_memory(e)
// tells).
//
// The Rust library (libvmm_alloc_capi.so) is found beside this one at the first call (or at
// $VMM_ALLOC_LIBRARY), so that this library needs nothing at link time.
#include <dlfcn.h>

#include <cstddef>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#define VMM_EXPORT extern "C" __attribute__((visibility("default")))

namespace vmm_alloc {
// Out of memory: what() is the full report.
struct OutOfMemoryError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace vmm_alloc

namespace {
constexpr int kOutOfMemory = 2;  // VMM_ALLOC_E_OOM

struct Rust {
  int (*try_malloc)(size_t, int, void*, void**) = nullptr;
  void (*free)(void*, size_t, int, void*) = nullptr;
  const char* (*last_error)() = nullptr;
  std::string error;  // why loading failed
};

std::string beside_this_library() {
  if (const char* env = std::getenv("VMM_ALLOC_LIBRARY")) return env;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&beside_this_library), &info) == 0 || !info.dli_fname)
    return "libvmm_alloc_capi.so";
  std::string self = info.dli_fname;
  auto slash = self.rfind('/');
  return (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) +
         "libvmm_alloc_capi.so";
}

const Rust& rust() {
  static Rust r;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string path = beside_this_library();
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      r.error = "vmm_alloc: cannot load " + path + ": " + (why ? why : "unknown error");
      return;
    }
    r.try_malloc =
        reinterpret_cast<int (*)(size_t, int, void*, void**)>(dlsym(lib, "vmm_alloc_try_malloc"));
    r.free = reinterpret_cast<void (*)(void*, size_t, int, void*)>(dlsym(lib, "vmm_alloc_free"));
    r.last_error = reinterpret_cast<const char* (*)()>(dlsym(lib, "vmm_alloc_last_error"));
    if (!r.try_malloc || !r.free || !r.last_error) {
      r.error = "vmm_alloc: " + path + " lacks the vmm_alloc_* functions";
      r.try_malloc = nullptr;
    }
  });
  return r;
}
}  // namespace

// PyTorch's alloc_fn: void*(size_t size, int device, cudaStream_t stream). Size 0 gives NULL.
VMM_EXPORT void* vmm_alloc_malloc(size_t size, int device, void* stream) {
  const Rust& r = rust();
  if (!r.try_malloc) throw std::runtime_error(r.error);
  void* ptr = nullptr;
  int rc = r.try_malloc(size, device, stream, &ptr);
  if (rc == 0) return ptr;
  const char* text = r.last_error();
  std::string message = text && *text ? text : "vmm_alloc: allocation failed";
  if (rc == kOutOfMemory) throw vmm_alloc::OutOfMemoryError(message);
  throw std::runtime_error(message);
}

// PyTorch's free_fn: void(void* ptr, size_t size, int device, cudaStream_t stream). Never
// throws (PyTorch frees in destructors); errors are kept in the Rust library's last error.
VMM_EXPORT void vmm_alloc_free(void* ptr, size_t size, int device, void* stream) noexcept {
  const Rust& r = rust();
  if (r.free) r.free(ptr, size, device, stream);
}

// PyTorch's set_begin_allocate_to_pool hook:
// void(int, MempoolId_t, std::function<bool(cudaStream_t)>), MempoolId_t = pair<ull, ull>.
// Allocating to a private pool (CUDA graph capture, torch.cuda.use_mem_pool while our allocator
// is the process-wide one) needs pool-private memory that vmm_alloc does not keep: refusing is
// the only safe answer, as memory a captured graph uses could otherwise be handed out again.
VMM_EXPORT void vmm_alloc_begin_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool,
    std::function<bool(void*)> filter) {
  (void)device;
  (void)pool;
  (void)filter;
  throw std::runtime_error(
      "vmm_alloc: private memory pools (CUDA graph capture, torch.cuda.use_mem_pool) are not "
      "supported while vmm_alloc is the process-wide allocator (vmm_alloc.install()); use "
      "vmm_alloc.pool() with PyTorch's own allocator instead");
}
