//! Note [Growth] (`src/expandable/growth.rs`): when several holes of a segment can hold a
//! growth, ours takes the one whose span (free bytes before, the hole, free bytes after) is
//! smallest, as best fit does among free blocks, so the large holes stay whole for large
//! requests; PyTorch's policy (and `best_fit_growth: false`) takes the lowest address.
//!
//! The scenario: blocks a (20 MiB), h1 (60), b (20), h2 (20), c (20) in one segment of 20 MiB
//! pages; h1 and h2 freed and `empty_cache` unmaps their pages, leaving a 60 MiB and a 20 MiB
//! hole between live blocks. A 20 MiB request, then a 60 MiB one.

use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// The allocator after the scenario's setup, the two holes' addresses, and the live blocks.
fn with_two_holes(
    config: ExpandableConfig,
) -> (ExpandableAllocator<SimBackend>, u64, u64, Vec<Allocation>) {
    let a = ExpandableAllocator::new(
        SimBackend::with_config(SimConfig::default()).unwrap(),
        config,
    )
    .unwrap();
    let blocks: Vec<Allocation> = [20, 60, 20, 20, 20]
        .iter()
        .map(|&mb| a.allocate(mb * MB, S0).unwrap())
        .collect();
    let addr = |i: usize| blocks[i].ptr().get();
    for i in 1..5 {
        assert_eq!(
            addr(i),
            addr(i - 1) + blocks[i - 1].size() as u64,
            "one contiguous segment"
        );
    }
    let (h1, h2) = (addr(1), addr(3));
    let [a0, b1, b2, b3, b4]: [Allocation; 5] = blocks.try_into().unwrap();
    a.deallocate(b1).unwrap();
    a.deallocate(b3).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(
        a.stats().reserved_bytes.all.current,
        60 * MB as u64,
        "the holes are unmapped"
    );
    (a, h1, h2, vec![a0, b2, b4])
}

#[test]
fn a_growth_takes_the_smallest_hole_that_holds_it_and_keeps_the_large_one_whole() {
    let (a, h1, h2, live) = with_two_holes(ExpandableConfig::default());
    let x = a.allocate(20 * MB, S0).unwrap();
    assert_eq!(
        x.ptr().get(),
        h2,
        "the 20 MiB request fills the 20 MiB hole"
    );
    let y = a.allocate(60 * MB, S0).unwrap();
    assert_eq!(
        y.ptr().get(),
        h1,
        "the 60 MiB hole is still whole for the 60 MiB request"
    );
    a.check_invariants().unwrap();
    for b in live.into_iter().chain([x, y]) {
        a.deallocate(b).unwrap();
    }
    a.check_invariants().unwrap();
}

#[test]
fn lowest_address_growth_splits_the_large_hole_as_pytorch_does() {
    for config in [
        ExpandableConfig {
            best_fit_growth: false,
            ..ExpandableConfig::default()
        },
        ExpandableConfig::pytorch_expandable(),
    ] {
        let (a, h1, h2, live) = with_two_holes(config);
        let x = a.allocate(20 * MB, S0).unwrap();
        assert_eq!(x.ptr().get(), h1, "the lowest hole that holds it");
        let y = a.allocate(60 * MB, S0).unwrap();
        assert!(
            y.ptr().get() != h1 && y.ptr().get() != h2,
            "neither hole holds 60 MiB any more: the segment grows elsewhere"
        );
        a.check_invariants().unwrap();
        for b in live.into_iter().chain([x, y]) {
            a.deallocate(b).unwrap();
        }
    }
}
