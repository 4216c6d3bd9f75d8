//! Note [Last free] (`src/expandable/last_free.rs`): a request of exactly the size of the block
//! freed just before it gets that block back, among equal exact fits, where best fit alone (and
//! PyTorch) takes the lowest.
//!
//! The scenario: 8 MiB blocks `a`, `b` and `c` with 4 MiB blocks between them, so no free
//! merges; `a` then `b` freed: two exact fits for an 8 MiB request, `a` the lower, `b` the later.
//! The rule applies only near the device's end (`reuse_last_free_above`, 90 % of the limit held):
//! the scenario maps two 20 MiB pages, which a 44 MiB device holds at 91 %, an 80 GiB one at
//! 0.05 %.

use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// A device the scenario's 40 MiB of pages fill to 91 %.
const NEAR_FULL: usize = 44 * MB;

/// The allocator with `a` and `b` freed, their addresses, and the blocks still live, on a device
/// of `capacity` bytes.
fn two_exact_fits(
    config: ExpandableConfig,
    capacity: usize,
) -> (ExpandableAllocator<SimBackend>, u64, u64, Vec<Allocation>) {
    let sim = SimBackend::with_config(SimConfig {
        capacity,
        ..SimConfig::default()
    })
    .unwrap();
    let alloc = ExpandableAllocator::new(sim, config).unwrap();
    let mut blocks: Vec<Allocation> = [8, 4, 8, 4, 8, 4]
        .iter()
        .map(|&mb| alloc.allocate(mb * MB, S0).unwrap())
        .collect();
    let b = blocks.remove(2);
    let a = blocks.remove(0);
    let (at_a, at_b) = (a.ptr().get(), b.ptr().get());
    assert!(at_a < at_b);
    alloc.deallocate(a).unwrap();
    alloc.deallocate(b).unwrap();
    (alloc, at_a, at_b, blocks)
}

fn give_back(alloc: &ExpandableAllocator<SimBackend>, blocks: Vec<Allocation>) {
    for b in blocks {
        alloc.deallocate(b).unwrap();
    }
    alloc.check_invariants().unwrap();
}

#[test]
fn the_request_right_after_a_free_of_its_size_gets_that_block_back() {
    let (alloc, _, at_b, mut blocks) = two_exact_fits(ExpandableConfig::default(), NEAR_FULL);
    assert_eq!(alloc.stats().reserved_bytes.all.current, 40 * MB as u64);
    let again = alloc.allocate(8 * MB, S0).unwrap();
    assert_eq!(
        again.ptr().get(),
        at_b,
        "the block just freed, not the lowest exact fit"
    );
    blocks.push(again);
    alloc.check_invariants().unwrap();
    give_back(&alloc, blocks);
}

#[test]
fn best_fit_takes_the_lowest_exact_fit_when_off_or_after_another_allocation() {
    let off = ExpandableConfig {
        reuse_last_free: false,
        ..ExpandableConfig::default()
    };
    for config in [off, ExpandableConfig::pytorch_expandable()] {
        let (alloc, at_a, _, mut blocks) = two_exact_fits(config, NEAR_FULL);
        let again = alloc.allocate(8 * MB, S0).unwrap();
        assert_eq!(again.ptr().get(), at_a, "the lowest exact fit");
        blocks.push(again);
        give_back(&alloc, blocks);
    }
    // Any allocation in between (here on another stream) ends the reuse: best fit again.
    let (alloc, at_a, _, mut blocks) = two_exact_fits(ExpandableConfig::default(), NEAR_FULL);
    blocks.push(alloc.allocate(4 * MB, StreamId::sim(3)).unwrap());
    let again = alloc.allocate(8 * MB, S0).unwrap();
    assert_eq!(again.ptr().get(), at_a);
    blocks.push(again);
    give_back(&alloc, blocks);
}

/// With room to spare (the allocator far below `reuse_last_free_above` of the device), the
/// exact fit is PyTorch's, the lowest: a program that never nears its device's end gets
/// PyTorch's layout; with the fraction at 0 the rule applies there too.
#[test]
fn with_room_to_spare_the_exact_fit_is_the_lowest_as_in_pytorch() {
    let (alloc, at_a, _, mut blocks) =
        two_exact_fits(ExpandableConfig::default(), SimConfig::default().capacity);
    let again = alloc.allocate(8 * MB, S0).unwrap();
    assert_eq!(again.ptr().get(), at_a, "the lowest exact fit, as PyTorch");
    blocks.push(again);
    give_back(&alloc, blocks);
    let always = ExpandableConfig {
        reuse_last_free_above: 0.0,
        ..ExpandableConfig::default()
    };
    let (alloc, _, at_b, mut blocks) = two_exact_fits(always, SimConfig::default().capacity);
    let again = alloc.allocate(8 * MB, S0).unwrap();
    assert_eq!(again.ptr().get(), at_b, "the block just freed");
    blocks.push(again);
    give_back(&alloc, blocks);
}

/// A free that merges with a free neighbour is not reused at its own address: taking it there
/// would split a larger free range that best fit keeps whole.
#[test]
fn a_block_merged_by_its_free_is_not_reused_at_its_address() {
    let sim = SimBackend::with_config(SimConfig {
        capacity: NEAR_FULL,
        ..SimConfig::default()
    })
    .unwrap();
    let alloc = ExpandableAllocator::new(sim, ExpandableConfig::default()).unwrap();
    let mut blocks: Vec<Allocation> = [8, 4, 8, 8, 4]
        .iter()
        .map(|&mb| alloc.allocate(mb * MB, S0).unwrap())
        .collect();
    let d = blocks.remove(3);
    let c = blocks.remove(2);
    let a = blocks.remove(0);
    let (at_a, at_d) = (a.ptr().get(), d.ptr().get());
    alloc.deallocate(a).unwrap();
    alloc.deallocate(c).unwrap();
    alloc.deallocate(d).unwrap(); // merges with c's range: 16 MiB free there
    let again = alloc.allocate(8 * MB, S0).unwrap();
    assert_ne!(again.ptr().get(), at_d);
    assert_eq!(
        again.ptr().get(),
        at_a,
        "the exact fit, leaving 16 MiB whole"
    );
    blocks.push(again);
    give_back(&alloc, blocks);
}

/// A free that completes inside an allocation's last resort is not a last free the next request
/// may take: the allocation that ran the release was carved from that very block. Found by the
/// fuzzing campaign (the reference model's sequence is in `fuzz_found.rs`): a block used on a
/// stream whose work is still running is freed (pending); the device is full, so the next
/// request of its size fails to grow, and the last resort synchronizes that stream, which
/// completes the free (remembered as the last free) and serves the request from the block's
/// range. The request after it, of the same size, was handed the same address again: two live
/// allocations on one range.
#[test]
fn a_free_completed_by_the_last_resort_is_not_reused_twice() {
    use vmm_alloc::testkit::EmulatedBackend;
    let sim = SimBackend::with_config(SimConfig {
        capacity: 2 * MB,
        ..SimConfig::default()
    })
    .unwrap();
    let alloc = ExpandableAllocator::new(sim.clone(), ExpandableConfig::default()).unwrap();
    let s1 = StreamId::sim(1);
    // One 2 MiB small-pool page, four 512 KiB blocks: the device is full.
    let mut blocks: Vec<Allocation> = (0..4)
        .map(|_| alloc.allocate(512 << 10, S0).unwrap())
        .collect();
    sim.hold_stream(s1);
    let used_elsewhere = blocks.remove(1);
    let at = used_elsewhere.ptr();
    alloc.record_stream(at, s1).unwrap();
    alloc.deallocate(used_elsewhere).unwrap();
    // Nothing is free until s1's work is done: the last resort waits for it.
    let e = alloc.allocate(512 << 10, S0).unwrap();
    assert_eq!(e.ptr(), at, "served from the block whose free completed");
    let f = alloc.allocate(512 << 10, S0);
    if let Ok(f) = &f {
        assert_ne!(f.ptr(), e.ptr(), "one range handed out twice");
    }
    assert!(
        f.is_err(),
        "the device holds four such blocks, and four are live"
    );
    alloc.check_invariants().unwrap();
    drop(f);
    alloc.deallocate(e).unwrap();
    for b in blocks {
        alloc.deallocate(b).unwrap();
    }
}
