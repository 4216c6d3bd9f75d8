//! Threads: 1 and 2 threads, each on its own stream, running allocate/free loops against one
//! shared allocator on the Sim backend (no device cost: this is lock and bookkeeping throughput).
//! The workloads and allocators are `vmm_dev_support::bench_threads`'s (its docs say what each
//! is), which `replay/benches/gpu.rs` runs on Cuda too. Groups: `threads/<n>` (the mixed ring),
//! `threads-same-size/<n>` (each step allocates the size it freed) and `threads-varied/<n>`
//! (sizes that do not come back soon), for 1 and 2 threads.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use vmm_alloc::{SimBackend, StreamId};
use vmm_dev_support::bench_threads::{self as threads, Shapes};

fn bench_threads(c: &mut Criterion) {
    let contenders = threads::contenders(SimBackend::new);
    // Separate streams: each thread's blocks live in its own pools.
    let streams = [StreamId::sim(1), StreamId::sim(2)];
    for shapes in Shapes::ALL {
        threads::measure(
            c,
            shapes,
            &contenders,
            streams,
            |n| format!("{}/{n}", shapes.sim_group()),
            |g| {
                g.sample_size(20)
                    .warm_up_time(Duration::from_millis(500))
                    .measurement_time(Duration::from_secs(2));
            },
        );
    }
}

criterion_group!(benches, bench_threads);
criterion_main!(benches);
