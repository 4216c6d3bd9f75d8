//! Hot path: the cost of one cached allocate + deallocate pair, the allocator's own bookkeeping
//! and nothing else (issue 7, benchmark 1).
//!
//! Sim backend (no driver time), 1 TiB so nothing ever runs out. For each allocator
//! (expandable with `ExpandableConfig::default()`, classic with PyTorch's defaults, PyTorch's expandable
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
//! The measurement is in `vmm_dev_support::bench_hot` (shared with `gpu.rs`); the pairs that reached the
//! driver, if any, go to `<target>/bench-extra/hot_path.json`.
//! Names: `hot_path/<allocator>/<size>/live<count>`.

use vmm_dev_support::{bench_extra as extra, bench_hot as hot};

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use vmm_alloc::backend::SimConfig;
use vmm_alloc::SimBackend;

/// Other live allocations held while measuring.
const LIVE: [usize; 3] = [0, 1_000, 100_000];

fn sim() -> SimBackend {
    // 1 TiB: the 100,000 background blocks (about 21 GiB live) plus every measured size never
    // come near it, so no measurement is an OOM path.
    SimBackend::with_config(SimConfig {
        capacity: 1 << 40,
        ..SimConfig::default()
    })
    .expect("a 1 TiB Sim is a valid configuration")
}

fn hot_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_path");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let mut notes = Vec::new();
    for live in LIVE {
        notes.extend(hot::measure_all(&mut group, live, sim));
    }
    group.finish();
    extra::write("hot_path", &hot::driver_notes(notes));
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
