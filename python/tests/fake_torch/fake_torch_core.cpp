// The C++ part of the fake torch: calls allocator functions the way libtorch does, from C++,
// translating a std::exception into an error code + text (libtorch's HANDLE_TH_ERRORS turns it
// into a Python RuntimeError). Built by the test runner (capi/tests/python.rs).
#include <cstddef>
#include <cstdio>
#include <exception>
#include <functional>
#include <utility>

using AllocFn = void* (*)(size_t, int, void*);
using MempoolId = std::pair<unsigned long long, unsigned long long>;
using BeginFn = void (*)(int, MempoolId, std::function<bool(void*)>);

extern "C" int fake_torch_call_alloc(void* fn, size_t size, int device, void* stream, void** out,
                                     char* err, size_t errlen) {
  try {
    std::function<void*(size_t, int, void*)> alloc_fn = reinterpret_cast<AllocFn>(fn);
    *out = alloc_fn(size, device, stream);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
    return 1;
  }
}

extern "C" int fake_torch_call_begin_pool(void* fn, int device, unsigned long long a,
                                          unsigned long long b, char* err, size_t errlen) {
  try {
    std::function<bool(void*)> filter = [](void*) { return true; };
    reinterpret_cast<BeginFn>(fn)(device, MempoolId{a, b}, filter);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
    return 1;
  }
}
