//! Common cases, part 2: access, freeing reservations, memory info, events, leak accounting,
//! shared clones and what errors say.

use vmm_alloc::backend::{Access, CallKind, Capabilities, Protection, StreamId};
use vmm_alloc::{BackendError, BackendErrorKind as E, DevAddr, VaRange};

use crate::support::{
    addr, expect_bytes, foreign_event, foreign_handle, map_whole, pattern, rw, unmap_whole, Case,
    Subject, TestResult,
};

pub fn cases<B: Subject>() -> Vec<Case<B>> {
    cases![
        set_access_covers_run_of_mappings,
        set_access_rejects_bad_requests,
        free_reservation_rejects_mapped,
        free_reservation_rejects_wrong_range,
        mem_info_tracks_created_bytes,
        events_record_query_release,
        full_cycle_leaves_nothing_live,
        release_before_unmap_cycle_leaves_nothing_live,
        dropping_a_clone_keeps_state,
        concurrent_use_from_threads,
        error_display_names_driver_call,
        caller_bug_exactly_for_bug_check_kinds,
    ]
}

fn set_access_covers_run_of_mappings<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let bytes = b.capabilities().contains(Capabilities::BYTES);
    let va = ok!(b.reserve(3 * g));
    // Three mappings of three handles, each a separate cuMemMap.
    let handles = [ok!(b.create(g)), ok!(b.create(g)), ok!(b.create(g))];
    for (i, h) in handles.iter().enumerate() {
        ok!(b.map(addr(va, i * g), g, *h, 0));
    }
    if bytes {
        rejects!(b, Write, b.write(va.start, &[1]), E::NoAccess { .. });
    }
    let before = b.calls();
    ok!(b.set_access(va.start, 3 * g, &rw(b)));
    let cost = b.calls().since(&before);
    ensure_eq!(
        cost.total(),
        1,
        "calls made by one set_access over three mappings ({cost})"
    );
    if bytes {
        // Every mapping of the run is writable now, and so is a range across the seams.
        for i in 0..3 {
            let data = pattern(64, i as u8);
            let at = addr(va, i * g + g - 64);
            ok!(b.write(at, &data));
            expect_bytes(b, at, &data, &format!("end of mapping {i}"))?;
        }
        let across = pattern(128, 9);
        ok!(b.write(addr(va, 2 * g - 64), &across));
        expect_bytes(
            b,
            addr(va, 2 * g - 64),
            &across,
            "across the seam of mappings 1 and 2",
        )?;
    }
    // A sub-run of whole mappings is fine too.
    ok!(b.set_access(addr(va, g), 2 * g, &rw(b)));
    ok!(b.unmap(va.start, 3 * g));
    for h in handles {
        ok!(b.release(h));
    }
    ok!(b.free_reservation(va));
    Ok(())
}

fn set_access_rejects_bad_requests<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let bytes = b.capabilities().contains(Capabilities::BYTES);
    let own = b.device();
    let n = b.device_count();
    let va = ok!(b.reserve(3 * g));
    let h = ok!(b.create(2 * g));
    ok!(b.map(va.start, 2 * g, h, 0));
    rejects!(
        b,
        SetAccess,
        b.set_access(va.start, 2 * g, &[]),
        E::EmptyAccessList
    );
    rejects!(b, SetAccess, b.set_access(va.start, 2 * g, &[Access::read_write(n)]),
        E::BadDevice { ordinal, devices } if *ordinal == n && *devices == n);
    let twice = [
        Access::read_write(own),
        Access {
            device: own,
            protection: Protection::Read,
        },
    ];
    rejects!(b, SetAccess, b.set_access(va.start, 2 * g, &twice),
        E::BadDevice { ordinal, .. } if *ordinal == own);
    // Half a mapping, a mapping plus unmapped space, unmapped space only.
    for (off, len) in [(0, g), (g, g), (0, 3 * g), (2 * g, g)] {
        let at = addr(va, off);
        rejects!(b, SetAccess, b.set_access(at, len, &rw(b)),
            E::PartialMapping { addr: a, len: l } if *a == at && *l == len);
    }
    if bytes {
        // None of the failed calls granted any access.
        rejects!(b, Write, b.write(va.start, &[1]), E::NoAccess { .. });
    }
    ok!(b.unmap(va.start, 2 * g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn free_reservation_rejects_mapped<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let h = ok!(b.create(g));
    ok!(b.map(va.start, g, h, 0));
    ok!(b.map(addr(va, 3 * g), g, h, 0));
    let err = rejects!(b, FreeReservation, b.free_reservation(va),
        E::ReservationStillMapped { addr: a, mappings: 2 } if *a == va.start);
    ensure!(
        err.is_caller_bug(),
        "freeing a mapped reservation is a caller bug: {err}"
    );
    ok!(b.unmap(va.start, g));
    rejects!(
        b,
        FreeReservation,
        b.free_reservation(va),
        E::ReservationStillMapped { mappings: 1, .. }
    );
    ok!(b.unmap(addr(va, 3 * g), g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    ensure!(b.live().is_empty(), "after the cycle: {}", b.live());
    Ok(())
}

fn free_reservation_rejects_wrong_range<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let wrong = [
        VaRange {
            start: va.start,
            len: 2 * g,
        },
        VaRange {
            start: va.start,
            len: 8 * g,
        },
        VaRange {
            start: addr(va, g),
            len: 3 * g,
        },
        VaRange {
            start: DevAddr::new(g as u64),
            len: g,
        },
    ];
    for r in wrong {
        let err = rejects!(b, FreeReservation, b.free_reservation(r),
            E::UnknownReservation { addr: a, len } if *a == r.start && *len == r.len);
        ensure!(
            !err.is_caller_bug(),
            "UnknownReservation is not a bug-check kind: {err}"
        );
    }
    ok!(b.free_reservation(va));
    rejects!(
        b,
        FreeReservation,
        b.free_reservation(va),
        E::UnknownReservation { .. }
    );
    Ok(())
}

fn mem_info_tracks_created_bytes<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let exact = !b.capabilities().contains(Capabilities::GPU);
    let m0 = ok!(b.mem_info());
    ensure!(
        m0.total > 0 && m0.free <= m0.total,
        "mem_info of a new backend: {m0:?}"
    );
    if exact {
        ensure_eq!(m0.free, m0.total, "free memory of a new emulated backend");
    }
    let h1 = ok!(b.create(g));
    let h2 = ok!(b.create(3 * g));
    let m1 = ok!(b.mem_info());
    ensure!(m1.free <= m1.total, "mem_info after creating: {m1:?}");
    ensure_eq!(m1.total, m0.total, "total memory after creating handles");
    if exact {
        ensure_eq!(
            m1.free,
            m0.free - 4 * g,
            "free memory after creating 4 granules"
        );
    } else {
        // The driver may round and others may allocate, but creating memory never adds any.
        ensure!(
            m1.free + g <= m0.free,
            "creating {:#x} bytes lowered free memory by less than one granule: {m0:?} -> {m1:?}",
            4 * g
        );
    }
    ok!(b.release(h1));
    if exact {
        ensure_eq!(
            ok!(b.mem_info()).free,
            m0.free - 3 * g,
            "free memory after releasing 1 granule"
        );
    }
    ok!(b.release(h2));
    if exact {
        ensure_eq!(ok!(b.mem_info()), m0, "mem_info after releasing everything");
    }
    Ok(())
}

fn events_record_query_release<B: Subject>(b: &B) -> TestResult {
    let s = StreamId::DEFAULT;
    let e1 = ok!(b.record_event(s));
    let e2 = ok!(b.record_event(s));
    ensure!(e1 != e2, "two recorded events share the id {e1:?}");
    ensure_eq!(b.live().events, 2, "live events after recording two");
    ok!(b.synchronize(s));
    ensure!(
        ok!(b.query_event(e1)),
        "{e1:?} is not complete after synchronize"
    );
    ensure!(
        ok!(b.query_event(e2)),
        "{e2:?} is not complete after synchronize"
    );
    ok!(b.release_event(e1));
    ensure_eq!(b.live().events, 1, "live events after releasing one");
    let err = rejects!(b, QueryEvent, b.query_event(e1), E::EventAlreadyReleased(x) if *x == e1);
    ensure!(
        err.is_caller_bug(),
        "querying a released event is a caller bug: {err}"
    );
    rejects!(b, ReleaseEvent, b.release_event(e1), E::EventAlreadyReleased(x) if *x == e1);
    ensure!(ok!(b.query_event(e2)), "releasing {e1:?} disturbed {e2:?}");
    let foreign = foreign_event(b)?;
    rejects!(b, QueryEvent, b.query_event(foreign), E::UnknownEvent(x) if *x == foreign);
    rejects!(
        b,
        ReleaseEvent,
        b.release_event(foreign),
        E::UnknownEvent(_)
    );
    ok!(b.release_event(e2));
    ensure_eq!(b.live().events, 0, "live events after releasing both");
    Ok(())
}

/// The growth pattern of an expandable segment: reserve, create + map page by page, one
/// set_access for the run, an event, then tear everything down.
fn full_cycle_leaves_nothing_live<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(8 * g));
    let mut handles = Vec::new();
    for i in 0..4 {
        let h = ok!(b.create(g));
        ok!(b.map(addr(va, i * g), g, h, 0));
        handles.push(h);
    }
    ok!(b.set_access(va.start, 4 * g, &rw(b)));
    let ev = ok!(b.record_event(StreamId::DEFAULT));
    let live = b.live();
    let expected = vmm_alloc::backend::LiveResources {
        reservations: 1,
        reserved_va_bytes: 8 * g,
        mappings: 4,
        mapped_bytes: 4 * g,
        handles: 4,
        physical_bytes: 4 * g,
        events: 1,
    };
    ensure_eq!(live, expected, "live resources in the middle of the cycle");
    ok!(b.synchronize(StreamId::DEFAULT));
    ensure!(ok!(b.query_event(ev)), "event incomplete after synchronize");
    ok!(b.release_event(ev));
    ok!(b.unmap(va.start, 4 * g));
    for h in handles {
        ok!(b.release(h));
    }
    ok!(b.free_reservation(va));
    ensure!(
        b.live().is_empty(),
        "after a full cycle the backend still holds {}",
        b.live()
    );
    let calls = b.calls();
    let expected_counts = [
        (CallKind::Reserve, 1),
        (CallKind::Create, 4),
        (CallKind::Map, 4),
        (CallKind::SetAccess, 1),
        (CallKind::RecordEvent, 1),
        (CallKind::Synchronize, 1),
        (CallKind::QueryEvent, 1),
        (CallKind::ReleaseEvent, 1),
        (CallKind::Unmap, 1),
        (CallKind::Release, 4),
        (CallKind::FreeReservation, 1),
    ];
    for (kind, n) in expected_counts {
        ensure_eq!(calls.calls(kind), n, "{kind} calls counted ({calls})");
        ensure_eq!(calls.failures(kind), 0, "{kind} failures counted ({calls})");
    }
    ensure_eq!(calls.total(), 20, "total calls counted ({calls})");
    Ok(())
}

/// Handles released right after mapping (the cached-handle pattern): the memory goes with the
/// last unmap and nothing is left.
fn release_before_unmap_cycle_leaves_nothing_live<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let a = ok!(b.create(2 * g));
    let c = ok!(b.create(g));
    ok!(b.map(va.start, 2 * g, a, 0));
    ok!(b.map(addr(va, 2 * g), g, c, 0));
    ok!(b.map(addr(va, 3 * g), g, c, 0));
    ok!(b.set_access(va.start, 4 * g, &rw(b)));
    ok!(b.release(a));
    ok!(b.release(c));
    ensure_eq!(
        b.live().physical_bytes,
        3 * g,
        "physical bytes held by released, mapped handles"
    );
    ok!(b.unmap(va.start, 4 * g));
    ok!(b.free_reservation(va));
    ensure!(
        b.live().is_empty(),
        "after the cycle the backend still holds {}",
        b.live()
    );
    Ok(())
}

fn dropping_a_clone_keeps_state<B: Subject>(b: &B) -> TestResult {
    let clone = b.clone();
    let m = map_whole(&clone, 2)?;
    let data = pattern(300, 3);
    let bytes = b.capabilities().contains(Capabilities::BYTES);
    if bytes {
        ok!(clone.write(addr(m.va, m.len - 300), &data));
    }
    let (live, calls) = (clone.live(), clone.calls());
    drop(clone);
    ensure_eq!(b.live(), live, "live resources seen by the remaining clone");
    ensure_eq!(b.calls(), calls, "calls seen by the remaining clone");
    if bytes {
        expect_bytes(
            b,
            addr(m.va, m.len - 300),
            &data,
            "after dropping the clone that wrote",
        )?;
    }
    unmap_whole(b, m)
}

/// A backend is shared between threads (`&self` methods, its own locking): cycles running at
/// once on clones never see each other's memory, and every call is counted.
fn concurrent_use_from_threads<B: Subject>(b: &B) -> TestResult {
    const THREADS: usize = 4;
    const ROUNDS: usize = 16;
    let bytes = b.capabilities().contains(Capabilities::BYTES);
    let results: Vec<TestResult> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let b = b.clone();
                scope.spawn(move || -> TestResult {
                    let g = b.granularity();
                    for round in 0..ROUNDS {
                        let m = map_whole(&b, 2)?;
                        if bytes {
                            let data = pattern(64, (t * ROUNDS + round) as u8);
                            ok!(b.write(addr(m.va, g - 32), &data));
                            expect_bytes(
                                &b,
                                addr(m.va, g - 32),
                                &data,
                                &format!("thread {t}, round {round}"),
                            )?;
                        }
                        unmap_whole(&b, m)?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("a worker thread panicked".into()))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    ensure!(
        b.live().is_empty(),
        "after all threads finished: {}",
        b.live()
    );
    let calls = b.calls();
    let cycles = (THREADS * ROUNDS) as u64;
    for kind in [
        CallKind::Reserve,
        CallKind::Create,
        CallKind::Map,
        CallKind::SetAccess,
    ] {
        ensure_eq!(
            calls.calls(kind),
            cycles,
            "{kind} calls counted across threads ({calls})"
        );
    }
    ensure_eq!(
        calls.failures(CallKind::Map),
        0,
        "failed maps across threads"
    );
    Ok(())
}

fn error_display_names_driver_call<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(g));
    let foreign = foreign_handle(b)?;
    let foreign_ev = foreign_event(b)?;
    let errors: Vec<(&str, Result<(), BackendError>)> = vec![
        ("cuMemAddressReserve", b.reserve(0).map(drop)),
        ("cuMemCreate", b.create(g / 2).map(drop)),
        ("cuMemMap", b.map(addr(va, g / 2), g, foreign, 0)),
        ("cuMemUnmap", b.unmap(va.start, g)),
        ("cuMemSetAccess", b.set_access(va.start, g, &[])),
        (
            "cuMemAddressFree",
            b.free_reservation(VaRange {
                start: va.start,
                len: 2 * g,
            }),
        ),
        ("cuMemRelease", b.release(foreign)),
        ("cuEventQuery", b.query_event(foreign_ev).map(drop)),
        ("cuEventDestroy", b.release_event(foreign_ev)),
    ];
    for (driver, result) in errors {
        let Err(err) = result else {
            return Err(format!("the {driver} call that breaks a rule succeeded").into());
        };
        let text = err.to_string();
        ensure_eq!(err.op.driver_name(), driver, "op of the error \"{text}\"");
        ensure!(
            text.starts_with(&format!("{driver} failed: ")),
            "error message does not start with \"{driver} failed: \": \"{text}\""
        );
        ensure!(
            text.ends_with(&err.kind.to_string()),
            "error message \"{text}\" does not carry its kind's message \"{}\"",
            err.kind
        );
    }
    // The length rule names the granularity so a user can fix the size.
    let err = b
        .create(g + 1)
        .expect_err("a non-multiple length is rejected");
    let text = err.to_string();
    ensure!(
        text.contains(&format!("{g:#x}")) && text.contains(&format!("{:#x}", g + 1)),
        "BadLength message does not name the granularity {g:#x} and the length: \"{text}\""
    );
    ok!(b.free_reservation(va));
    Ok(())
}

fn caller_bug_exactly_for_bug_check_kinds<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(2 * g));
    let h = ok!(b.create(g));
    let gone = ok!(b.create(g));
    ok!(b.release(gone));
    ok!(b.map(va.start, g, h, 0));
    let ev = ok!(b.record_event(StreamId::DEFAULT));
    ok!(b.release_event(ev));
    let foreign = foreign_handle(b)?;
    let foreign_ev = foreign_event(b)?;
    let top = DevAddr::new(u64::MAX - (g as u64 - 1));
    // (call result, whether the rule it breaks is one CUDA accepts silently)
    let results: Vec<(Result<(), BackendError>, bool)> = vec![
        (b.reserve(0).map(drop), false),
        (b.map(addr(va, g / 2), g, h, 0), false),
        (b.map(addr(va, 2 * g), g, h, 0), false),
        (b.map(va.start, g, h, 0), false),
        (b.map(addr(va, g), g, h, g), false),
        (b.map(addr(va, g), g, foreign, 0), false),
        (b.unmap(va.start, 2 * g), false),
        (b.set_access(va.start, g, &[]), false),
        (
            b.set_access(va.start, g, &[Access::read_write(b.device_count())]),
            false,
        ),
        (
            b.free_reservation(VaRange {
                start: va.start,
                len: g,
            }),
            false,
        ),
        (b.query_event(foreign_ev).map(drop), false),
        (b.map(top, 2 * g, h, 0), false),
        (b.unmap(addr(va, g), g), true),
        (b.release(gone), true),
        (b.free_reservation(va), true),
        (b.query_event(ev).map(drop), true),
        (b.release_event(ev), true),
    ];
    for (result, bug) in results {
        let Err(err) = result else {
            return Err("a call that breaks a rule succeeded".into());
        };
        ensure_eq!(err.is_caller_bug(), bug, "is_caller_bug() of \"{err}\"");
        ensure!(
            !err.is_out_of_memory(),
            "a rule violation claims to be out of memory: {err}"
        );
    }
    ok!(b.unmap(va.start, g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}
