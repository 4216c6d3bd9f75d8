/* Loads libvmm_alloc_torch.so and libvmm_alloc_capi.so with dlopen, as PyTorch does, and calls
 * them through function pointers of PyTorch's exact types (CUDAPluggableAllocator.h) from several
 * threads, writing and reading bytes through every returned pointer (the Host backend: real
 * memory). Exit code 0 and "ok" on success; a message and 1 on the first failure. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct CUstream_st* cudaStream_t;
typedef struct { unsigned long long first, second; } MempoolId_t;
typedef void* (*alloc_fn_t)(size_t, int, cudaStream_t);
typedef void (*free_fn_t)(void*, size_t, int, cudaStream_t);
typedef void (*init_fn_t)(int);
typedef void (*reset_fn_t)(void);
typedef void (*memory_fraction_fn_t)(double, int);
typedef void* (*base_alloc_fn_t)(void*, size_t*);
typedef void (*record_stream_fn_t)(void*, cudaStream_t);
typedef void (*end_allocate_to_pool_fn_t)(int, MempoolId_t);
typedef void (*release_pool_fn_t)(int, MempoolId_t);
typedef int (*try_malloc_t)(size_t, int, void*, void**);
typedef const char* (*last_error_t)(void);

static alloc_fn_t alloc_fn;
static free_fn_t free_fn;

#define CHECK(cond, ...)                  \
  do {                                    \
    if (!(cond)) {                        \
      fprintf(stderr, "FAILED: " __VA_ARGS__); \
      fprintf(stderr, "\n");              \
      return 1;                           \
    }                                     \
  } while (0)

static void* worker(void* arg) {
  uintptr_t t = (uintptr_t)arg;
  for (size_t i = 0; i < 300; i++) {
    size_t size = 1 + (i * 7919 + t * 104729) % (4u << 20);
    cudaStream_t stream = (cudaStream_t)(t % 3);
    unsigned char* p = alloc_fn(size, 0, stream);
    if (!p) return (void*)1;
    memset(p, (int)(t + i) & 0xff, size);
    for (size_t j = 0; j < size; j += 4093)
      if (p[j] != ((t + i) & 0xff)) return (void*)2;
    if (p[size - 1] != ((t + i) & 0xff)) return (void*)2;
    free_fn(p, size, 0, stream);
  }
  return NULL;
}

int main(int argc, char** argv) {
  CHECK(argc == 3, "usage: %s SHIM.so CAPI.so", argv[0]);
  void* shim = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  CHECK(shim, "dlopen %s: %s", argv[1], dlerror());
  void* capi = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  CHECK(capi, "dlopen %s: %s", argv[2], dlerror());
  alloc_fn = (alloc_fn_t)dlsym(shim, "vmm_alloc_malloc");
  free_fn = (free_fn_t)dlsym(shim, "vmm_alloc_free");
  init_fn_t init_fn = (init_fn_t)dlsym(capi, "vmm_alloc_init");
  reset_fn_t reset_fn = (reset_fn_t)dlsym(capi, "vmm_alloc_reset");
  memory_fraction_fn_t fraction_fn = (memory_fraction_fn_t)dlsym(capi, "vmm_alloc_set_memory_fraction");
  base_alloc_fn_t base_fn = (base_alloc_fn_t)dlsym(capi, "vmm_alloc_base_alloc");
  record_stream_fn_t record_fn = (record_stream_fn_t)dlsym(capi, "vmm_alloc_record_stream");
  end_allocate_to_pool_fn_t end_fn = (end_allocate_to_pool_fn_t)dlsym(capi, "vmm_alloc_end_allocate_to_pool");
  release_pool_fn_t release_fn = (release_pool_fn_t)dlsym(capi, "vmm_alloc_release_pool");
  try_malloc_t try_malloc = (try_malloc_t)dlsym(capi, "vmm_alloc_try_malloc");
  last_error_t last_error = (last_error_t)dlsym(capi, "vmm_alloc_last_error");
  CHECK(alloc_fn && free_fn && init_fn && reset_fn && fraction_fn && base_fn && record_fn &&
            end_fn && release_fn && try_malloc && last_error,
        "a symbol is missing");
  CHECK(dlsym(shim, "vmm_alloc_begin_allocate_to_pool"), "begin_allocate_to_pool missing");

  init_fn(1);
  fraction_fn(1.0, 0);
  CHECK(alloc_fn(0, 0, NULL) == NULL, "size 0 must give NULL");

  pthread_t threads[6];
  for (uintptr_t t = 0; t < 6; t++) pthread_create(&threads[t], NULL, worker, (void*)t);
  for (int t = 0; t < 6; t++) {
    void* rc = NULL;
    pthread_join(threads[t], &rc);
    CHECK(rc == NULL, "thread %d failed with %p", t, rc);
  }

  unsigned char* p = alloc_fn(1000, 0, NULL);
  CHECK(p, "alloc after threads");
  record_fn(p, (cudaStream_t)5);
  size_t size = 1000;
  CHECK(base_fn(p, &size) == p, "base_alloc must return the allocation");
  MempoolId_t pool = {0, 1};
  end_fn(0, pool);
  release_fn(0, pool);
  free_fn(p, 1000, 0, NULL);
  /* A pointer we never allocated: refused (last error set), no crash. */
  free_fn(&size, sizeof size, 0, NULL);
  CHECK(strstr(last_error(), "not the start of a live allocation"), "foreign free: %s", last_error());
  /* Out of memory through the non-throwing entry: code 2 and the report. */
  void* big = NULL;
  CHECK(try_malloc((size_t)1 << 40, 0, NULL, &big) == 2, "1 TiB must be out of memory");
  CHECK(strstr(last_error(), "CUDA out of memory"), "oom text: %s", last_error());
  reset_fn();
  printf("ok\n");
  return 0;
}
