//! Threads: 1 and 2 threads, each on its own stream, running allocate/free loops against one
//! shared allocator on the Sim backend (no device cost: this is lock and bookkeeping throughput).
//! Reported as operations per second, one operation being one `allocate` or one `deallocate`.
//! The total work is the same for 1 and 2 threads (`PAIRS` pairs per iteration, split between
//! the threads), so the two groups' times compare directly.
//!
//! Each thread keeps a ring of `RING` live blocks and, per step, frees the oldest and allocates the
//! next size of `SIZES` (small and large pools both), so the free-range index holds more than one
//! block; in the `threads-same-size` groups it allocates the size it just freed instead, and in
//! the `threads-varied` groups the next of 48 sizes (512 B to 8.5 MiB), so a size comes back only
//! 48 steps after it was last asked for: what a per-stream cache of freed blocks cannot serve. Every allocator (expandable: the default, whose per-stream front cache engages
//! once threads contend; `-front-cache` with it always on; `-single-lock` with it off;
//! pytorch-expandable, classic) runs in the same process, and so does `expandable-unshared`: one
//! allocator per thread, nothing shared, the most any locking scheme could reach on the machine.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::config::{AllocConf, ExpandableConfig, FrontCacheMode};
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, SimBackend, StreamId};

const SIZES: [usize; 6] = [512, 4 << 10, 64 << 10, 1 << 20, 3 << 20, 20 << 20];
const RING: usize = 8;
/// Allocate/free pairs per iteration, all threads together: enough that spawning the threads is
/// noise.
const PAIRS: usize = 4_000;

type Make = fn() -> Arc<dyn Allocator>;

fn expandable() -> Arc<dyn Allocator> {
    Arc::new(
        ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).expect("alloc"),
    )
}

/// `expandable-unshared` makes a fresh allocator per thread from this marker.
const UNSHARED: &str = "expandable-unshared";

const ALLOCATORS: [(&str, Make); 6] = [
    ("expandable", expandable),
    ("expandable-single-lock", || {
        let config = ExpandableConfig {
            front_cache: FrontCacheMode::Off,
            ..ExpandableConfig::default()
        };
        Arc::new(ExpandableAllocator::new(SimBackend::new(), config).expect("alloc"))
    }),
    ("expandable-front-cache", || {
        let config = ExpandableConfig {
            front_cache: FrontCacheMode::Always,
            ..ExpandableConfig::default()
        };
        Arc::new(ExpandableAllocator::new(SimBackend::new(), config).expect("alloc"))
    }),
    (UNSHARED, expandable),
    ("pytorch-expandable", || {
        Arc::new(
            ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::pytorch_expandable())
                .expect("alloc"),
        )
    }),
    ("classic", || {
        Arc::new(ClassicAllocator::new(SimBackend::new(), AllocConf::default()).expect("alloc"))
    }),
];

/// What each step of a thread's loop allocates after freeing the oldest block of its ring.
#[derive(Clone, Copy)]
enum Shapes {
    /// The next of `SIZES`: each size freed four allocations before it is asked for again.
    Ring,
    /// The size just freed (fixed shapes: a tensor freed and the next of its shape allocated).
    SameSize,
    /// The next of `VARIED` sizes: none asked for again within 48 steps.
    Varied,
}

/// The `threads-varied` sizes: 48 of them, from 512 B up by 23 % a step, rounded to 512 B.
fn varied(i: usize) -> usize {
    let k = (i % 48) as i32;
    ((512.0 * 1.23f64.powi(k)) as usize).div_ceil(512) * 512
}

/// One thread's loop: `pairs` times, free the oldest of the ring and allocate the next size.
fn churn(
    a: &dyn Allocator,
    stream: StreamId,
    ring: &mut Vec<Allocation>,
    pairs: usize,
    shapes: Shapes,
) {
    for i in 0..pairs {
        let old = ring.remove(0);
        let size = match shapes {
            Shapes::SameSize => old.requested(),
            Shapes::Ring => SIZES[i % SIZES.len()],
            Shapes::Varied => varied(i),
        };
        a.deallocate(old).expect("deallocate");
        ring.push(black_box(a.allocate(size, stream).expect("allocate")));
    }
}

/// Runs `iters * PAIRS / threads` pairs on each of `threads` threads at once (each on its own
/// allocator when `unshared`: fresh ones, warmed before the start) and returns the time from
/// the common start to the last thread's end (thread start-up is outside it).
fn run(
    a: &Arc<dyn Allocator>,
    unshared: bool,
    shapes: Shapes,
    threads: usize,
    iters: u64,
) -> Duration {
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let a = if unshared {
                expandable()
            } else {
                Arc::clone(a)
            };
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                // Separate streams: each thread's blocks live in its own pools.
                let stream = StreamId::sim(t as u64 + 1);
                let mut ring: Vec<Allocation> = (0..RING)
                    .map(|i| {
                        a.allocate(SIZES[i % SIZES.len()], stream)
                            .expect("allocate")
                    })
                    .collect();
                if unshared {
                    churn(&*a, stream, &mut ring, PAIRS, shapes);
                }
                start.wait();
                churn(
                    &*a,
                    stream,
                    &mut ring,
                    iters as usize * PAIRS / threads,
                    shapes,
                );
                for b in ring {
                    a.deallocate(b).expect("deallocate");
                }
            })
        })
        .collect();
    start.wait();
    let t = Instant::now();
    for h in handles {
        h.join().expect("thread");
    }
    t.elapsed()
}

fn bench_threads(c: &mut Criterion) {
    // `threads`: the mixed ring; `threads-same-size`: each step allocates the size it freed;
    // `threads-varied`: sizes that do not come back soon.
    for (prefix, shapes) in [
        ("threads", Shapes::Ring),
        ("threads-same-size", Shapes::SameSize),
        ("threads-varied", Shapes::Varied),
    ] {
        for threads in [1, 2] {
            let mut g = c.benchmark_group(format!("{prefix}/{threads}"));
            g.sample_size(20)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(2))
                .throughput(Throughput::Elements((PAIRS * 2) as u64));
            for (name, make) in ALLOCATORS {
                let a = make();
                let unshared = name == UNSHARED;
                // Map every segment once, so the timed loops run on cached memory.
                run(&a, unshared, shapes, threads, 1);
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter_custom(|iters| run(&a, unshared, shapes, threads, iters))
                });
            }
            g.finish();
        }
    }
}

criterion_group!(benches, bench_threads);
criterion_main!(benches);
