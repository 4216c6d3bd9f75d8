//! Growth and release of one segment, on any backend: shared by `growth.rs` (Host) and `gpu.rs`
//! (Cuda). See `growth.rs` for what each case measures.
//!
//! For one target size, in one criterion group `<prefix>/<N>GiB`:
//! * `raw-2MiB` / `raw-20MiB`: the floor, no allocator: create + map + set_access per page;
//! * `<allocator>/grow`: 64 MiB allocations until the target is allocated, from an empty allocator;
//! * `<allocator>/release`: deallocate everything + `empty_cache`;
//! * `expandable-warm-cache/regrow`: the same growth after a release that kept the handles.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode};
use vmm_alloc::backend::{Access, Backend, CallCounts, CallKind, PhysHandle};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::config::{AllocConf, ExpandableConfig};
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, StreamId};

use crate::bench_extra::Json;

pub const GIB: usize = 1 << 30;
pub const MIB: usize = 1 << 20;
/// Growth targets.
pub const TARGETS: [usize; 2] = [GIB, 8 * GIB];
/// Size of each allocation that grows the segment: large-pool requests, as a model's tensors are.
const STEP: usize = 64 * MIB;
/// Above the largest target, so `empty_cache` keeps every unmapped handle for the next growth.
const WARM_CACHE_LIMIT: usize = 16 * GIB;
/// The raw loop's page sizes: the granularity, and the expandable policies' large-pool page.
const RAW_PAGES: [usize; 2] = [2 * MIB, 20 * MIB];

/// Builds one allocator over a backend.
pub type Make<B> = fn(B) -> Box<dyn Allocator>;

fn expandable<B: Backend + 'static>(b: B) -> Box<dyn Allocator> {
    Box::new(ExpandableAllocator::new(b, ExpandableConfig::default()).expect("expandable"))
}

fn expandable_warm<B: Backend + 'static>(b: B) -> Box<dyn Allocator> {
    let config = ExpandableConfig {
        handle_cache_limit: WARM_CACHE_LIMIT,
        ..ExpandableConfig::default()
    };
    Box::new(ExpandableAllocator::new(b, config).expect("expandable"))
}

fn pytorch_expandable<B: Backend + 'static>(b: B) -> Box<dyn Allocator> {
    Box::new(ExpandableAllocator::new(b, ExpandableConfig::pytorch_expandable()).expect("pytorch"))
}

fn classic<B: Backend + 'static>(b: B) -> Box<dyn Allocator> {
    Box::new(ClassicAllocator::new(b, AllocConf::default()).expect("classic"))
}

/// The cases, in the order they run; `expandable-warm-cache` is expandable with a handle cache
/// above the target (`handle_cache_limit`).
fn cases<B: Backend + 'static>() -> [(&'static str, Make<B>); 4] {
    [
        ("expandable", expandable::<B>),
        ("pytorch-expandable", pytorch_expandable::<B>),
        ("classic", classic::<B>),
        ("expandable-warm-cache", expandable_warm::<B>),
    ]
}

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
fn raw_grow<B: Backend>(b: &B, target: usize, page: usize) -> Duration {
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

const COUNTED: [CallKind; 8] = [
    CallKind::Reserve,
    CallKind::Create,
    CallKind::Map,
    CallKind::SetAccess,
    CallKind::Unmap,
    CallKind::Release,
    CallKind::FreeReservation,
    CallKind::Synchronize,
];

fn counts_line(c: &CallCounts) -> String {
    COUNTED
        .iter()
        .filter(|&&k| c.calls(k) > 0)
        .map(|&k| format!("{} {}", k.driver_name(), c.calls(k)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn counts_json(c: &CallCounts) -> Json {
    Json::obj(
        COUNTED
            .iter()
            .map(|&k| (k.driver_name(), c.calls(k).into())),
    )
}

/// Driver calls of one grow / release / regrow cycle per allocator, and of the raw loops, for
/// growth to `target`: printed and returned (not timed). The figure behind the "zero creations
/// on warm regrowth" target.
pub fn call_counts<B: Backend + Clone + 'static>(target: usize, new: &dyn Fn() -> B) -> Json {
    println!("driver calls, growth to {} GiB:", target / GIB);
    let mut rows = Vec::new();
    let mut row = |case: &str, phase: &str, c: CallCounts| {
        println!("  {case:<24} {phase:<8} {}", counts_line(&c));
        rows.push(Json::obj([
            ("case", case.into()),
            ("phase", phase.into()),
            ("calls", counts_json(&c)),
        ]));
    };
    for (name, make) in cases::<B>() {
        let b = new();
        let a = make(b.clone());
        let before = b.calls();
        let blocks = grow(&*a, target);
        let grown = b.calls();
        release(&*a, blocks);
        let released = b.calls();
        let blocks = grow(&*a, target);
        let regrown = b.calls();
        release(&*a, blocks);
        row(name, "grow", grown.since(&before));
        row(name, "release", released.since(&grown));
        row(name, "regrow", regrown.since(&released));
    }
    for page in RAW_PAGES {
        let b = new();
        let before = b.calls();
        raw_grow(&b, target, page);
        row(
            &format!("raw-{}MiB", page / MIB),
            "cycle",
            b.calls().since(&before),
        );
    }
    Json::obj([("target_bytes", target.into()), ("rows", Json::Arr(rows))])
}

/// The criterion group `<prefix>/<N>GiB`: the raw loops, then grow and release per allocator and
/// the warm-cache regrowth, each allocator on a fresh backend from `new`.
pub fn bench_target<B: Backend + Clone + 'static>(
    c: &mut Criterion,
    prefix: &str,
    target: usize,
    new: &dyn Fn() -> B,
) {
    let mut g = c.benchmark_group(format!("{prefix}/{}GiB", target / GIB));
    // One iteration is milliseconds to tens of milliseconds: flat sampling keeps the run short.
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for page in RAW_PAGES {
        let b = new();
        g.bench_function(format!("raw-{}MiB", page / MIB), |bench| {
            bench.iter_custom(|iters| (0..iters).map(|_| raw_grow(&b, target, page)).sum())
        });
    }
    for (name, make) in cases::<B>() {
        let a = make(new());
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
