//! The replay loop's error path: a driver failure (not an out-of-memory) stops the replay and
//! names the event it happened at.

use super::*;
use vmm_alloc::backend::{BackendErrorKind, CallKind};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::testkit::{EmulatedBackend, FaultError, FaultPlan, Trigger};
use vmm_alloc::ExpandableAllocator;

/// Replays `trace` through ours on a Sim backend whose `nth_create`-th `cuMemCreate` fails with
/// an injected driver error.
fn replay_failing(trace: &Trace, nth_create: u64) -> Result<ReplayOutcome, ReplayError> {
    let sim = SimBackend::new();
    sim.set_faults(FaultPlan::new().fail(
        CallKind::Create,
        Trigger::Nth(nth_create),
        FaultError::Injected,
    ));
    let alloc = ExpandableAllocator::new(sim, ExpandableConfig::default()).unwrap();
    let opts = ReplayOptions::default();
    let (capacity, policy) = (opts.capacity, Policy::Expandable);
    drive(
        trace,
        policy,
        &opts,
        capacity,
        &alloc,
        None,
        &mut |_| {},
        String::new(),
    )
}

#[test]
fn a_driver_error_names_the_event_it_happened_at() {
    let trace = crate::workloads::small_after_large(1);
    let e = replay_failing(&trace, 3).expect_err("the injected error stops the replay");
    let (at, what) = e.event.clone().expect("an event is named");
    let at = at as usize;
    assert!(matches!(trace.events[at], Event::Alloc { .. }), "{e}");
    assert_eq!(what, describe(&trace.events[at]));
    assert!(
        matches!(&e.source, AllocError::Backend(b) if b.kind == BackendErrorKind::Injected),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with(&format!("event {at} (allocation ")),
        "{e}"
    );
    // Exactly that event: the events before it replay without an error.
    let before = Trace {
        events: trace.events[..at].to_vec(),
        ..trace.clone()
    };
    replay_failing(&before, 3).expect("the events before the named one replay");
}

#[test]
fn a_driver_error_in_the_initial_blocks_names_the_block() {
    let mut trace = crate::workloads::small_after_large(1);
    trace.initial = vec![crate::InitialBlock {
        id: 1_000_001,
        size: 8192,
        stream: 3,
    }];
    let e = replay_failing(&trace, 1).expect_err("the first create fails");
    assert_eq!(
        e.event,
        Some((
            0,
            "initial block 1000001 of 8192 bytes on stream 3".to_string()
        ))
    );
}
