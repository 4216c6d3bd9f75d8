//! Regression tests that pin exact figures and addresses, each able to fail on the bug it names.

use vmm_alloc::backend::{Backend, SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::{AllocError, Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

pub(super) fn sim(capacity: usize) -> SimBackend {
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
    let alloc = ExpandableAllocator::new(backend.clone(), ExpandableConfig::default()).unwrap();
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
    let alloc = ExpandableAllocator::new(sim(256 * MB), ExpandableConfig::default()).unwrap();
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
    let config = ExpandableConfig {
        large_page: 2 * MB,
        ..ExpandableConfig::default()
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

/// pytorch#123548, the issue's own reproducer: with `max_split_size_mb:128`, each cycle allocates
/// A = 91 MiB and B = 45.5 MiB, then a 2 MiB block that stays alive, then frees A and B. The
/// freed 136.5 MiB range is fenced off from the segment's unmapped tail by the 2 MiB block, and
/// PyTorch's oversize rule refuses it to the next A (91 < 128 <= 136.5), so every cycle maps
/// new memory: reserved grows by about 138 MiB a cycle (220 MiB to 14 GiB over 100 cycles on
/// the 16 GiB card). The faithful policy must reproduce that; ours must not.
#[test]
fn pytorch_123548_reserved_grows_only_with_the_faithful_oversize_rules() {
    let conf = "max_split_size_mb:128";
    let cycles = 40;
    let run = |config: ExpandableConfig| {
        let alloc =
            ExpandableAllocator::new(sim(16 << 30), config.with_alloc_conf(conf).unwrap()).unwrap();
        let mut reserved = Vec::new();
        let mut kept = Vec::new();
        for _ in 0..cycles {
            let a = alloc.allocate(91 * MB, S0).unwrap();
            let b = alloc.allocate(91 * MB / 2, S0).unwrap();
            kept.push(alloc.allocate(2 * MB, S0).unwrap());
            alloc.deallocate(a).unwrap();
            alloc.deallocate(b).unwrap();
            reserved.push(alloc.stats().reserved_bytes.all.current / MB as u64);
        }
        assert_eq!(alloc.stats().num_alloc_retries, 0, "no memory pressure");
        reserved
    };
    let theirs = run(ExpandableConfig::pytorch_expandable());
    let ours = run(ExpandableConfig::default());
    let growth = |r: &[u64]| (r[cycles - 1] - r[9]) / (cycles as u64 - 10);
    // The issue measured ~138 MiB a cycle: the freed 136.5 MiB stays stranded every time.
    assert!(
        (130..=160).contains(&growth(&theirs)),
        "the faithful policy should leak ~138 MiB a cycle: {theirs:?}"
    );
    // Ours grows by the kept 2 MiB a cycle only: 80 MiB kept after 40 cycles, plus A and B's
    // free range and a page of slack.
    assert!(growth(&ours) <= 2, "ours grows: {ours:?}");
    assert!(
        ours[cycles - 1] <= 80 + 137 + 20,
        "ours holds more than live + one cycle: {ours:?}"
    );
}

/// Handles unmapped for the free-everything retry go to the cache; those the retry did not use
/// must not stay cached past the allocation, beyond `handle_cache_limit` (0 by default), nor at
/// all without the cache. (Other streams' pages are kept past the call by default, for the
/// growths that would create them, `kept_pages.rs`; here they are released, PyTorch's way.)
#[test]
fn the_oom_retry_leaves_no_handle_cached_beyond_the_bound() {
    for (handle_cache, limit) in [(true, 0), (true, 8 * MB), (false, 64 * MB)] {
        let backend = sim(64 * MB);
        let config = ExpandableConfig {
            large_page: 2 * MB,
            remap_defrag: false,
            handle_cache,
            handle_cache_limit: limit,
            keep_after_retry: false,
            ..ExpandableConfig::default()
        };
        let alloc = ExpandableAllocator::new(backend.clone(), config).unwrap();
        // Stream 1 maps all 64 MiB and frees it; stream 0 then needs 4 MiB: create fails, the
        // retry unmaps stream 1's 32 pages and maps two of them.
        let other = alloc.allocate(64 * MB, StreamId::sim(1)).unwrap();
        alloc.deallocate(other).unwrap();
        let a = alloc.allocate(4 * MB, S0).unwrap();
        let stats = alloc.stats();
        assert_eq!(stats.num_alloc_retries, 1, "the retry path ran");
        let bound = if handle_cache { limit } else { 0 } as u64;
        assert_eq!(
            stats.handle_cache_bytes, bound,
            "cache {handle_cache}, limit {limit}: what the retry did not use is released"
        );
        assert_eq!(
            backend.live().handles as u64,
            2 + stats.handles_cached,
            "the device holds the two mapped handles and the cached ones only"
        );
        alloc.deallocate(a).unwrap();
    }
}

/// Remap moves a handle through the cache within one allocation; without the cache nothing may
/// stay there afterwards.
#[test]
fn remap_leaves_no_handle_cached_without_the_cache() {
    let backend = sim(64 * MB);
    let config = ExpandableConfig {
        handle_cache: false,
        ..ExpandableConfig::default()
    };
    let alloc = ExpandableAllocator::new(backend.clone(), config).unwrap();
    // Stream 1 holds three 20 MiB pages, frees them; stream 0's 20 MiB growth harvests one.
    let other = alloc.allocate(60 * MB, StreamId::sim(1)).unwrap();
    alloc.deallocate(other).unwrap();
    let a = alloc.allocate(20 * MB, S0).unwrap();
    let stats = alloc.stats();
    assert!(stats.remapped_bytes > 0, "remap ran");
    assert_eq!(stats.handles_cached, 0);
    assert_eq!(backend.live().handles, 3);
    alloc.deallocate(a).unwrap();
}
