//! Loom model of the allocators' thread-safe front end (issue 8, reliability): every interleaving
//! (up to loom's preemption bound) of 2-3 threads calling one shared allocator over the Sim
//! backend, with `allocate`, `deallocate` on another thread after a hand-off, `record_stream`,
//! `empty_cache` and `stats`. Compiled only with `--cfg loom` (see `main.rs`), which turns
//! the allocators' lock (`src/sync.rs`) into loom's:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --test loom
//! ```
//!
//! Each model explores every schedule with at most 3 preemptions (`LOOM_MAX_PREEMPTIONS=N`
//! changes the bound; tokio and crossbeam run theirs at 2) and prints how many it explored.
//!
//! Checked in every schedule: no two live blocks overlap, the hand-off's consumer frees what the
//! producer allocated without error, no call fails, `stats()` read by a third thread meets its
//! identities, and at the end nothing is live, the invariants hold, `empty_cache` brings reserved
//! bytes to 0 and, once the allocator is dropped, the backend holds nothing.
//!
//! The Sim backend's own lock (`parking_lot` in `backend/checked.rs`) is not modelled: it is held
//! only inside one backend call, which runs no loom operation, so no schedule can find it taken.
use loom::sync::mpsc::channel;
use loom::sync::Arc;
use loom::thread;

use vmm_alloc::backend::SimConfig;
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::config::{AllocConf, ExpandableConfig, FrontCacheMode};
use vmm_alloc::{Allocation, Allocator, Backend, ExpandableAllocator, SimBackend, StreamId};

const S1: StreamId = StreamId::sim(1);
const S2: StreamId = StreamId::sim(2);
const KB: usize = 1 << 10;
const MB: usize = 1 << 20;

fn disjoint(a: &Allocation, b: &Allocation) {
    let (a0, a1) = (a.ptr().get(), a.ptr().get() + a.size() as u64);
    let (b0, b1) = (b.ptr().get(), b.ptr().get() + b.size() as u64);
    assert!(a1 <= b0 || b1 <= a0, "live blocks overlap: {a:?} and {b:?}");
}

fn stats_sane<A: Allocator>(alloc: &A) {
    let s = alloc.stats();
    let (allocated, active, reserved) = (
        s.allocated_bytes.all.current,
        s.active_bytes.all.current,
        s.reserved_bytes.all.current,
    );
    assert!(allocated <= active && active <= reserved, "{s:?}");
    for st in [
        s.allocation,
        s.allocated_bytes,
        s.reserved_bytes,
        s.active_bytes,
    ] {
        assert_eq!(st.all.current, st.all.allocated - st.all.freed, "{s:?}");
        assert_eq!(
            st.all.current,
            st.small_pool.current + st.large_pool.current
        );
    }
}

/// Preemption bound when `LOOM_MAX_PREEMPTIONS` is not set: 3 explores each model here in
/// seconds; unbounded, the three-thread models run for many minutes (classic's small one 2.5
/// minutes, expandable's more than 10).
const DEFAULT_PREEMPTIONS: usize = 3;

/// `loom::model` with [`DEFAULT_PREEMPTIONS`], printing how many schedules it explored.
fn model(f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(DEFAULT_PREEMPTIONS);
    }
    let bound = builder.preemption_bound;
    let schedules = std::sync::Arc::new(AtomicU64::new(0));
    let counter = schedules.clone();
    let started = std::time::Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Relaxed);
        f()
    });
    println!(
        "{} schedules explored in {:.2} s (preemption bound {bound:?})",
        schedules.load(Relaxed),
        started.elapsed().as_secs_f64()
    );
}

/// Producer (allocates on S1, keeps one block, hands one to the consumer), consumer (uses the
/// handed block on S2 too, allocates its own, frees both), and a third thread that empties the
/// cache and reads stats; then the end checks.
fn three_threads<A, F>(make: F, small: bool, invariants: fn(&A) -> Result<(), String>)
where
    A: Allocator + 'static,
    F: Fn(SimBackend) -> A + Sync + Send + 'static,
{
    let (s1, s2) = if small {
        (3 * KB, 5 * KB)
    } else {
        (3 * MB, 5 * MB)
    };
    model(move || {
        let sim = SimBackend::new();
        let alloc = Arc::new(make(sim.clone()));
        let (tx, rx) = channel::<Allocation>();

        let producer = {
            let alloc = alloc.clone();
            thread::spawn(move || {
                let kept = alloc.allocate(s1, S1).expect("allocate");
                let given = alloc.allocate(s2, S1).expect("allocate");
                disjoint(&kept, &given);
                tx.send(given).unwrap();
                alloc.deallocate(kept).expect("deallocate");
            })
        };
        let consumer = {
            let alloc = alloc.clone();
            thread::spawn(move || {
                let own = alloc.allocate(s1, S2).expect("allocate");
                let given = rx.recv().unwrap();
                disjoint(&own, &given);
                alloc.record_stream(given.ptr(), S2).expect("record_stream");
                alloc.deallocate(given).expect("deallocate");
                alloc.deallocate_ptr(own.ptr()).expect("deallocate_ptr");
            })
        };
        let janitor = {
            let alloc = alloc.clone();
            thread::spawn(move || {
                alloc.empty_cache().expect("empty_cache");
                stats_sane(&*alloc);
            })
        };
        producer.join().unwrap();
        consumer.join().unwrap();
        janitor.join().unwrap();

        let alloc = Arc::try_unwrap(alloc)
            .ok()
            .expect("threads gave their handles back");
        assert_eq!(alloc.stats().allocation.all.current, 0);
        invariants(&alloc).expect("invariants");
        alloc.empty_cache().expect("empty_cache");
        assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
        drop(alloc);
        assert!(sim.live().is_empty(), "{}", sim.live());
    });
}

/// Two threads racing for the same pool and stream: each allocates, shows its block to the
/// other while it is live, frees it and allocates again; blocks live at once must be disjoint.
fn same_stream_race<A, F>(make: F, size: usize)
where
    A: Allocator + 'static,
    F: Fn(SimBackend) -> A + Sync + Send + 'static,
{
    model(move || {
        let sim = SimBackend::new();
        let alloc = Arc::new(make(sim.clone()));
        let (tx, rx) = channel::<(u64, u64)>();
        let (ack_tx, ack_rx) = channel::<()>();
        let other = {
            let alloc = alloc.clone();
            thread::spawn(move || {
                let a = alloc.allocate(size, S1).expect("allocate");
                tx.send((a.ptr().get(), a.size() as u64)).unwrap();
                // Live until the main thread has compared it with its own.
                ack_rx.recv().unwrap();
                alloc.deallocate(a).expect("deallocate");
                let b = alloc.allocate(size, S1).expect("allocate");
                alloc.deallocate(b).expect("deallocate");
            })
        };
        let a = alloc.allocate(size, S1).expect("allocate");
        let b = alloc.allocate(size, S1).expect("allocate");
        disjoint(&a, &b);
        let (p, len) = rx.recv().unwrap();
        for mine in [&a, &b] {
            let (m0, m1) = (mine.ptr().get(), mine.ptr().get() + mine.size() as u64);
            assert!(
                m1 <= p || p + len <= m0,
                "{mine:?} overlaps the other thread's live block at {p:#x}"
            );
        }
        ack_tx.send(()).unwrap();
        alloc.deallocate(a).expect("deallocate");
        let c = alloc.allocate(size, S1).expect("allocate");
        disjoint(&b, &c);
        alloc.deallocate(b).expect("deallocate");
        alloc.deallocate(c).expect("deallocate");
        other.join().unwrap();
        let alloc = Arc::try_unwrap(alloc).unwrap_or_else(|_| panic!("handles back"));
        assert_eq!(alloc.stats().allocation.all.current, 0);
        alloc.empty_cache().expect("empty_cache");
        assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
        drop(alloc);
        assert!(sim.live().is_empty(), "{}", sim.live());
    });
}

/// RMM #861: two threads allocating at once on one stream get different blocks (both still live
/// when compared).
fn concurrent_allocations_differ<A, F>(make: F, size: usize)
where
    A: Allocator + 'static,
    F: Fn(SimBackend) -> A + Sync + Send + 'static,
{
    model(move || {
        let sim = SimBackend::new();
        let alloc = Arc::new(make(sim.clone()));
        let other = {
            let alloc = alloc.clone();
            thread::spawn(move || alloc.allocate(size, S1).expect("allocate"))
        };
        let mine = alloc.allocate(size, S1).expect("allocate");
        let theirs = other.join().unwrap();
        disjoint(&mine, &theirs);
        alloc.deallocate(mine).expect("deallocate");
        alloc.deallocate(theirs).expect("deallocate");
        let alloc = Arc::try_unwrap(alloc).unwrap_or_else(|_| panic!("handles back"));
        assert_eq!(alloc.stats().allocation.all.current, 0);
        alloc.empty_cache().expect("empty_cache");
        assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
        drop(alloc);
        assert!(sim.live().is_empty(), "{}", sim.live());
    });
}

fn expandable(sim: SimBackend) -> ExpandableAllocator<SimBackend> {
    ExpandableAllocator::new(sim, ExpandableConfig::default()).expect("allocator")
}

fn classic(sim: SimBackend) -> ClassicAllocator<SimBackend> {
    ClassicAllocator::new(sim, AllocConf::default()).expect("allocator")
}

#[test]
fn expandable_hand_off_small() {
    three_threads(expandable, true, |a| {
        a.check_invariants().map_err(|e| e.to_string())
    });
}

#[test]
fn expandable_hand_off_large() {
    three_threads(expandable, false, |a| {
        a.check_invariants().map_err(|e| e.to_string())
    });
}

#[test]
fn expandable_same_stream() {
    same_stream_race(expandable, 3 * MB);
}

#[test]
fn classic_hand_off_small() {
    three_threads(classic, true, |a| {
        a.check_invariants().map_err(|e| e.to_string())
    });
}

#[test]
fn classic_hand_off_large() {
    three_threads(classic, false, |a| {
        a.check_invariants().map_err(|e| e.to_string())
    });
}

#[test]
fn classic_same_stream() {
    same_stream_race(classic, 3 * MB);
}

#[test]
fn expandable_concurrent_allocations_differ() {
    concurrent_allocations_differ(expandable, 3 * MB);
}

#[test]
fn classic_concurrent_allocations_differ() {
    concurrent_allocations_differ(classic, 3 * MB);
}

fn with_front_cache(sim: SimBackend) -> ExpandableAllocator<SimBackend> {
    let config = ExpandableConfig {
        front_cache: FrontCacheMode::Always,
        ..ExpandableConfig::default()
    };
    ExpandableAllocator::new(sim, config).expect("allocator")
}

/// A thread that checks the invariants (the stashed blocks' too) and reads the statistics while
/// the others run.
fn spawn_checker(alloc: &Arc<ExpandableAllocator<SimBackend>>) -> thread::JoinHandle<()> {
    let alloc = alloc.clone();
    thread::spawn(move || {
        alloc.check_invariants().expect("invariants mid-flight");
        stats_sane(&*alloc);
    })
}

/// The end of a front-cache model, every thread joined: the invariants hold, `calls`
/// allocations were made and all freed, `empty_cache` gives every byte back and the dropped
/// allocator leaves the backend with nothing. Returns the statistics read before emptying.
fn front_cache_end(
    alloc: Arc<ExpandableAllocator<SimBackend>>,
    sim: &SimBackend,
    calls: u64,
) -> vmm_alloc::stats::MemoryStats {
    let alloc = Arc::try_unwrap(alloc).unwrap_or_else(|_| panic!("handles back"));
    alloc.check_invariants().expect("invariants");
    let s = alloc.stats();
    assert_eq!(s.allocation.all.current, 0);
    assert_eq!(
        (s.allocation.all.allocated, s.allocation.all.freed),
        (calls, calls)
    );
    alloc.empty_cache().expect("empty_cache");
    assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
    drop(alloc);
    assert!(sim.live().is_empty(), "{}", sim.live());
    s
}

/// The per-stream front cache (Note [Front cache]): two threads on two streams of a 42 MiB
/// device. The first grows its stream's segments (a 20 MiB block, a 4 KiB one), frees the large
/// block (stashed in its shard), tells the second, then frees and allocates the small one again
/// (stashed and taken back, or through the core). The second then allocates 40 MiB, which fits
/// only if the memory stashed on the first stream is reclaimed: every schedule must succeed, and
/// the statistics read at the end must count every call. A third thread checks the invariants
/// (the stashed blocks' too) and reads the statistics while they run.
#[test]
fn front_cache_two_streams_growth_and_reclaim() {
    model(|| {
        let sim = SimBackend::with_config(SimConfig {
            capacity: 42 * MB,
            ..SimConfig::default()
        })
        .expect("sim");
        let alloc = Arc::new(with_front_cache(sim.clone()));
        let (tx, rx) = channel::<()>();
        let first = {
            let alloc = alloc.clone();
            thread::spawn(move || {
                let large = alloc.allocate(20 * MB, S1).expect("allocate");
                let small = alloc.allocate(4 * KB, S1).expect("allocate");
                alloc.deallocate(large).expect("deallocate");
                tx.send(()).unwrap();
                alloc.deallocate(small).expect("deallocate");
                let again = alloc.allocate(4 * KB, S1).expect("allocate");
                alloc.deallocate(again).expect("deallocate");
            })
        };
        let second = {
            let alloc = alloc.clone();
            thread::spawn(move || {
                rx.recv().unwrap();
                let big = alloc
                    .allocate(40 * MB, S2)
                    .expect("reclaims the stashed memory");
                alloc.deallocate(big).expect("deallocate");
            })
        };
        let reader = spawn_checker(&alloc);
        first.join().unwrap();
        second.join().unwrap();
        reader.join().unwrap();
        let s = front_cache_end(alloc, &sim, 4);
        // The 40 MiB block, with the small one beside it or not: never the stashed 20 MiB too.
        let peak = s.allocated_bytes.all.peak;
        assert!(
            peak == (40 * MB) as u64 || peak == (40 * MB + 4 * KB) as u64,
            "{s:?}"
        );
    });
}

#[test]
fn front_cache_hand_off() {
    three_threads(with_front_cache, true, |a| {
        a.check_invariants().map_err(|e| e.to_string())
    });
}

/// One stream's loop of the mixed ring (Note [Front allowance]): a 4 KiB and an 8 KiB block; the
/// 4 KiB one freed (stashed); a 12 KiB block the core serves from its free range while the
/// 4 KiB block stays stashed; then 4 KiB again, whose take would set a new peak (24 KiB live
/// after 20 KiB), so its allowance cannot pay for it and the slow path takes it back.
fn mixed_ring_step(alloc: &ExpandableAllocator<SimBackend>, stream: StreamId) {
    let a = alloc.allocate(4 * KB, stream).expect("allocate");
    let b = alloc.allocate(8 * KB, stream).expect("allocate");
    alloc.deallocate(a).expect("deallocate");
    let c = alloc.allocate(12 * KB, stream).expect("allocate");
    let d = alloc.allocate(4 * KB, stream).expect("allocate");
    for x in [&b, &c] {
        disjoint(x, &d);
    }
    disjoint(&b, &c);
    for x in [b, c, d] {
        alloc.deallocate(x).expect("deallocate");
    }
}

/// The front cache keeping its stash across the core's allocations (Note [Front allowance]):
/// two threads on two streams run [`mixed_ring_step`] while a third checks the invariants
/// (among them: what a user reads is within every peak, and the shards' allowances fit below
/// the peaks) and reads the statistics. In every schedule: no call fails, no live blocks
/// overlap, and at the end every call is counted, nothing is live, and the peak of allocated
/// bytes is at least one stream's 24 KiB and at most both streams' 48 KiB (never a stashed
/// block counted on top).
#[test]
fn front_cache_mixed_ring_keeps_peaks_exact() {
    mixed_ring_model(FrontCacheMode::Always);
}

/// The default front cache engaging and disengaging while threads run (Note [Engage on
/// contention]). Under loom a window is two allocations and every free through `deallocate`
/// of a disengaged cache counts as contended (loom never runs a failing `try_lock`), so the
/// first such free engages it wherever it falls among the other threads' calls. Two threads on
/// two streams run [`mixed_ring_step`] on an allocator that starts disengaged while a third
/// checks the invariants (among them: a disengaged cache holds nothing, an engaged one names
/// every block that must be freed through the core) and reads the statistics. In every
/// schedule, those where a window's misses disengage it again too: no call fails, no live
/// blocks overlap, every call is counted, and the peak is what the calls made it.
#[test]
fn front_cache_engages_and_disengages_mid_flight() {
    mixed_ring_model(FrontCacheMode::OnContention);
}

/// Two threads on two streams run [`mixed_ring_step`] on an allocator with the front cache in
/// `mode` while a third checks the invariants and reads the statistics; at the end every call
/// is counted, nothing is live, and the peak of allocated bytes is at least one stream's 24 KiB
/// and at most both streams' 48 KiB.
fn mixed_ring_model(mode: FrontCacheMode) {
    model(move || {
        let sim = SimBackend::new();
        let config = ExpandableConfig {
            front_cache: mode,
            ..ExpandableConfig::default()
        };
        let alloc = Arc::new(ExpandableAllocator::new(sim.clone(), config).expect("allocator"));
        let workers: Vec<_> = [S1, S2]
            .into_iter()
            .map(|stream| {
                let alloc = alloc.clone();
                thread::spawn(move || mixed_ring_step(&alloc, stream))
            })
            .collect();
        let reader = spawn_checker(&alloc);
        for w in workers {
            w.join().unwrap();
        }
        reader.join().unwrap();
        let s = front_cache_end(alloc, &sim, 8);
        let peak = s.allocated_bytes.all.peak;
        assert!((24 * KB as u64..=48 * KB as u64).contains(&peak), "{s:?}");
    });
}
