//! The exported C functions (declared in `include/vmm_alloc.h`). Every one runs under
//! [`guard`](crate::boundary::guard): no panic crosses the boundary, errors become a code and
//! this thread's last error. They take no global interpreter lock and may be called from any
//! thread; each device's allocator is created on its first use.

use std::cell::RefCell;
use std::ffi::{c_char, c_double, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};

use vmm_alloc::config::FrontCacheMode;
use vmm_alloc::DevAddr;

use crate::boundary::{guard, guard_value, last_error_ptr, CallError, E_FAILED, E_INVALID, E_OOM};
use crate::devices::{allocate_on, free_on, registry, snapshot_of, stats_of};
use crate::recording;
use crate::report::{oom_report, stats_json};
use crate::settings::Settings;

/// PyTorch's `MempoolId_t` (`std::pair<CaptureId_t, CaptureId_t>`), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MempoolId {
    /// First id (0 for user pools).
    pub first: u64,
    /// Second id.
    pub second: u64,
}

/// Allocations in sleep pools, all devices: while 0, a free never looks there.
static SLEEPERS: AtomicU64 = AtomicU64::new(0);
/// Frees PyTorch made that failed (foreign pointers): reported in the statistics.
static FAILED_FREES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The sleep tag of this thread's allocations (`vmm_alloc.sleepable(tag)`), if any.
    static TAG: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn cstr<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, CallError> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a NUL-terminated string (the header says so) valid for the call.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(Some)
        .map_err(|_| CallError::new(E_INVALID, format!("vmm_alloc: {what} is not UTF-8")))
}

fn alloc_error(e: vmm_alloc::AllocError, dev: &dyn crate::devices::DeviceOps) -> CallError {
    if e.is_out_of_memory() {
        CallError::new(E_OOM, oom_report(&e, dev))
    } else {
        CallError::new(E_INVALID, format!("vmm_alloc: {e}"))
    }
}

/// Allocates `size` bytes on `device` for `stream`; `*out` gets the pointer (NULL for size 0,
/// which is not an error). Returns 0 or an error code (2 = out of memory) with the last error set.
///
/// # Safety
///
/// `out` must be valid for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn vmm_alloc_try_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    out: *mut *mut c_void,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(CallError::new(E_INVALID, "vmm_alloc: out is NULL"));
        }
        let ptr = malloc_inner(size, device, stream as u64)?;
        // SAFETY: checked non-null above; the caller guarantees it is writable.
        unsafe { *out = ptr };
        Ok(())
    })
}

#[inline]
fn malloc_inner(size: usize, device: c_int, stream: u64) -> Result<*mut c_void, CallError> {
    if size == 0 {
        return Ok(std::ptr::null_mut());
    }
    let dev = registry().device(device)?;
    let tagged = TAG.with(|t| t.borrow().clone());
    if let Some(tag) = tagged {
        let p = dev
            .sleep_allocate(size, &tag)
            .map_err(|e| alloc_error(e, dev))?;
        SLEEPERS.fetch_add(1, Ordering::Relaxed);
        return Ok(p.get() as *mut c_void);
    }
    let stream = dev.stream(stream)?;
    match allocate_on(dev, size, stream) {
        Ok(a) => {
            if recording::active() {
                recording::on_alloc(device as u32, &a);
            }
            Ok(a.ptr().get() as *mut c_void)
        }
        Err(e) => {
            if recording::active() && e.is_out_of_memory() {
                let free = dev.mem_info().map_or(0, |(_, f)| f);
                recording::on_oom(device as u32, size as u64, stream.raw(), free);
            }
            Err(alloc_error(e, dev))
        }
    }
}

/// Like `vmm_alloc_malloc` but never throws: NULL on failure, with the last error set. For C
/// callers (CuPy, tests); PyTorch must use `vmm_alloc_malloc`.
#[no_mangle]
pub extern "C" fn vmm_alloc_malloc_nothrow(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    guard_value(std::ptr::null_mut(), || {
        malloc_inner(size, device, stream as u64)
    })
}

/// Frees `ptr` (from `vmm_alloc_malloc`). PyTorch's free signature: the size and stream are
/// not needed. A pointer this library did not allocate is refused: nothing happens, the last
/// error says so and `vmm.failed_frees` counts it (a free cannot throw: PyTorch frees in
/// destructors).
#[no_mangle]
pub extern "C" fn vmm_alloc_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = (size, stream);
    vmm_alloc_try_free(ptr, device);
}

/// Frees `ptr`, returning 0 or an error code with the last error set (a pointer this library
/// did not allocate, a double free).
#[no_mangle]
pub extern "C" fn vmm_alloc_try_free(ptr: *mut c_void, device: c_int) -> c_int {
    let rc = guard(|| free_inner(ptr, device));
    if rc != 0 {
        FAILED_FREES.fetch_add(1, Ordering::Relaxed);
    }
    rc
}

#[inline]
fn free_inner(ptr: *mut c_void, device: c_int) -> Result<(), CallError> {
    if ptr.is_null() {
        return Ok(());
    }
    let dev = registry().device(device)?;
    let addr = DevAddr::new(ptr as u64);
    if SLEEPERS.load(Ordering::Relaxed) > 0 {
        if let Some(r) = dev.sleep_free(addr) {
            r.map_err(|e| alloc_error(e, dev))?;
            SLEEPERS.fetch_sub(1, Ordering::Relaxed);
            return Ok(());
        }
    }
    free_on(dev, addr).map_err(|e| alloc_error(e, dev))?;
    if recording::active() {
        recording::on_free(device as u32, addr);
    }
    Ok(())
}

/// PyTorch's init hook: `void(int device_count)`. Validates the settings now, so a bad
/// configuration is reported early (on stderr: the hook cannot fail).
#[no_mangle]
pub extern "C" fn vmm_alloc_init(device_count: c_int) {
    let rc = guard(|| {
        if device_count < 0 {
            return Err(CallError::new(
                E_INVALID,
                "vmm_alloc: negative device count",
            ));
        }
        registry().settings().map(|_| ())
    });
    if rc != 0 {
        eprintln!("{}", last_error_string());
    }
}

/// PyTorch's reset hook (`torch.cuda.empty_cache()` under route A): empties every open device's
/// cache.
#[no_mangle]
pub extern "C" fn vmm_alloc_reset() {
    let _ = vmm_alloc_empty_cache(-1);
}

/// Returns every cached byte of `device` (-1: every open device) to the driver.
#[no_mangle]
pub extern "C" fn vmm_alloc_empty_cache(device: c_int) -> c_int {
    guard(|| {
        let reg = registry();
        for (i, dev) in reg.open_devices() {
            if device >= 0 && i as c_int != device {
                continue;
            }
            dev.allocator()
                .empty_cache()
                .map_err(|e| alloc_error(e, dev))?;
            if recording::active() {
                recording::on_empty_cache(i);
            }
        }
        Ok(())
    })
}

/// PyTorch's memory-fraction hook: `void(double fraction, int device)`. The allocator takes its
/// limit at creation, so this must come before the device's first allocation; later it is
/// refused (last error set, message on stderr).
#[no_mangle]
pub extern "C" fn vmm_alloc_set_memory_fraction(fraction: c_double, device: c_int) {
    let rc = guard(|| {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(CallError::new(
                E_INVALID,
                format!("vmm_alloc: memory fraction {fraction} is not in [0, 1]"),
            ));
        }
        let reg = registry();
        if reg.open_devices().any(|(i, _)| i as c_int == device) {
            return Err(CallError::new(
                E_INVALID,
                "vmm_alloc: set_per_process_memory_fraction must come before the device's first \
                 allocation",
            ));
        }
        let mut s = reg.settings()?;
        s.config.memory_fraction = fraction;
        reg.configure(s)
    });
    if rc != 0 {
        eprintln!("{}", last_error_string());
    }
}

/// PyTorch's record_stream hook: `void(void* ptr, cudaStream_t stream)`.
#[no_mangle]
pub extern "C" fn vmm_alloc_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    let rc = guard(|| {
        let addr = DevAddr::new(ptr as u64);
        for (_, dev) in registry().open_devices() {
            let s = dev.stream(stream as u64)?;
            match dev.allocator().record_stream(addr, s) {
                Ok(()) => return Ok(()),
                Err(vmm_alloc::AllocError::InvalidPointer(_)) => continue,
                Err(e) => return Err(alloc_error(e, dev)),
            }
        }
        Err(CallError::new(
            E_INVALID,
            format!("vmm_alloc: record_stream of {ptr:?}, not a live allocation of vmm_alloc"),
        ))
    });
    if rc != 0 {
        eprintln!("{}", last_error_string());
    }
}

/// PyTorch's base-allocation hook: `void*(void* ptr, size_t* size)`. Every allocation is its own
/// base (VMM memory cannot be shared through `cudaIpcGetMemHandle`, the only user); `*size` is
/// left as given.
#[no_mangle]
pub extern "C" fn vmm_alloc_base_alloc(ptr: *mut c_void, size: *mut usize) -> *mut c_void {
    let _ = size;
    ptr
}

/// PyTorch's end-allocate-to-pool hook: `void(int device, MempoolId_t)`. Nothing to end: the
/// begin hook refuses private pools.
#[no_mangle]
pub extern "C" fn vmm_alloc_end_allocate_to_pool(device: c_int, pool: MempoolId) {
    let _ = (device, pool);
}

/// PyTorch's release-pool hook: `void(int device, MempoolId_t)`. No private pool exists; the
/// device's cache is emptied, as PyTorch's pool destructor asks.
#[no_mangle]
pub extern "C" fn vmm_alloc_release_pool(device: c_int, pool: MempoolId) {
    let _ = pool;
    let _ = vmm_alloc_empty_cache(device);
}

/// This thread's last error text (empty if none): valid until this thread's next failing call.
#[no_mangle]
pub extern "C" fn vmm_alloc_last_error() -> *const c_char {
    last_error_ptr()
}

fn last_error_string() -> String {
    // SAFETY: `last_error_ptr` points at this thread's NUL-terminated buffer.
    unsafe { CStr::from_ptr(last_error_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn out_string(s: String) -> *mut c_char {
    CString::new(s.replace('\0', " "))
        .unwrap_or_default()
        .into_raw()
}

/// Frees a string this library returned.
///
/// # Safety
///
/// `s` is NULL or a string returned by this library and not freed yet.
#[no_mangle]
pub unsafe extern "C" fn vmm_alloc_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: made by `CString::into_raw` in `out_string`, freed once (the caller's promise).
        drop(unsafe { CString::from_raw(s) });
    }
}

/// Sets the configuration before the first allocation: `pytorch_conf` as
/// `PYTORCH_CUDA_ALLOC_CONF`, `ours` as `VMM_ALLOC_CONF`, `backend` as `VMM_ALLOC_BACKEND`
/// (each NULL = the environment variable's value). Validated: returns an error code with a
/// message naming the bad value; refused once a device allocator runs.
#[no_mangle]
pub extern "C" fn vmm_alloc_configure(
    pytorch_conf: *const c_char,
    ours: *const c_char,
    backend: *const c_char,
) -> c_int {
    guard(|| {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let pick = |p: *const c_char, what: &str, var: &str| -> Result<Option<String>, CallError> {
            Ok(cstr(p, what)?.map(str::to_owned).or_else(|| env(var)))
        };
        let settings = Settings::parse(
            pick(backend, "backend", "VMM_ALLOC_BACKEND")?.as_deref(),
            pick(pytorch_conf, "pytorch_conf", "PYTORCH_CUDA_ALLOC_CONF")?.as_deref(),
            pick(ours, "ours", "VMM_ALLOC_CONF")?.as_deref(),
        )
        .map_err(|m| CallError::new(E_INVALID, m))?;
        registry().configure(settings)
    })
}

/// The settings in force as JSON (`backend`, `pytorch_conf`, `ours`, every field of the
/// allocator's `ExpandableConfig` by its name, `front_cache` as `false`/`auto`/`true`), or
/// NULL with the last error set. Free with `vmm_alloc_string_free`.
#[no_mangle]
pub extern "C" fn vmm_alloc_config_json() -> *mut c_char {
    guard_value(std::ptr::null_mut(), || {
        let s = registry().settings()?;
        let c = &s.config;
        let v = serde_json::json!({
            "backend": s.backend.name(),
            "pytorch_conf": s.pytorch_conf,
            "ours": s.ours,
            "capacity": s.capacity,
            "small_page": c.small_page,
            "large_page": c.large_page,
            "handle_cache": c.handle_cache,
            "handle_cache_limit": c.handle_cache_limit,
            "remap_defrag": c.remap_defrag,
            "memory_fraction": c.memory_fraction,
            "max_split_size": c.max_split_size,
            // Every other field, so that a user sees what each of our keys resolved to.
            "va_factor": c.va_factor,
            "va_fallback": c.va_fallback,
            "sync_only_after_frees": c.sync_only_after_frees,
            "peers": c.peers,
            "roundup_power2_divisions": c.roundup_power2_divisions,
            "faithful_oversize": c.faithful_oversize,
            "max_non_split_rounding": c.max_non_split_rounding,
            "pressure_tail": c.pressure_tail,
            "headroom_bytes": c.headroom_bytes,
            "headroom_fraction": c.headroom_fraction,
            "remap_before_create": c.remap_before_create,
            "borrow_across_pools": c.borrow_across_pools,
            "park_remaps": c.park_remaps,
            "front_cache": match c.front_cache {
                FrontCacheMode::Off => "false",
                FrontCacheMode::OnContention => "auto",
                FrontCacheMode::Always => "true",
            },
            "best_fit_growth": c.best_fit_growth,
            "reuse_last_free": c.reuse_last_free,
            "drain_after_sync": c.drain_after_sync,
            "harvest_lowest_first": c.harvest_lowest_first,
            "give_back_before_foreign_sync": c.give_back_before_foreign_sync,
            "give_back_below_free_pages": c.give_back_below_free_pages,
            "give_back_below_all_free_pages": c.give_back_below_all_free_pages,
            "fine_pages_above": c.fine_pages_above,
            "reuse_last_free_above": c.reuse_last_free_above,
            "stream_page_share": c.stream_page_share,
            "stream_page_floor": c.stream_page_floor,
            "batch_unmaps": c.batch_unmaps,
            "tail_takes_rest": c.tail_takes_rest,
            "alias_rescue": c.alias_rescue,
            "rescue_after_oom": c.rescue_after_oom,
            "skip_hopeless_growth": c.skip_hopeless_growth,
            "put_back_after_retry": c.put_back_after_retry,
            "keep_after_retry": c.keep_after_retry,
        });
        Ok(out_string(v.to_string()))
    })
}

/// `device`'s statistics as JSON with PyTorch's `memory_stats()` keys plus ours (`vmm.*`), or
/// NULL with the last error set. Opens the device if needed. Free with `vmm_alloc_string_free`.
#[no_mangle]
pub extern "C" fn vmm_alloc_stats_json(device: c_int) -> *mut c_char {
    guard_value(std::ptr::null_mut(), || {
        let reg = registry();
        let dev = reg.device(device)?;
        let settings = reg.settings()?;
        let mut json = stats_json(&stats_of(dev), dev, settings.config.max_split_size);
        // Splice the process-wide counter in without re-parsing.
        json.pop();
        json.push_str(&format!(
            ",\"vmm.failed_frees\":{}}}",
            FAILED_FREES.load(Ordering::Relaxed)
        ));
        Ok(out_string(json))
    })
}

/// Sets every peak statistic of `device` to its current value (`reset_peak_memory_stats`).
#[no_mangle]
pub extern "C" fn vmm_alloc_reset_peak_stats(device: c_int) -> c_int {
    guard(|| {
        registry().device(device)?.allocator().reset_peak_stats();
        Ok(())
    })
}

/// Starts recording allocations and frees of every device (keeping at most `max_entries`
/// snapshot entries per device; the trace for `vmm-replay` keeps everything).
#[no_mangle]
pub extern "C" fn vmm_alloc_record_start(max_entries: u64) -> c_int {
    guard(|| {
        let states = registry()
            .open_devices()
            .map(|(i, d)| (i, snapshot_of(d)))
            .collect();
        recording::start(states, usize::try_from(max_entries).unwrap_or(usize::MAX));
        Ok(())
    })
}

/// Stops recording; what was recorded can still be written.
#[no_mangle]
pub extern "C" fn vmm_alloc_record_stop() -> c_int {
    guard(|| {
        recording::stop();
        Ok(())
    })
}

/// Writes `device`'s recorded trace to `path` in the format `vmm-replay` reads.
#[no_mangle]
pub extern "C" fn vmm_alloc_record_write_trace(device: c_int, path: *const c_char) -> c_int {
    guard(|| {
        let path = cstr(path, "path")?.ok_or_else(|| CallError::new(E_INVALID, "path is NULL"))?;
        let conf = registry().settings()?.pytorch_conf;
        recording::write_trace(device as u32, path, conf).map_err(|m| CallError::new(E_FAILED, m))
    })
}

/// Writes `device`'s memory snapshot (state now, plus the recorded history if any) to `path` as
/// a PyTorch snapshot pickle that pytorch.org/memory_viz opens.
#[no_mangle]
pub extern "C" fn vmm_alloc_dump_snapshot(device: c_int, path: *const c_char) -> c_int {
    guard(|| {
        let path = cstr(path, "path")?.ok_or_else(|| CallError::new(E_INVALID, "path is NULL"))?;
        let reg = registry();
        let dev = reg.device(device)?;
        let settings = reg.settings()?;
        let stats = stats_of(dev);
        recording::dump_snapshot(
            device as u32,
            path,
            snapshot_of(dev),
            settings.config,
            settings.pytorch_conf,
            stats.reserved_bytes.all.peak,
        )
        .map_err(|m| CallError::new(E_FAILED, m))
    })
}

/// Sets this thread's sleep tag: while set (non-NULL), this thread's allocations go to the
/// sleep pool under that tag; NULL turns it off.
#[no_mangle]
pub extern "C" fn vmm_alloc_set_sleep_tag(tag: *const c_char) -> c_int {
    guard(|| {
        let tag = cstr(tag, "tag")?.map(str::to_owned);
        TAG.with(|t| *t.borrow_mut() = tag);
        Ok(())
    })
}

/// Puts `device`'s sleep-pool allocations with `tag` (NULL: all) to sleep, copying their bytes
/// to host memory first if `keep_contents`. The caller synchronizes the device first.
#[no_mangle]
pub extern "C" fn vmm_alloc_sleep(
    device: c_int,
    tag: *const c_char,
    keep_contents: c_int,
) -> c_int {
    guard(|| {
        let tag = cstr(tag, "tag")?;
        let dev = registry().device(device)?;
        dev.sleep(tag, keep_contents != 0)
            .map(|_| ())
            .map_err(|e| alloc_error(e, dev))
    })
}

/// Wakes `device`'s asleep allocations with `tag` (NULL: all), restoring saved contents.
#[no_mangle]
pub extern "C" fn vmm_alloc_wake(device: c_int, tag: *const c_char) -> c_int {
    guard(|| {
        let tag = cstr(tag, "tag")?;
        let dev = registry().device(device)?;
        dev.wake(tag).map(|_| ()).map_err(|e| alloc_error(e, dev))
    })
}
