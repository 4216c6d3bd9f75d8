//! Note [Unmap runs]: `empty_cache` gives adjacent free pages back with one unmap call; a run the
//! driver refuses whole is unmapped page by page; a refusal of every unmap leaves the state as it
//! was; PyTorch's policy keeps one call per page.

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
