//! When the front cache stashes by default (`FrontCacheMode::OnContention`, Note [Engage on
//! contention] in `src/expandable/front/engage.rs`): never for one thread, whose allocator is
//! then the one without the front cache call for call; once frees find the lock taken; and no
//! longer once its stashes serve too few allocations.
//!
//! Contention is made, not waited for: the test holds the allocator's lock as an allocation
//! does (`while_allocating`) while another thread frees, and lets go only once that free has
//! counted the lock as taken. A lock held by a call the cache never serves (statistics, a
//! snapshot) is no contention (Note [Other calls]).

use std::sync::atomic::{AtomicBool, Ordering};

use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::config::{ExpandableConfig, FrontCacheMode};
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const S1: StreamId = StreamId::sim(1);
const S2: StreamId = StreamId::sim(2);
const RING: [usize; 6] = [512, 4096, 65536, MB, 3 * MB, 20 * MB];

fn sim() -> SimBackend {
    SimBackend::with_config(SimConfig {
        capacity: 1 << 30,
        ..SimConfig::default()
    })
    .unwrap()
}

fn alloc(mode: FrontCacheMode) -> ExpandableAllocator<SimBackend> {
    alloc_on(sim(), mode)
}

fn alloc_on(sim: SimBackend, mode: FrontCacheMode) -> ExpandableAllocator<SimBackend> {
    let config = ExpandableConfig {
        front_cache: mode,
        ..ExpandableConfig::default()
    };
    ExpandableAllocator::new(sim, config).unwrap()
}

/// Frees `a` on another thread while this one holds the allocator's lock as an allocation
/// does, and lets the lock go once the free has counted it taken.
fn free_while_locked(alloc: &ExpandableAllocator<SimBackend>, a: Allocation) {
    let before = alloc.front_contended_frees();
    std::thread::scope(|s| {
        let freer = alloc.while_allocating(|| {
            let freer = s.spawn(|| alloc.deallocate(a).unwrap());
            while alloc.front_contended_frees() == before {
                std::thread::yield_now();
            }
            freer
        });
        freer.join().unwrap();
    });
}

/// Frees `a` on another thread while this one holds the allocator's lock through a call the
/// front cache never serves (`with_backend`, as `stats()` and `snapshot()` do), and lets the
/// lock go once the free has found it taken (counted as contention or not), or has returned
/// without it (stashed by an engaged cache).
fn free_while_read(alloc: &ExpandableAllocator<SimBackend>, a: Allocation) {
    let done = AtomicBool::new(false);
    let seen = || {
        (
            alloc.front_frees_behind_other_calls(),
            alloc.front_contended_frees(),
        )
    };
    let before = seen();
    std::thread::scope(|s| {
        let freer = alloc.with_backend(|_| {
            let freer = s.spawn(|| {
                alloc.deallocate(a).unwrap();
                done.store(true, Ordering::SeqCst);
            });
            while seen() == before && !done.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            freer
        });
        freer.join().unwrap();
    });
}

/// Contended frees until the cache engages; how many it took (at most `limit`).
fn contend_until_engaged(alloc: &ExpandableAllocator<SimBackend>, limit: usize) -> usize {
    for n in 1..=limit {
        let a = alloc.allocate(4096, S2).unwrap();
        free_while_locked(alloc, a);
        if alloc.front_engaged() {
            return n;
        }
    }
    limit + 1
}

/// Steps of two streams' rings (free the oldest, allocate the next size) from `step`.
fn ring_steps(
    alloc: &ExpandableAllocator<SimBackend>,
    rings: &mut [Vec<Allocation>; 2],
    steps: std::ops::Range<usize>,
    sizes: impl Fn(usize) -> usize,
) -> Vec<u64> {
    let mut addrs = Vec::new();
    for step in steps {
        for (ring, s) in rings.iter_mut().zip([S1, S2]) {
            alloc.deallocate(ring.remove(0)).unwrap();
            let a = alloc.allocate(sizes(step), s).unwrap();
            addrs.push(a.ptr().get());
            ring.push(a);
        }
    }
    addrs
}

fn rings(alloc: &ExpandableAllocator<SimBackend>) -> [Vec<Allocation>; 2] {
    [S1, S2].map(|s| {
        (0..8)
            .map(|i| alloc.allocate(RING[i % 6], s).unwrap())
            .collect()
    })
}

/// One thread, two streams, every kind of call: the default allocator hands out the same
/// addresses and reads the same statistics as the one without the front cache, and never
/// engages it.
#[test]
fn one_thread_gets_exactly_the_allocator_without_the_front_cache() {
    let run = |mode| {
        let a = alloc(mode);
        let mut rs = rings(&a);
        let mut addrs = ring_steps(&a, &mut rs, 0..3000, |i| RING[(i + 8) % 6]);
        addrs.extend(ring_steps(&a, &mut rs, 0..3000, |i| (i % 97 + 1) * 40_000));
        let used = a.allocate(MB, S1).unwrap();
        a.record_stream(used.ptr(), S2).unwrap();
        a.deallocate(used).unwrap();
        a.empty_cache().unwrap();
        let engaged = a.front_engaged();
        a.check_invariants().unwrap();
        // Each Sim has a window of addresses of its own, placed by what else the process runs:
        // addresses compare as offsets from the lowest handed out.
        let low = addrs.iter().copied().min().unwrap_or(0);
        let offsets: Vec<u64> = addrs.iter().map(|&p| p - low).collect();
        (engaged, offsets, a.stats(), a.front_contended_frees())
    };
    let (auto, off) = (run(FrontCacheMode::OnContention), run(FrontCacheMode::Off));
    assert!(!auto.0, "one thread engaged the front cache");
    assert_eq!(auto.3, 0, "one thread found the lock taken");
    assert_eq!(
        auto.1, off.1,
        "addresses differ from the allocator without it"
    );
    assert_eq!(auto.2, off.2, "statistics differ");
}

/// Frees that find the lock taken engage the cache; a block another stream uses, allocated
/// before, is named then, so its free still waits for that stream; and a ring of recurring
/// sizes is then served from the stashes, window after window, without disengaging.
#[test]
fn contended_frees_engage_it_and_a_recurring_ring_keeps_it() {
    let backend = sim();
    let a = alloc_on(backend.clone(), FrontCacheMode::OnContention);
    let mut rs = rings(&a);
    let used = a.allocate(MB, S1).unwrap();
    let side = StreamId::sim(7);
    backend.hold_stream(side);
    a.record_stream(used.ptr(), side).unwrap();
    let took = contend_until_engaged(&a, 1000);
    assert!(took <= 1000, "1000 contended frees did not engage it");
    assert!(took >= 2, "one contended free engaged it");
    a.check_invariants().unwrap();
    let p = used.ptr();
    a.deallocate(used).unwrap();
    let again = a.allocate(MB, S1).unwrap();
    assert_ne!(
        again.ptr(),
        p,
        "a block in use by another stream was stashed"
    );
    a.deallocate(again).unwrap();
    backend.release_stream(side);
    let slow = a.front_slow_allocations();
    ring_steps(&a, &mut rs, 0..10_000, |i| RING[(i + 8) % 6]);
    assert!(
        a.front_engaged(),
        "a ring served from the stash disengaged it"
    );
    let slow = a.front_slow_allocations() - slow;
    assert!(
        slow < 1000,
        "{slow} of 20,000 ring allocations took the lock"
    );
    // A size the stash has never seen every eighth step: those take the lock, so windows are
    // judged, and the stash still serves most requests.
    let slow = a.front_slow_allocations();
    ring_steps(&a, &mut rs, 0..10_000, |i| match i % 8 {
        7 => 5 * MB + (i % 61) * 4096,
        _ => RING[(i + 8) % 6],
    });
    let slow = a.front_slow_allocations() - slow;
    assert!(
        slow >= 2_000,
        "only {slow} new sizes took the lock: no window was judged"
    );
    assert!(
        a.front_engaged(),
        "a stash serving most requests disengaged"
    );
    a.check_invariants().unwrap();
}

/// Steps of sixteen streams' rings taken in turn (stream `3 + step % 16` frees its oldest block
/// and allocates `sizes(step)`): each shard of the front cache sees four streams, the one just
/// served never next, so no request finds its stream's arena (Note [Front arena]), and sizes
/// that do not recur never find a stashed block either.
fn many_stream_steps(
    alloc: &ExpandableAllocator<SimBackend>,
    rings: &mut [Vec<Allocation>],
    steps: std::ops::Range<usize>,
    sizes: impl Fn(usize) -> usize,
) {
    for step in steps {
        let k = step % rings.len();
        let s = StreamId::sim(3 + k as u64);
        if rings[k].len() >= 4 {
            alloc.deallocate(rings[k].remove(0)).unwrap();
        }
        rings[k].push(alloc.allocate(sizes(step), s).unwrap());
    }
}

/// Requests the stashes and the arenas cannot serve: after a window mostly missed, the cache
/// disengages, gives its stash back (the statistics match the allocator without it), and waits
/// for four times as many contended frees before it engages again.
#[test]
fn a_cache_that_serves_too_few_disengages_and_waits_longer_next_time() {
    let a = alloc(FrontCacheMode::OnContention);
    let off = alloc(FrontCacheMode::Off);
    let mut rs: Vec<Vec<Allocation>> = (0..16).map(|_| Vec::new()).collect();
    let mut rs_off: Vec<Vec<Allocation>> = (0..16).map(|_| Vec::new()).collect();
    let first = contend_until_engaged(&a, 1000);
    assert!(first <= 1000);
    for _ in 0..first {
        let b = off.allocate(4096, S2).unwrap();
        off.deallocate(b).unwrap();
    }
    let varied = |i: usize| (i % 97 + 1) * 4_000;
    many_stream_steps(&a, &mut rs, 0..5000, varied);
    many_stream_steps(&off, &mut rs_off, 0..5000, varied);
    assert!(
        !a.front_engaged(),
        "a cache missing every request stayed engaged"
    );
    a.check_invariants().unwrap();
    assert_eq!(a.front_contended_frees(), 0, "the count starts again");
    let (sa, so) = (a.stats(), off.stats());
    assert_eq!(
        (
            sa.allocation,
            sa.allocated_bytes,
            sa.requested_bytes,
            sa.active
        ),
        (
            so.allocation,
            so.allocated_bytes,
            so.requested_bytes,
            so.active
        )
    );
    let second = contend_until_engaged(&a, 4 * first + 10);
    assert_eq!(second, 4 * first, "the second engagement's wait");
    a.check_invariants().unwrap();
}

/// A thread that only reads (a monitor calling `stats()`) beside one that allocates and frees:
/// every free that finds the lock held by the reader is no contention, so the cache never
/// engages, however often it happens, and the allocating thread's addresses are those of the
/// allocator without the cache; a free behind an allocation still counts.
#[test]
fn a_thread_reading_statistics_never_engages_it() {
    let a = alloc(FrontCacheMode::OnContention);
    let off = alloc(FrontCacheMode::Off);
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..300 {
        let size = RING[i % 6];
        let b = a.allocate(size, S1).unwrap();
        mine.push(b.ptr().get());
        free_while_read(&a, b);
        let b = off.allocate(size, S1).unwrap();
        theirs.push(b.ptr().get());
        off.deallocate(b).unwrap();
    }
    assert_eq!(a.front_frees_behind_other_calls(), 300);
    assert_eq!(a.front_contended_frees(), 0, "a reader's lock counted");
    assert!(!a.front_engaged(), "a reading thread engaged the cache");
    let offsets = |v: &[u64]| {
        let low = v.iter().copied().min().unwrap_or(0);
        v.iter().map(|&p| p - low).collect::<Vec<_>>()
    };
    assert_eq!(offsets(&mine), offsets(&theirs), "addresses differ");
    let b = a.allocate(4096, S2).unwrap();
    free_while_locked(&a, b);
    assert_eq!(a.front_contended_frees(), 1, "a free behind an allocation");
    a.check_invariants().unwrap();
}

/// `Always` stashes from the first call, `Off` never, whatever the threads do.
#[test]
fn always_and_off_ignore_contention() {
    let always = alloc(FrontCacheMode::Always);
    assert!(always.front_engaged());
    let off = alloc(FrontCacheMode::Off);
    for _ in 0..100 {
        let b = off.allocate(4096, S2).unwrap();
        off.deallocate(b).unwrap();
    }
    assert!(!off.front_engaged());
    assert_eq!(off.front_contended_frees(), 0);
    let mut rs = rings(&always);
    ring_steps(&always, &mut rs, 0..5000, |i| (i % 97 + 1) * 40_000);
    assert!(always.front_engaged(), "Always disengaged");
}
