//! Minimized reproducers of the expandable-allocator bugs the release-side sweeps and the fuzz
//! campaign found, kept as regression tests: each failed before its fix (stale cache stats after
//! a failed `empty_cache` or trim; a handle orphaned by a failed release without the cache; a
//! leaked event).

use vmm_alloc::backend::{Backend, CallKind, SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::testkit::{FaultError, FaultPlan, Trigger};
use vmm_alloc::{Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;

fn setup(config: ExpandableConfig) -> (SimBackend, ExpandableAllocator<SimBackend>) {
    setup_with_capacity(config, 256 * MB)
}

fn setup_with_capacity(
    config: ExpandableConfig,
    capacity: usize,
) -> (SimBackend, ExpandableAllocator<SimBackend>) {
    let sim = SimBackend::with_config(SimConfig {
        capacity,
        ..SimConfig::default()
    })
    .unwrap();
    let a = ExpandableAllocator::new(sim.clone(), config).unwrap();
    (sim, a)
}

fn fail_once(sim: &SimBackend, kind: CallKind) {
    sim.set_faults(FaultPlan::new().fail(kind, Trigger::Nth(1), FaultError::Injected));
}

/// `release_cached` returns at the first error (`?`) before `sync_cache_stats()`: the handles
/// it already unmapped into the cache are not in `handles_cached` / `handle_cache_bytes`.
#[test]

fn failed_empty_cache_keeps_cache_stats_in_sync() {
    let (sim, a) = setup(ExpandableConfig::default());
    let x = a.allocate(30 * MB, StreamId::DEFAULT).unwrap();
    a.deallocate(x).unwrap();
    fail_once(&sim, CallKind::FreeReservation);
    a.empty_cache().unwrap_err();
    sim.clear_faults();
    a.check_invariants().unwrap(); // "stat handle_cache_bytes = 0, but the state sums to 41943040"
}

/// Without the handle cache, `unmapped_handle` releases each unmapped chunk's handle; when that
/// release fails the handle is neither cached nor released: the allocator forgets it and the
/// device keeps it until the backend itself is dropped.
#[test]

fn failed_release_does_not_orphan_the_handle() {
    let (sim, a) = setup(ExpandableConfig::pytorch_expandable());
    let x = a.allocate(30 * MB, StreamId::DEFAULT).unwrap();
    a.deallocate(x).unwrap();
    fail_once(&sim, CallKind::Release);
    a.empty_cache().unwrap_err();
    sim.clear_faults();
    a.empty_cache().unwrap();
    drop(a);
    assert_eq!(sim.live().handles, 0, "{}", sim.live()); // 1 handle left
}

/// `process_events` ignores a failed `release_event` and forgets the event: it stays live in
/// the backend for good.
#[test]

fn failed_event_release_does_not_leak_the_event() {
    let (sim, a) = setup(ExpandableConfig::default());
    let side = StreamId::sim(1);
    sim.hold_stream(side);
    let x = a.allocate(MB, StreamId::DEFAULT).unwrap();
    a.record_stream(x.ptr(), side).unwrap();
    a.deallocate(x).unwrap();
    sim.release_stream(side);
    fail_once(&sim, CallKind::ReleaseEvent);
    let y = a.allocate(MB, StreamId::DEFAULT).unwrap(); // processes the pending free
    sim.clear_faults();
    a.deallocate(y).unwrap();
    a.empty_cache().unwrap();
    drop(a);
    assert_eq!(sim.live().events, 0, "{}", sim.live()); // 1 event left
}

/// A trim whose release failed put the handle back in the cache without updating
/// `handle_cache_bytes` (found by `fuzz/`, campaign `expandable`, seed 1): a growth on a full
/// device with cached handles, where the second release fails.
#[test]
fn failed_trim_keeps_cache_stats_in_sync() {
    let config = ExpandableConfig {
        large_page: 2 * MB,
        handle_cache_limit: 0,
        ..ExpandableConfig::default()
    };
    let (sim, a) = setup_with_capacity(config, 64 * MB);
    let x = a.allocate(1, StreamId::sim(1)).unwrap();
    let y = a.allocate(MB + 1, StreamId::DEFAULT).unwrap();
    a.deallocate(x).unwrap();
    a.deallocate(y).unwrap();
    sim.set_faults(
        FaultPlan::new()
            .fail(CallKind::Create, Trigger::From(1), FaultError::OutOfMemory)
            .fail(CallKind::Release, Trigger::Nth(2), FaultError::Injected),
    );
    let _ = a.allocate(7 * MB + 1, StreamId::DEFAULT);
    sim.clear_faults();
    a.check_invariants().unwrap();
    a.empty_cache().unwrap();
    drop(a);
    assert_eq!(sim.live().handles, 0, "{}", sim.live());
}

/// A growth that reserved a new segment and then failed, whose reservation the driver would not
/// free, left an empty segment behind: the failed allocation changed `segment` and the snapshot
/// (found by the long fault sweep, `VMM_FAULT_SWEEP_OPS=1200`, on Host). The reservation is now
/// kept aside and freed by the next `empty_cache`.
#[test]
fn a_failed_growth_whose_reservation_will_not_free_changes_nothing() {
    let (sim, a) = setup(ExpandableConfig::default());
    let kept = a.allocate(MB, StreamId::DEFAULT).unwrap();
    let (stats, snap) = (a.stats(), a.snapshot());
    sim.set_faults(
        FaultPlan::new()
            .fail(CallKind::Create, Trigger::From(1), FaultError::OutOfMemory)
            .fail(
                CallKind::FreeReservation,
                Trigger::From(1),
                FaultError::Injected,
            ),
    );
    // A new stream needs a new segment; its first page cannot be created.
    a.allocate(30 * MB, StreamId::sim(7)).unwrap_err();
    sim.clear_faults();
    assert_eq!(a.stats().segment.all.current, stats.segment.all.current);
    assert_eq!(
        a.snapshot(),
        snap,
        "the failed allocation changed the segments"
    );
    a.check_invariants().unwrap();
    a.deallocate(kept).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(sim.live().reservations, 0, "{}", sim.live());
    drop(a);
    assert!(sim.live().is_empty(), "{}", sim.live());
}
