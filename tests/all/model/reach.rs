//! The generated sequences must reach the states worth testing, or the property tests prove
//! little: growth, OOM under a small capacity and under another user's pressure, remap-defrag,
//! handle reuse, the free-everything retry, several streams and pools at once, frees left pending
//! on a held stream that block reuse, held memory made safe to unmap by a synchronize, and the
//! alias rescue (Note [Alias rescue]) and its revival (Note [Rescue revived]).

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use vmm_alloc::backend::{SimBackend, SimConfig};

use super::{config_strategy, op_strategy, run};

/// Runs 300 cases from a fixed seed and adds up what they reached.
#[test]
fn sequences_reach_the_interesting_states() {
    let mut runner = TestRunner::deterministic();
    let strategy = (
        config_strategy(),
        prop_oneof![Just(64usize), Just(128)],
        proptest::collection::vec(op_strategy(), 60..120),
    );
    let mut t = [0u64; 12];
    for _ in 0..300 {
        let (config, capacity_mb, ops) = strategy.new_tree(&mut runner).unwrap().current();
        let sim = SimBackend::with_config(SimConfig {
            capacity: capacity_mb << 20,
            ..SimConfig::default()
        })
        .unwrap();
        let r = run(sim, config.clone(), &ops)
            .unwrap_or_else(|e| panic!("{e:?}\nconfig {config:?}, {capacity_mb} MiB, ops {ops:?}"));
        let s = r.stats;
        let reached = [
            s.num_device_alloc,
            s.num_ooms,
            s.remapped_bytes,
            s.handle_reuses,
            s.num_alloc_retries,
            r.pending_held,
            r.blocked_reuse,
            r.synced_before_unmap,
            r.squeezed_ooms,
            // Segments alive at once: several streams and both pools.
            s.segment.all.peak,
            s.alias_rescues,
            s.alias_revivals,
        ];
        for (i, x) in reached.into_iter().enumerate() {
            t[i] = if i == 9 { t[i].max(x) } else { t[i] + x };
        }
    }
    let [maps, ooms, remapped, reuses, retries, pending, blocked, synced, squeezed, segments, rescues, revivals] =
        t;
    println!("reached: {t:?}");
    assert!(maps > 1000, "growth: {maps} pages mapped");
    assert!(ooms > 10, "OOM reached {ooms} times");
    assert!(remapped > 0, "remap-defrag never ran");
    assert!(reuses > 0, "the handle cache never served a page");
    assert!(retries > 0, "the free-everything retry never ran");
    assert!(
        pending > 20,
        "only {pending} frees left pending on a held stream"
    );
    assert!(
        blocked > 20,
        "pending frees blocked reuse only {blocked} times"
    );
    assert!(
        synced > 5,
        "held memory made safe by a synchronize only {synced} times"
    );
    assert!(
        squeezed > 5,
        "OOM under another user's pressure only {squeezed} times"
    );
    assert!(segments >= 5, "at most {segments} segments at once");
    assert!(
        rescues > 50,
        "an alias rescue served only {rescues} requests"
    );
    assert!(
        revivals > 5,
        "a freed rescue served only {revivals} requests again"
    );
}
