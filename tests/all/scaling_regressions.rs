//! Issue 21, item 1: costs that grew faster than the work. Timings live in `benches/scaling.rs`;
//! these check what can be counted: a request larger than the device fails before any driver
//! work beyond a memory query, and the driver calls of one operation do not grow with the number
//! of streams the allocator serves.

use vmm_alloc::backend::{Backend, CallKind, SimConfig};
use vmm_alloc::{
    AllocError, Allocator, ClassicAllocator, ExpandableAllocator, ExpandableConfig, SimBackend,
    StreamId,
};

const MB: usize = 1 << 20;
const GB: usize = 1 << 30;

fn sim(capacity: usize) -> SimBackend {
    SimBackend::with_config(SimConfig {
        capacity,
        va_limit: 1 << 60,
        ..SimConfig::default()
    })
    .unwrap()
}

/// A 200 GiB request on an 80 GiB device, with some memory cached: an out-of-memory report at
/// once, no call but the memory query, the cache untouched, one `num_ooms`.
fn oversize_fails_fast<A: Allocator>(alloc: &A, sim: &SimBackend) {
    let cached = alloc.allocate(30 * MB, StreamId::DEFAULT).unwrap();
    alloc.deallocate(cached).unwrap();
    let before = (sim.calls(), alloc.stats(), alloc.snapshot());
    let err = alloc.allocate(200 * GB, StreamId::DEFAULT).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    assert!(
        err.to_string().contains("Tried to allocate 200.00 GiB"),
        "{err}"
    );
    let calls = sim.calls().since(&before.0);
    assert_eq!(
        calls.calls(CallKind::MemInfo),
        1,
        "the report's memory query"
    );
    assert_eq!(
        calls.total(),
        1,
        "no driver work but the memory query: {calls:?}"
    );
    let after = alloc.stats();
    assert_eq!(after.num_ooms, before.1.num_ooms + 1);
    assert_eq!(
        after.num_alloc_retries, before.1.num_alloc_retries,
        "no retry"
    );
    assert_eq!(after.reserved_bytes, before.1.reserved_bytes, "cache kept");
    assert_eq!(alloc.snapshot(), before.2);
}

#[test]
fn a_request_larger_than_the_device_fails_before_any_driver_work_expandable() {
    for config in [
        ExpandableConfig::default(),
        ExpandableConfig::pytorch_expandable(),
    ] {
        let sim = sim(80 * GB);
        let alloc = ExpandableAllocator::new(sim.clone(), config).unwrap();
        oversize_fails_fast(&alloc, &sim);
    }
}

/// The same request through the classic allocator, which does what PyTorch does (reference
/// §1.9): no segment is made (the driver would refuse it), the cache is freed, the retry is
/// counted, then the out-of-memory report. The only driver work: the cached segment's
/// `cudaFree` (unmap, release, free its reservation) and the report's memory query.
fn oversize_frees_the_cache_retries_and_fails(
    alloc: &ClassicAllocator<SimBackend>,
    sim: &SimBackend,
) {
    let cached = alloc.allocate(30 * MB, StreamId::DEFAULT).unwrap();
    alloc.deallocate(cached).unwrap();
    let (calls, stats) = (sim.calls(), alloc.stats());
    assert_eq!(stats.reserved_bytes.all.current, (30 * MB) as u64);
    let err = alloc.allocate(200 * GB, StreamId::DEFAULT).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    assert!(
        err.to_string().contains("Tried to allocate 200.00 GiB"),
        "{err}"
    );
    let calls = sim.calls().since(&calls);
    for kind in [CallKind::Reserve, CallKind::Create, CallKind::Map] {
        assert_eq!(calls.calls(kind), 0, "no segment is made: {calls:?}");
    }
    assert_eq!(
        calls.calls(CallKind::MemInfo),
        1,
        "the report's memory query"
    );
    assert_eq!(
        calls.calls(CallKind::FreeReservation),
        1,
        "the cached segment's cudaFree"
    );
    let after = alloc.stats();
    assert_eq!(after.num_ooms, stats.num_ooms + 1);
    assert_eq!(
        after.num_alloc_retries,
        stats.num_alloc_retries + 1,
        "PyTorch's retry"
    );
    assert_eq!(after.num_device_free, stats.num_device_free + 1);
    assert_eq!(
        after.reserved_bytes.all.current, 0,
        "the cache was emptied before the report"
    );
    alloc.check_invariants().unwrap();
    assert!(sim.live().is_empty(), "nothing left on the device");
}

#[test]
fn a_request_larger_than_the_device_frees_the_cache_and_fails_without_a_segment_classic() {
    let sim = sim(80 * GB);
    let alloc = ClassicAllocator::with_alloc_conf(sim.clone(), "").unwrap();
    oversize_frees_the_cache_retries_and_fails(&alloc, &sim);
}

#[test]
fn a_request_larger_than_the_allowed_fraction_fails_the_same_way() {
    let sim = sim(80 * GB);
    let alloc =
        ClassicAllocator::with_alloc_conf(sim.clone(), "per_process_memory_fraction:0.5").unwrap();
    oversize_frees_the_cache_retries_and_fails(&alloc, &sim);
    // Just under the limit is still tried (and served).
    let a = alloc.allocate(38 * GB, StreamId::DEFAULT).unwrap();
    alloc.deallocate(a).unwrap();
}

/// Driver calls of one allocate + free on a fresh stream, after `streams` streams were served.
fn calls_for_one_more_stream<A: Allocator>(alloc: &A, sim: &SimBackend, streams: u64) -> u64 {
    let held: Vec<_> = (1..=streams)
        .map(|s| alloc.allocate(512, StreamId::sim(s)).unwrap())
        .collect();
    let before = sim.calls();
    let a = alloc.allocate(512, StreamId::sim(streams + 1)).unwrap();
    alloc.deallocate(a).unwrap();
    let n = sim.calls().since(&before).total();
    for a in held {
        alloc.deallocate(a).unwrap();
    }
    n
}

#[test]
fn driver_calls_per_operation_do_not_grow_with_the_streams_served() {
    for streams in [10, 1000] {
        let s = sim(4 * GB);
        let e = ExpandableAllocator::new(s.clone(), ExpandableConfig::default()).unwrap();
        let s2 = sim(4 * GB);
        let c = ClassicAllocator::with_alloc_conf(s2.clone(), "").unwrap();
        let (ce, cc) = (
            calls_for_one_more_stream(&e, &s, streams),
            calls_for_one_more_stream(&c, &s2, streams),
        );
        // A new stream's first block: reserve, create, map, set access (a new segment).
        assert!(ce <= 4, "expandable, {streams} streams: {ce} calls");
        assert!(cc <= 4, "classic, {streams} streams: {cc} calls");
        e.check_invariants().unwrap();
        c.check_invariants().unwrap();
    }
}

/// `n` streams on a device of exactly `n` small segments, each holding one live 512-byte block
/// and its free remainder (split: nothing to release), then a request on a new stream: the
/// device is full, every retry fails, and the release walks must not visit the `n` free
/// remainders (they did: PyTorch's walk over every free block, O(n) per failure, issue 21).
fn classic_release_steps_on_a_full_device(n: u64) -> u64 {
    let sim = sim(n as usize * 2 * MB);
    let alloc = ClassicAllocator::with_alloc_conf(sim.clone(), "").unwrap();
    let _live: Vec<_> = (0..n)
        .map(|i| alloc.allocate(512, StreamId::sim(i + 1)).unwrap())
        .collect();
    assert_eq!(alloc.stats().reserved_bytes.all.current, n * 2 * MB as u64);
    let steps = alloc.release_walk_steps();
    for _ in 0..3 {
        let err = alloc.allocate(512, StreamId::sim(n + 1)).unwrap_err();
        assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    }
    assert_eq!(alloc.stats().num_alloc_retries, 3);
    alloc.check_invariants().unwrap();
    alloc.release_walk_steps() - steps
}

#[test]
fn a_failing_allocation_on_a_full_device_visits_no_unreleasable_block_classic() {
    for n in [1 << 10, 1 << 14] {
        assert_eq!(
            classic_release_steps_on_a_full_device(n),
            0,
            "n = {n}: no free block is a whole segment, so nothing may be walked"
        );
    }
}

/// The releasable ones are still found, in PyTorch's order, and only they are visited: free
/// three whole segments among `n` split ones and ask for a segment more than the device has
/// free.
#[test]
fn a_failing_allocation_releases_exactly_the_whole_free_segments_classic() {
    let n: u64 = 1 << 12;
    let sim = sim(n as usize * 2 * MB);
    let alloc = ClassicAllocator::with_alloc_conf(sim.clone(), "").unwrap();
    let mut live: Vec<_> = (0..n)
        .map(|i| alloc.allocate(512, StreamId::sim(i + 1)).unwrap())
        .collect();
    for a in live.drain(..3) {
        alloc.deallocate(a).unwrap();
    }
    let steps = alloc.release_walk_steps();
    // A 20 MiB segment does not fit the 6 MiB the three cached segments hold.
    let err = alloc.allocate(2 * MB, StreamId::sim(n + 1)).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    assert_eq!(alloc.release_walk_steps() - steps, 3);
    assert_eq!(
        alloc.stats().reserved_bytes.all.current,
        (n - 3) * 2 * MB as u64,
        "the three whole free segments were given back"
    );
    alloc.check_invariants().unwrap();
}

/// What a large-pool segment maps at a time (`ExpandableConfig::default()`'s page).
const PAGE: usize = 20 * MB;

/// `n` streams on a device of exactly `n` pages, each stream's segment mapping one page, filled
/// by one live block. The page stays 20 MiB (`stream_page_share` off: Note [Stream pages] would
/// shrink it with this many streams on so small a device).
fn full_expandable(n: u64) -> (ExpandableAllocator<SimBackend>, Vec<vmm_alloc::Allocation>) {
    assert_eq!(ExpandableConfig::default().large_page, PAGE);
    let config = ExpandableConfig {
        stream_page_share: 0.0,
        ..ExpandableConfig::default()
    };
    let alloc = ExpandableAllocator::new(sim(n as usize * PAGE), config).unwrap();
    let live: Vec<_> = (0..n)
        .map(|i| alloc.allocate(PAGE, StreamId::sim(i + 1)).unwrap())
        .collect();
    assert_eq!(alloc.stats().reserved_bytes.all.current, n * PAGE as u64);
    (alloc, live)
}

/// `n` streams on a device of exactly `n` pages, each stream's segment holding one live page
/// (nothing to release), then three requests on a new stream: the device is full, every retry
/// fails. Returns the segments the release path visited for the three, once the release index
/// is up to date (an `empty_cache` brings it up to date: the changes of the setup are examined
/// once, not on every failure).
fn expandable_release_steps_on_a_full_device(n: u64) -> u64 {
    let (alloc, _live) = full_expandable(n);
    alloc.empty_cache().unwrap();
    alloc.check_invariants().unwrap();
    let steps = alloc.release_walk_steps();
    for _ in 0..3 {
        let err = alloc.allocate(PAGE, StreamId::sim(n + 1)).unwrap_err();
        assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    }
    assert_eq!(alloc.stats().num_alloc_retries, 3);
    assert_eq!(alloc.stats().reserved_bytes.all.current, n * PAGE as u64);
    alloc.check_invariants().unwrap();
    alloc.release_walk_steps() - steps
}

#[test]
fn a_failing_allocation_on_a_full_device_visits_no_unreleasable_segment_expandable() {
    let steps = [1 << 10, 1 << 14].map(expandable_release_steps_on_a_full_device);
    // Each failure tries to grow twice (before and after its last-resort release); the device
    // has no room and no segment a free chunk, so each growth is hopeless before it reserves
    // (Note [Hopeless growth]): its harvest list visits the release index's segments, none. Not
    // one of the `n` full segments is visited (before that check, each growth reserved a new
    // segment and visited it once: 6).
    assert_eq!(
        steps,
        [0, 0],
        "1k and 16k streams: the visits of three failures"
    );
}

/// The releasable ones are still found and given back, and only they are visited: free the
/// pages of three streams among `n` and ask for more than the three pages.
#[test]
fn a_failing_allocation_releases_exactly_the_free_pages_expandable() {
    let n: u64 = 1 << 12;
    let (alloc, mut live) = full_expandable(n);
    alloc.empty_cache().unwrap();
    for a in live.drain(..3) {
        alloc.deallocate(a).unwrap();
    }
    let steps = alloc.release_walk_steps();
    let err = alloc.allocate(4 * PAGE, StreamId::sim(n + 1)).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    // The three segments whose page was freed, and the request's own new segment, a few times
    // each (examined, walked by the harvest, released); none of the other 4093.
    let visited = alloc.release_walk_steps() - steps;
    assert!(visited <= 16, "visited {visited} segments");
    assert_eq!(
        alloc.stats().reserved_bytes.all.current,
        (n - 3) * PAGE as u64,
        "the three free pages were given back"
    );
    alloc.check_invariants().unwrap();
}

/// One stream's segment of `n` pages on a device of `n` pages, each page holding one live block,
/// then two blocks in the middle freed (not adjacent): two fully-free pages among `n` mapped under
/// live blocks.
fn one_segment_two_free_pages(
    n: usize,
) -> (
    ExpandableAllocator<SimBackend>,
    Vec<vmm_alloc::Allocation>,
    SimBackend,
) {
    let s = sim(n * PAGE);
    let alloc = ExpandableAllocator::new(s.clone(), ExpandableConfig::default()).unwrap();
    let mut live: Vec<_> = (0..n)
        .map(|_| alloc.allocate(PAGE, StreamId::DEFAULT).unwrap())
        .collect();
    assert_eq!(alloc.snapshot().segments.len(), 1, "one segment");
    assert_eq!(alloc.stats().reserved_bytes.all.current, (n * PAGE) as u64);
    let upper = live.remove(n / 2 + 2);
    let lower = live.remove(n / 2);
    alloc.deallocate(upper).unwrap();
    alloc.deallocate(lower).unwrap();
    (alloc, live, s)
}

/// Note [Free chunk walk]: a pressured growth lists the fully-free chunks to remap, and the
/// release index and `empty_cache` look for them; each examined every chunk of the segment,
/// those under live blocks too (a third of the churn bench's time on a full device). The walks
/// now examine only the chunks starting in free pieces: the work must not grow with `n`.
#[test]
fn free_chunk_walks_skip_the_chunks_under_live_blocks() {
    let mut steps = Vec::new();
    for n in [64, 1024] {
        // A 2-page request: no free range holds it, so the segment grows under pressure and
        // remaps both free pages (no memory is left to create).
        let (alloc, _live, s) = one_segment_two_free_pages(n);
        let before = (alloc.chunk_walk_steps(), s.calls());
        let grown = alloc.allocate(2 * PAGE, StreamId::DEFAULT).unwrap();
        let calls = s.calls().since(&before.1);
        assert_eq!(
            calls.calls(CallKind::Create),
            0,
            "n = {n}: remapped, not created"
        );
        assert_eq!(alloc.stats().remapped_bytes, 2 * PAGE as u64, "n = {n}");
        let grow_steps = alloc.chunk_walk_steps() - before.0;
        // `empty_cache` with the two pages freed again, elsewhere: finds and unmaps exactly them.
        alloc.deallocate(grown).unwrap();
        let before = alloc.chunk_walk_steps();
        alloc.empty_cache().unwrap();
        let release_steps = alloc.chunk_walk_steps() - before;
        assert_eq!(
            alloc.stats().reserved_bytes.all.current,
            ((n - 2) * PAGE) as u64,
            "n = {n}: the two free pages given back"
        );
        alloc.check_invariants().unwrap();
        steps.push((grow_steps, release_steps));
    }
    assert_eq!(steps[0], steps[1], "chunk walk steps at n = 64, 1024");
    let (grow, release) = steps[1];
    assert!(grow <= 8 && release <= 8, "{steps:?}");
}

/// Note [Harvest list]: a pressured growth's first harvest brings the release index up to date
/// and lists the remap candidates in one walk of each segment. The index's own update walked a
/// touched segment to its first free chunk, then the list walked it again (a tenth of the churn
/// bench's time on a full device): one segment, one visit, and each of its two free pages
/// examined once (its own chunk, and the chunk below that ends the search).
#[test]
fn a_pressured_growth_walks_each_segment_once() {
    for n in [64, 1024] {
        let (alloc, _live, _s) = one_segment_two_free_pages(n);
        let before = (alloc.release_walk_steps(), alloc.chunk_walk_steps());
        let grown = alloc.allocate(2 * PAGE, StreamId::DEFAULT).unwrap();
        assert_eq!(alloc.stats().remapped_bytes, 2 * PAGE as u64, "n = {n}");
        let visits = alloc.release_walk_steps() - before.0;
        let chunk_steps = alloc.chunk_walk_steps() - before.1;
        assert_eq!((visits, chunk_steps), (1, 4), "n = {n}: (segments, chunks)");
        alloc.deallocate(grown).unwrap();
        alloc.check_invariants().unwrap();
    }
}

/// Note [Chunk cache]: a pressured growth searches the chunk map only inside the free pieces
/// that changed since the last growth's listing. One segment of `n` pages on a device of `n`
/// pages, four single pages freed apart from each other, then two 2-page requests: neither fits
/// a free range, so each grows under pressure and remaps two free pages. The first searches
/// inside all four free pieces (two chunks examined each: its own and the one below that ends
/// the search); the second finds the two it did not take unchanged, and searches nothing.
#[test]
fn a_second_pressured_growth_searches_only_the_changed_free_pieces() {
    let n = 64;
    let s = sim(n * PAGE);
    let alloc = ExpandableAllocator::new(s, ExpandableConfig::default()).unwrap();
    let mut live: Vec<_> = (0..n)
        .map(|_| alloc.allocate(PAGE, StreamId::DEFAULT).unwrap())
        .collect();
    for i in [40, 30, 20, 10] {
        alloc.deallocate(live.remove(i)).unwrap();
    }
    let mut steps = Vec::new();
    for round in 1..=2 {
        let before = alloc.chunk_walk_steps();
        live.push(alloc.allocate(2 * PAGE, StreamId::DEFAULT).unwrap());
        steps.push(alloc.chunk_walk_steps() - before);
        let remapped = alloc.stats().remapped_bytes;
        assert_eq!(remapped, (round * 2 * PAGE) as u64, "round {round}");
        alloc.check_invariants().unwrap();
    }
    assert_eq!(steps, [8, 0], "chunks examined by the two growths");
}

/// Note [Indexed chunk listing]: the listings of fully-free chunks find the free pieces that may
/// hold one in the best-fit index. They walked every piece of each segment, the `n` used pieces
/// under live blocks included (two fifths of the churn bench's time on a full device at max
/// 64 MiB): the pieces examined must not grow with `n`. A pressured growth lists the two free
/// pages (for the hopeless check and its harvest); `empty_cache`, with the two pages freed
/// again, brings the release index up and releases them: each examines only those two pieces.
#[test]
fn chunk_listings_examine_the_free_pieces_not_the_used_ones() {
    let mut examined = Vec::new();
    for n in [64, 1024] {
        let (alloc, _live, _s) = one_segment_two_free_pages(n);
        let before = alloc.listed_free_pieces();
        let grown = alloc.allocate(2 * PAGE, StreamId::DEFAULT).unwrap();
        assert_eq!(alloc.stats().remapped_bytes, 2 * PAGE as u64, "n = {n}");
        let grow = alloc.listed_free_pieces() - before;
        alloc.deallocate(grown).unwrap();
        let before = alloc.listed_free_pieces();
        alloc.empty_cache().unwrap();
        let release = alloc.listed_free_pieces() - before;
        assert_eq!(
            alloc.stats().reserved_bytes.all.current,
            ((n - 2) * PAGE) as u64,
            "n = {n}: the two free pages given back"
        );
        alloc.check_invariants().unwrap();
        examined.push((grow, release));
    }
    assert_eq!(examined[0], examined[1], "pieces examined at n = 64, 1024");
    let (grow, release) = examined[1];
    assert!(grow <= 2 && release <= 2, "{examined:?}");
}
