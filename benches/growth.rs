//! Growth and release on the Host backend (real mmap/mprotect mappings of a sparse memfd; growth
//! maps pages without writing them, so 8 GiB costs address space and kernel VMAs, not RAM).
//!
//! For each target (1 GiB, 8 GiB), one process, every allocator:
//! * `raw-2MiB` / `raw-20MiB`: the floor, no allocator: create + map + set_access per page
//!   (granularity-sized pages, and the 20 MiB pages the expandable policies use for large blocks);
//! * `<allocator>/grow`: 64 MiB allocations until the target is allocated, from an empty allocator
//!   (every page a new physical handle);
//! * `<allocator>/release`: deallocate everything + `empty_cache`;
//! * `expandable/regrow-warm`: the same growth after a release that kept the handles
//!   (`handle_cache_limit` above the target), so growth maps cached handles and creates none.
//!
//! Allocators: `expandable` (ours), `pytorch-expandable` (`Config::pytorch_expandable`: no handle
//! cache, so its regrowth is its cold growth) and `classic` (one `cudaMalloc`-style segment per 64 MiB
//! request; after `empty_cache` it has nothing to reuse either). Driver calls per phase are
//! printed once, outside timing, before the timed runs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode};
use vmm_alloc::backend::{Access, Backend, CallCounts, CallKind, HostConfig, PhysHandle};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::config::{AllocConf, Config};
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, HostBackend, StreamId};

const GIB: usize = 1 << 30;
const MIB: usize = 1 << 20;
/// Growth targets. 8 GiB fits: the backend's capacity below is 16 GiB and nothing is written.
const TARGETS: [usize; 2] = [GIB, 8 * GIB];
/// Size of each allocation that grows the segment: large-pool requests, as a model's tensors are.
const STEP: usize = 64 * MIB;
/// Above the largest target, so `empty_cache` keeps every unmapped handle for the next growth.
const WARM_CACHE_LIMIT: usize = 16 * GIB;

fn host() -> HostBackend {
    // 16 GiB of sparse capacity: room for an 8 GiB segment plus the allocator's rounding.
    HostBackend::with_config(HostConfig {
        granularity: 2 * MIB,
        capacity: 16 * GIB,
    })
    .expect("host backend")
}

type Make = fn(HostBackend) -> Box<dyn Allocator>;

fn expandable(b: HostBackend) -> Box<dyn Allocator> {
    Box::new(ExpandableAllocator::new(b, Config::default()).expect("expandable"))
}

fn expandable_warm(b: HostBackend) -> Box<dyn Allocator> {
    let config = Config {
        handle_cache_limit: WARM_CACHE_LIMIT,
        ..Config::default()
    };
    Box::new(ExpandableAllocator::new(b, config).expect("expandable"))
}

fn pytorch_expandable(b: HostBackend) -> Box<dyn Allocator> {
    Box::new(ExpandableAllocator::new(b, Config::pytorch_expandable()).expect("pytorch"))
}

fn classic(b: HostBackend) -> Box<dyn Allocator> {
    Box::new(ClassicAllocator::new(b, AllocConf::default()).expect("classic"))
}

const ALLOCATORS: [(&str, Make); 3] = [
    ("expandable", expandable),
    ("pytorch-expandable", pytorch_expandable),
    ("classic", classic),
];

fn grow(a: &dyn Allocator, target: usize) -> Vec<Allocation> {
    (0..target / STEP)
        .map(|_| a.allocate(STEP, StreamId::DEFAULT).expect("growth"))
        .collect()
}

fn release(a: &dyn Allocator, blocks: Vec<Allocation>) {
    for b in blocks {
        a.deallocate(b).expect("deallocate");
    }
    a.empty_cache().expect("empty_cache");
}

/// The raw loop: a reservation, then per page create + map + set_access. Returns the time of the
/// page loop only (the reservation and the teardown are not growth). Rounds the target up to whole
/// pages, as the allocators do (1 GiB is 52 pages of 20 MiB).
fn raw_grow(b: &HostBackend, target: usize, page: usize) -> Duration {
    let pages = target.div_ceil(page);
    let len = pages * page;
    let va = b.reserve(len).expect("reserve");
    let own = [Access::read_write(b.device())];
    let mut handles: Vec<PhysHandle> = Vec::with_capacity(pages);
    let t = Instant::now();
    for i in 0..pages {
        let at = va.start.checked_add(i * page).expect("inside");
        let h = b.create(page).expect("create");
        b.map(at, page, h, 0).expect("map");
        b.set_access(at, page, &own).expect("set_access");
        handles.push(h);
    }
    let took = t.elapsed();
    b.unmap(va.start, len).expect("unmap");
    for h in handles {
        b.release(h).expect("release");
    }
    b.free_reservation(va).expect("free_reservation");
    took
}

fn counts(c: &CallCounts) -> String {
    use CallKind::*;
    [
        Reserve,
        Create,
        Map,
        SetAccess,
        Unmap,
        Release,
        FreeReservation,
        Synchronize,
    ]
    .iter()
    .filter(|&&k| c.calls(k) > 0)
    .map(|&k| format!("{} {}", k.driver_name(), c.calls(k)))
    .collect::<Vec<_>>()
    .join(", ")
}

/// Driver calls of one grow / release / regrow cycle per allocator, printed once (not timed):
/// the figure behind the "zero creations on warm regrowth" target.
fn print_call_counts() {
    let mut rows: Vec<(&str, Make)> = ALLOCATORS.to_vec();
    rows.insert(1, ("expandable (warm cache)", expandable_warm));
    for target in TARGETS {
        println!("driver calls, growth to {} GiB:", target / GIB);
        for &(name, make) in &rows {
            let b = host();
            let a = make(b.clone());
            let phase = |what: &str, f: &mut dyn FnMut()| {
                let before = b.calls();
                f();
                println!(
                    "  {name:<24} {what:<8} {}",
                    counts(&b.calls().since(&before))
                );
            };
            let mut blocks = Vec::new();
            phase("grow", &mut || blocks = grow(&*a, target));
            phase("release", &mut || release(&*a, std::mem::take(&mut blocks)));
            phase("regrow", &mut || blocks = grow(&*a, target));
            release(&*a, blocks);
        }
        let b = host();
        let before = b.calls();
        raw_grow(&b, target, 2 * MIB);
        println!(
            "  {:<24} {:<8} {}",
            "raw-2MiB",
            "cycle",
            counts(&b.calls().since(&before))
        );
    }
}

fn bench_growth(c: &mut Criterion) {
    print_call_counts();
    for target in TARGETS {
        let mut g = c.benchmark_group(format!("growth/{}GiB", target / GIB));
        // One iteration is milliseconds to tens of milliseconds: flat sampling keeps the run short.
        g.sampling_mode(SamplingMode::Flat)
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        for page in [2 * MIB, 20 * MIB] {
            let b = host();
            g.bench_function(format!("raw-{}MiB", page / MIB), |bench| {
                bench.iter_custom(|iters| (0..iters).map(|_| raw_grow(&b, target, page)).sum())
            });
        }
        let mut cases: Vec<(&str, Make)> = ALLOCATORS.to_vec();
        cases.push(("expandable-warm-cache", expandable_warm));
        for (name, make) in cases {
            let a = make(host());
            let a = &*a;
            let warm = name == "expandable-warm-cache";
            if warm {
                // Fill the handle cache once: every later growth finds its handles there.
                let blocks = grow(a, target);
                release(a, blocks);
            }
            let grow_id = if warm { "regrow" } else { "grow" };
            g.bench_function(BenchmarkId::new(name, grow_id), |bench| {
                bench.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let t = Instant::now();
                        let blocks = black_box(grow(a, target));
                        total += t.elapsed();
                        release(a, blocks);
                    }
                    total
                })
            });
            if !warm {
                g.bench_function(BenchmarkId::new(name, "release"), |bench| {
                    bench.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let blocks = grow(a, target);
                            let t = Instant::now();
                            release(a, black_box(blocks));
                            total += t.elapsed();
                        }
                        total
                    })
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench_growth);
criterion_main!(benches);
