//! The per-stream front cache (`ExpandableConfig::front_cache`, Note [Front cache] in
//! `src/expandable/front/mod.rs`): what a user reads is the same as without it (every block counter
//! and its peak, after every call), stashed memory serves another stream under pressure, blocks
//! used by other streams still wait for their events, and a double free is still told.

use proptest::prelude::*;
use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::config::{ExpandableConfig, FrontCacheMode};
use vmm_alloc::stats::MemoryStats;
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::{AllocError, Allocation, Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const S1: StreamId = StreamId::sim(1);
const S2: StreamId = StreamId::sim(2);

fn sim(capacity: usize) -> SimBackend {
    SimBackend::with_config(SimConfig {
        capacity,
        ..SimConfig::default()
    })
    .unwrap()
}

fn front(on: bool) -> ExpandableConfig {
    ExpandableConfig {
        front_cache: if on {
            FrontCacheMode::Always
        } else {
            FrontCacheMode::Off
        },
        ..ExpandableConfig::default()
    }
}

/// The counters a user reads that depend only on the calls, not on where blocks are placed.
fn counters(s: &MemoryStats) -> impl PartialEq + std::fmt::Debug {
    (
        s.allocation,
        s.allocated_bytes,
        s.active,
        s.active_bytes,
        s.requested_bytes,
        s.num_ooms,
    )
}

#[test]
fn a_parked_block_is_taken_back_by_the_same_request_and_the_totals_count_both_calls() {
    let alloc = ExpandableAllocator::new(sim(1 << 30), front(true)).unwrap();
    let a = alloc.allocate(5000, S1).unwrap();
    let b = alloc.allocate(3 * MB, S1).unwrap();
    let pa = a.ptr();
    alloc.deallocate(a).unwrap();
    let again = alloc.allocate(5000, S1).unwrap();
    assert_eq!(again.ptr(), pa, "the stashed block serves the same request");
    let s = alloc.stats();
    assert_eq!(s.allocation.all.current, 2);
    assert_eq!((s.allocation.all.allocated, s.allocation.all.freed), (3, 1));
    assert_eq!(s.allocation.small_pool.allocated, 2);
    assert_eq!(s.allocated_bytes.all.peak, (5120 + 3 * MB) as u64);
    assert_eq!(s.requested_bytes.all.allocated, (2 * 5000 + 3 * MB) as u64);
    alloc.check_invariants().unwrap();
    alloc.deallocate(again).unwrap();
    alloc.deallocate(b).unwrap();
    // Stashed, but stats() reads them freed, and empty_cache gives their pages back.
    let s = alloc.stats();
    assert_eq!(
        (s.allocated_bytes.all.current, s.active.all.current),
        (0, 0)
    );
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
    alloc.check_invariants().unwrap();
}

/// Note [Front allowance]: a loop that frees one size and asks for another keeps its stash
/// across the core's allocation, and the peaks stay what a user read: 20 KiB live at most
/// before the last request (the stashed 4 KiB block is not counted on top of the 12 KiB one),
/// 24 KiB after it, exactly as without the front cache.
#[test]
fn a_stash_kept_across_a_core_allocation_leaves_the_peaks_exact() {
    let run = |on: bool| {
        let alloc = ExpandableAllocator::new(sim(1 << 30), front(on)).unwrap();
        let a = alloc.allocate(4096, S1).unwrap();
        let b = alloc.allocate(8192, S1).unwrap();
        let pa = a.ptr();
        alloc.deallocate(a).unwrap();
        let c = alloc.allocate(12288, S1).unwrap();
        alloc.check_invariants().unwrap();
        let mid = alloc.stats();
        let d = alloc.allocate(4096, S1).unwrap();
        assert_eq!(d.ptr(), pa, "the 4 KiB block comes back");
        alloc.check_invariants().unwrap();
        let end = alloc.stats();
        for x in [b, c, d] {
            alloc.deallocate(x).unwrap();
        }
        (mid, end)
    };
    let ((mid_on, end_on), (mid_off, end_off)) = (run(true), run(false));
    assert_eq!(mid_on.allocated_bytes.all.peak, 20 << 10);
    assert_eq!(end_on.allocated_bytes.all.peak, 24 << 10);
    assert_eq!(counters(&mid_on), counters(&mid_off));
    assert_eq!(counters(&end_on), counters(&end_off));
}

/// Note [Stash age]: a stashed block between used memory whose size is not asked for again goes
/// back to the core after its stream's fifth slow allocation, and best fit then reuses its range;
/// until then the core serves other sizes around it. (The requests alternate between the pools,
/// so each misses the arena the one before was lent, Note [Front arena], and takes the lock; the
/// large ones fit in a page mapped first, so none grows, which would give the stash back.)
#[test]
fn a_stashed_block_not_asked_for_again_goes_back_to_the_core() {
    let alloc = ExpandableAllocator::new(sim(1 << 30), front(true)).unwrap();
    let first = alloc.allocate(3 * MB, S1).unwrap();
    let x = alloc.allocate(8192, S1).unwrap();
    let y = alloc.allocate(4096, S1).unwrap();
    let px = x.ptr();
    alloc.deallocate(x).unwrap();
    let mut kept = vec![first, y];
    for size in [3 * MB, 1024, 5 * MB, 2048] {
        let a = alloc.allocate(size, S1).unwrap();
        assert_ne!(
            a.ptr(),
            px,
            "still stashed: the {size}-byte request goes elsewhere"
        );
        kept.push(a);
    }
    let fifth = alloc.allocate(3072, S1).unwrap();
    assert_eq!(
        fifth.ptr(),
        px,
        "given back: best fit takes the 8 KiB range"
    );
    alloc.check_invariants().unwrap();
    kept.push(fifth);
    for a in kept {
        alloc.deallocate(a).unwrap();
    }
    alloc.check_invariants().unwrap();
}

/// Note [Stash age]: a stashed block beside a free range goes back to the core at its stream's
/// next slow allocation (freed, it merges), which best fit then serves from the merged range.
/// (The request is longer than the free range beside the block, the one lent to the stream's
/// arena, Note [Front arena], so it takes the lock.)
#[test]
fn a_stashed_block_beside_a_free_range_goes_back_at_the_next_slow_allocation() {
    let alloc = ExpandableAllocator::new(sim(1 << 30), front(true)).unwrap();
    let a = alloc.allocate(3 * MB, S1).unwrap();
    let b = alloc.allocate(4 * MB, S1).unwrap();
    let pb = b.ptr();
    alloc.deallocate(b).unwrap();
    let z = alloc.allocate(16 * MB, S1).unwrap();
    assert_eq!(
        z.ptr(),
        pb,
        "given back and merged with the page's free end"
    );
    alloc.check_invariants().unwrap();
    for x in [a, z] {
        alloc.deallocate(x).unwrap();
    }
}

/// Two streams, each a ring of 8 live blocks: block `i` of the run asks for `size(i)`, and each
/// of `steps` steps frees each ring's oldest block and asks for the next size, the allocator's
/// invariants checked after every step. Returns the allocations that took the lock from step
/// `warm` on, and the statistics at the end (before the rings are freed).
fn two_rings(
    on: bool,
    size: impl Fn(usize) -> usize,
    steps: usize,
    warm: usize,
) -> (u64, MemoryStats) {
    let alloc = ExpandableAllocator::new(sim(1 << 30), front(on)).unwrap();
    let mut rings: Vec<Vec<Allocation>> = [S1, S2]
        .iter()
        .map(|&s| {
            (0..8)
                .map(|i| alloc.allocate(size(i), s).unwrap())
                .collect()
        })
        .collect();
    let mut slow_before = 0;
    for step in 0..steps {
        if step == warm {
            slow_before = alloc.front_slow_allocations();
        }
        for (ring, s) in rings.iter_mut().zip([S1, S2]) {
            alloc.deallocate(ring.remove(0)).unwrap();
            ring.push(alloc.allocate(size(step + 8), s).unwrap());
        }
        alloc.check_invariants().unwrap();
    }
    let slow_when_warm = alloc.front_slow_allocations() - slow_before;
    let stats = alloc.stats();
    for ring in rings {
        for a in ring {
            alloc.deallocate(a).unwrap();
        }
    }
    alloc.check_invariants().unwrap();
    (slow_when_warm, stats)
}

/// The loop of `benches/threads.rs` on two streams, from a cold start: each keeps a ring of 8
/// live blocks and per step frees the oldest and asks for the next of six sizes (both pools),
/// so every request is for a size freed four allocations before, with other sizes asked for in
/// between. Once the rings are warm the stash serves every request without the allocator's lock
/// (Note [Front allowance], Note [Stash age]), and the statistics match the allocator without
/// the front cache.
#[test]
fn a_ring_of_six_sizes_is_served_without_the_lock_once_warm() {
    const SIZES: [usize; 6] = [512, 4096, 65536, MB, 3 * MB, 20 * MB];
    let run = |on| two_rings(on, |i| SIZES[i % 6], 600, 100);
    let ((slow_on, on), (_, off)) = (run(true), run(false));
    assert_eq!(slow_on, 0, "steps 100-599 of both rings took the lock");
    assert_eq!(counters(&on), counters(&off));
}

/// Note [Front arena]: the loop of `benches/threads.rs`'s `threads-varied` on two streams, each a
/// ring of 8 live blocks whose next request is the next of 48 sizes (512 B up by 23 % a step), so
/// no size comes back within the stash's reach. Once warm, most requests are carved from the
/// free ranges lent to their stream's shard, without the allocator's lock, and the statistics
/// (every block counter and its peak) match the allocator without the front cache.
#[test]
fn sizes_that_do_not_recur_are_carved_from_the_arena_without_the_lock() {
    let varied = |i: usize| ((512.0 * 1.23f64.powi((i % 48) as i32)) as usize).div_ceil(512) * 512;
    let run = |on| two_rings(on, varied, 1000, 200);
    let ((slow_on, on), (_, off)) = (run(true), run(false));
    assert!(
        slow_on < 160,
        "{slow_on} of 1,600 warm requests took the lock"
    );
    assert_eq!(counters(&on), counters(&off));
}

/// A request the stream's free ranges cannot hold gives the stash back before the core grows:
/// the stashed 20 MiB block's page serves a 10 MiB request, nothing new is mapped.
#[test]
fn the_core_never_grows_while_a_stashed_block_could_serve() {
    let alloc = ExpandableAllocator::new(sim(1 << 30), front(true)).unwrap();
    let big = alloc.allocate(20 * MB, S1).unwrap();
    alloc.deallocate(big).unwrap();
    let half = alloc.allocate(10 * MB, S1).unwrap();
    let s = alloc.stats();
    assert_eq!(s.reserved_bytes.all.current, 20 * MB as u64);
    assert_eq!(s.allocated_bytes.all.current, 10 * MB as u64);
    alloc.check_invariants().unwrap();
    alloc.deallocate(half).unwrap();
}

#[test]
fn memory_parked_on_one_stream_serves_another_that_runs_out() {
    let alloc = ExpandableAllocator::new(sim(64 * MB), front(true)).unwrap();
    let blocks: Vec<Allocation> = (0..3)
        .map(|_| alloc.allocate(20 * MB, S1).unwrap())
        .collect();
    for b in blocks {
        alloc.deallocate(b).unwrap();
    }
    alloc.check_invariants().unwrap();
    // 60 MiB mapped for stream 1, all of it stashed: stream 2's 50 MiB needs it back.
    let big = alloc.allocate(50 * MB, S2).unwrap();
    let s = alloc.stats();
    assert_eq!(s.allocated_bytes.all.current, 50 * MB as u64);
    assert!(s.reserved_bytes.all.current <= 64 * MB as u64);
    alloc.check_invariants().unwrap();
    alloc.deallocate(big).unwrap();
}

#[test]
fn a_block_used_by_another_stream_still_waits_for_its_event() {
    let backend = sim(1 << 30);
    let alloc = ExpandableAllocator::new(backend.clone(), front(true)).unwrap();
    let side = StreamId::sim(7);
    backend.hold_stream(side);
    let a = alloc.allocate(MB, S1).unwrap();
    let p = a.ptr();
    alloc.record_stream(p, side).unwrap();
    alloc.deallocate(a).unwrap();
    let b = alloc.allocate(MB, S1).unwrap();
    assert_ne!(
        b.ptr(),
        p,
        "memory the side stream still uses is not reused"
    );
    assert_eq!(
        alloc.stats().active.all.current,
        2,
        "the block stays active"
    );
    alloc.check_invariants().unwrap();
    backend.release_stream(side);
    alloc.deallocate(b).unwrap();
    let c = alloc.allocate(MB, S1).unwrap();
    alloc.deallocate(c).unwrap();
    let s = alloc.stats();
    assert_eq!((s.active.all.current, s.allocation.all.current), (0, 0));
    alloc.check_invariants().unwrap();
}

#[test]
fn a_parked_block_freed_again_by_address_is_a_double_free() {
    let alloc = ExpandableAllocator::new(sim(1 << 30), front(true)).unwrap();
    let a = alloc.allocate(4096, S1).unwrap();
    let p = a.ptr();
    alloc.deallocate(a).unwrap();
    assert!(matches!(
        alloc.deallocate_ptr(p),
        Err(AllocError::DoubleFree(_))
    ));
    assert!(alloc.record_stream(p, S2).is_err());
    alloc.check_invariants().unwrap();
}

/// A block borrowed from the large pool (Note [Borrowing]) counts in the large pool: its free
/// goes through the core, never stashed, so freeing it and asking again counts as without the
/// front cache (a stashed pair would count in the small pool). The setup of
/// `a_small_request_under_pressure_borrows_a_free_range_of_the_large_pool`: 24 MiB device, a
/// full small page, 14 MiB free beside a live block in a large page.
#[test]
fn a_borrowed_block_is_never_parked() {
    let run = |on: bool| {
        let a = ExpandableAllocator::new(sim(24 * MB), front(on)).unwrap();
        let mut live: Vec<_> = (0..2).map(|_| a.allocate(MB, S1).unwrap()).collect();
        let big = a.allocate(12 * MB, S1).unwrap();
        live.push(a.allocate(6 * MB, S1).unwrap());
        a.deallocate(big).unwrap();
        let borrowed = a.allocate(MB, S1).unwrap();
        a.deallocate(borrowed).unwrap();
        let again = a.allocate(MB, S1).unwrap();
        a.check_invariants().unwrap();
        let s = a.stats();
        assert_eq!(s.allocated_bytes.large_pool.current, 7 * MB as u64, "{s:?}");
        a.deallocate(again).unwrap();
        for b in live {
            a.deallocate(b).unwrap();
        }
        a.check_invariants().unwrap();
        a.stats()
    };
    assert_eq!(counters(&run(true)), counters(&run(false)));
}

/// One call of the comparison: allocate `SIZES[size]` on stream `stream`, free the `i`-th live
/// block (typed or by address), record a use by stream 2, read statistics, empty the cache.
#[derive(Clone, Debug)]
enum Op {
    Alloc { size: usize, stream: u64 },
    Free { i: usize, by_ptr: bool },
    Record { i: usize },
    EmptyCache,
    ResetPeaks,
    Stats,
}

const SIZES: [usize; 5] = [512, 65536, MB, 3 * MB, 25 * MB + 512];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SIZES.len(), 1..3u64).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => (any::<usize>(), any::<bool>()).prop_map(|(i, by_ptr)| Op::Free { i, by_ptr }),
        1 => any::<usize>().prop_map(|i| Op::Record { i }),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ResetPeaks),
        2 => Just(Op::Stats),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The same calls with the front cache on and off: whenever statistics are read (reading
    /// them gives the stashed blocks back, so they are read at random points, not after every
    /// call, where no block would stay stashed long enough to be taken back) the block counters
    /// (current, peak and totals of allocations, bytes, active blocks, requested bytes) and the
    /// out-of-memory count agree, and both allocators' invariants hold (blocks used by another
    /// stream become inactive at the same calls: while any waits, allocations take the slow
    /// path, which looks at events as the core always does).
    #[test]
    fn front_cache_counts_match_the_core(ops in proptest::collection::vec(op(), 1..120)) {
        let off = ExpandableAllocator::new(sim(4 << 30), front(false)).unwrap();
        let on = ExpandableAllocator::new(sim(4 << 30), front(true)).unwrap();
        let mut live: Vec<(Allocation, Allocation)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { size, stream } => {
                    let s = StreamId::sim(stream);
                    match (off.allocate(SIZES[size], s), on.allocate(SIZES[size], s)) {
                        (Ok(a), Ok(b)) => live.push((a, b)),
                        (Err(_), Err(_)) => {}
                        (a, b) => {
                            let (a, b) = (a.map(|a| a.into_ptr()), b.map(|b| b.into_ptr()));
                            prop_assert!(false, "one failed where the other did not: {a:?} {b:?}");
                        }
                    }
                }
                Op::Free { i, by_ptr } if !live.is_empty() => {
                    let (a, b) = live.swap_remove(i % live.len());
                    if by_ptr {
                        off.deallocate_ptr(a.into_ptr()).unwrap();
                        on.deallocate_ptr(b.into_ptr()).unwrap();
                    } else {
                        off.deallocate(a).unwrap();
                        on.deallocate(b).unwrap();
                    }
                }
                Op::Record { i } if !live.is_empty() => {
                    let (a, b) = &live[i % live.len()];
                    off.record_stream(a.ptr(), S2).unwrap();
                    on.record_stream(b.ptr(), S2).unwrap();
                }
                Op::EmptyCache => {
                    off.empty_cache().unwrap();
                    on.empty_cache().unwrap();
                }
                Op::ResetPeaks => {
                    off.reset_peak_stats();
                    on.reset_peak_stats();
                }
                Op::Stats => {
                    prop_assert_eq!(counters(&off.stats()), counters(&on.stats()));
                }
                _ => {}
            }
            on.check_invariants().unwrap();
            off.check_invariants().unwrap();
        }
        for (a, b) in live {
            off.deallocate(a).unwrap();
            on.deallocate(b).unwrap();
        }
        let sn = on.stats();
        prop_assert_eq!(counters(&off.stats()), counters(&sn));
        prop_assert_eq!(sn.allocated_bytes.all.current, 0);
        on.empty_cache().unwrap();
        on.check_invariants().unwrap();
    }
}
