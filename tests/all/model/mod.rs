//! Property tests: random operation sequences against `ExpandableAllocator`, checked after every
//! step against the test kit's plain reference model (`vmm_alloc::testkit::expandable_model`) of
//! what must hold (DESIGN.md's invariants), with the device's own view of its mappings (the test
//! kit's `Observed` backend). On Host, every live allocation carries a pattern derived from its id
//! at bounded, granule-aware sample spans, checked every step.
//!
//! `PROPTEST_CASES=10000 cargo test --release --test all model` runs them harder.

mod reach;

use proptest::prelude::*;
use vmm_alloc::backend::{HostBackend, HostConfig, SimBackend, SimConfig};

use vmm_alloc::testkit::expandable_model::{config_strategy, op_strategy, run};

/// 64 cases in `cargo test` (CI's budget); `PROPTEST_CASES` overrides it. (A literal `cases:` in
/// the config would silently shadow the environment variable.)
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Shrinking runs until the sequence is minimal: proptest's default budget (4 × cases) gives up
/// long before a 100-op sequence is down to the few ops that matter. It costs nothing when
/// nothing fails.
fn proptest_config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        max_shrink_iters: 1_000_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(proptest_config())]

    /// Sim, with capacities from tight (OOM, remap-defrag, handle reuse) to roomy.
    #[test]
    fn expandable_matches_model_on_sim(
        config in config_strategy(),
        capacity_mb in prop_oneof![Just(64usize), Just(128), Just(512), Just(4096)],
        ops in proptest::collection::vec(op_strategy(), 1..120),
    ) {
        let sim = SimBackend::with_config(SimConfig { capacity: capacity_mb << 20, ..SimConfig::default() }).unwrap();
        run(sim, config, &ops)?;
    }

    /// Host: the same sequences with real bytes, every live allocation's pattern checked.
    #[test]
    fn expandable_keeps_data_on_host(
        config in config_strategy(),
        capacity_mb in prop_oneof![Just(64usize), Just(256)],
        ops in proptest::collection::vec(op_strategy(), 1..80),
    ) {
        let host = HostBackend::with_config(HostConfig { capacity: capacity_mb << 20, ..HostConfig::default() }).unwrap();
        run(host, config, &ops)?;
    }
}
