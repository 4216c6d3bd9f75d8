//! What the buffer wrapper costs: a `Buffer` allocate + drop pair against the bare
//! `allocate` + `deallocate` pair it wraps, on Sim (no driver, so only the bookkeeping and the
//! wrapper are timed), for both allocators, warm (the block is cached: the hot path).
//!
//! Ids: `buffer_pair/<allocator>/{allocation,buffer}/<size>`. The target (issue 17): the
//! buffer costs at most 10 ns more than the bare pair. `DeviceBuffer<T>` adds cudarc's events on
//! a GPU; that pair is `gpu_hot_path/device-buffer` in `gpu.rs`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use vmm_alloc::backend::SimBackend;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocator, Buffer, ClassicAllocator, ExpandableAllocator, StreamId};

const SIZES: [(usize, &str); 2] = [(4096, "4KiB"), (3 << 20, "3MiB")];

fn pair<A: Allocator + 'static>(c: &mut Criterion, name: &str, alloc: Arc<A>) {
    let mut group = c.benchmark_group("buffer_pair");
    for (size, label) in SIZES {
        // Warm: the block exists and is cached, as in a running program.
        drop(Buffer::new(&alloc, size, StreamId::DEFAULT).unwrap());
        group.bench_function(BenchmarkId::new(format!("{name}/allocation"), label), |b| {
            b.iter(|| {
                let a = alloc.allocate(black_box(size), StreamId::DEFAULT).unwrap();
                alloc.deallocate(black_box(a)).unwrap();
            })
        });
        group.bench_function(BenchmarkId::new(format!("{name}/buffer"), label), |b| {
            b.iter(|| {
                let buf = Buffer::new(&alloc, black_box(size), StreamId::DEFAULT).unwrap();
                drop(black_box(buf));
            })
        });
    }
    group.finish();
}

fn buffer_pair(c: &mut Criterion) {
    let expandable =
        ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
    pair(c, "expandable", Arc::new(expandable));
    let classic = ClassicAllocator::with_alloc_conf(SimBackend::new(), "").unwrap();
    pair(c, "classic", Arc::new(classic));
}

criterion_group!(benches, buffer_pair);
criterion_main!(benches);
