/* vmm_alloc: the C ABI of libvmm_alloc_capi.so (Rust) and libvmm_alloc_torch.so (the C++ shim).
 * Every function may be called from any thread and never lets a Rust panic out. Functions
 * returning int give 0 or an error code, with vmm_alloc_last_error() set on this thread. */
#ifndef VMM_ALLOC_H
#define VMM_ALLOC_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st* cudaStream_t;
typedef struct { unsigned long long first, second; } vmm_alloc_mempool_id; /* MempoolId_t */

enum { VMM_ALLOC_OK = 0, VMM_ALLOC_E_FAILED = 1, VMM_ALLOC_E_OOM = 2, VMM_ALLOC_E_INVALID = 3, VMM_ALLOC_E_PANIC = 4 };

/* libvmm_alloc_torch.so (PyTorch's CUDAPluggableAllocator: alloc_fn, free_fn) */
void* vmm_alloc_malloc(size_t size, int device, cudaStream_t stream); /* throws on failure (C++) */
void vmm_alloc_free(void* ptr, size_t size, int device, cudaStream_t stream);
/* set_begin_allocate_to_pool: void(int, MempoolId_t, std::function<bool(cudaStream_t)>), C++ only: throws (refused) */

/* libvmm_alloc_capi.so: allocation */
int vmm_alloc_try_malloc(size_t size, int device, cudaStream_t stream, void** out); /* size 0: *out = NULL, 0 */
void* vmm_alloc_malloc_nothrow(size_t size, int device, cudaStream_t stream);     /* NULL on failure */
void vmm_alloc_free(void* ptr, size_t size, int device, cudaStream_t stream);    /* never fails loudly */
int vmm_alloc_try_free(void* ptr, int device);

/* PyTorch's optional hooks */
void vmm_alloc_init(int device_count);
void vmm_alloc_reset(void);                                   /* empty_cache on every device */
void vmm_alloc_set_memory_fraction(double fraction, int device);
void* vmm_alloc_base_alloc(void* ptr, size_t* size);
void vmm_alloc_record_stream(void* ptr, cudaStream_t stream);
void vmm_alloc_end_allocate_to_pool(int device, vmm_alloc_mempool_id pool);
void vmm_alloc_release_pool(int device, vmm_alloc_mempool_id pool);

/* For the Python package */
const char* vmm_alloc_last_error(void);
int vmm_alloc_configure(const char* pytorch_conf, const char* ours, const char* backend);
char* vmm_alloc_config_json(void);                            /* free with vmm_alloc_string_free */
char* vmm_alloc_stats_json(int device);                       /* free with vmm_alloc_string_free */
void vmm_alloc_string_free(char* s);
int vmm_alloc_empty_cache(int device);                        /* -1: every device */
int vmm_alloc_reset_peak_stats(int device);
int vmm_alloc_record_start(uint64_t max_entries);
int vmm_alloc_record_stop(void);
int vmm_alloc_record_write_trace(int device, const char* path);
int vmm_alloc_dump_snapshot(int device, const char* path);
int vmm_alloc_set_sleep_tag(const char* tag);                 /* NULL: off (per thread) */
int vmm_alloc_sleep(int device, const char* tag, int keep_contents);
int vmm_alloc_wake(int device, const char* tag);

#ifdef __cplusplus
}
#endif
#endif
