//! Issue 21, item 2: an allocation given back to an allocator that did not make it. Two Sim
//! allocators used to hand out the same first address, so allocator B freed its own live block
//! when given A's allocation (or A's pointer, by address), and then handed out memory it still
//! held. An `Allocation` now names its allocator, and each Sim backend draws its addresses from
//! its own window of the process's address space, as real device addresses are unique in a
//! process (Host: `mmap`; Cuda: `cuMemAddressReserve`), so the address-only paths cannot be
//! fooled either.

use vmm_alloc::backend::{HostBackend, HostConfig};
use vmm_alloc::{
    AllocError, Allocator, ClassicAllocator, ExpandableAllocator, ExpandableConfig, SimBackend,
    StreamId,
};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// A's allocation given to B is refused with `ForeignAllocation`, B's state is unchanged (stats
/// and snapshot), B's next allocation does not overlap B's live block, and A still takes its own
/// allocation back by address.
fn cross_free_is_refused<A: Allocator, B: Allocator>(a: &A, b: &B) {
    let from_a = a.allocate(MB, S0).unwrap();
    let from_b = b.allocate(MB, S0).unwrap();
    assert_ne!(from_a.allocator(), from_b.allocator());
    let (stats, snapshot) = (b.stats(), b.snapshot());
    let a_ptr = from_a.ptr();
    let err = b.deallocate(from_a).unwrap_err();
    match &err {
        AllocError::ForeignAllocation {
            ptr,
            owner,
            allocator,
        } => {
            assert_eq!(*ptr, a_ptr);
            assert_eq!(*allocator, from_b.allocator());
            assert_ne!(owner, allocator);
        }
        other => panic!("expected ForeignAllocation, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("foreign allocation") && msg.contains("deallocate_ptr"),
        "{msg}"
    );
    assert_eq!(b.stats(), stats, "a refused free changes no statistic");
    assert_eq!(b.snapshot(), snapshot, "a refused free changes no block");
    // B's block is still live: its next allocation lies elsewhere.
    let next = b.allocate(MB, S0).unwrap();
    let (lo, hi) = (
        from_b.ptr().get(),
        from_b.ptr().get() + from_b.size() as u64,
    );
    let (nlo, nhi) = (next.ptr().get(), next.ptr().get() + next.size() as u64);
    assert!(
        nhi <= lo || nlo >= hi,
        "B's next allocation overlaps its live block"
    );
    b.deallocate(next).unwrap();
    b.deallocate(from_b).unwrap();
    // The error gave the address back: the right allocator frees it.
    a.deallocate_ptr(a_ptr).unwrap();
    assert_eq!(a.stats().allocated_bytes.all.current, 0);
    assert_eq!(b.stats().allocated_bytes.all.current, 0);
}

#[test]
fn expandable_refuses_another_allocators_allocation_on_sim() {
    let cfg = ExpandableConfig::default;
    let a = ExpandableAllocator::new(SimBackend::new(), cfg()).unwrap();
    let b = ExpandableAllocator::new(SimBackend::new(), cfg()).unwrap();
    cross_free_is_refused(&a, &b);
    a.check_invariants().unwrap();
    b.check_invariants().unwrap();
}

#[test]
fn classic_refuses_another_allocators_allocation_on_sim() {
    let a = ClassicAllocator::with_alloc_conf(SimBackend::new(), "").unwrap();
    let b = ClassicAllocator::with_alloc_conf(SimBackend::new(), "").unwrap();
    cross_free_is_refused(&a, &b);
    a.check_invariants().unwrap();
    b.check_invariants().unwrap();
}

#[test]
fn a_classic_allocation_is_refused_by_an_expandable_allocator_and_back() {
    let c = ClassicAllocator::with_alloc_conf(SimBackend::new(), "").unwrap();
    let e = ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
    // Different policies place the first block at the same base too.
    cross_free_is_refused(&c, &e);
    cross_free_is_refused(&e, &c);
}

#[test]
fn foreign_allocations_are_refused_on_host() {
    let a = ExpandableAllocator::new(small_host(), ExpandableConfig::default()).unwrap();
    let b = ClassicAllocator::with_alloc_conf(small_host(), "").unwrap();
    let x = a.allocate(MB, S0).unwrap();
    let ptr = x.ptr();
    let before = b.stats();
    assert!(matches!(
        b.deallocate(x),
        Err(AllocError::ForeignAllocation { .. })
    ));
    assert_eq!(b.stats(), before);
    // By address, a pointer B never handed out is refused by B's own lookup.
    assert_eq!(b.deallocate_ptr(ptr), Err(AllocError::InvalidPointer(ptr)));
    a.deallocate_ptr(ptr).unwrap();
}

#[test]
fn a_pointer_another_allocator_handed_out_is_refused_by_address_when_not_live_here() {
    let a = ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
    let b = ClassicAllocator::with_alloc_conf(SimBackend::new(), "").unwrap();
    let x = a.allocate(MB, S0).unwrap();
    // B holds nothing: the address lookup refuses it, and record_stream too.
    assert_eq!(
        b.deallocate_ptr(x.ptr()),
        Err(AllocError::InvalidPointer(x.ptr()))
    );
    assert!(b.record_stream(x.ptr(), StreamId::sim(7)).is_err());
    a.deallocate(x).unwrap();
}

/// B's live blocks, by address and size.
fn ranges(allocs: &[vmm_alloc::Allocation]) -> Vec<(u64, u64)> {
    allocs
        .iter()
        .map(|a| (a.ptr().get(), a.ptr().get() + a.size() as u64))
        .collect()
}

/// The address-only paths (what the C ABI calls): A's pointer given to B, while B holds live
/// blocks of the same sizes and history, is not one of B's: `deallocate_ptr` and `record_stream`
/// refuse it as not allocated here and change nothing. Before each Sim backend had its own
/// addresses, A's first pointer was B's first pointer, and B freed its own live block.
fn foreign_pointer_is_refused<A: Allocator, B: Allocator>(a: &A, b: &B) {
    let from_a: Vec<_> = (0..4).map(|_| a.allocate(MB, S0).unwrap()).collect();
    let from_b: Vec<_> = (0..4).map(|_| b.allocate(MB, S0).unwrap()).collect();
    for (x, y) in ranges(&from_a)
        .iter()
        .flat_map(|x| ranges(&from_b).into_iter().map(move |y| (*x, y)))
    {
        assert!(
            x.1 <= y.0 || y.1 <= x.0,
            "A's block {x:x?} overlaps B's {y:x?}"
        );
    }
    let (stats, snapshot) = (b.stats(), b.snapshot());
    for x in &from_a {
        assert_eq!(
            b.deallocate_ptr(x.ptr()),
            Err(AllocError::InvalidPointer(x.ptr())),
            "B freed A's pointer"
        );
        assert!(b.record_stream(x.ptr(), StreamId::sim(7)).is_err());
    }
    assert_eq!(b.stats(), stats, "a refused pointer changes no statistic");
    assert_eq!(b.snapshot(), snapshot, "a refused pointer changes no block");
    // B's blocks are all still live: its next allocation overlaps none of them.
    let next = b.allocate(MB, S0).unwrap();
    let n = ranges(std::slice::from_ref(&next))[0];
    for y in ranges(&from_b) {
        assert!(
            n.1 <= y.0 || y.1 <= n.0,
            "B's next block overlaps its live {y:x?}"
        );
    }
    for x in from_a {
        a.deallocate_ptr(x.into_ptr()).unwrap();
    }
    for y in from_b.into_iter().chain([next]) {
        b.deallocate(y).unwrap();
    }
    assert_eq!(a.stats().allocated_bytes.all.current, 0);
    assert_eq!(b.stats().allocated_bytes.all.current, 0);
}

#[test]
fn a_foreign_pointer_is_refused_by_address_on_sim_by_every_pair_of_allocators() {
    let e = || ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
    let c = || ClassicAllocator::with_alloc_conf(SimBackend::new(), "").unwrap();
    foreign_pointer_is_refused(&e(), &e());
    foreign_pointer_is_refused(&c(), &c());
    foreign_pointer_is_refused(&e(), &c());
    foreign_pointer_is_refused(&c(), &e());
    let (a, b) = (c(), c());
    foreign_pointer_is_refused(&a, &b);
    a.check_invariants().unwrap();
    b.check_invariants().unwrap();
}

#[test]
fn a_foreign_pointer_is_refused_by_address_on_host() {
    let a = ExpandableAllocator::new(small_host(), ExpandableConfig::default()).unwrap();
    let b = ExpandableAllocator::new(small_host(), ExpandableConfig::default()).unwrap();
    foreign_pointer_is_refused(&a, &b);
}

/// A 64 MiB Host backend (real memory: kept small so the tests run anywhere).
fn small_host() -> HostBackend {
    HostBackend::with_config(HostConfig {
        capacity: 64 * MB,
        ..HostConfig::default()
    })
    .unwrap()
}
