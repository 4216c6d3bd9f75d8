//! Cases only the Sim backend runs: its defaults and settings, its address-space model, peer
//! devices, and that it refuses to move bytes.

use vmm_alloc::backend::{Access, Backend, CallKind, MemInfo, Protection, SimBackend, SimConfig};
use vmm_alloc::{BackendErrorKind as E, VaRange};

use crate::support::{rw, Case, TestResult};

pub fn cases() -> Vec<Case<SimBackend>> {
    cases![
        defaults_are_an_h100,
        config_validation_errors,
        address_space_exhaustion_with_tiny_va_limit,
        two_live_backends_never_share_an_address,
        freed_reservation_is_reused,
        reservations_never_look_contiguous,
        peer_devices_accept_access_entries,
        moving_bytes_is_unsupported,
    ]
}

fn sim_with(config: SimConfig) -> Result<SimBackend, libtest_mimic::Failed> {
    SimBackend::with_config(config)
        .map_err(|e| format!("SimBackend::with_config({config:?}) failed: {e}").into())
}

fn defaults_are_an_h100(b: &SimBackend) -> TestResult {
    let d = SimConfig::default();
    ensure_eq!(
        (d.granularity, d.capacity, d.va_limit, d.devices),
        (2usize << 20, 80usize << 30, 128u64 << 40, 1u32),
        "SimConfig::default() (granularity, capacity, va_limit, devices)"
    );
    ensure_eq!(b.config(), d, "config of SimBackend::new()");
    ensure_eq!(b.granularity(), 2 << 20, "granularity of SimBackend::new()");
    ensure_eq!(
        (b.device(), b.device_count()),
        (0, 1),
        "(device, device_count)"
    );
    ensure_eq!(b.name(), "sim", "name");
    ensure_eq!(
        ok!(b.mem_info()),
        MemInfo {
            free: 80 << 30,
            total: 80 << 30
        },
        "mem_info"
    );
    let va = ok!(b.reserve(b.granularity()));
    // 0x2_0000_0000 for the first backend alive in a process; other tests' backends are alive
    // beside this one, each in its own window above it.
    ensure!(
        va.start.get() >= 0x2_0000_0000 && va.start.get().is_multiple_of(2 << 20),
        "address of the first reservation {:#x}: at or above 0x2_0000_0000, granule-aligned",
        va.start.get()
    );
    ok!(b.free_reservation(va));
    Ok(())
}

/// Real device addresses are unique in a process; so are Sim's: two live backends' reservations
/// never overlap, so a pointer of one is never a live block of the other (issue 21, item 2).
fn two_live_backends_never_share_an_address(a: &SimBackend) -> TestResult {
    let b = sim_with(a.config())?;
    let g = a.granularity();
    let ra: Vec<VaRange> = (0..8).map(|_| a.reserve(4 * g)).collect::<Result<_, _>>()?;
    let rb: Vec<VaRange> = (0..8).map(|_| b.reserve(4 * g)).collect::<Result<_, _>>()?;
    let span = |r: &VaRange| (r.start.get(), r.start.get() + r.len as u64);
    for x in ra.iter().map(span) {
        for y in rb.iter().map(span) {
            ensure!(
                x.1 <= y.0 || y.1 <= x.0,
                "reservations {x:x?} and {y:x?} of two live Sim backends overlap"
            );
        }
    }
    for r in ra {
        ok!(a.free_reservation(r));
    }
    for r in rb {
        ok!(b.free_reservation(r));
    }
    Ok(())
}

fn config_validation_errors(_: &SimBackend) -> TestResult {
    let d = SimConfig::default();
    let bad = [
        (
            SimConfig {
                granularity: 3 << 20,
                ..d
            },
            "granularity",
        ),
        (
            SimConfig {
                granularity: 256,
                capacity: 1 << 20,
                ..d
            },
            "granularity",
        ),
        (
            SimConfig {
                granularity: 0,
                ..d
            },
            "granularity",
        ),
        (
            SimConfig {
                capacity: (80 << 30) + 4096,
                ..d
            },
            "capacity",
        ),
        (SimConfig { devices: 0, ..d }, "devices"),
        (
            SimConfig {
                va_limit: u64::MAX,
                ..d
            },
            "va_limit",
        ),
    ];
    for (config, field) in bad {
        match SimBackend::with_config(config) {
            Ok(_) => return Err(format!("SimBackend::with_config accepted {config:?}").into()),
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
    // The smallest valid settings work and are what the backend reports.
    let small = SimConfig {
        granularity: 512,
        capacity: 512 * 8,
        va_limit: 512 * 64,
        devices: 3,
        reserve_from_top: true,
    };
    let b = sim_with(small)?;
    ensure_eq!(b.config(), small, "config of a custom Sim");
    ensure_eq!(
        (b.granularity(), b.device_count()),
        (512, 3),
        "(granularity, device_count)"
    );
    ensure_eq!(
        ok!(b.mem_info()),
        MemInfo {
            free: 4096,
            total: 4096
        },
        "mem_info"
    );
    Ok(())
}

fn address_space_exhaustion_with_tiny_va_limit(_: &SimBackend) -> TestResult {
    let d = SimConfig::default();
    let g = d.granularity;
    let b = sim_with(SimConfig {
        va_limit: 4 * g as u64,
        ..d
    })?;
    let first = ok!(b.reserve(2 * g));
    let second = ok!(b.reserve(g)); // one guard granule after the first: fills the limit
    let err = rejects!(&b, Reserve, b.reserve(g),
        E::AddressSpaceExhausted { requested } if *requested == g);
    ensure!(
        err.is_out_of_memory(),
        "AddressSpaceExhausted must say is_out_of_memory(): {err}"
    );
    rejects!(
        &b,
        Reserve,
        b.reserve(8 * g),
        E::AddressSpaceExhausted { .. }
    );
    // Freed address space is reusable.
    ok!(b.free_reservation(first));
    let again = ok!(b.reserve(2 * g));
    ensure_eq!(again, first, "reservation after freeing the first");
    rejects!(&b, Reserve, b.reserve(g), E::AddressSpaceExhausted { .. });
    ok!(b.free_reservation(again));
    ok!(b.free_reservation(second));
    ensure!(b.live().is_empty(), "after the cycle: {}", b.live());
    Ok(())
}

fn freed_reservation_is_reused(b: &SimBackend) -> TestResult {
    let g = b.granularity();
    let a = ok!(b.reserve(4 * g));
    let c = ok!(b.reserve(g));
    ok!(b.free_reservation(a));
    // First fit: the hole left by `a` takes a range of up to its size.
    let smaller = ok!(b.reserve(2 * g));
    ensure_eq!(
        smaller.start,
        a.start,
        "start of a 2-granule reservation after freeing 4 granules there"
    );
    ok!(b.free_reservation(smaller));
    let same = ok!(b.reserve(4 * g));
    ensure_eq!(same, a, "a reservation of the freed size");
    for r in [same, c] {
        ok!(b.free_reservation(r));
    }
    Ok(())
}

fn reservations_never_look_contiguous(b: &SimBackend) -> TestResult {
    let g = b.granularity();
    let rs: Vec<VaRange> = [g, 2 * g, g, 3 * g]
        .into_iter()
        .map(|len| b.reserve(len))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("reserve failed: {e}"))?;
    let mut sorted = rs.clone();
    sorted.sort_by_key(|r| r.start);
    for w in sorted.windows(2) {
        let gap = w[1].start.get() - w[0].end().map_or(u64::MAX, |e| e.get());
        ensure!(
            gap >= g as u64,
            "reservations {} and {} are only {gap:#x} apart",
            w[0],
            w[1]
        );
    }
    for r in rs {
        ok!(b.free_reservation(r));
    }
    Ok(())
}

fn peer_devices_accept_access_entries(b: &SimBackend) -> TestResult {
    let g = b.granularity();
    rejects!(
        b,
        SetAccess,
        b.set_access(vmm_alloc::DevAddr::new(0), g, &[Access::read_write(1)]),
        E::BadDevice {
            ordinal: 1,
            devices: 1
        }
    );
    let sim = sim_with(SimConfig {
        devices: 3,
        ..SimConfig::default()
    })?;
    ensure_eq!(sim.device_count(), 3, "device_count");
    let va = ok!(sim.reserve(g));
    let h = ok!(sim.create(g));
    ok!(sim.map(va.start, g, h, 0));
    let all = [
        Access::read_write(0),
        Access::read_write(2),
        Access {
            device: 1,
            protection: Protection::Read,
        },
    ];
    ok!(sim.set_access(va.start, g, &all));
    ok!(sim.set_access(va.start, g, &[Access::read_write(1)])); // a peer alone
    rejects!(
        &sim,
        SetAccess,
        sim.set_access(va.start, g, &[Access::read_write(3)]),
        E::BadDevice {
            ordinal: 3,
            devices: 3
        }
    );
    rejects!(
        &sim,
        SetAccess,
        sim.set_access(
            va.start,
            g,
            &[rw(&sim)[0], Access::read_write(1), Access::read_write(1)]
        ),
        E::BadDevice {
            ordinal: 1,
            devices: 3
        }
    );
    ok!(sim.unmap(va.start, g));
    ok!(sim.release(h));
    ok!(sim.free_reservation(va));
    Ok(())
}

fn moving_bytes_is_unsupported(b: &SimBackend) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(g));
    let h = ok!(b.create(g));
    ok!(b.map(va.start, g, h, 0));
    ok!(b.set_access(va.start, g, &rw(b)));
    rejects!(b, Write, b.write(va.start, &[1, 2, 3]), E::Unsupported(_));
    rejects!(b, Read, b.read(va.start, &mut [0u8; 3]), E::Unsupported(_));
    ok!(b.unmap(va.start, g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}
