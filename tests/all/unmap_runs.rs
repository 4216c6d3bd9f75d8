//! Note [Unmap runs]: `empty_cache` gives adjacent free pages back with one unmap call; a run the
//! driver refuses whole is unmapped page by page; a refusal of every unmap leaves the state as it
//! was; PyTorch's policy keeps one call per page. Note [Harvest unmap runs]: the pages a growth
//! remaps from a quiet stream are unmapped at its end, adjacent ones with one call.

use vmm_alloc::backend::{Backend, CallKind, SimBackend};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::testkit::{FaultError, FaultPlan, Trigger};
use vmm_alloc::{Allocator, ExpandableAllocator, StreamId};

use crate::expandable_regressions::sim;

const MB: usize = 1 << 20;

/// An allocator whose one segment holds three adjacent free 20 MiB pages (a 60 MiB block, freed).
fn three_free_pages(config: ExpandableConfig) -> (SimBackend, ExpandableAllocator<SimBackend>) {
    let backend = sim(1 << 30);
    let alloc = ExpandableAllocator::new(backend.clone(), config).unwrap();
    let a = alloc.allocate(60 * MB, StreamId::DEFAULT).unwrap();
    alloc.deallocate(a).unwrap();
    assert_eq!(
        backend.calls().calls(CallKind::Map),
        3,
        "three pages mapped"
    );
    (backend, alloc)
}

fn unmaps(backend: &SimBackend) -> u64 {
    backend.calls().calls(CallKind::Unmap)
}

/// Three free pages, and `empty_cache` with every unmap from `when` on refused.
fn empty_cache_refusing_unmaps(when: Trigger) -> (SimBackend, ExpandableAllocator<SimBackend>) {
    let (backend, alloc) = three_free_pages(ExpandableConfig::default());
    let fault = FaultPlan::new().fail(CallKind::Unmap, when, FaultError::Injected);
    backend.set_faults(fault);
    let result = alloc.empty_cache();
    backend.clear_faults();
    assert_eq!(result.is_ok(), matches!(when, Trigger::Nth(_)), "{when:?}");
    alloc.check_invariants().unwrap();
    (backend, alloc)
}

#[test]
fn empty_cache_unmaps_adjacent_free_pages_with_one_call() {
    for (config, calls) in [
        (ExpandableConfig::default(), 1),
        (
            ExpandableConfig {
                batch_unmaps: false,
                ..ExpandableConfig::default()
            },
            3,
        ),
        (ExpandableConfig::pytorch_expandable(), 3),
    ] {
        let batch = config.batch_unmaps;
        let (backend, alloc) = three_free_pages(config);
        alloc.empty_cache().unwrap();
        assert_eq!(unmaps(&backend), calls, "batch_unmaps {batch}");
        // The same memory given back either way: nothing mapped, every handle released.
        let live = backend.live();
        assert_eq!(
            (live.mapped_bytes, live.handles),
            (0, 0),
            "batch_unmaps {batch}"
        );
        assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
        alloc.check_invariants().unwrap();
    }
}

#[test]
fn a_run_the_driver_refuses_whole_is_unmapped_page_by_page() {
    let (backend, alloc) = empty_cache_refusing_unmaps(Trigger::Nth(1));
    assert_eq!(unmaps(&backend), 1 + 3, "the refused run, then each page");
    assert_eq!(backend.live().mapped_bytes, 0);
    assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
}

#[test]
fn when_every_unmap_is_refused_the_pages_stay_as_they_were() {
    let (backend, alloc) = empty_cache_refusing_unmaps(Trigger::From(1));
    assert_eq!(alloc.stats().reserved_bytes.all.current, 60 * MB as u64);
    assert_eq!(backend.live().mapped_bytes, 60 * MB);
    // Still usable, and given back once the driver agrees.
    let a = alloc.allocate(60 * MB, StreamId::DEFAULT).unwrap();
    alloc.deallocate(a).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(backend.live().mapped_bytes, 0);
    alloc.check_invariants().unwrap();
}

/// Note [Harvest unmap runs] (`src/expandable/growth.rs`): on a 64 MiB device, stream 1 frees
/// a 60 MiB block (three adjacent 20 MiB pages) and the default stream asks for 60 MiB. The
/// device is full, so the growth synchronizes stream 1 and remaps its three pages; `faults`
/// (the refusals of unmaps a page-by-page retry gets through) are injected during the request.
/// Returns the allocator, its backend and the unmap calls the request made.
fn harvest_three_pages(
    config: ExpandableConfig,
    faults: Option<Trigger>,
) -> (SimBackend, ExpandableAllocator<SimBackend>, u64) {
    let backend = sim(64 * MB);
    let alloc = ExpandableAllocator::new(backend.clone(), config).unwrap();
    let other = alloc.allocate(60 * MB, StreamId::sim(1)).unwrap();
    alloc.deallocate(other).unwrap();
    let before = unmaps(&backend);
    if let Some(when) = faults {
        let plan = FaultPlan::new().fail(CallKind::Unmap, when, FaultError::Injected);
        backend.set_faults(plan);
    }
    let mine = alloc.allocate(60 * MB, StreamId::DEFAULT);
    backend.clear_faults();
    let mine = mine.expect("the growth's result does not depend on its unmaps");
    let stats = alloc.stats();
    assert_eq!(
        stats.remapped_bytes,
        60 * MB as u64,
        "stream 1's pages remapped"
    );
    assert_eq!(stats.calls.calls(CallKind::Synchronize), 1);
    assert_eq!(
        stats.calls.calls(CallKind::Create),
        3,
        "no page created twice"
    );
    assert_eq!(stats.reserved_bytes.all.current, 60 * MB as u64);
    // Each handle mapped once, where the request is: no old mapping left behind.
    assert_eq!(stats.parked_pages, 0);
    assert_eq!(backend.live().mapped_bytes, 60 * MB);
    alloc.check_invariants().unwrap();
    let calls = unmaps(&backend) - before;
    // The block is usable and given back whole.
    alloc.deallocate(mine).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(backend.live().mapped_bytes, 0);
    alloc.check_invariants().unwrap();
    (backend, alloc, calls)
}

#[test]
fn pages_a_growth_harvests_are_unmapped_with_one_call_at_its_end() {
    for (config, calls) in [
        (ExpandableConfig::default(), 1),
        (
            ExpandableConfig {
                batch_unmaps: false,
                ..ExpandableConfig::default()
            },
            3,
        ),
    ] {
        let batch = config.batch_unmaps;
        let (_, _, request_calls) = harvest_three_pages(config, None);
        assert_eq!(request_calls, calls, "batch_unmaps {batch}");
    }
}

#[test]
fn a_harvested_run_the_driver_refuses_is_unmapped_page_by_page() {
    let (_, _, calls) = harvest_three_pages(ExpandableConfig::default(), Some(Trigger::Nth(1)));
    assert_eq!(calls, 1 + 3, "the refused run, then each page");
}

#[test]
fn harvested_pages_the_driver_will_not_unmap_stay_parked_until_it_does() {
    let backend = sim(64 * MB);
    let alloc = ExpandableAllocator::new(backend.clone(), ExpandableConfig::default()).unwrap();
    let other = alloc.allocate(60 * MB, StreamId::sim(1)).unwrap();
    alloc.deallocate(other).unwrap();
    let plan = FaultPlan::new().fail(CallKind::Unmap, Trigger::From(1), FaultError::Injected);
    backend.set_faults(plan);
    let mine = alloc.allocate(60 * MB, StreamId::DEFAULT).unwrap();
    backend.clear_faults();
    // The request got its memory; the old mappings wait, parked, counted nowhere as reserved.
    let stats = alloc.stats();
    assert_eq!(stats.parked_pages, 3);
    assert_eq!(stats.reserved_bytes.all.current, 60 * MB as u64);
    assert_eq!(
        backend.live().mapped_bytes,
        120 * MB,
        "each handle mapped twice"
    );
    alloc.check_invariants().unwrap();
    // The next give-back unmaps them.
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().parked_pages, 0);
    assert_eq!(backend.live().mapped_bytes, 60 * MB);
    alloc.deallocate(mine).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(backend.live().mapped_bytes, 0);
    alloc.check_invariants().unwrap();
}
