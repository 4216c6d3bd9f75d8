//! The exported functions, called as C would, on the Host backend (real bytes behind every
//! pointer). One process, one registry: every test configures the same settings first.

use std::ffi::{c_void, CStr, CString};
use std::sync::{Once, RwLock, RwLockReadGuard, RwLockWriteGuard};

use vmm_alloc_capi::*;

const CAPACITY_MB: usize = 256;

/// Tests share one allocator: those that compare its statistics before and after a call hold
/// this exclusively, the rest shared (an OOM that fails at once left a window too short for a
/// concurrent test to hide in before issue 21 no longer does).
static SHARED: RwLock<()> = RwLock::new(());

/// The allocator to oneself, for a test that compares statistics before and after a call.
fn setup_alone() -> RwLockWriteGuard<'static, ()> {
    configure();
    SHARED.write().unwrap_or_else(|e| e.into_inner())
}

fn setup() -> RwLockReadGuard<'static, ()> {
    configure();
    SHARED.read().unwrap_or_else(|e| e.into_inner())
}

fn configure() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let ours = CString::new(format!("capacity_mb:{CAPACITY_MB}")).unwrap();
        let rc = vmm_alloc_configure(std::ptr::null(), ours.as_ptr(), c"host".as_ptr());
        assert_eq!(rc, 0, "{}", last_error());
    });
}

fn last_error() -> String {
    // SAFETY: the library returns this thread's NUL-terminated buffer.
    unsafe { CStr::from_ptr(vmm_alloc_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn malloc(size: usize, device: i32, stream: u64) -> Result<*mut u8, (i32, String)> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out pointer.
    let rc = unsafe { vmm_alloc_try_malloc(size, device, stream as *mut c_void, &mut p) };
    if rc == 0 {
        Ok(p.cast())
    } else {
        Err((rc, last_error()))
    }
}

fn free(p: *mut u8) {
    assert_eq!(vmm_alloc_try_free(p.cast(), 0), 0, "{}", last_error());
}

fn stats() -> serde_json::Value {
    let s = vmm_alloc_stats_json(0);
    assert!(!s.is_null(), "{}", last_error());
    // SAFETY: a string the library returned, freed right after.
    let v = serde_json::from_str(&unsafe { CStr::from_ptr(s) }.to_string_lossy()).unwrap();
    // SAFETY: returned by the library, not freed yet.
    unsafe { vmm_alloc_string_free(s) };
    v
}

#[test]
fn zero_bytes_is_null_without_error() {
    let _shared = setup();
    assert_eq!(malloc(0, 0, 0).unwrap(), std::ptr::null_mut());
}

#[test]
fn returned_memory_holds_what_is_written() {
    let _shared = setup();
    let p = malloc(5000, 0, 0).unwrap();
    assert_eq!(p as usize % 512, 0, "allocations are 512-byte aligned");
    // SAFETY: 5000 bytes were allocated at `p`, on the Host backend: real memory.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p, 5000) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    assert!(bytes.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    free(p);
}

#[test]
fn a_foreign_pointer_is_refused_and_counted_not_a_crash() {
    let _shared = setup();
    let before = stats()["vmm.failed_frees"].as_u64().unwrap();
    let mut local = [0u8; 64];
    assert_eq!(vmm_alloc_try_free(local.as_mut_ptr().cast(), 0), E_INVALID);
    assert!(
        last_error().contains("not the start of a live allocation"),
        "{}",
        last_error()
    );
    vmm_alloc_free(local.as_mut_ptr().cast(), 64, 0, std::ptr::null_mut());
    assert!(stats()["vmm.failed_frees"].as_u64().unwrap() >= before + 2);
}

#[test]
fn a_double_free_is_an_error() {
    let _shared = setup();
    let p = malloc(1 << 20, 0, 0).unwrap();
    free(p);
    assert_ne!(vmm_alloc_try_free(p.cast(), 0), 0);
    assert!(!last_error().is_empty());
}

#[test]
fn out_of_memory_gives_the_report_and_changes_nothing() {
    let _alone = setup_alone();
    let before = stats()["allocated_bytes.all.current"].as_u64().unwrap();
    let (rc, msg) = malloc((CAPACITY_MB + 1) << 20, 0, 0).unwrap_err();
    assert_eq!(rc, E_OOM);
    assert!(
        msg.starts_with("CUDA out of memory. Tried to allocate"),
        "{msg}"
    );
    assert!(
        msg.contains("vmm_alloc: reserved") && msg.contains("Advice:"),
        "{msg}"
    );
    assert!(stats()["num_ooms"].as_u64().unwrap() >= 1);
    assert_eq!(
        stats()["allocated_bytes.all.current"].as_u64().unwrap(),
        before
    );
}

#[test]
fn bad_devices_and_settings_are_errors_with_messages() {
    let _shared = setup();
    let (rc, msg) = malloc(100, 999, 0).unwrap_err();
    assert_eq!(rc, E_INVALID);
    assert!(msg.contains("device 999"), "{msg}");
    // A device allocator exists (other tests): configuration is refused, with the reason.
    let _ = malloc(100, 0, 0).map(free);
    assert_eq!(
        vmm_alloc_configure(std::ptr::null(), std::ptr::null(), c"host".as_ptr()),
        E_INVALID
    );
    assert!(
        last_error().contains("before the first allocation"),
        "{}",
        last_error()
    );
    let rc = vmm_alloc_configure(
        c"max_split_size_mb:nope".as_ptr(),
        std::ptr::null(),
        std::ptr::null(),
    );
    assert_eq!(rc, E_INVALID);
    assert!(
        last_error().contains("PYTORCH_CUDA_ALLOC_CONF"),
        "{}",
        last_error()
    );
}

#[test]
fn stats_use_pytorch_names_and_follow_allocations() {
    let _shared = setup();
    let p = malloc(3 << 20, 0, 7).unwrap();
    let s = stats();
    for key in [
        "allocated_bytes.all.current",
        "reserved_bytes.large_pool.peak",
        "allocation.all.current",
        "active_bytes.small_pool.freed",
        "num_device_alloc",
        "vmm.driver_calls.cuMemCreate",
        "vmm.fragmentation",
    ] {
        assert!(s.get(key).is_some(), "missing {key}");
    }
    assert!(s["allocated_bytes.all.current"].as_u64().unwrap() >= 3 << 20);
    assert!(s["reserved_bytes.all.current"].as_u64().unwrap() >= 3 << 20);
    assert_eq!(s["vmm.backend"], "host");
    free(p);
}

#[test]
fn record_stream_knows_live_allocations_only() {
    let _shared = setup();
    let p = malloc(4096, 0, 0).unwrap();
    vmm_alloc_record_stream(p.cast(), 3 as *mut c_void);
    free(p);
    vmm_alloc_record_stream(p.cast(), 3 as *mut c_void);
    assert!(last_error().contains("record_stream"), "{}", last_error());
}

#[test]
fn many_threads_allocate_write_and_free() {
    let _shared = setup();
    std::thread::scope(|s| {
        for t in 0..8u8 {
            s.spawn(move || {
                for i in 0..200usize {
                    let size = 512 + (i * 997 + t as usize * 131) % (3 << 20);
                    let p = malloc(size, 0, t as u64 % 3).unwrap();
                    // SAFETY: `size` bytes of real memory at `p`, this thread's alone.
                    let b = unsafe { std::slice::from_raw_parts_mut(p, size) };
                    b.fill(t);
                    assert!(b.iter().all(|&x| x == t), "thread {t} lost its bytes");
                    free(p);
                }
            });
        }
    });
}

#[test]
fn sleep_releases_and_wake_restores_the_bytes_at_the_same_address() {
    let _shared = setup();
    assert_eq!(vmm_alloc_set_sleep_tag(c"weights".as_ptr()), 0);
    let p = malloc(10_000, 0, 0).unwrap();
    assert_eq!(vmm_alloc_set_sleep_tag(std::ptr::null()), 0);
    // SAFETY: 10,000 bytes of real memory at `p`.
    unsafe { std::slice::from_raw_parts_mut(p, 10_000) }.fill(0xAB);
    let mapped = stats()["vmm.sleep.mapped_bytes"].as_u64().unwrap();
    assert!(mapped >= 10_000);
    assert_eq!(
        vmm_alloc_sleep(0, c"weights".as_ptr(), 1),
        0,
        "{}",
        last_error()
    );
    let s = stats();
    assert_eq!(s["vmm.sleep.asleep_bytes"].as_u64().unwrap(), mapped);
    assert_eq!(s["vmm.sleep.mapped_bytes"].as_u64().unwrap(), 0);
    assert_eq!(
        vmm_alloc_wake(0, c"weights".as_ptr()),
        0,
        "{}",
        last_error()
    );
    // SAFETY: awake again at the same address.
    assert!(unsafe { std::slice::from_raw_parts(p, 10_000) }
        .iter()
        .all(|&b| b == 0xAB));
    free(p);
    assert_eq!(stats()["vmm.sleep.allocations"].as_u64().unwrap(), 0);
}

#[test]
fn recording_writes_a_replayable_trace_and_a_snapshot() {
    let _shared = setup();
    let dir = std::env::temp_dir().join(format!("vmm-capi-rec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(vmm_alloc_record_start(u64::MAX), 0);
    let a = malloc(1 << 20, 0, 0).unwrap();
    let b = malloc(5 << 20, 0, 0).unwrap();
    free(a);
    assert_eq!(vmm_alloc_empty_cache(0), 0);
    assert_eq!(vmm_alloc_record_stop(), 0);
    let trace = dir.join("t.vmmtrace");
    let snap = dir.join("s.pickle");
    let tpath = CString::new(trace.to_str().unwrap()).unwrap();
    let spath = CString::new(snap.to_str().unwrap()).unwrap();
    assert_eq!(
        vmm_alloc_record_write_trace(0, tpath.as_ptr()),
        0,
        "{}",
        last_error()
    );
    assert_eq!(
        vmm_alloc_dump_snapshot(0, spath.as_ptr()),
        0,
        "{}",
        last_error()
    );
    let t = vmm_replay::native::read_native_file(&trace).unwrap();
    // Other tests run alongside: at least our two allocations and one free are there.
    let allocs = t
        .events
        .iter()
        .filter(|e| matches!(e, vmm_replay::Event::Alloc { .. }))
        .count();
    assert!(allocs >= 2, "{t:?}");
    let bytes = std::fs::read(&snap).unwrap();
    assert_eq!(&bytes[..2], b"\x80\x04", "pickle protocol 4");
    let back = vmm_replay::snapshot::read_snapshot(&bytes, "s").unwrap();
    assert!(!back.is_empty());
    free(b);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn hooks_with_no_result_do_not_crash_on_odd_input() {
    let _shared = setup();
    vmm_alloc_init(1);
    vmm_alloc_init(-1);
    vmm_alloc_set_memory_fraction(2.0, 0);
    assert!(last_error().contains("not in [0, 1]"), "{}", last_error());
    let mut size = 77usize;
    let p = 0x1000 as *mut c_void;
    assert_eq!(vmm_alloc_base_alloc(p, &mut size), p);
    vmm_alloc_end_allocate_to_pool(
        0,
        MempoolId {
            first: 0,
            second: 1,
        },
    );
    vmm_alloc_release_pool(
        0,
        MempoolId {
            first: 0,
            second: 1,
        },
    );
    vmm_alloc_reset();
    assert_eq!(vmm_alloc_reset_peak_stats(0), 0);
    let c = vmm_alloc_config_json();
    assert!(!c.is_null());
    // SAFETY: returned by the library.
    let text = unsafe { CStr::from_ptr(c) }.to_string_lossy().into_owned();
    // SAFETY: returned by the library, not freed yet.
    unsafe { vmm_alloc_string_free(c) };
    assert!(text.contains("\"backend\":\"host\""), "{text}");
}

/// `vmm_alloc_config_json` (Python's `vmm_alloc.config()`) shows what every one of our keys
/// resolved to, so a user can check a `VMM_ALLOC_CONF` took effect.
#[test]
fn the_config_shows_every_own_key() {
    let _g = setup();
    let c = vmm_alloc_config_json();
    assert!(!c.is_null(), "{}", last_error());
    // SAFETY: returned by the library.
    let text = unsafe { CStr::from_ptr(c) }.to_string_lossy().into_owned();
    // SAFETY: returned by the library, not freed yet.
    unsafe { vmm_alloc_string_free(c) };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (key, _) in vmm_alloc::config::OWN_KEYS {
        // Sizes are given in MiB and shown in bytes, under the field's name.
        let field = match key {
            "headroom_mb" => "headroom_bytes",
            k => k.strip_suffix("_mb").unwrap_or(k),
        };
        assert!(
            v.get(field).is_some(),
            "{key} ({field}) missing from {text}"
        );
    }
    let d = vmm_alloc::ExpandableConfig::default();
    assert_eq!(v["va_fallback"], d.va_fallback, "{text}");
    assert_eq!(v["stream_page_floor"], d.stream_page_floor, "{text}");
    assert_eq!(v["front_cache"], "auto", "{text}");
    assert_eq!(
        v["give_back_below_all_free_pages"], d.give_back_below_all_free_pages,
        "{text}"
    );
}
