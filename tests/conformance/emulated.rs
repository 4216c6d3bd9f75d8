//! Cases for the emulated backends (Sim and Host): enforced capacity, fault injection and
//! test-held events. Both implement them the same way, so both run these.

use libtest_mimic::Failed;
use vmm_alloc::backend::{CallKind, CallKinds, MemInfo, StreamId};
use vmm_alloc::testkit::{FaultError, FaultPlan, Trigger};
use vmm_alloc::BackendErrorKind as E;

use crate::support::{addr, rw, Case, Emulated, TestResult};

pub fn cases<B: Emulated>() -> Vec<Case<B>> {
    cases![
        capacity_enforced_with_out_of_memory,
        huge_reserve_exhausts_address_space,
        fault_nth_fails_only_that_call,
        fault_from_fails_persistently,
        fault_counts_calls_per_kind_from_install,
        fault_out_of_memory_is_out_of_memory,
        fault_on_every_kind_changes_nothing,
        fault_random_same_seed_same_calls,
        fault_random_different_seed_differs,
        fault_random_adjacent_seeds_differ,
        fault_random_respects_kinds_and_probability,
        held_stream_keeps_events_pending,
        pending_events_and_generations_count,
        faults_fired_tracks_current_plan,
    ]
}

fn capacity_enforced_with_out_of_memory<B: Emulated>(_: &B) -> TestResult {
    let b = ok!(B::with_granules(4));
    let g = b.granularity();
    let total = 4 * g;
    ensure_eq!(
        ok!(b.mem_info()),
        MemInfo { free: total, total },
        "mem_info of a 4-granule device"
    );
    let h1 = ok!(b.create(3 * g));
    let err = rejects!(&b, Create, b.create(2 * g),
        E::OutOfMemory { requested, free, total: t }
            if *requested == 2 * g && *free == g && *t == total);
    ensure!(
        err.is_out_of_memory(),
        "OutOfMemory must say is_out_of_memory(): {err}"
    );
    ensure!(
        !err.is_caller_bug(),
        "OutOfMemory is not a caller bug: {err}"
    );
    let h2 = ok!(b.create(g)); // exactly fills the device
    rejects!(&b, Create, b.create(g), E::OutOfMemory { free: 0, .. });
    // Released but still mapped memory still counts against the capacity.
    let va = ok!(b.reserve(3 * g));
    ok!(b.map(va.start, 3 * g, h1, 0));
    ok!(b.release(h1));
    rejects!(&b, Create, b.create(g), E::OutOfMemory { free: 0, .. });
    ok!(b.unmap(va.start, 3 * g));
    ensure_eq!(
        ok!(b.mem_info()).free,
        3 * g,
        "free memory after the last unmap of the released handle"
    );
    let h3 = ok!(b.create(3 * g));
    ok!(b.release(h2));
    ok!(b.release(h3));
    ok!(b.free_reservation(va));
    ensure!(b.live().is_empty(), "after the cycle: {}", b.live());
    Ok(())
}

fn huge_reserve_exhausts_address_space<B: Emulated>(b: &B) -> TestResult {
    let len = 1usize << 60;
    let err = rejects!(b, Reserve, b.reserve(len),
        E::AddressSpaceExhausted { requested } if *requested == len);
    ensure!(
        err.is_out_of_memory(),
        "AddressSpaceExhausted must say is_out_of_memory(): {err}"
    );
    // And the backend still works.
    let va = ok!(b.reserve(b.granularity()));
    ok!(b.free_reservation(va));
    Ok(())
}

fn fault_nth_fails_only_that_call<B: Emulated>(b: &B) -> TestResult {
    let g = b.granularity();
    let before_install = ok!(b.create(g)); // not counted by the plan
    b.set_faults(FaultPlan::new().fail(CallKind::Create, Trigger::Nth(2), FaultError::Injected));
    let first = ok!(b.create(g));
    let err = rejects!(b, Create, b.create(g), E::Injected);
    ensure!(
        !err.is_out_of_memory() && !err.is_caller_bug(),
        "an injected fault is neither OOM nor a caller bug: {err}"
    );
    let third = ok!(b.create(g));
    let fourth = ok!(b.create(g));
    ensure_eq!(b.clear_faults(), 1, "faults the Nth(2) plan injected");
    for h in [before_install, first, third, fourth] {
        ok!(b.release(h));
    }
    Ok(())
}

fn fault_from_fails_persistently<B: Emulated>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let h = ok!(b.create(g));
    b.set_faults(FaultPlan::new().fail(CallKind::Map, Trigger::From(2), FaultError::Injected));
    ok!(b.map(va.start, g, h, 0));
    for i in 1..4 {
        rejects!(b, Map, b.map(addr(va, i * g), g, h, 0), E::Injected);
    }
    // Other kinds are unaffected.
    ok!(b.unmap(va.start, g));
    ensure_eq!(b.clear_faults(), 3, "faults the From(2) plan injected");
    for i in 0..4 {
        ok!(b.map(addr(va, i * g), g, h, 0));
    }
    ok!(b.unmap(va.start, 4 * g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn fault_counts_calls_per_kind_from_install<B: Emulated>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(2 * g));
    let h = ok!(b.create(g));
    ok!(b.map(va.start, g, h, 0)); // before install: not counted
    b.set_faults(FaultPlan::new().fail(CallKind::Map, Trigger::Nth(2), FaultError::Injected));
    let others = [ok!(b.create(g)), ok!(b.create(g))]; // other kinds: not counted
    ok!(b.unmap(va.start, g));
    ok!(b.map(va.start, g, h, 0)); // map #1
    rejects!(b, Map, b.map(addr(va, g), g, h, 0), E::Injected); // map #2
                                                                // Installing a plan replaces the old one and restarts counting.
    b.set_faults(FaultPlan::new().fail(CallKind::Unmap, Trigger::Nth(1), FaultError::Injected));
    ok!(b.map(addr(va, g), g, h, 0));
    rejects!(b, Unmap, b.unmap(va.start, 2 * g), E::Injected);
    ok!(b.unmap(va.start, 2 * g));
    ensure_eq!(b.clear_faults(), 1, "faults the second plan injected");
    for h in [h, others[0], others[1]] {
        ok!(b.release(h));
    }
    ok!(b.free_reservation(va));
    Ok(())
}

fn fault_out_of_memory_is_out_of_memory<B: Emulated>(b: &B) -> TestResult {
    let g = b.granularity();
    let held = ok!(b.create(2 * g));
    let info = ok!(b.mem_info());
    b.set_faults(
        FaultPlan::new()
            .fail(CallKind::Create, Trigger::Nth(1), FaultError::OutOfMemory)
            .fail(CallKind::Reserve, Trigger::Nth(1), FaultError::OutOfMemory)
            .fail(CallKind::Map, Trigger::Nth(1), FaultError::OutOfMemory),
    );
    let err = rejects!(b, Create, b.create(g),
        E::OutOfMemory { requested, free, total }
            if *requested == g && *free == info.free && *total == info.total);
    ensure!(
        err.is_out_of_memory(),
        "an injected OutOfMemory must say is_out_of_memory(): {err}"
    );
    let err = rejects!(b, Reserve, b.reserve(3 * g),
        E::AddressSpaceExhausted { requested } if *requested == 3 * g);
    ensure!(
        err.is_out_of_memory(),
        "an injected reserve OutOfMemory must say is_out_of_memory(): {err}"
    );
    // Every injected out-of-memory error carries the length of the call it failed.
    let va = ok!(b.reserve(2 * g));
    rejects!(b, Map, b.map(va.start, 2 * g, held, 0),
        E::OutOfMemory { requested, .. } if *requested == 2 * g);
    ensure_eq!(b.clear_faults(), 3, "faults injected");
    ok!(b.free_reservation(va));
    ok!(b.release(held));
    Ok(())
}

fn fault_on_every_kind_changes_nothing<B: Emulated>(b: &B) -> TestResult {
    let g = b.granularity();
    let bytes = b
        .capabilities()
        .contains(vmm_alloc::backend::Capabilities::BYTES);
    let once = |kind| {
        b.set_faults(FaultPlan::new().fail(kind, Trigger::Nth(1), FaultError::Injected));
    };
    once(CallKind::Reserve);
    rejects!(b, Reserve, b.reserve(g), E::Injected);
    let va = ok!(b.reserve(g));
    once(CallKind::Create);
    rejects!(b, Create, b.create(g), E::Injected);
    let h = ok!(b.create(g));
    once(CallKind::Map);
    rejects!(b, Map, b.map(va.start, g, h, 0), E::Injected);
    // The failed map left nothing behind, not even a memory of the range having been mapped.
    rejects!(b, Unmap, b.unmap(va.start, g), E::NotMapped { .. });
    ok!(b.map(va.start, g, h, 0));
    once(CallKind::SetAccess);
    rejects!(b, SetAccess, b.set_access(va.start, g, &rw(b)), E::Injected);
    if bytes {
        rejects!(b, Write, b.write(va.start, &[1]), E::NoAccess { .. });
    }
    ok!(b.set_access(va.start, g, &rw(b)));
    if bytes {
        ok!(b.write(va.start, &[42]));
    }
    once(CallKind::RecordEvent);
    rejects!(
        b,
        RecordEvent,
        b.record_event(StreamId::DEFAULT),
        E::Injected
    );
    let ev = ok!(b.record_event(StreamId::DEFAULT));
    once(CallKind::ReleaseEvent);
    rejects!(b, ReleaseEvent, b.release_event(ev), E::Injected);
    ensure!(
        ok!(b.query_event(ev)),
        "the event survived a failed release but is incomplete"
    );
    ok!(b.release_event(ev));
    once(CallKind::Unmap);
    rejects!(b, Unmap, b.unmap(va.start, g), E::Injected);
    if bytes {
        let mut out = [0u8; 1];
        ok!(b.read(va.start, &mut out));
        ensure_eq!(out[0], 42, "byte read through a mapping whose unmap failed");
    }
    ok!(b.unmap(va.start, g));
    rejects!(b, Unmap, b.unmap(va.start, g), E::DoubleUnmap { .. });
    once(CallKind::Release);
    rejects!(b, Release, b.release(h), E::Injected);
    ok!(b.release(h));
    once(CallKind::FreeReservation);
    rejects!(b, FreeReservation, b.free_reservation(va), E::Injected);
    ok!(b.free_reservation(va));
    ensure_eq!(
        b.clear_faults(),
        1,
        "faults fired by the last plan (free_reservation)"
    );
    Ok(())
}

/// Runs 64 creates on a fresh backend under a random plan; returns which ones failed.
fn random_failures<B: Emulated>(seed: u64, probability: f64) -> Result<Vec<bool>, Failed> {
    let b = ok!(B::fresh());
    let g = b.granularity();
    b.set_faults(FaultPlan::new().random(
        seed,
        probability,
        CallKinds::CREATE,
        FaultError::Injected,
    ));
    let mut failed = Vec::new();
    for _ in 0..64 {
        match b.create(g) {
            Ok(h) => {
                ok!(b.release(h));
                failed.push(false);
            }
            Err(e) => {
                ensure_eq!(e.kind, E::Injected, "kind of a random fault");
                failed.push(true);
            }
        }
    }
    let n = failed.iter().filter(|&&f| f).count() as u64;
    ensure_eq!(
        b.clear_faults(),
        n,
        "faults the random plan reports for seed {seed}"
    );
    ensure!(b.live().is_empty(), "after the random run: {}", b.live());
    Ok(failed)
}

fn show(failed: &[bool]) -> String {
    failed.iter().map(|&f| if f { 'x' } else { '.' }).collect()
}

fn fault_random_same_seed_same_calls<B: Emulated>(_: &B) -> TestResult {
    let first = random_failures::<B>(42, 0.5)?;
    let again = random_failures::<B>(42, 0.5)?;
    ensure!(
        first == again,
        "seed 42 failed different calls: {} vs {}",
        show(&first),
        show(&again)
    );
    ensure!(
        first.contains(&true) && first.contains(&false),
        "p = 0.5 over 64 calls should fail some and pass some: {}",
        show(&first)
    );
    Ok(())
}

fn fault_random_different_seed_differs<B: Emulated>(_: &B) -> TestResult {
    let a = random_failures::<B>(1, 0.5)?;
    let c = random_failures::<B>(2, 0.5)?;
    ensure!(
        a != c,
        "seeds 1 and 2 failed the same 64 calls: {}",
        show(&a)
    );
    Ok(())
}

/// Seeds that differ only in the lowest bit must give different fault sequences too: a test loop
/// `for seed in 0..n` otherwise exercises only n/2 distinct scenarios.
fn fault_random_adjacent_seeds_differ<B: Emulated>(_: &B) -> TestResult {
    let runs = (0..8u64)
        .map(|seed| random_failures::<B>(seed, 0.5))
        .collect::<Result<Vec<_>, _>>()?;
    for i in 0..runs.len() {
        for j in i + 1..runs.len() {
            ensure!(
                runs[i] != runs[j],
                "seeds {i} and {j} fail exactly the same 64 calls ({})",
                show(&runs[i])
            );
        }
    }
    Ok(())
}

fn fault_random_respects_kinds_and_probability<B: Emulated>(b: &B) -> TestResult {
    let g = b.granularity();
    ensure_eq!(
        random_failures::<B>(7, 1.0)?,
        vec![true; 64],
        "p = 1 fails every create"
    );
    ensure_eq!(
        random_failures::<B>(7, 0.0)?,
        vec![false; 64],
        "p = 0 fails no create"
    );
    ensure_eq!(
        random_failures::<B>(7, f64::NAN)?,
        vec![false; 64],
        "p = NaN fails no create"
    );
    // Kinds outside the set never fail, even at p = 1.
    b.set_faults(FaultPlan::new().random(7, 1.0, CallKinds::MAP, FaultError::Injected));
    let va = ok!(b.reserve(g));
    let h = ok!(b.create(g));
    rejects!(b, Map, b.map(va.start, g, h, 0), E::Injected);
    ensure_eq!(b.clear_faults(), 1, "faults injected by the map-only plan");
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn held_stream_keeps_events_pending<B: Emulated>(b: &B) -> TestResult {
    let (held, other) = (StreamId::sim(1), StreamId::sim(2));
    b.hold_stream(held);
    let e1 = ok!(b.record_event(held));
    ensure!(
        !ok!(b.query_event(e1)),
        "an event on a held stream completed at once"
    );
    let e2 = ok!(b.record_event(other));
    ensure!(
        ok!(b.query_event(e2)),
        "an event on another stream is pending"
    );
    let e0 = ok!(b.record_event(StreamId::DEFAULT));
    ensure!(
        ok!(b.query_event(e0)),
        "an event on the default stream is pending"
    );
    ensure!(
        b.complete_event(e1),
        "complete_event({e1:?}) said the event is not live"
    );
    ensure!(
        ok!(b.query_event(e1)),
        "{e1:?} is pending after complete_event"
    );
    let e3 = ok!(b.record_event(held));
    ensure!(
        !ok!(b.query_event(e3)),
        "a new event on the still-held stream completed at once"
    );
    ok!(b.synchronize(held));
    ensure!(
        ok!(b.query_event(e3)),
        "{e3:?} is pending after synchronize"
    );
    let e4 = ok!(b.record_event(held));
    ensure!(
        !ok!(b.query_event(e4)),
        "synchronize stopped holding the stream"
    );
    b.release_stream(held);
    ensure!(
        ok!(b.query_event(e4)),
        "{e4:?} is pending after release_stream"
    );
    let e5 = ok!(b.record_event(held));
    ensure!(
        ok!(b.query_event(e5)),
        "an event on a released stream is pending"
    );
    for e in [e0, e1, e2, e3, e4, e5] {
        ok!(b.release_event(e));
    }
    ensure!(
        !b.complete_event(e1),
        "complete_event of a released event said it was live"
    );
    Ok(())
}

fn pending_events_and_generations_count<B: Emulated>(b: &B) -> TestResult {
    let (held, other) = (StreamId::sim(5), StreamId::sim(6));
    let generations = |b: &B| (b.stream_generation(held), b.stream_generation(other));
    ensure_eq!(
        generations(b),
        (0, 0),
        "stream generations of a new backend"
    );
    b.hold_stream(held);
    let evs = [
        ok!(b.record_event(held)),
        ok!(b.record_event(held)),
        ok!(b.record_event(held)),
    ];
    let free = ok!(b.record_event(other));
    ensure_eq!(
        (b.pending_events(held), b.pending_events(other)),
        (3, 0),
        "pending (held, other)"
    );
    ensure!(b.complete_event(evs[0]), "complete_event of a live event");
    ensure_eq!(b.pending_events(held), 2, "pending after completing one");
    ok!(b.release_event(evs[1])); // a released event is no longer pending
    ensure_eq!(
        b.pending_events(held),
        1,
        "pending after releasing a pending event"
    );
    ensure_eq!(
        generations(b),
        (0, 0),
        "generations before any synchronize or release"
    );
    ok!(b.synchronize(held));
    ensure_eq!(b.pending_events(held), 0, "pending after synchronize");
    ensure_eq!(
        generations(b),
        (1, 0),
        "generations after synchronizing the held stream"
    );
    let late = ok!(b.record_event(held));
    ensure_eq!(
        b.pending_events(held),
        1,
        "pending after recording on the still-held stream"
    );
    b.release_stream(held);
    ensure_eq!(b.pending_events(held), 0, "pending after release_stream");
    ensure_eq!(generations(b), (2, 0), "generations after release_stream");
    ok!(b.synchronize(other));
    ensure_eq!(
        generations(b),
        (2, 1),
        "generations after synchronizing the other stream"
    );
    for e in [evs[0], evs[2], free, late] {
        ok!(b.release_event(e));
    }
    Ok(())
}

fn faults_fired_tracks_current_plan<B: Emulated>(b: &B) -> TestResult {
    let g = b.granularity();
    b.set_faults(
        FaultPlan::new()
            .fail(CallKind::Create, Trigger::Nth(1), FaultError::Injected)
            .fail(CallKind::Reserve, Trigger::Nth(1), FaultError::Injected),
    );
    ensure_eq!(b.faults_fired(), 0, "faults fired before any call");
    rejects!(b, Create, b.create(g), E::Injected);
    ensure_eq!(b.faults_fired(), 1, "faults fired after one");
    rejects!(b, Reserve, b.reserve(g), E::Injected);
    ensure_eq!(b.faults_fired(), 2, "faults fired after two");
    b.set_faults(FaultPlan::new().fail(CallKind::Create, Trigger::Nth(1), FaultError::Injected));
    ensure_eq!(
        b.faults_fired(),
        0,
        "faults fired by a newly installed plan"
    );
    rejects!(b, Create, b.create(g), E::Injected);
    ensure_eq!(
        b.clear_faults(),
        1,
        "clear_faults returns what the current plan fired"
    );
    ensure_eq!(b.faults_fired(), 0, "faults fired after clear_faults");
    let h = ok!(b.create(g));
    ok!(b.release(h));
    Ok(())
}
