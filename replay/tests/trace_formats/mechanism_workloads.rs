//! The workloads that show one mechanism each ([`workloads::MECHANISMS`]): replayed through our
//! allocator with the mechanism on and off, the smallest device each fits on says what it buys.

use super::*;
use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocator, ExpandableAllocator, StreamId};
use vmm_replay::replay::{min_capacity, Policy, ReplayOptions};

const MIB: usize = 1 << 20;

/// Whether `trace` replays through `config` on a device of `capacity` bytes with no OOM.
fn fits(trace: &Trace, config: &ExpandableConfig, capacity: usize) -> bool {
    let sim = SimBackend::with_config(SimConfig {
        capacity,
        ..SimConfig::default()
    })
    .unwrap();
    let a = ExpandableAllocator::new(sim, config.clone()).unwrap();
    let mut live = HashMap::new();
    for e in &trace.events {
        match *e {
            Event::Alloc { id, size, stream } => {
                match a.allocate(size as usize, StreamId::sim(stream)) {
                    Ok(b) => {
                        live.insert(id, b);
                    }
                    Err(_) => return false,
                }
            }
            Event::Free { id } => a.deallocate(live.remove(&id).unwrap()).unwrap(),
            Event::EmptyCache => a.empty_cache().unwrap(),
            Event::FailedAlloc { .. } => {}
        }
    }
    a.check_invariants().unwrap();
    true
}

/// The smallest capacity, in MiB steps of 2, on which `trace` fits with `config`.
fn min_mib(trace: &Trace, config: &ExpandableConfig) -> usize {
    let (mut lo, mut hi) = (1, 4096);
    assert!(
        fits(trace, config, hi * MIB),
        "{} fits in 4 GiB",
        trace.name
    );
    while hi - lo > 2 {
        let mid = (lo + hi) / 2 / 2 * 2;
        if fits(trace, config, mid * MIB) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// Note [Borrowing]: the last small tensors of `small-after-large` fit in the free bytes of
/// large pages when the pools lend; without it they need new small pages. Ours also fits on a
/// smaller device than both PyTorch policies.
#[test]
fn small_after_large_needs_less_capacity_with_borrowing() {
    let trace = workloads::by_name("small-after-large", 1, 0, 0).unwrap();
    let ours = min_mib(&trace, &ExpandableConfig::default());
    let no_borrow = ExpandableConfig {
        borrow_across_pools: false,
        ..ExpandableConfig::default()
    };
    let without = min_mib(&trace, &no_borrow);
    eprintln!("small-after-large: {ours} MiB with borrowing, {without} without");
    assert!(
        ours + 2 <= without,
        "borrowing {ours} MiB, without {without} MiB"
    );
    let opts = ReplayOptions::default();
    for policy in [Policy::Classic, Policy::PytorchExpandable] {
        let (theirs, _) = min_capacity(&trace, policy, &opts, 4 << 30, 2 * MIB)
            .unwrap()
            .unwrap();
        assert!(ours * MIB <= theirs, "{}: {theirs} < ours", policy.name());
    }
}
