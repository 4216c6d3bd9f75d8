//! `Buffer`, the backend-generic core of `DeviceBuffer<T>`: freed on drop, stream-ordered, with
//! PyTorch's `record_stream` semantics, the allocator kept alive by its buffers. Run on Sim (held
//! events decide when a stream's work completes) and on Host (real bytes), for both allocators,
//! and from several threads. The cudarc layer over it is checked on a GPU
//! (`tests/cuda_buffer.rs`, `scripts/gpu-validate.sh`).

use std::sync::{Arc, Mutex};
use std::thread;

use vmm_alloc::allocator::leaked_allocations;
use vmm_alloc::backend::{Backend, CallKind, HostBackend, SimBackend};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::config::{ExpandableConfig, FrontCacheMode};
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::{AllocError, Allocator, Buffer, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const HOME: StreamId = StreamId::DEFAULT;
const SIDE: StreamId = StreamId::sim(7);

/// The leak counter is process-wide: tests that read it take turns.
static LEAK_COUNTER: Mutex<()> = Mutex::new(());

fn expandable<B: Backend + Clone>(backend: &B) -> Arc<ExpandableAllocator<B>> {
    Arc::new(ExpandableAllocator::new(backend.clone(), ExpandableConfig::default()).unwrap())
}

fn classic<B: Backend + Clone>(backend: &B) -> Arc<ClassicAllocator<B>> {
    Arc::new(ClassicAllocator::with_alloc_conf(backend.clone(), "").unwrap())
}

/// What a dropped buffer must do on one allocator: free at once, reusable on its own stream with
/// no synchronization, and not reused while a declared side stream's work is pending.
fn drop_is_stream_ordered<A: Allocator>(backend: &SimBackend, alloc: Arc<A>) {
    let syncs = || backend.calls().calls(CallKind::Synchronize);
    let buf = Buffer::new(&alloc, 3 * MB, HOME).unwrap();
    let p = buf.ptr();
    assert_eq!(alloc.stats().allocated_bytes.all.current as usize, 3 * MB);
    let before = syncs();
    drop(buf);
    assert_eq!(
        alloc.stats().allocated_bytes.all.current,
        0,
        "freed on drop"
    );
    let again = Buffer::new(&alloc, 3 * MB, HOME).unwrap();
    assert_eq!(again.ptr(), p, "reused on its own stream at once");
    assert_eq!(syncs(), before, "a drop never synchronizes");

    backend.hold_stream(SIDE);
    again.record_stream(SIDE).unwrap();
    again.record_stream(SIDE).unwrap(); // a repeat is harmless
    again.record_stream(HOME).unwrap(); // the home stream needs nothing
    drop(again);
    let other = Buffer::new(&alloc, 3 * MB, HOME).unwrap();
    assert_ne!(other.ptr(), p, "side stream still running: not reused");
    assert!(alloc.stats().active_bytes.all.current as usize >= 6 * MB);
    backend.release_stream(SIDE);
    let third = Buffer::new(&alloc, 3 * MB, HOME).unwrap();
    assert_eq!(
        third.ptr(),
        p,
        "reused once the side stream's work completed"
    );
    drop((other, third));
    assert_eq!(alloc.stats().allocated_bytes.all.current, 0);
}

#[test]
fn drop_is_stream_ordered_on_expandable() {
    let backend = SimBackend::new();
    drop_is_stream_ordered(&backend, expandable(&backend));
}

#[test]
fn drop_is_stream_ordered_on_classic() {
    let backend = SimBackend::new();
    drop_is_stream_ordered(&backend, classic(&backend));
}

#[test]
fn buffers_keep_the_allocator_alive_and_the_last_one_tears_it_down() {
    let backend = SimBackend::new();
    let alloc = expandable(&backend);
    let a = Buffer::new(&alloc, MB, HOME).unwrap();
    let b = Buffer::new(&alloc, 5 * MB, SIDE).unwrap();
    drop(alloc); // the user's handle goes; the buffers still own theirs
    assert!(!backend.live().is_empty());
    assert_eq!(b.allocator().stats().allocation.all.current, 2);
    drop(a);
    drop(b);
    assert!(
        backend.live().is_empty(),
        "the last buffer dropped the allocator, which gave everything back: {}",
        backend.live()
    );
}

#[test]
fn ranges_are_bounds_checked() {
    let backend = SimBackend::new();
    let alloc = expandable(&backend);
    let buf = Buffer::new(&alloc, 1000, HOME).unwrap();
    assert_eq!(buf.len(), 1000);
    let (at, len) = buf.range(100..400).unwrap();
    assert_eq!((at.offset_from(buf.ptr()), len), (Some(100), 300));
    assert_eq!(buf.range(0..1000).map(|r| r.1), Some(1000));
    assert!(buf.range(0..1001).is_none());
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = buf.range(10..5);
    assert!(reversed.is_none());
}

#[test]
fn errors_are_values_and_failed_frees_are_counted_as_leaks() {
    let _turn = LEAK_COUNTER.lock().unwrap_or_else(|p| p.into_inner());
    let backend = SimBackend::new();
    let alloc = expandable(&backend);
    assert!(matches!(
        Buffer::new(&alloc, 0, HOME),
        Err(AllocError::InvalidSize { size: 0 })
    ));

    // An allocation given to a buffer of another allocator cannot be freed through it: the error
    // names it as another allocator's.
    let other = expandable(&SimBackend::new());
    let foreign = alloc.allocate(MB, HOME).unwrap();
    let p = foreign.ptr();
    let before = leaked_allocations();
    let wrong = Buffer::adopt(other, foreign);
    assert!(matches!(wrong.free(), Err(AllocError::ForeignAllocation { ptr: q, .. }) if q == p));
    let after = leaked_allocations();
    assert_eq!(after.allocations, before.allocations + 1);
    assert_eq!(after.bytes, before.bytes + MB as u64);
    // Still live in its own allocator, which frees it by address.
    alloc.deallocate_ptr(p).unwrap();

    // A right `free` reports success and counts nothing.
    let fine = Buffer::new(&alloc, MB, HOME).unwrap();
    fine.free().unwrap();
    assert_eq!(leaked_allocations(), after);
    assert_eq!(alloc.stats().allocated_bytes.all.current, 0);
}

#[test]
fn a_dropped_allocation_is_counted_and_into_ptr_is_not() {
    let _turn = LEAK_COUNTER.lock().unwrap_or_else(|p| p.into_inner());
    let backend = SimBackend::new();
    let alloc = expandable(&backend);
    let before = leaked_allocations();
    let kept = alloc.allocate(2 * MB, HOME).unwrap().into_ptr();
    assert_eq!(
        leaked_allocations(),
        before,
        "into_ptr hands ownership over"
    );
    alloc.deallocate_ptr(kept).unwrap();
    #[allow(clippy::let_underscore_must_use)]
    let _ = alloc.allocate(2 * MB, HOME).unwrap(); // dropped: a leak
    let after = leaked_allocations();
    assert_eq!(after.allocations, before.allocations + 1);
    assert_eq!(after.bytes, before.bytes + 2 * MB as u64);
    assert_eq!(
        alloc.stats().allocated_bytes.all.current as usize,
        2 * MB,
        "the memory of a dropped Allocation stays allocated"
    );
}

/// Fills `buf` with bytes derived from `seed`.
fn fill<B: Backend, A: Allocator + ?Sized>(backend: &B, buf: &Buffer<A>, seed: u8) {
    let data: Vec<u8> = (0..buf.len()).map(|i| seed ^ (i as u8)).collect();
    backend.write(buf.ptr(), &data).unwrap();
}

/// Whether `buf` still holds what [`fill`] wrote with `seed`.
fn holds<B: Backend, A: Allocator + ?Sized>(backend: &B, buf: &Buffer<A>, seed: u8) -> bool {
    let mut out = vec![0u8; buf.len()];
    backend.read(buf.ptr(), &mut out).unwrap();
    out.iter().enumerate().all(|(i, &b)| b == seed ^ (i as u8))
}

#[test]
fn host_bytes_of_live_buffers_survive_drops_and_reuse() {
    let backend = HostBackend::new().unwrap();
    let alloc = expandable(&backend);
    let mut live: Vec<(Buffer<_>, u8)> = Vec::new();
    for round in 0..6u8 {
        for k in 0..4u8 {
            let seed = round * 16 + k;
            let size = (1 + (seed as usize * 7919) % 5) * MB / 2 + seed as usize * 512;
            let buf = Buffer::new(&alloc, size, HOME).unwrap();
            fill(&backend, &buf, seed);
            if k % 2 == 1 {
                buf.record_stream(SIDE).unwrap();
            }
            live.push((buf, seed));
        }
        // Drop every other buffer (the side stream completes at once on Host), reallocate.
        let mut i = 0;
        live.retain(|_| {
            i += 1;
            i % 2 == 0
        });
        for (buf, seed) in &live {
            assert!(holds(&backend, buf, *seed), "round {round}: bytes changed");
        }
    }
    drop(live);
    assert_eq!(alloc.stats().allocated_bytes.all.current, 0);
}

#[test]
fn buffers_from_many_threads_share_one_allocator() {
    let backend = HostBackend::new().unwrap();
    let alloc = expandable(&backend);
    let _turn = LEAK_COUNTER.lock().unwrap_or_else(|p| p.into_inner());
    let leaks_before = leaked_allocations();
    let workers: Vec<_> = (0..4u8)
        .map(|t| {
            let (alloc, backend) = (alloc.clone(), backend.clone());
            thread::spawn(move || {
                let own = StreamId::sim(100 + t as u64);
                let mut kept: Vec<(Buffer<_>, u8)> = Vec::new();
                for i in 0..60u8 {
                    let seed = t.wrapping_mul(61).wrapping_add(i);
                    let stream = if i % 3 == 0 { HOME } else { own };
                    let buf = Buffer::new(&alloc, 64 * 1024 + (i as usize) * 4096, stream).unwrap();
                    fill(&backend, &buf, seed);
                    if i % 4 == 0 {
                        buf.record_stream(StreamId::sim(200 + t as u64)).unwrap();
                    }
                    kept.push((buf, seed));
                    if kept.len() > 8 {
                        let (old, s) = kept.remove(i as usize % kept.len());
                        assert!(holds(&backend, &old, s), "thread {t}: bytes changed");
                        drop(old); // freed on this thread, allocated maybe on another stream
                    }
                }
                // Hand the rest to the main thread: buffers are Send.
                kept
            })
        })
        .collect();
    let handed: Vec<_> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    for (buf, seed) in &handed {
        assert!(holds(&backend, buf, *seed));
    }
    drop(handed);
    assert_eq!(alloc.stats().allocated_bytes.all.current, 0);
    assert_eq!(leaked_allocations(), leaks_before, "no buffer leaked");
}

/// A buffer dropped on an allocator with the front cache on goes back as the allocation it was,
/// not just its address, so the next buffer of its size on its stream is served from the stash
/// without the allocator's lock (Note [Front cache]); the counters match the allocator without
/// the front cache.
#[test]
fn a_dropped_buffer_is_stashed_by_the_front_cache() {
    let run = |front_cache: bool| {
        let config = ExpandableConfig {
            front_cache: if front_cache {
                FrontCacheMode::Always
            } else {
                FrontCacheMode::Off
            },
            ..ExpandableConfig::default()
        };
        let alloc = Arc::new(ExpandableAllocator::new(SimBackend::new(), config).unwrap());
        let first = Buffer::new(&alloc, 3 * MB, HOME).unwrap();
        let p = first.ptr();
        let slow = alloc.front_slow_allocations();
        drop(first);
        let again = Buffer::new(&alloc, 3 * MB, HOME).unwrap();
        assert_eq!(again.ptr(), p);
        let took_the_lock = alloc.front_slow_allocations() - slow;
        again.free().unwrap();
        let s = alloc.stats();
        (
            took_the_lock,
            s.allocation,
            s.allocated_bytes,
            s.requested_bytes,
        )
    };
    let (on, off) = (run(true), run(false));
    assert_eq!(on.0, 0, "served from the stash");
    assert_eq!((on.1, on.2, on.3), (off.1, off.2, off.3));
}
