//! The pressure soak (`tests/common/pressure_soak.rs`) on a real GPU: three CUDA streams, an
//! allocator held to 96 MiB by `per_process_memory_fraction`, blocks filled with
//! `cuMemsetD8Async` and incremented by a kernel on their own stream, freed with that work still
//! queued. Every remap, parked page, alias rescue and rescue space of the run is then the
//! driver's, and a synchronization the allocator skipped where it was needed shows as a block a
//! stale kernel incremented. Ignored without a GPU; `scripts/gpu-validate.sh` runs it with
//! `--include-ignored`. The same soak runs on Host in CI (`tests/all/pressure_soak_host.rs`).

#[path = "common/pressure_soak.rs"]
mod pressure_soak;

use std::collections::HashMap;
use std::sync::Arc;

use pressure_soak::{soak, Device};
use vmm_alloc::backend::{Backend, StreamId};
use vmm_alloc::cudarc::driver::result::memset_d8_async;
use vmm_alloc::cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use vmm_alloc::cudarc::nvrtc::Ptx;
use vmm_alloc::{CudaBackend, DevAddr, ExpandableAllocator, ExpandableConfig};

const ADD_ONE_PTX: &str = include_str!("data/add_one.ptx");
const MIB: usize = 1 << 20;

struct Gpu {
    backend: CudaBackend,
    streams: HashMap<StreamId, Arc<CudaStream>>,
    add_one: CudaFunction,
}

impl Device for Gpu {
    fn fill(&self, at: DevAddr, floats: usize, byte: u8, stream: StreamId) {
        let s = &self.streams[&stream];
        // A raw driver call: the context must be current on this thread (cudarc's own calls see
        // to it themselves).
        s.context().bind_to_thread().unwrap();
        // SAFETY: `at` starts a live allocation of at least `floats * 4` bytes, mapped read-write
        // in this context, and `s` is a stream of the same context.
        unsafe { memset_d8_async(at.get(), byte, floats * 4, s.cu_stream()) }.unwrap();
    }

    fn bump(&self, at: DevAddr, floats: usize, stream: StreamId) {
        let s = &self.streams[&stream];
        let (ptr, n) = (at.get(), floats as u32);
        let mut launch = s.launch_builder(&self.add_one);
        launch.arg(&ptr).arg(&n);
        // SAFETY: add_one takes (float*, unsigned) and touches data[0..n), which the live
        // allocation at `ptr` holds.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.unwrap();
    }

    fn read(&self, at: DevAddr, n: usize, stream: StreamId) -> Vec<f32> {
        self.streams[&stream].synchronize().unwrap();
        let mut raw = vec![0u8; n * 4];
        self.backend.read(at, &mut raw).unwrap();
        raw.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-validate.sh runs it"]
fn a_pressured_multi_stream_run_keeps_every_blocks_bytes_on_a_gpu() {
    let backend = CudaBackend::new(0).unwrap_or_else(|e| panic!("no GPU: {e}"));
    let context = backend.context();
    let mut streams = HashMap::new();
    for _ in 0..3 {
        let s = context.new_stream().unwrap();
        streams.insert(backend.register_stream(&s).unwrap(), s);
    }
    let add_one = context
        .load_module(Ptx::from_src(ADD_ONE_PTX))
        .unwrap()
        .load_function("add_one")
        .unwrap();
    let total = backend.mem_info().unwrap().total;
    // 96 MiB of the device, as the Host run's whole device; rescues on after an OOM, as there.
    let config = ExpandableConfig {
        memory_fraction: (96 * MIB) as f64 / total as f64,
        rescue_after_oom: true,
        ..ExpandableConfig::default()
    };
    let a = ExpandableAllocator::new(backend.clone(), config).unwrap();
    let mut ids: Vec<StreamId> = streams.keys().copied().collect();
    ids.sort();
    let gpu = Gpu {
        backend,
        streams,
        add_one,
    };
    let report = soak(&a, &gpu, &ids, 1, 300, 12).unwrap();
    eprintln!("{report:?}");
    report.assert_pressured();
}
