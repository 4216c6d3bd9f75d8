//! The C ABI's malloc + free pair against the Rust allocator's own pair, both on the Sim backend
//! with the default configuration: the difference is what the boundary costs (device lookup,
//! stream id, `catch_unwind`, the recording and sleep-pool checks). Target: at most 20 ns.
use std::ffi::c_void;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocator, ExpandableAllocator, SimBackend, StreamId};

fn pairs(c: &mut Criterion) {
    let mut group = c.benchmark_group("abi_pair");
    for size in [4096usize, 3 << 20] {
        let rust =
            ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
        group.bench_function(format!("rust_{size}"), |b| {
            b.iter(|| {
                let a = rust.allocate(black_box(size), StreamId::DEFAULT).unwrap();
                rust.deallocate(a).unwrap();
            })
        });
        // SAFETY: a valid C string; before the first allocation.
        let rc = vmm_alloc_capi::vmm_alloc_configure(
            std::ptr::null(),
            std::ptr::null(),
            c"sim".as_ptr(),
        );
        assert!(rc == 0 || size != 4096, "configure failed");
        group.bench_function(format!("c_abi_{size}"), |b| {
            b.iter(|| {
                let mut p: *mut c_void = std::ptr::null_mut();
                // SAFETY: `p` is a valid out pointer.
                let rc = unsafe {
                    vmm_alloc_capi::vmm_alloc_try_malloc(
                        black_box(size),
                        0,
                        std::ptr::null_mut(),
                        &mut p,
                    )
                };
                assert_eq!(rc, 0);
                vmm_alloc_capi::vmm_alloc_free(p, size, 0, std::ptr::null_mut());
            })
        });
    }
    group.finish();
}

criterion_group!(benches, pairs);
criterion_main!(benches);
