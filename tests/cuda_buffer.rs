//! `DeviceBuffer<T>` and `CudaMemory` on a real GPU: cudarc's calls on our memory, kernels, views,
//! stream-ordered drops, and the caller's current context left alone. Ignored without a GPU;
//! `scripts/gpu-validate.sh` runs them with `--include-ignored` (where a missing GPU fails them).
//! The same semantics are tested without a GPU on Sim and Host in `tests/buffer.rs`.

use std::sync::Arc;
use std::thread;

use vmm_alloc::cudarc::driver::result::ctx::get_current;
use vmm_alloc::cudarc::driver::{CudaFunction, DeviceSlice, LaunchConfig, PushKernelArg};
use vmm_alloc::cudarc::nvrtc::Ptx;
use vmm_alloc::{Allocator, CudaMemory, StreamId};

const ADD_ONE_PTX: &str = include_str!("data/add_one.ptx");

fn memory() -> Arc<CudaMemory> {
    CudaMemory::expandable(0).unwrap_or_else(|e| panic!("no GPU: {e}"))
}

fn add_one(memory: &CudaMemory) -> CudaFunction {
    let module = memory
        .context()
        .load_module(Ptx::from_src(ADD_ONE_PTX))
        .unwrap();
    module.load_function("add_one").unwrap()
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-validate.sh runs it"]
fn cudarc_copies_memsets_kernels_and_views_work_on_our_memory() {
    let memory = memory();
    let stream = memory.context().new_stream().unwrap();
    let n = 1000usize;
    let host: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let mut buf = memory.alloc::<f32>(n, &stream).unwrap();
    assert_eq!(buf.len(), n);
    stream.memcpy_htod(&host, &mut buf).unwrap();
    let f = add_one(&memory);
    let count = n as u32;
    let mut launch = stream.launch_builder(&f);
    launch.arg(&mut buf).arg(&count);
    // SAFETY: add_one takes (float*, unsigned) and touches data[0..n), which `buf` holds.
    unsafe { launch.launch(LaunchConfig::for_num_elems(count)) }.unwrap();
    let out = stream.clone_dtoh(&buf).unwrap();
    assert!(out.iter().zip(&host).all(|(o, h)| *o == h + 1.0));

    let view = buf.slice(100..110).unwrap();
    assert_eq!(
        stream.clone_dtoh(&view).unwrap(),
        host[100..110].iter().map(|h| h + 1.0).collect::<Vec<_>>()
    );
    assert!(buf.slice(0..n + 1).is_none());
    let mut tail = buf.slice_mut(n - 10..).unwrap();
    stream.memset_zeros(&mut tail).unwrap();
    let out = stream.clone_dtoh(&buf).unwrap();
    assert!(out[n - 10..].iter().all(|&x| x == 0.0));
    assert_eq!(out[n - 11], host[n - 11] + 1.0);

    let zeros = memory.alloc_zeros::<u64>(4096, &stream).unwrap();
    assert!(stream.clone_dtoh(&zeros).unwrap().iter().all(|&x| x == 0));
    drop((buf, zeros));
    stream.synchronize().unwrap();
    assert_eq!(memory.stats().allocated_bytes.all.current, 0);
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-validate.sh runs it"]
fn a_buffer_dropped_while_kernels_use_it_is_reused_in_stream_order() {
    let memory = memory();
    let stream = memory.context().new_stream().unwrap();
    let f = add_one(&memory);
    let n = 16usize << 20; // 64 MiB of f32: the kernels below take a while
    let count = n as u32;
    let mut a = memory.alloc_zeros::<f32>(n, &stream).unwrap();
    for _ in 0..200 {
        let mut launch = stream.launch_builder(&f);
        launch.arg(&mut a).arg(&count);
        // SAFETY: as above.
        unsafe { launch.launch(LaunchConfig::for_num_elems(count)) }.unwrap();
    }
    let p = a.device_address();
    drop(a); // the kernels are most likely still running
    let mut b = memory.alloc::<f32>(n, &stream).unwrap();
    assert_eq!(
        b.device_address(),
        p,
        "reused on its stream at once, no synchronization"
    );
    let pattern: Vec<f32> = (0..n).map(|i| (i % 977) as f32).collect();
    stream.memcpy_htod(&pattern, &mut b).unwrap();
    assert_eq!(
        stream.clone_dtoh(&b).unwrap(),
        pattern,
        "queued after the kernels, not overwritten by them"
    );
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-validate.sh runs it"]
fn our_calls_leave_the_current_context_alone_and_allocators_coexist() {
    thread::spawn(|| {
        assert_eq!(
            get_current().unwrap(),
            None,
            "a fresh thread has no current context"
        );
        let first = memory();
        assert_eq!(
            get_current().unwrap(),
            None,
            "creating the allocator changed the context"
        );
        let second = CudaMemory::expandable(0).unwrap();
        let a = first.allocate(5 << 20, StreamId::DEFAULT).unwrap();
        let b = second.allocate(5 << 20, StreamId::DEFAULT).unwrap();
        assert_eq!(get_current().unwrap(), None, "allocate changed the context");
        assert!(
            a.ptr().get() + a.size() as u64 <= b.ptr().get()
                || b.ptr().get() + b.size() as u64 <= a.ptr().get()
        );
        first.deallocate(a).unwrap();
        second.deallocate(b).unwrap();
        first.empty_cache().unwrap();
        second.empty_cache().unwrap();
        let ctx = first.context();
        let stream = ctx.default_stream();
        let buf = first.alloc::<u8>(1 << 20, &stream).unwrap();
        // cudarc's own calls bind the context; ours must put back what was current.
        ctx.bind_to_thread().unwrap();
        let bound = get_current().unwrap();
        assert!(bound.is_some());
        drop(buf);
        first.empty_cache().unwrap();
        assert_eq!(get_current().unwrap(), bound);
        drop((first, second, stream, ctx));
        assert_eq!(
            get_current().unwrap(),
            bound,
            "dropping the allocators changed the context"
        );
    })
    .join()
    .unwrap();
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-validate.sh runs it"]
fn buffers_move_between_threads_and_free_there() {
    let memory = memory();
    let stream = memory.context().new_stream().unwrap();
    let bufs: Vec<_> = (0..8)
        .map(|i| memory.alloc_zeros::<u32>(1000 + i * 4096, &stream).unwrap())
        .collect();
    let workers: Vec<_> = bufs
        .into_iter()
        .map(|buf| {
            let stream = stream.clone();
            thread::spawn(move || {
                assert!(stream.clone_dtoh(&buf).unwrap().iter().all(|&x| x == 0));
                drop(buf);
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(memory.stats().allocated_bytes.all.current, 0);
}
