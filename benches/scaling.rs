//! Cost per operation against the size of the state: 1k → 1M streams, segments, reservations
//! and live blocks (issue 21, item 1). A plain timing binary, not criterion: one pass over a
//! million-entry state already takes seconds, and the figure wanted is the *ratio* of the time
//! per event at n = 1M to the time at n = 1k (flat within 2× when every operation is
//! O(log n) or better).
//!
//! Cases, each on Sim (bookkeeping only, so the allocator and backend cost is all that is timed):
//! * `<allocator>/streams`: n allocations of 512 B, each on its own stream (so each makes its own
//!   segment and reservation), then n frees; per event = (alloc + free) / 2n;
//! * `<allocator>/live`: n allocations of 512 B on one stream, all live, then n frees;
//! * `classic/oom`: n streams on a device of exactly n small segments, each segment split by one
//!   live 512-byte block (nothing releasable), then 1000 requests on a new stream that all fail
//!   (the device is full: each frees what it can, retries and builds the OOM report); per event
//!   = one failed request. The setup is not timed;
//! * `expandable/oom`: n streams on a device of exactly n large pages, each stream's segment
//!   mapping one page filled by one live block (nothing releasable), an `empty_cache` (so the
//!   release index has seen the setup), then 1000 requests of a page on a new stream that all
//!   fail; per event = one failed request. The setup is not timed;
//! * `sim/reservations`: n reservations of 2 MiB on the bare backend, then n frees;
//! * `std/btreemap`, `std/hashmap`: the containers the state is made of, bare: n inserts of
//!   addresses 2 MiB apart (the keys the allocators use), then n removes. No scan can hide in
//!   them, so their growth with n is what memory alone (caches, TLB) costs on the machine.
//!
//! `cargo bench --bench scaling` runs n = 1k, 4k, ... up to `VMM_SCALING_MAX` (default 1M) and
//! prints ns per event and the ratio to the smallest n; `VMM_SCALING_CASE=expandable` runs only
//! the cases whose name contains it, `VMM_SCALING_MIN` starts at a larger n. Each n is run
//! `2^20 / n` times (at least once), each time on a fresh allocator, and the time averaged: every
//! n then does the same number of events (2M), so a small n is not timed on a single
//! millisecond, and a run at one n alone (`VMM_SCALING_MIN` = `VMM_SCALING_MAX`) under
//! `valgrind --tool=cachegrind --cache-sim=no` counts the instructions per event at that n
//! (RELIABILITY.md, "Scaling").

use std::time::Instant;

use vmm_alloc::backend::{Backend, SimConfig};
use vmm_alloc::{
    Allocator, ClassicAllocator, ExpandableAllocator, ExpandableConfig, SimBackend, StreamId,
};

/// A device big enough that nothing here runs out: 2 MiB of pages for each of a million streams (2 TiB).
fn sim() -> SimBackend {
    SimBackend::with_config(SimConfig {
        capacity: 2 << 40,
        va_limit: 1 << 62,
        ..SimConfig::default()
    })
    .expect("sim config")
}

fn expandable() -> ExpandableAllocator<SimBackend> {
    // Reservations of 1.125 × 80 GiB per segment would be the default; the scaling is the same,
    // but a small device keeps a million reservations inside the 2^62 of address space.
    ExpandableAllocator::new(sim(), ExpandableConfig::default()).expect("expandable")
}

fn classic() -> ClassicAllocator<SimBackend> {
    ClassicAllocator::with_alloc_conf(sim(), "").expect("classic")
}

/// ns per event of `n` allocations (stream picked by `stream_of`) then `n` frees.
fn alloc_free<A: Allocator>(alloc: &A, n: u64, stream_of: impl Fn(u64) -> u64) -> f64 {
    let t = Instant::now();
    let live: Vec<_> = (0..n)
        .map(|i| {
            alloc
                .allocate(512, StreamId::sim(stream_of(i)))
                .expect("allocate")
        })
        .collect();
    for a in live {
        alloc.deallocate(a).expect("deallocate");
    }
    t.elapsed().as_nanos() as f64 / (2 * n) as f64
}

/// ns per failed request on a full device of `n` streams (see the module docs).
fn classic_oom(n: u64) -> f64 {
    const FAILS: u64 = 1000;
    let sim = SimBackend::with_config(SimConfig {
        capacity: n as usize * (2 << 20),
        va_limit: 1 << 62,
        ..SimConfig::default()
    })
    .expect("sim config");
    let alloc = ClassicAllocator::with_alloc_conf(sim, "").expect("classic");
    let live: Vec<_> = (0..n)
        .map(|i| alloc.allocate(512, StreamId::sim(i + 1)).expect("fits"))
        .collect();
    let t = Instant::now();
    for _ in 0..FAILS {
        let failed = alloc.allocate(512, StreamId::sim(n + 1));
        assert!(failed.is_err(), "the device is full");
    }
    let ns = t.elapsed().as_nanos() as f64 / FAILS as f64;
    keep(live);
    ns
}

/// ns per failed request on a full device of `n` expandable segments (see the module docs).
fn expandable_oom(n: u64) -> f64 {
    const FAILS: u64 = 1000;
    let page = ExpandableConfig::default().large_page;
    let sim = SimBackend::with_config(SimConfig {
        capacity: n as usize * page,
        va_limit: 1 << 62,
        ..SimConfig::default()
    })
    .expect("sim config");
    let alloc = ExpandableAllocator::new(sim, ExpandableConfig::default()).expect("expandable");
    let live: Vec<_> = (0..n)
        .map(|i| alloc.allocate(page, StreamId::sim(i + 1)).expect("fits"))
        .collect();
    alloc.empty_cache().expect("empty_cache");
    let t = Instant::now();
    for _ in 0..FAILS {
        let failed = alloc.allocate(page, StreamId::sim(n + 1));
        assert!(failed.is_err(), "the device is full");
    }
    let ns = t.elapsed().as_nanos() as f64 / FAILS as f64;
    keep(live);
    ns
}

fn reservations(n: u64) -> f64 {
    let sim = sim();
    let t = Instant::now();
    let vas: Vec<_> = (0..n)
        .map(|_| sim.reserve(2 << 20).expect("reserve"))
        .collect();
    for va in vas {
        sim.free_reservation(va).expect("free");
    }
    t.elapsed().as_nanos() as f64 / (2 * n) as f64
}

/// ns per event of n inserts then n removes of `Address -> [u64; 4]` (about a block's size).
fn container<M: Default>(
    n: u64,
    insert: impl Fn(&mut M, u64),
    remove: impl Fn(&mut M, u64),
) -> f64 {
    let mut map = M::default();
    let t = Instant::now();
    for i in 0..n {
        insert(&mut map, 0x2_0000_0000 + (i << 21));
    }
    for i in 0..n {
        remove(&mut map, 0x2_0000_0000 + (i << 21));
    }
    std::hint::black_box(&map);
    t.elapsed().as_nanos() as f64 / (2 * n) as f64
}

fn keep<T>(value: T) {
    std::hint::black_box(value);
}

type Btree = std::collections::BTreeMap<u64, [u64; 4]>;
type Hash = rustc_hash::FxHashMap<u64, [u64; 4]>;

fn main() {
    let max: u64 = std::env::var("VMM_SCALING_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20);
    let min: u64 = std::env::var("VMM_SCALING_MIN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let sizes: Vec<u64> = std::iter::successors(Some(1024u64), |n| Some(n * 4))
        .skip_while(|&n| n < min)
        .take_while(|&n| n <= max)
        .collect();
    type Case = (&'static str, fn(u64) -> f64);
    let cases: [Case; 9] = [
        ("expandable/streams", |n| {
            alloc_free(&expandable(), n, |i| i + 1)
        }),
        ("expandable/live", |n| alloc_free(&expandable(), n, |_| 1)),
        ("classic/streams", |n| alloc_free(&classic(), n, |i| i + 1)),
        ("classic/live", |n| alloc_free(&classic(), n, |_| 1)),
        ("classic/oom", classic_oom),
        ("expandable/oom", expandable_oom),
        ("sim/reservations", reservations),
        ("std/btreemap", |n| {
            container::<Btree>(
                n,
                |m, k| keep(m.insert(k, [k; 4])),
                |m, k| keep(m.remove(&k)),
            )
        }),
        ("std/hashmap", |n| {
            container::<Hash>(
                n,
                |m, k| keep(m.insert(k, [k; 4])),
                |m, k| keep(m.remove(&k)),
            )
        }),
    ];
    let only = std::env::var("VMM_SCALING_CASE").unwrap_or_default();
    println!(
        "{:<22} {:>9} {:>12} {:>8}",
        "case", "n", "ns/event", "ratio"
    );
    for (name, run) in cases.into_iter().filter(|(name, _)| name.contains(&*only)) {
        let mut first = None;
        for &n in &sizes {
            let rounds = ((1u64 << 20) / n).max(1);
            let ns = (0..rounds).map(|_| run(n)).sum::<f64>() / rounds as f64;
            let base = *first.get_or_insert(ns);
            println!("{name:<22} {n:>9} {ns:>12.1} {:>8.2}", ns / base);
        }
    }
}
