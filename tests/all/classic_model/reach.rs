//! The generated sequences must reach the states worth testing, or the property tests prove
//! little: OOMs, the free-everything retry, splits and merges, frees left pending on a held stream
//! that block reuse, oversize blocks under `max_split_size` and their release, garbage
//! collection, placements from the cache and from new segments, several segments at once.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use super::{conf_strategy, op_strategy, run};

/// Runs 300 cases from a fixed seed and adds up what they reached (the most segments at once:
/// the largest of them).
#[test]
fn classic_sequences_reach_the_interesting_states() {
    let mut runner = TestRunner::deterministic();
    let strategy = (
        conf_strategy(),
        prop::sample::select(vec![48usize, 96, 256]),
        proptest::collection::vec(op_strategy(), 60..150),
        any::<bool>(),
    );
    let mut totals: Vec<(&str, u64, u64)> = Vec::new();
    let mut most = 0;
    for _ in 0..300 {
        let (conf, capacity_mb, ops, free_all) = strategy.new_tree(&mut runner).unwrap().current();
        let r = run(&conf, capacity_mb, &ops, free_all).unwrap();
        let s = r.stats;
        let reached = [
            ("OOMs", s.num_ooms, 500),
            ("free-everything retries", s.num_alloc_retries, 500),
            ("splits", s.inactive_split.all.allocated, 2000),
            ("frees merged with a neighbour", r.merges, 1000),
            ("frees pending on a held stream", r.pending_held, 100),
            (
                "allocations a pending block would have held",
                r.blocked_reuse,
                50,
            ),
            ("allocations served from the cache", r.cached, 2000),
            ("allocations given a new segment", r.fresh, 2000),
            ("oversize allocations live at once (summed)", r.oversize, 50),
            (
                "oversize segments released for a request",
                r.oversize_frees,
                10,
            ),
            (
                "segments collected by the garbage collector",
                r.gc_frees,
                50,
            ),
            ("segments freed", s.num_device_free, 2000),
        ];
        if totals.is_empty() {
            totals = reached
                .iter()
                .map(|&(name, _, min)| (name, 0, min))
                .collect();
        }
        for (t, (_, x, _)) in totals.iter_mut().zip(reached) {
            t.1 += x;
        }
        most = most.max(s.segment.all.peak);
    }
    totals.push(("most segments at once", most, 8));
    for (name, got, min) in totals {
        println!("{name}: {got}");
        assert!(got >= min, "{name}: {got}, fewer than {min}");
    }
}
