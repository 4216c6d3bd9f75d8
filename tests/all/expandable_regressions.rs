//! Regression tests that pin exact figures and addresses, each able to fail on the bug it names.

use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::config::Config;
use vmm_alloc::{AllocError, Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn sim(capacity: usize) -> SimBackend {
    SimBackend::with_config(SimConfig {
        capacity,
        ..SimConfig::default()
    })
    .unwrap()
}

/// A never-completing event queued first must not hide a later pending free whose events did
/// complete: pending frees are not a FIFO that stops at the first unfinished entry.
#[test]
fn a_stuck_event_does_not_block_later_pending_frees() {
    let backend = sim(1 << 30);
    let alloc = ExpandableAllocator::new(backend.clone(), Config::default()).unwrap();
    let (s1, s2, stuck) = (StreamId::sim(1), StreamId::sim(2), StreamId::sim(9));
    backend.hold_stream(stuck);
    let a = alloc.allocate(MB, s1).unwrap();
    alloc.record_stream(a.ptr(), stuck).unwrap();
    alloc.deallocate(a).unwrap();
    let b = alloc.allocate(MB, s1).unwrap();
    let pb = b.ptr();
    alloc.record_stream(pb, s2).unwrap();
    alloc.deallocate(b).unwrap();
    assert_eq!(alloc.stats().active.all.current, 2, "both frees pending");
    // b's event (on s2) completed at once; a's (on the stuck stream) never does.
    let c = alloc.allocate(MB, s1).unwrap();
    assert_eq!(
        c.ptr(),
        pb,
        "b's memory is reused although a's event is stuck"
    );
    assert_eq!(alloc.stats().active.all.current, 2, "a pending, c live");
    alloc.deallocate(c).unwrap();
}

/// The OOM report carries the right figures, not just the right words.
#[test]
fn oom_report_figures_are_exact() {
    let alloc = ExpandableAllocator::new(sim(256 * MB), Config::default()).unwrap();
    // 150 MiB live in eight 20 MiB pages: 160 MiB reserved, 10 MiB of it unallocated.
    let keep = alloc.allocate(150 * MB, S0).unwrap();
    let err = alloc.allocate(120 * MB, S0).unwrap_err();
    let AllocError::OutOfMemory(r) = &err else {
        panic!("not an OOM: {err}")
    };
    let m = MB as u64;
    assert_eq!(
        (
            r.tried,
            r.total,
            r.free,
            r.allocated,
            r.reserved_unallocated
        ),
        (120 * m, 256 * m, 96 * m, 150 * m, 10 * m),
        "requested, device total, device free, allocated, reserved but unallocated"
    );
    assert_eq!(r.allowed, None);
    assert_eq!(
        err.to_string(),
        "CUDA out of memory. Tried to allocate 120.00 MiB. GPU 0 has a total capacity of \
         256.00 MiB of which 96.00 MiB is free. Of the allocated memory 150.00 MiB is allocated \
         by vmm-alloc, and 10.00 MiB is reserved by vmm-alloc but unallocated."
    );
    alloc.deallocate(keep).unwrap();
}

/// Growth maps the lowest unmapped gap that fits, not the end of the segment nor a higher gap.
#[test]
fn growth_maps_the_lowest_interior_gap() {
    let config = Config {
        large_page: 2 * MB,
        ..Config::default()
    };
    let alloc = ExpandableAllocator::new(sim(1 << 30), config).unwrap();
    let pages: Vec<_> = (0..5)
        .map(|_| alloc.allocate(2 * MB, S0).unwrap())
        .collect();
    let mut pages = pages.into_iter();
    let (p0, p1, p2, p3, p4) = (
        pages.next().unwrap(),
        pages.next().unwrap(),
        pages.next().unwrap(),
        pages.next().unwrap(),
        pages.next().unwrap(),
    );
    let (gap1, gap3) = (p1.ptr(), p3.ptr());
    alloc.deallocate(p1).unwrap();
    alloc.deallocate(p3).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved_bytes.all.current, 6 * MB as u64);
    let a = alloc.allocate(2 * MB, S0).unwrap();
    assert_eq!(a.ptr(), gap1, "the lowest gap is mapped first");
    let b = alloc.allocate(2 * MB, S0).unwrap();
    assert_eq!(b.ptr(), gap3, "then the next one");
    for x in [p0, p2, p4, a, b] {
        alloc.deallocate(x).unwrap();
    }
}
