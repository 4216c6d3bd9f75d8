//! Deterministic tests of the classic allocator: PyTorch's own tests that need no GPU (rounding
//! and stats, 1 MiB allocations packing into 2 MiB segments, `max_split_size` under a memory
//! fraction) and the behaviour of `DeviceCachingAllocator` step by step.

use vmm_alloc::backend::{Backend, SimBackend, SimConfig};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::snapshot::BlockState;
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::{AllocError, Allocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn sim(capacity: usize) -> SimBackend {
    SimBackend::with_config(SimConfig {
        capacity,
        ..SimConfig::default()
    })
    .unwrap()
}

fn classic(backend: &SimBackend, conf: &str) -> ClassicAllocator<SimBackend> {
    ClassicAllocator::with_alloc_conf(backend.clone(), conf).unwrap()
}

#[test]
fn one_byte_is_512_and_stats_move_by_exactly_that() {
    let backend = sim(1 << 30);
    let alloc = classic(&backend, "");
    let a = alloc.allocate(1, S0).unwrap();
    assert_eq!(a.size(), 512);
    let s = alloc.stats();
    assert_eq!(s.allocated_bytes.all.current, 512);
    assert_eq!(s.active_bytes.small_pool.current, 512);
    assert_eq!(s.requested_bytes.all.current, 1);
    assert_eq!(
        s.reserved_bytes.small_pool.current,
        2 * MB as u64,
        "a 2 MiB small segment"
    );
    assert_eq!(s.inactive_split_bytes.all.current, 2 * MB as u64 - 512);
    alloc.deallocate(a).unwrap();
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!(s.active_bytes.all.freed, 512);
    assert_eq!(s.allocated_bytes.all.current, 0);
    assert_eq!(s.reserved_bytes.all.current, 0);
    assert_eq!(s.inactive_split.all.current, 0);
    assert!(backend.live().is_empty(), "{}", backend.live());
}

#[test]
fn one_mib_allocations_pack_two_to_a_small_segment() {
    let alloc = classic(&sim(1 << 30), "");
    let segments = |n| {
        move |a: &ClassicAllocator<SimBackend>| assert_eq!(a.stats().segment.small_pool.current, n)
    };
    let a = alloc.allocate(MB, S0).unwrap();
    segments(1)(&alloc);
    let b = alloc.allocate(MB, S0).unwrap();
    segments(1)(&alloc);
    let c = alloc.allocate(MB, S0).unwrap();
    segments(2)(&alloc);
    assert_eq!(
        b.ptr().get(),
        a.ptr().get() + MB as u64,
        "the second fills the first segment"
    );
    for x in [a, b, c] {
        alloc.deallocate(x).unwrap();
    }
}

#[test]
fn max_split_size_under_a_memory_fraction() {
    // PyTorch's test_max_split_expandable, classic: a 120 MiB budget, max_split_size 40 MiB.
    let backend = sim(1 << 30);
    let fraction = 120.0 / 1024.0;
    let alloc = classic(
        &backend,
        &format!("max_split_size_mb:40,per_process_memory_fraction:{fraction}"),
    );
    let three: Vec<_> = (0..3)
        .map(|_| alloc.allocate(40 * MB, S0).unwrap())
        .collect();
    let err = alloc.allocate(40 * MB, S0).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(
        err.to_string()
            .contains("This process is allowed 120.00 MiB"),
        "{err}"
    );
    assert_eq!(alloc.stats().num_ooms, 1);
    for a in three {
        alloc.deallocate(a).unwrap();
    }
    // The three cached 40 MiB segments are oversize: released to make room for 120 MiB.
    let big = alloc.allocate(120 * MB, S0).unwrap();
    let s = alloc.stats();
    assert_eq!(s.num_device_free, 3);
    assert_eq!(s.reserved_bytes.all.current, 120 * MB as u64);
    assert_eq!(alloc.oversize(), (1, 1));
    alloc.deallocate(big).unwrap();
}

#[test]
fn split_and_merge_keep_inactive_split_stats() {
    let alloc = classic(&sim(1 << 30), "");
    // Below 10 MiB: one 20 MiB large segment, split three times.
    let a = alloc.allocate(4 * MB, S0).unwrap();
    let b = alloc.allocate(4 * MB, S0).unwrap();
    let c = alloc.allocate(4 * MB, S0).unwrap();
    let split = |n: u64, bytes: usize| {
        let s = alloc.stats();
        assert_eq!(
            (
                s.inactive_split.all.current,
                s.inactive_split_bytes.all.current
            ),
            (n, bytes as u64)
        );
    };
    assert_eq!(alloc.stats().segment.all.current, 1);
    split(1, 8 * MB);
    alloc.deallocate(b).unwrap();
    split(2, 12 * MB);
    alloc.deallocate(a).unwrap(); // merges with b's block
    split(2, 16 * MB);
    alloc.deallocate(c).unwrap(); // merges everything: the segment is whole again
    split(0, 0);
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].blocks.len(), 1);
    assert_eq!(snap.segments[0].blocks[0].size, 20 * MB);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
}

#[test]
fn large_blocks_split_only_leaving_more_than_a_mib() {
    let alloc = classic(&sim(1 << 30), "");
    // 19.5 MiB gets a 20 MiB segment; 0.5 MiB left is not split off (a large block splits only
    // when more than 1 MiB remains), so the allocation holds all 20 MiB.
    let a = alloc.allocate(19 * MB + MB / 2, S0).unwrap();
    assert_eq!(a.size(), 20 * MB);
    assert_eq!(alloc.snapshot().segments[0].blocks.len(), 1);
    alloc.deallocate(a).unwrap();
    // 12 MiB fits the cached 20 MiB block (best fit), which splits: 8 MiB stay free.
    let b = alloc.allocate(12 * MB, S0).unwrap();
    assert_eq!(alloc.stats().segment.all.current, 1);
    assert_eq!(alloc.snapshot().segments[0].blocks.len(), 2);
    alloc.deallocate(b).unwrap();
}

#[test]
fn a_large_block_splits_only_when_more_than_one_mib_remains() {
    let alloc = classic(&sim(1 << 30), "");
    // 19 MiB in a 20 MiB segment leaves exactly 1 MiB: not split, the block is 20 MiB.
    let a = alloc.allocate(19 * MB, S0).unwrap();
    assert_eq!(a.size(), 20 * MB);
    alloc.deallocate(a).unwrap();
    // 512 bytes less leaves 1 MiB + 512: split.
    let b = alloc.allocate(19 * MB - 512, S0).unwrap();
    assert_eq!(b.size(), 19 * MB - 512);
    assert_eq!(alloc.snapshot().segments[0].blocks.len(), 2);
    alloc.deallocate(b).unwrap();
}

#[test]
fn freed_memory_is_reused_on_its_stream_only() {
    let alloc = classic(&sim(1 << 30), "");
    let other = StreamId::sim(3);
    let a = alloc.allocate(4 * MB, S0).unwrap();
    let p = a.ptr();
    alloc.deallocate(a).unwrap();
    let b = alloc.allocate(4 * MB, other).unwrap();
    assert_ne!(b.ptr(), p);
    assert_eq!(alloc.stats().segment.all.current, 2, "a segment per stream");
    let c = alloc.allocate(4 * MB, S0).unwrap();
    assert_eq!(c.ptr(), p, "same stream: best fit reuses it");
    for x in [b, c] {
        alloc.deallocate(x).unwrap();
    }
}

#[test]
fn record_stream_defers_the_free_until_the_event() {
    let backend = sim(1 << 30);
    let alloc = classic(&backend, "");
    let side = StreamId::sim(7);
    backend.hold_stream(side);
    let a = alloc.allocate(MB, S0).unwrap();
    let p = a.ptr();
    alloc.record_stream(p, side).unwrap();
    alloc.deallocate(a).unwrap();
    let pending = alloc.snapshot().segments[0].blocks[0].state;
    assert_eq!(pending, BlockState::ActivePendingFree);
    assert!(matches!(
        alloc.deallocate_ptr(p),
        Err(AllocError::DoubleFree(_))
    ));
    let b = alloc.allocate(MB, S0).unwrap();
    assert_ne!(b.ptr(), p, "still used by the side stream");
    assert_eq!(alloc.stats().active.all.current, 2);
    backend.release_stream(side);
    let c = alloc.allocate(MB, S0).unwrap();
    assert_eq!(c.ptr(), p, "reused once the event completed");
    for x in [b, c] {
        alloc.deallocate(x).unwrap();
    }
}

#[test]
fn oom_reports_the_segment_size_then_recovers() {
    let backend = sim(64 * MB);
    let alloc = classic(&backend, "");
    let big = alloc.allocate(60 * MB, S0).unwrap();
    let before = (alloc.stats().allocated_bytes, alloc.snapshot());
    // 3 MiB needs a 20 MiB segment: PyTorch reports the segment size it tried.
    let err = alloc.allocate(3 * MB, S0).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("CUDA out of memory. Tried to allocate 20.00 MiB."),
        "{text}"
    );
    assert!(text.contains("of which 4.00 MiB is free"), "{text}");
    assert!(
        text.contains("60.00 MiB is allocated by vmm-alloc"),
        "{text}"
    );
    assert_eq!(alloc.stats().num_ooms, 1);
    assert_eq!(
        alloc.stats().num_alloc_retries,
        1,
        "counted on the last stage only"
    );
    assert_eq!((alloc.stats().allocated_bytes, alloc.snapshot()), before);
    alloc.deallocate(big).unwrap();
    let ok = alloc.allocate(3 * MB, S0).unwrap();
    alloc.deallocate(ok).unwrap();
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let backend = sim(1 << 30);
    let alloc = classic(&backend, "");
    let a = alloc.allocate(4096, S0).unwrap();
    let p = a.ptr();
    let before = (alloc.stats(), alloc.snapshot());
    assert!(matches!(
        alloc.allocate(0, S0),
        Err(AllocError::InvalidSize { .. })
    ));
    assert!(matches!(
        alloc.allocate(usize::MAX, S0),
        Err(AllocError::TooLarge { .. })
    ));
    let interior = p.checked_add(512).unwrap();
    assert!(matches!(
        alloc.deallocate_ptr(interior),
        Err(AllocError::InvalidPointer(_))
    ));
    assert!(alloc.record_stream(interior, StreamId::sim(2)).is_err());
    assert_eq!((alloc.stats(), alloc.snapshot()), before);
    alloc.deallocate(a).unwrap();
    assert!(matches!(
        alloc.deallocate_ptr(p),
        Err(AllocError::DoubleFree(_))
    ));
    assert!(ClassicAllocator::with_alloc_conf(backend.clone(), "max_split_size_mb:2").is_err());
}

#[test]
fn dropping_with_live_blocks_and_pending_events_leaves_nothing() {
    let backend = sim(1 << 30);
    let side = StreamId::sim(5);
    backend.hold_stream(side);
    {
        let alloc = classic(&backend, "");
        let _live = alloc.allocate(30 * MB, S0).unwrap();
        let pending = alloc.allocate(MB, S0).unwrap();
        alloc.record_stream(pending.ptr(), side).unwrap();
        alloc.deallocate(pending).unwrap();
        assert!(!backend.live().is_empty());
    }
    assert!(backend.live().is_empty(), "{}", backend.live());
}

#[test]
fn garbage_collection_frees_the_oldest_cached_segments_above_the_threshold() {
    let backend = sim(1 << 30);
    // 160 MiB allowed, collect above half of it (80 MiB).
    let fraction = 160.0 / 1024.0;
    let conf = format!("garbage_collection_threshold:0.5,per_process_memory_fraction:{fraction}");
    let alloc = classic(&backend, &conf);
    // Cache a 40 MiB segment, then reuse a 48 MiB one (40 MiB never fits it) five times.
    let old = alloc.allocate(40 * MB, S0).unwrap();
    alloc.deallocate(old).unwrap();
    for _ in 0..5 {
        let x = alloc.allocate(48 * MB, S0).unwrap();
        alloc.deallocate(x).unwrap();
    }
    assert_eq!(alloc.stats().reserved_bytes.all.current, 88 * MB as u64);
    // 88 MiB cached > 80 MiB: a new segment first collects the block unused longest, the 40 MiB
    // one, and keeps the 48 MiB one that was just used.
    let y = alloc.allocate(64 * MB, S0).unwrap();
    assert_eq!(alloc.stats().num_device_free, 1);
    assert_eq!(
        alloc.stats().reserved_bytes.all.current,
        (48 + 64) * MB as u64
    );
    alloc.deallocate(y).unwrap();
    // Without the threshold nothing is collected: 40 + 48 + 64 MiB fit in 160.
    let alloc = classic(&backend, &format!("per_process_memory_fraction:{fraction}"));
    let old = alloc.allocate(40 * MB, S0).unwrap();
    alloc.deallocate(old).unwrap();
    let x = alloc.allocate(48 * MB, S0).unwrap();
    alloc.deallocate(x).unwrap();
    let y = alloc.allocate(64 * MB, S0).unwrap();
    assert_eq!(alloc.stats().num_device_free, 0);
    alloc.deallocate(y).unwrap();
}

#[test]
fn real_bytes_survive_splits_merges_and_reuse_on_host() {
    use vmm_alloc::backend::{HostBackend, HostConfig};
    let host = HostBackend::with_config(HostConfig {
        capacity: 256 * MB,
        ..HostConfig::default()
    })
    .unwrap();
    let alloc = ClassicAllocator::with_alloc_conf(host.clone(), "").unwrap();
    let pattern = |seed: u8, len: usize| -> Vec<u8> {
        (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
    };
    // Three blocks split from one 20 MiB segment, each filled with its own bytes.
    let blocks: Vec<_> = (0..3u8)
        .map(|i| {
            let a = alloc.allocate(3 * MB, S0).unwrap();
            host.write(a.ptr(), &pattern(i, 3 * MB)).unwrap();
            (i, a)
        })
        .collect();
    assert_eq!(alloc.stats().segment.all.current, 1);
    let mut blocks = blocks.into_iter();
    let (_, first) = blocks.next().unwrap();
    alloc.deallocate(first).unwrap();
    // The freed block is reused and overwritten; its neighbours keep their bytes.
    let again = alloc.allocate(3 * MB, S0).unwrap();
    host.write(again.ptr(), &pattern(9, 3 * MB)).unwrap();
    for (i, a) in blocks {
        let mut out = vec![0; 3 * MB];
        host.read(a.ptr(), &mut out).unwrap();
        assert!(out == pattern(i, 3 * MB), "block {i} changed");
        alloc.deallocate(a).unwrap();
    }
    alloc.deallocate(again).unwrap();
    alloc.empty_cache().unwrap();
    assert!(host.live().is_empty(), "{}", host.live());
}
