// PyTorch's side of an out-of-memory: it calls alloc_fn (a std::function<void*(size_t, int,
// cudaStream_t)>) from C++ and lets a std::exception propagate to Python. This program does the
// same and checks that the exception carries our report, and that foreign and zero requests
// behave. Exit code 0 and "ok" on success.
#include <dlfcn.h>

#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>

typedef struct CUstream_st* cudaStream_t;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* shim = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!shim) { std::fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
  std::function<void*(size_t, int, cudaStream_t)> alloc_fn =
      reinterpret_cast<void* (*)(size_t, int, cudaStream_t)>(dlsym(shim, "vmm_alloc_malloc"));
  std::function<void(void*, size_t, int, cudaStream_t)> free_fn =
      reinterpret_cast<void (*)(void*, size_t, int, cudaStream_t)>(dlsym(shim, "vmm_alloc_free"));
  void* p = alloc_fn(4096, 0, nullptr);
  if (!p) { std::fprintf(stderr, "FAILED: no memory for 4 KiB\n"); return 1; }
  free_fn(p, 4096, 0, nullptr);
  try {
    alloc_fn(size_t(1) << 40, 0, nullptr);
    std::fprintf(stderr, "FAILED: 1 TiB did not throw\n");
    return 1;
  } catch (const std::runtime_error& e) {
    std::string what = e.what();
    if (what.rfind("CUDA out of memory. Tried to allocate", 0) != 0 ||
        what.find("vmm_alloc: reserved") == std::string::npos) {
      std::fprintf(stderr, "FAILED: report: %s\n", what.c_str());
      return 1;
    }
  }
  try {
    alloc_fn(16, 999, nullptr);
    std::fprintf(stderr, "FAILED: device 999 did not throw\n");
    return 1;
  } catch (const std::exception& e) {
    if (std::string(e.what()).find("device 999") == std::string::npos) {
      std::fprintf(stderr, "FAILED: %s\n", e.what());
      return 1;
    }
  }
  std::printf("ok\n");
  return 0;
}
