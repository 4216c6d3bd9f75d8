//! The pressure soak (`tests/common/pressure_soak.rs`) on Host: real bytes in memfd pages, three
//! streams on a 96 MiB device, every remap, parked page and alias rescue of the run checked
//! by what the blocks hold. The same soak runs on a GPU in `tests/cuda_pressure.rs`.

#[path = "../common/pressure_soak.rs"]
mod pressure_soak;

use pressure_soak::{soak, Device};
use vmm_alloc::backend::{Backend, HostBackend, HostConfig, StreamId};
use vmm_alloc::{DevAddr, ExpandableAllocator, ExpandableConfig};

const MIB: usize = 1 << 20;

/// Host memory is written and read at once: stream order holds trivially.
struct HostBytes<'a>(&'a ExpandableAllocator<HostBackend>);

impl HostBytes<'_> {
    fn floats(&self, at: DevAddr, n: usize) -> Vec<f32> {
        let mut raw = vec![0u8; n * 4];
        self.0.with_backend(|b| b.read(at, &mut raw)).unwrap();
        raw.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn store(&self, at: DevAddr, values: &[f32]) {
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.0.with_backend(|b| b.write(at, &raw)).unwrap();
    }
}

impl Device for HostBytes<'_> {
    fn fill(&self, at: DevAddr, floats: usize, byte: u8, _: StreamId) {
        self.0
            .with_backend(|b| b.write(at, &vec![byte; floats * 4]))
            .unwrap();
    }

    fn bump(&self, at: DevAddr, floats: usize, _: StreamId) {
        let mut v = self.floats(at, floats);
        v.iter_mut().for_each(|x| *x += 1.0);
        self.store(at, &v);
    }

    fn read(&self, at: DevAddr, n: usize, _: StreamId) -> Vec<f32> {
        self.floats(at, n)
    }
}

#[test]
fn a_pressured_multi_stream_run_keeps_every_blocks_bytes_on_host() {
    let host = HostBackend::with_config(HostConfig {
        capacity: 96 * MIB,
        ..HostConfig::default()
    })
    .unwrap();
    // Rescues stay on after an OOM, as for a program that catches it and goes on (by default
    // an OOM pauses them until `empty_cache`), so that the run makes some.
    let config = ExpandableConfig {
        rescue_after_oom: true,
        ..ExpandableConfig::default()
    };
    let a = ExpandableAllocator::new(host, config).unwrap();
    let streams = [StreamId::DEFAULT, StreamId::sim(1), StreamId::sim(2)];
    let report = soak(&a, &HostBytes(&a), &streams, 1, 300, 12).unwrap();
    eprintln!("{report:?}");
    report.assert_pressured();
}
