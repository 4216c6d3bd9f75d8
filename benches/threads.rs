//! Threads: 1 and 2 threads, each on its own stream, running allocate/free loops against one
//! shared allocator on the Sim backend (no device cost: this is lock and bookkeeping throughput).
//! Reported as operations per second, one operation being one `allocate` or one `deallocate`.
//!
//! Each thread keeps a ring of `RING` live blocks and, per step, frees the oldest and allocates the
//! next size of `SIZES` (small and large pools both), so the free-range index holds more than one
//! block. Every allocator (expandable, pytorch-expandable, classic) runs in the same process.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::config::{AllocConf, ExpandableConfig};
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, SimBackend, StreamId};

const SIZES: [usize; 6] = [512, 4 << 10, 64 << 10, 1 << 20, 3 << 20, 20 << 20];
const RING: usize = 8;
/// Allocate/free pairs per thread per iteration: enough that spawning the threads is noise.
const PAIRS: usize = 2_000;

type Make = fn() -> Arc<dyn Allocator>;

const ALLOCATORS: [(&str, Make); 3] = [
    ("expandable", || {
        Arc::new(
            ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default())
                .expect("alloc"),
        )
    }),
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

/// One thread's loop: `pairs` times, free the oldest of the ring and allocate the next size.
fn churn(a: &dyn Allocator, stream: StreamId, ring: &mut Vec<Allocation>, pairs: usize) {
    for i in 0..pairs {
        let old = ring.remove(0);
        a.deallocate(old).expect("deallocate");
        let size = SIZES[i % SIZES.len()];
        ring.push(black_box(a.allocate(size, stream).expect("allocate")));
    }
}

/// Runs `iters * PAIRS` pairs on each of `threads` threads at once and returns the time from the
/// common start to the last thread's end (thread start-up is outside it).
fn run(a: &Arc<dyn Allocator>, threads: usize, iters: u64) -> Duration {
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let a = Arc::clone(a);
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
                start.wait();
                churn(&*a, stream, &mut ring, iters as usize * PAIRS);
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
    for threads in [1, 2] {
        let mut g = c.benchmark_group(format!("threads/{threads}"));
        g.sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2))
            .throughput(Throughput::Elements((threads * PAIRS * 2) as u64));
        for (name, make) in ALLOCATORS {
            let a = make();
            // Map every segment once, so the timed loops run on cached memory.
            run(&a, threads, 1);
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| run(&a, threads, iters))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench_threads);
criterion_main!(benches);
