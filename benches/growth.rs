//! Growth and release on the Host backend (real mmap/mprotect mappings of a sparse memfd; growth
//! maps pages without writing them, so 8 GiB costs address space and kernel VMAs, not RAM).
//!
//! For each target (1 GiB, 8 GiB), one process, every allocator:
//! * `raw-2MiB` / `raw-20MiB`: the floor, no allocator: create + map + set_access per page
//!   (granularity-sized pages, and the 20 MiB pages the expandable policies use for large blocks);
//! * `<allocator>/grow`: 64 MiB allocations until the target is allocated, from an empty allocator
//!   (every page a new physical handle);
//! * `<allocator>/release`: deallocate everything + `empty_cache`;
//! * `expandable-warm-cache/regrow`: the same growth after a release that kept the handles
//!   (`handle_cache_limit` above the target), so growth maps cached handles and creates none.
//!
//! Allocators: `expandable` (ours), `pytorch-expandable` (`ExpandableConfig::pytorch_expandable`: no handle
//! cache, so its regrowth is its cold growth) and `classic` (one `cudaMalloc`-style segment per 64 MiB
//! request; after `empty_cache` it has nothing to reuse either). Driver calls per phase are
//! printed once, outside timing, before the timed runs, and written to
//! `<target>/bench-extra/growth.json`. The code is in `vmm_dev_support::bench_growth`, shared with `gpu.rs`.
//! Names: `growth/<N>GiB/<case>`.

use vmm_dev_support::{bench_extra as extra, bench_growth as growth};

use criterion::{criterion_group, criterion_main, Criterion};
use extra::Json;
use growth::{GIB, MIB, TARGETS};
use vmm_alloc::backend::HostConfig;
use vmm_alloc::HostBackend;

fn host() -> HostBackend {
    // 16 GiB of sparse capacity: room for an 8 GiB segment plus the allocator's rounding.
    HostBackend::with_config(HostConfig {
        granularity: 2 * MIB,
        capacity: 16 * GIB,
    })
    .expect("host backend")
}

fn bench_growth(c: &mut Criterion) {
    let counts = TARGETS.map(|target| growth::call_counts(target, &host));
    extra::write(
        "growth",
        &Json::obj([("targets", Json::Arr(counts.into()))]),
    );
    for target in TARGETS {
        growth::bench_target(c, "growth", target, &host);
    }
}

criterion_group!(benches, bench_growth);
criterion_main!(benches);
