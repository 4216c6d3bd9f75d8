//! Hot path: the cost of one cached allocate + deallocate pair, the allocator's own bookkeeping
//! and nothing else (issue 7, benchmark 1).
//!
//! Sim backend (no driver time), 1 TiB so nothing ever runs out. For each allocator
//! (expandable with `Config::default()`, classic with PyTorch's defaults, PyTorch's expandable
//! policy) and each count of other live allocations (0, 1,000, 100,000) the allocator is built
//! once and filled, then each size (512 B, 64 KiB, 1 MiB, 20 MiB, 256 MiB) is allocated and
//! freed once untimed, so its memory is mapped and cached, and the pair is timed.
//!
//! The live allocations are built fragmented, as a long-running program leaves them: twice the
//! count is allocated (sizes cycling 512 B, 4 KiB, 64 KiB, 768 KiB) and every other one freed, so
//! the free-range index holds about as many ranges as there are live blocks. After each
//! measurement the backend's call count in `stats().calls` is compared: a pair that reached the
//! driver is reported, because it would not be measuring the cached path. (Only the expandable
//! policies fill `stats().calls`; classic's pairs are not checked this way.)
//!
//! All three allocators run in the same process, so their ratios hold on a noisy machine.
//! Names: `hot_path/<allocator>/<size>/live<count>`.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion};
use vmm_alloc::backend::SimConfig;
use vmm_alloc::config::Config;
use vmm_alloc::{
    Allocation, Allocator, ClassicAllocator, ExpandableAllocator, SimBackend, StreamId,
};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// The measured sizes, with the labels used in the benchmark names.
const SIZES: [(usize, &str); 5] = [
    (512, "512B"),
    (64 * KIB, "64KiB"),
    (MIB, "1MiB"),
    (20 * MIB, "20MiB"),
    (256 * MIB, "256MiB"),
];

/// Other live allocations held while measuring.
const LIVE: [usize; 3] = [0, 1_000, 100_000];

/// Sizes of the background allocations, cycled: small-pool and large-pool blocks both.
const BACKGROUND: [usize; 4] = [512, 4 * KIB, 64 * KIB, 768 * KIB];

fn sim() -> SimBackend {
    // 1 TiB: the 100,000 background blocks (about 21 GiB live) plus every measured size never
    // come near it, so no measurement is an OOM path.
    SimBackend::with_config(SimConfig {
        capacity: 1 << 40,
        ..SimConfig::default()
    })
    .expect("a 1 TiB Sim is a valid configuration")
}

/// Allocates `2 * live` blocks and frees every other one: `live` blocks stay live, separated by
/// free ranges. The returned blocks must stay alive for the whole measurement.
fn fill<A: Allocator>(alloc: &A, live: usize) -> Vec<Allocation> {
    let mut kept = Vec::with_capacity(live);
    let mut freed = Vec::with_capacity(live);
    for i in 0..2 * live {
        let a = alloc
            .allocate(BACKGROUND[(i / 2) % BACKGROUND.len()], StreamId::DEFAULT)
            .expect("background allocation");
        if i % 2 == 0 {
            kept.push(a);
        } else {
            freed.push(a);
        }
    }
    for a in freed {
        alloc.deallocate(a).expect("background free");
    }
    kept
}

/// Measures every size on one allocator holding `live` other allocations.
fn measure<A: Allocator>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    alloc: &A,
    live: usize,
) {
    let background = fill(alloc, live);
    for (size, label) in SIZES {
        // Untimed first pair: maps (or carves) the memory, which later pairs then find cached.
        let first = alloc
            .allocate(size, StreamId::DEFAULT)
            .expect("warm-up allocation");
        alloc.deallocate(first).expect("warm-up free");
        let before = alloc.stats().calls.total();
        group.bench_function(BenchmarkId::new(name, format!("{label}/live{live}")), |b| {
            b.iter(|| {
                let a = alloc
                    .allocate(black_box(size), StreamId::DEFAULT)
                    .expect("cached allocation");
                alloc.deallocate(black_box(a)).expect("cached free");
            })
        });
        let driver_calls = alloc.stats().calls.total() - before;
        if driver_calls > 0 {
            println!("note: {name} {label} live{live}: {driver_calls} driver calls while timed (not purely cached)");
        }
    }
    for a in background {
        alloc.deallocate(a).expect("background free");
    }
}

fn hot_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_path");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for live in LIVE {
        let expandable = ExpandableAllocator::new(sim(), Config::default()).expect("expandable");
        measure(&mut group, "expandable", &expandable, live);
        drop(expandable);
        let classic = ClassicAllocator::with_alloc_conf(sim(), "").expect("classic");
        measure(&mut group, "classic", &classic, live);
        drop(classic);
        let pytorch = ExpandableAllocator::new(sim(), Config::pytorch_expandable())
            .expect("pytorch-expandable");
        measure(&mut group, "pytorch-expandable", &pytorch, live);
    }
    group.finish();
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
