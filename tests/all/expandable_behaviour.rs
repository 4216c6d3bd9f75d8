//! Deterministic tests of the expandable allocator's behaviour.

use vmm_alloc::backend::{Backend, CallKind, SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::testkit::EmulatedBackend;
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

#[test]
fn rounds_like_pytorch_and_splits_pools() {
    let alloc = ExpandableAllocator::new(sim(1 << 30), ExpandableConfig::default()).unwrap();
    let a = alloc.allocate(1, S0).unwrap();
    assert_eq!(a.size(), 512);
    let b = alloc.allocate(1000, S0).unwrap();
    assert_eq!(b.size(), 1024);
    let s = alloc.stats();
    assert_eq!(s.allocated_bytes.small_pool.current, 1536);
    assert_eq!(
        s.reserved_bytes.small_pool.current,
        2 * MB as u64,
        "small pool maps 2 MiB pages"
    );
    let big = alloc.allocate(3 * MB, S0).unwrap();
    assert_eq!(
        alloc.stats().reserved_bytes.large_pool.current,
        20 * MB as u64,
        "large pool maps 20 MiB pages"
    );
    assert_ne!(
        alloc.snapshot().segments.len(),
        1,
        "small and large requests use separate segments"
    );
    for x in [a, b, big] {
        alloc.deallocate(x).unwrap();
    }
}

#[test]
fn growth_is_contiguous_and_sets_access_once_per_run() {
    let backend = sim(4 << 30);
    let alloc = ExpandableAllocator::new(backend.clone(), ExpandableConfig::default()).unwrap();
    let a = alloc.allocate(100 * MB, S0).unwrap();
    let b = alloc.allocate(100 * MB, S0).unwrap();
    assert_eq!(
        b.ptr().get(),
        a.ptr().get() + a.size() as u64,
        "the segment grows in place"
    );
    let calls = backend.calls();
    assert_eq!(calls.calls(CallKind::Reserve), 1, "one VA reservation");
    assert_eq!(
        calls.calls(CallKind::SetAccess),
        2,
        "one set_access per growth, not per page"
    );
    assert_eq!(calls.calls(CallKind::Map), calls.calls(CallKind::Create));
    alloc.deallocate(a).unwrap();
    alloc.deallocate(b).unwrap();
}

#[test]
fn oom_message_and_state_after_oom() {
    let alloc = ExpandableAllocator::new(sim(256 * MB), ExpandableConfig::default()).unwrap();
    let keep = alloc.allocate(200 * MB, S0).unwrap();
    let err = alloc.allocate(200 * MB, S0).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("CUDA out of memory. Tried to allocate 200.00 MiB. GPU 0 has a total capacity of 256.00 MiB"), "{msg}");
    assert!(msg.contains("allocated by vmm-alloc"), "{msg}");
    assert_eq!(alloc.stats().num_ooms, 1);
    alloc.check_invariants().unwrap();
    // Usable after the OOM.
    alloc.deallocate(keep).unwrap();
    let again = alloc.allocate(200 * MB, S0).unwrap();
    alloc.deallocate(again).unwrap();
}

#[test]
fn huge_and_zero_sizes_are_errors() {
    let alloc = ExpandableAllocator::new(sim(1 << 30), ExpandableConfig::default()).unwrap();
    for size in [usize::MAX, usize::MAX - 511, 1 << 61] {
        assert!(
            matches!(alloc.allocate(size, S0), Err(AllocError::TooLarge { .. })),
            "size {size}"
        );
    }
    assert!(alloc.allocate(1 << 40, S0).unwrap_err().is_out_of_memory());
    assert!(matches!(
        alloc.allocate(0, S0),
        Err(AllocError::InvalidSize { .. })
    ));
    alloc.check_invariants().unwrap();
    assert_eq!(alloc.stats().allocation.all.current, 0);
}

#[test]
fn bad_pointers_are_errors() {
    let alloc = ExpandableAllocator::new(sim(1 << 30), ExpandableConfig::default()).unwrap();
    let a = alloc.allocate(4096, S0).unwrap();
    let p = a.ptr();
    let interior = p.checked_add(512).unwrap();
    assert!(matches!(
        alloc.deallocate_ptr(interior),
        Err(AllocError::InvalidPointer(_))
    ));
    assert!(matches!(
        alloc.deallocate_ptr(vmm_alloc::DevAddr::new(12345)),
        Err(AllocError::InvalidPointer(_))
    ));
    alloc.deallocate(a).unwrap();
    assert!(matches!(
        alloc.deallocate_ptr(p),
        Err(AllocError::DoubleFree(_))
    ));
    assert!(alloc.record_stream(p, StreamId::sim(1)).is_err());
    alloc.check_invariants().unwrap();
}

#[test]
fn double_free_is_told_from_a_reused_address_after_many_frees() {
    let alloc = ExpandableAllocator::new(sim(1 << 30), ExpandableConfig::default()).unwrap();
    // The same address freed, reused and freed again thousands of times: each second free is a
    // double free, and a live reuse of the address is never mistaken for one.
    for _ in 0..10_000 {
        let a = alloc.allocate(4096, S0).unwrap();
        let p = a.ptr();
        alloc.deallocate(a).unwrap();
        assert!(matches!(
            alloc.deallocate_ptr(p),
            Err(AllocError::DoubleFree(_))
        ));
        let b = alloc.allocate(4096, S0).unwrap();
        assert_eq!(b.ptr(), p, "best fit reuses the freed block");
        alloc.deallocate(b).unwrap();
    }
    // A free remembered long ago is forgotten once thousands of other addresses were freed since;
    // it then reads as a foreign pointer, still an error.
    let old = alloc.allocate(4096, S0).unwrap();
    let old_ptr = old.ptr();
    let keep = alloc.allocate(4096, S0).unwrap();
    alloc.deallocate(old).unwrap();
    let many: Vec<_> = (0..5000)
        .map(|_| alloc.allocate(512, S0).unwrap())
        .collect();
    for a in many {
        alloc.deallocate(a).unwrap();
    }
    assert!(alloc.deallocate_ptr(old_ptr).is_err());
    alloc.deallocate(keep).unwrap();
    alloc.check_invariants().unwrap();
    assert_eq!(alloc.stats().allocation.all.current, 0);
}

#[test]
fn remap_synchronizes_a_stream_only_after_a_free_on_it() {
    let alloc = ExpandableAllocator::new(sim(100 * MB), ExpandableConfig::default()).unwrap();
    let other = StreamId::sim(9);
    let syncs = || alloc.stats().calls.calls(CallKind::Synchronize);
    // Five 20 MiB pages on the default stream fill the device.
    let mut blocks: Vec<_> = (0..5)
        .map(|_| alloc.allocate(20 * MB, S0).unwrap())
        .collect();
    let (first, second, third) = (blocks.remove(0), blocks.remove(0), blocks.remove(0));
    alloc.deallocate(first).unwrap();
    alloc.deallocate(second).unwrap();
    // Growing on another stream harvests a free page of S0: S0's queued work may still use it,
    // so S0 is synchronized first.
    let a = alloc.allocate(20 * MB, other).unwrap();
    assert_eq!(syncs(), 1);
    // Nothing was freed on S0 since: its other free page is quiet, no second synchronization.
    let b = alloc.allocate(20 * MB, other).unwrap();
    assert_eq!(syncs(), 1);
    // A new free on S0: the next harvest must wait for S0 again.
    alloc.deallocate(third).unwrap();
    let c = alloc.allocate(20 * MB, other).unwrap();
    assert_eq!(syncs(), 2);
    assert_eq!(alloc.stats().remapped_bytes, 60 * MB as u64);
    assert_eq!(
        alloc.stats().bytes_created,
        100 * MB as u64,
        "no handle created twice"
    );
    for x in [a, b, c].into_iter().chain(blocks) {
        alloc.deallocate(x).unwrap();
    }
    alloc.check_invariants().unwrap();

    // PyTorch's policy synchronizes before every unmap, quiet or not.
    let faithful = ExpandableConfig {
        remap_defrag: true,
        handle_cache: true,
        ..ExpandableConfig::pytorch_expandable()
    };
    let alloc = ExpandableAllocator::new(sim(100 * MB), faithful).unwrap();
    let mut blocks: Vec<_> = (0..5)
        .map(|_| alloc.allocate(20 * MB, S0).unwrap())
        .collect();
    alloc.deallocate(blocks.remove(0)).unwrap();
    alloc.deallocate(blocks.remove(0)).unwrap();
    let a = alloc.allocate(20 * MB, other).unwrap();
    let b = alloc.allocate(20 * MB, other).unwrap();
    assert_eq!(alloc.stats().calls.calls(CallKind::Synchronize), 2);
    for x in [a, b].into_iter().chain(blocks) {
        alloc.deallocate(x).unwrap();
    }
}

#[test]
fn record_stream_blocks_reuse_until_the_event_completes() {
    let backend = sim(1 << 30);
    let alloc = ExpandableAllocator::new(backend.clone(), ExpandableConfig::default()).unwrap();
    let side = StreamId::sim(7);
    backend.hold_stream(side);
    let a = alloc.allocate(MB, S0).unwrap();
    let p = a.ptr();
    alloc.record_stream(p, side).unwrap();
    alloc.deallocate(a).unwrap();
    let b = alloc.allocate(MB, S0).unwrap();
    assert_ne!(
        b.ptr(),
        p,
        "memory still used by the side stream must not be reused"
    );
    assert_eq!(
        alloc.stats().active.all.current,
        2,
        "the pending block stays active"
    );
    backend.release_stream(side);
    let c = alloc.allocate(MB, S0).unwrap();
    assert_eq!(c.ptr(), p, "after the event completes the block is reused");
    for x in [b, c] {
        alloc.deallocate(x).unwrap();
    }
}

#[test]
fn a_stuck_stream_does_not_block_another_streams_reuse() {
    let backend = sim(1 << 30);
    let alloc = ExpandableAllocator::new(backend.clone(), ExpandableConfig::default()).unwrap();
    let stuck = StreamId::sim(9);
    backend.hold_stream(stuck);
    let a = alloc.allocate(MB, S0).unwrap();
    alloc.record_stream(a.ptr(), stuck).unwrap();
    alloc.deallocate(a).unwrap();
    let b = alloc.allocate(MB, StreamId::sim(1)).unwrap();
    let pb = b.ptr();
    alloc.deallocate(b).unwrap();
    let c = alloc.allocate(MB, StreamId::sim(1)).unwrap();
    assert_eq!(c.ptr(), pb, "stream 1 reuses its own free block at once");
    alloc.deallocate(c).unwrap();
}

#[test]
fn pending_frees_are_reclaimed_before_oom() {
    let backend = sim(64 * MB);
    let alloc = ExpandableAllocator::new(backend.clone(), ExpandableConfig::default()).unwrap();
    let side = StreamId::sim(3);
    backend.hold_stream(side);
    let a = alloc.allocate(40 * MB, S0).unwrap();
    alloc.record_stream(a.ptr(), side).unwrap();
    alloc.deallocate(a).unwrap();
    // Only by waiting for the side stream can this fit.
    let b = alloc.allocate(40 * MB, S0).unwrap();
    assert!(alloc.stats().num_alloc_retries >= 1);
    alloc.deallocate(b).unwrap();
}

#[test]
fn handle_cache_reuses_handles_and_remap_moves_free_pages() {
    // Small pages everywhere so that interior pages can be harvested.
    let backend = sim(64 * MB);
    let config = ExpandableConfig {
        large_page: 2 * MB,
        ..ExpandableConfig::default()
    };
    let alloc = ExpandableAllocator::new(backend.clone(), config).unwrap();
    // Fill the device with 2 MiB blocks on stream 0, then free every other one: 32 MiB free in holes.
    let blocks: Vec<_> = (0..32)
        .map(|_| alloc.allocate(2 * MB, S0).unwrap())
        .collect();
    let mut keep = Vec::new();
    for (i, b) in blocks.into_iter().enumerate() {
        if i % 2 == 0 {
            alloc.deallocate(b).unwrap();
        } else {
            keep.push(b);
        }
    }
    let creates = backend.calls().calls(CallKind::Create);
    // A large contiguous request on another stream can only be served by remapping those pages.
    let big = alloc.allocate(30 * MB, StreamId::sim(1)).unwrap();
    let stats = alloc.stats();
    assert_eq!(
        backend.calls().calls(CallKind::Create),
        creates,
        "no new handle: pages were remapped"
    );
    assert!(
        stats.remapped_bytes >= 30 * MB as u64,
        "remapped {}",
        stats.remapped_bytes
    );
    assert!(stats.handle_reuses >= 15);
    assert_eq!(
        stats.num_alloc_retries, 0,
        "remap avoided the free-everything retry"
    );
    alloc.check_invariants().unwrap();
    alloc.deallocate(big).unwrap();
    for b in keep {
        alloc.deallocate(b).unwrap();
    }
}

#[test]
fn pytorch_policy_recreates_where_ours_remaps() {
    let backend = sim(64 * MB);
    let config = ExpandableConfig {
        large_page: 2 * MB,
        ..ExpandableConfig::pytorch_expandable()
    };
    let alloc = ExpandableAllocator::new(backend.clone(), config).unwrap();
    let blocks: Vec<_> = (0..32)
        .map(|_| alloc.allocate(2 * MB, S0).unwrap())
        .collect();
    let mut keep = Vec::new();
    for (i, b) in blocks.into_iter().enumerate() {
        if i % 2 == 0 {
            alloc.deallocate(b).unwrap();
        } else {
            keep.push(b);
        }
    }
    let creates = backend.calls().calls(CallKind::Create);
    let big = alloc.allocate(30 * MB, StreamId::sim(1)).unwrap();
    assert_eq!(
        alloc.stats().num_alloc_retries,
        1,
        "PyTorch frees everything and retries"
    );
    assert!(
        backend.calls().calls(CallKind::Create) >= creates + 15,
        "and creates the handles again"
    );
    alloc.deallocate(big).unwrap();
    for b in keep {
        alloc.deallocate(b).unwrap();
    }
}

#[test]
fn empty_cache_returns_everything_and_drop_leaves_nothing() {
    let backend = sim(1 << 30);
    {
        let alloc = ExpandableAllocator::new(backend.clone(), ExpandableConfig::default()).unwrap();
        let a = alloc.allocate(30 * MB, S0).unwrap();
        let b = alloc.allocate(1000, StreamId::sim(2)).unwrap();
        alloc.deallocate(a).unwrap();
        alloc.deallocate(b).unwrap();
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
        assert!(backend.live().is_empty(), "{}", backend.live());
        // Now leave live blocks, a pending free and a half-grown state behind.
        let side = StreamId::sim(5);
        backend.hold_stream(side);
        let _live = alloc.allocate(5 * MB, S0).unwrap();
        let p = alloc.allocate(MB, S0).unwrap();
        alloc.record_stream(p.ptr(), side).unwrap();
        alloc.deallocate(p).unwrap();
    }
    assert!(
        backend.live().is_empty(),
        "dropping the allocator leaked: {}",
        backend.live()
    );
}

#[test]
fn threads_share_one_allocator() {
    let backend = sim(2 << 30);
    let alloc = std::sync::Arc::new(
        ExpandableAllocator::new(backend.clone(), ExpandableConfig::default()).unwrap(),
    );
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let alloc = alloc.clone();
            std::thread::spawn(move || {
                // Threads 0 and 1 share stream 1; 2 and 3 have their own.
                let stream = StreamId::sim(t.max(1));
                let mut held = Vec::new();
                let mut x = t + 1;
                for _ in 0..2000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    if held.len() < 16 && x >> 63 == 0 {
                        let size = 512 + (x >> 40) as usize % (8 * MB);
                        held.push(alloc.allocate(size, stream).unwrap());
                    } else if let Some(a) = held.pop() {
                        alloc.deallocate(a).unwrap();
                    }
                }
                for a in held {
                    alloc.deallocate(a).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    alloc.check_invariants().unwrap();
    assert_eq!(alloc.stats().allocation.all.current, 0);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
    assert!(backend.live().is_empty());
}
