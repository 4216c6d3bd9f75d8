//! The replay engine on small traces written here.

use vmm_replay::replay::{min_capacity, replay, Policy, ReplayOptions};
use vmm_replay::{Event, InitialBlock, StartState, Trace};

const MB: u64 = 1 << 20;

fn trace(initial: Vec<InitialBlock>, events: Vec<Event>) -> Trace {
    Trace {
        name: "test".into(),
        initial,
        events,
        start: StartState::Empty,
        skipped_frees: 0,
        recorded: None,
        alloc_conf: None,
        skipped: Default::default(),
    }
}

/// Fragmenting pattern: forty 20 MiB blocks (a page each), every other freed, then requests that
/// need several contiguous pages.
fn fragmenting() -> Trace {
    let mut events = Vec::new();
    for id in 0..40 {
        events.push(Event::Alloc {
            id,
            size: 20 * MB,
            stream: 0,
        });
    }
    for id in (0..40).step_by(2) {
        events.push(Event::Free { id });
    }
    for id in 100..104 {
        events.push(Event::Alloc {
            id,
            size: 60 * MB,
            stream: 0,
        });
    }
    for id in (100..104).chain((1..40).step_by(2)) {
        events.push(Event::Free { id });
    }
    trace(Vec::new(), events)
}

#[test]
fn replay_measures_live_and_reserved() {
    let t = trace(
        vec![InitialBlock {
            id: 1,
            size: 10 * MB,
            stream: 0,
        }],
        vec![
            Event::Alloc {
                id: 2,
                size: 5 * MB,
                stream: 0,
            },
            Event::Free { id: 1 },
            Event::Alloc {
                id: 3,
                size: 1000,
                stream: 7,
            },
            Event::Free { id: 2 },
            Event::Free { id: 3 },
            Event::Free { id: 99 }, // unknown: skipped
            Event::EmptyCache,
        ],
    );
    assert_eq!(t.peak_live_bytes(), 15 * MB);
    for policy in Policy::ALL {
        let o = replay(&t, policy, &ReplayOptions::default()).unwrap();
        assert_eq!(o.peak_live_bytes, 15 * MB, "{}", o.allocator);
        assert_eq!(o.ooms, 0);
        assert_eq!(o.events, 8);
        // Expandable: 10 MiB and 5 MiB share the large pool's 20 MiB pages, then a 2 MiB small
        // page. Classic: a 10 MiB segment, a 20 MiB one for 5 MiB, and a 2 MiB small one.
        let expected = if policy == Policy::Classic { 32 } else { 22 };
        assert_eq!(o.peak_reserved_bytes, expected * MB, "{}", o.allocator);
        let utilization = 15.0 / expected as f64;
        assert!(
            (o.utilization - utilization).abs() < 1e-9,
            "{}",
            o.allocator
        );
        assert_eq!(
            o.timeline.last().map(|p| p.reserved),
            Some(0),
            "empty_cache at the end returns everything"
        );
    }
}

#[test]
fn ooms_are_counted_and_their_frees_skipped() {
    let t = trace(
        Vec::new(),
        vec![
            Event::Alloc {
                id: 1,
                size: 30 * MB,
                stream: 0,
            },
            Event::Alloc {
                id: 2,
                size: 30 * MB,
                stream: 0,
            },
            Event::Free { id: 2 },
            Event::Free { id: 1 },
        ],
    );
    let o = replay(
        &t,
        Policy::Expandable,
        &ReplayOptions {
            capacity: 48 << 20,
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    assert_eq!(o.ooms, 1);
    assert_eq!(o.peak_live_bytes, 30 * MB);
}

#[test]
fn bisection_finds_the_smallest_capacity() {
    let t = fragmenting();
    for policy in Policy::ALL {
        let opts = ReplayOptions::default();
        let (cap, at) = min_capacity(&t, policy, &opts, 1 << 30, 2 << 20)
            .unwrap()
            .expect("fits in 1 GiB");
        assert_eq!(at.ooms, 0);
        assert!(cap as u64 >= t.peak_live_bytes());
        let below = replay(
            &t,
            policy,
            &ReplayOptions {
                capacity: cap - (2 << 20),
                ..opts.clone()
            },
        )
        .unwrap();
        assert!(
            below.ooms > 0,
            "{}: {cap} is not the smallest",
            policy.name()
        );
    }
    assert!(min_capacity(
        &t,
        Policy::Expandable,
        &ReplayOptions::default(),
        64 << 20,
        2 << 20
    )
    .unwrap()
    .is_none());
}

#[test]
fn ours_creates_less_under_pressure() {
    let t = fragmenting();
    let defaults = ReplayOptions::default();
    // At the smallest capacity PyTorch's policy gets by with, ours fits too and creates less.
    let (cap, theirs) = min_capacity(&t, Policy::PytorchExpandable, &defaults, 1 << 30, 2 << 20)
        .unwrap()
        .unwrap();
    let ours = replay(
        &t,
        Policy::Expandable,
        &ReplayOptions {
            capacity: cap,
            ..defaults
        },
    )
    .unwrap();
    assert_eq!(ours.ooms, 0);
    assert!(
        ours.bytes_created < theirs.bytes_created,
        "ours {} vs theirs {}",
        ours.bytes_created,
        theirs.bytes_created
    );
}
