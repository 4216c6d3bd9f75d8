//! Regressions for the classic-allocator bugs the sweeps found (fixed in `src/classic/`).

use vmm_alloc::backend::{Backend, CallKind, SimBackend, SimConfig};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::testkit::{FaultError, FaultPlan, Trigger};
use vmm_alloc::{Allocator, StreamId};

const MB: usize = 1 << 20;

fn setup() -> (SimBackend, ClassicAllocator<SimBackend>) {
    let sim = SimBackend::with_config(SimConfig {
        capacity: 256 * MB,
        ..SimConfig::default()
    })
    .unwrap();
    let a = ClassicAllocator::with_alloc_conf(sim.clone(), "").unwrap();
    (sim, a)
}

fn fail_once(sim: &SimBackend, kind: CallKind) {
    sim.set_faults(FaultPlan::new().fail(kind, Trigger::Nth(1), FaultError::Injected));
}

/// A `cudaFree` whose unmap worked but whose release or address free failed used to leave the
/// segment in the pool, unmapped (its blocks would be handed out again), and teardown then
/// stopped at the unmap (double unmap), stranding the handle and the reservation.
#[test]
fn a_half_done_device_free_is_not_reused_and_is_given_back_later() {
    for kind in [CallKind::Release, CallKind::FreeReservation] {
        let (sim, a) = setup();
        let x = a.allocate(30 * MB, StreamId::DEFAULT).unwrap();
        a.deallocate(x).unwrap();
        fail_once(&sim, kind);
        assert!(a.empty_cache().is_err(), "{kind:?}");
        sim.clear_faults();
        // The segment is gone for the allocator: nothing reserved, nothing mapped.
        assert_eq!(a.stats().reserved_bytes.all.current, 0, "{kind:?}");
        assert!(a.snapshot().segments.is_empty(), "{kind:?}");
        assert_eq!(sim.live().mappings, 0, "{kind:?}");
        // The next empty_cache gives back what was left.
        a.empty_cache().unwrap();
        assert!(sim.live().is_empty(), "{kind:?}: {}", sim.live());
    }
}

/// A failed rollback of a `cudaMalloc` (the reservation's free fails after the create failed)
/// used to strand the reservation.
#[test]
fn a_failed_malloc_rollback_is_given_back_later() {
    let (sim, a) = setup();
    sim.set_faults(
        FaultPlan::new()
            .fail(CallKind::Create, Trigger::Nth(1), FaultError::Injected)
            .fail(
                CallKind::FreeReservation,
                Trigger::Nth(1),
                FaultError::Injected,
            ),
    );
    a.allocate(30 * MB, StreamId::DEFAULT).unwrap_err();
    sim.clear_faults();
    assert_eq!(sim.live().reservations, 1);
    a.empty_cache().unwrap();
    assert!(sim.live().is_empty(), "{}", sim.live());
}

/// An event whose release failed used to be forgotten, live in the backend for good.
#[test]
fn a_failed_event_release_is_retried() {
    let (sim, a) = setup();
    let side = StreamId::sim(1);
    sim.hold_stream(side);
    let x = a.allocate(MB, StreamId::DEFAULT).unwrap();
    a.record_stream(x.ptr(), side).unwrap();
    a.deallocate(x).unwrap();
    sim.release_stream(side);
    fail_once(&sim, CallKind::ReleaseEvent);
    let y = a.allocate(MB, StreamId::DEFAULT).unwrap();
    sim.clear_faults();
    a.deallocate(y).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(sim.live().events, 0, "{}", sim.live());
    drop(a);
    assert!(sim.live().is_empty(), "{}", sim.live());
}
