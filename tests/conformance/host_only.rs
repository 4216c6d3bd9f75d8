//! Cases only the Host backend runs: its settings, and that its memory really goes back to the OS.

use vmm_alloc::backend::{Backend, CallKind, HostBackend, HostConfig, MemInfo};
use vmm_alloc::BackendErrorKind as E;

use crate::support::{addr, expect_bytes, map_whole, pattern, rw, Case, TestResult};

pub fn cases() -> Vec<Case<HostBackend>> {
    cases![
        default_config,
        config_validation_errors,
        resident_memory_returned_after_unmap_and_release,
        released_handle_keeps_memory_until_last_unmap,
    ]
}

fn resident(b: &HostBackend) -> Result<u64, libtest_mimic::Failed> {
    b.resident_pool_bytes()
        .map_err(|e| format!("resident_pool_bytes failed: {e}").into())
}

fn default_config(b: &HostBackend) -> TestResult {
    let d = HostConfig::default();
    ensure_eq!(
        (d.granularity, d.capacity),
        (2usize << 20, 16usize << 30),
        "HostConfig::default()"
    );
    ensure_eq!(
        b.granularity(),
        2 << 20,
        "granularity of HostBackend::new()"
    );
    ensure_eq!(
        ok!(b.mem_info()),
        MemInfo {
            free: 16 << 30,
            total: 16 << 30
        },
        "mem_info"
    );
    ensure_eq!(
        (b.name(), b.device(), b.device_count()),
        ("host", 0, 1),
        "(name, device, device_count)"
    );
    ensure_eq!(resident(b)?, 0, "resident pool bytes of a new backend");
    Ok(())
}

fn config_validation_errors(_: &HostBackend) -> TestResult {
    let d = HostConfig::default();
    // 512 is a power of two but smaller than any OS page.
    let bad = [
        (
            HostConfig {
                granularity: 3 << 20,
                ..d
            },
            "granularity",
        ),
        (
            HostConfig {
                granularity: 512,
                capacity: 512 * 8,
            },
            "granularity",
        ),
        (
            HostConfig {
                granularity: 0,
                ..d
            },
            "granularity",
        ),
        (HostConfig { capacity: 0, ..d }, "capacity"),
        (
            HostConfig {
                capacity: (2 << 20) * 3 + (64 << 10),
                ..d
            },
            "capacity",
        ),
    ];
    for (config, field) in bad {
        match HostBackend::with_config(config) {
            Ok(_) => return Err(format!("HostBackend::with_config accepted {config:?}").into()),
            Err(err) => {
                ensure_eq!(err.op, CallKind::Init, "op of the error for {config:?}");
                let E::BadConfig(msg) = &err.kind else {
                    return Err(
                        format!("{config:?} gave {:?}, expected BadConfig", err.kind).into(),
                    );
                };
                ensure!(
                    msg.contains(field),
                    "the error for a bad {field} does not name it: \"{err}\""
                );
            }
        }
    }
    let small = HostConfig {
        granularity: 64 << 10,
        capacity: 4 * (64 << 10),
    };
    let b = ok!(HostBackend::with_config(small));
    ensure_eq!(b.granularity(), 64 << 10, "granularity of a custom Host");
    ensure_eq!(
        ok!(b.mem_info()),
        MemInfo {
            free: 256 << 10,
            total: 256 << 10
        },
        "mem_info"
    );
    Ok(())
}

fn resident_memory_returned_after_unmap_and_release(b: &HostBackend) -> TestResult {
    let g = b.granularity();
    ensure_eq!(resident(b)?, 0, "resident bytes before anything is written");
    let m = map_whole(b, 2)?;
    ensure_eq!(
        resident(b)?,
        0,
        "resident bytes of mapped, unwritten memory"
    );
    // Two pages, far apart.
    ok!(b.write(m.va.start, &pattern(4096, 1)));
    ok!(b.write(addr(m.va, g + 100), &pattern(10, 2)));
    let written = resident(b)?;
    ensure!(
        written >= 2 * 4096,
        "writing two pages made only {written} bytes resident"
    );
    ok!(b.unmap(m.va.start, m.len));
    ensure_eq!(
        resident(b)?,
        written,
        "resident bytes after unmapping a live handle (it may be mapped again)"
    );
    ok!(b.release(m.handle));
    ensure_eq!(
        resident(b)?,
        0,
        "resident bytes after the handle was released and unmapped"
    );
    ok!(b.free_reservation(m.va));
    Ok(())
}

fn released_handle_keeps_memory_until_last_unmap(b: &HostBackend) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(2 * g));
    let h = ok!(b.create(g));
    ok!(b.map(va.start, g, h, 0));
    ok!(b.map(addr(va, g), g, h, 0));
    ok!(b.set_access(va.start, 2 * g, &rw(b)));
    let data = pattern(4096, 3);
    ok!(b.write(va.start, &data));
    let written = resident(b)?;
    ensure!(
        written >= 4096,
        "writing a page made only {written} bytes resident"
    );
    ok!(b.release(h));
    ok!(b.unmap(va.start, g));
    ensure_eq!(
        resident(b)?,
        written,
        "resident bytes while one mapping of the released handle is left"
    );
    expect_bytes(b, addr(va, g), &data, "bytes through the last mapping")?;
    ok!(b.unmap(addr(va, g), g));
    ensure_eq!(
        resident(b)?,
        0,
        "resident bytes after the last unmap of a released handle"
    );
    ok!(b.free_reservation(va));
    Ok(())
}
