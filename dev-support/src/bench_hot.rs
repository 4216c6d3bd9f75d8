//! The hot-path measurement shared by `hot_path.rs` (Sim) and `gpu.rs` (Cuda): one cached
//! allocate + deallocate pair per size, with a fragmented set of other live allocations.

use std::hint::black_box;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId};
use vmm_alloc::backend::Backend;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocation, Allocator, ClassicAllocator, ExpandableAllocator, StreamId};

use crate::bench_extra::Json;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// The measured sizes, with the labels used in the benchmark names.
pub const SIZES: [(usize, &str); 5] = [
    (512, "512B"),
    (64 * KIB, "64KiB"),
    (MIB, "1MiB"),
    (20 * MIB, "20MiB"),
    (256 * MIB, "256MiB"),
];

/// Sizes of the background allocations, cycled: small-pool and large-pool blocks both.
const BACKGROUND: [usize; 4] = [512, 4 * KIB, 64 * KIB, 768 * KIB];

/// The case name of one size at one live count: `<size>/live<count>`.
pub fn case(label: &str, live: usize) -> String {
    format!("{label}/live{live}")
}

/// Allocates `2 * live` blocks and frees every other one: `live` blocks stay live, separated by
/// free ranges. The returned blocks must stay alive for the whole measurement.
fn fill<A: Allocator + ?Sized>(alloc: &A, live: usize) -> Vec<Allocation> {
    let mut kept = Vec::with_capacity(live);
    let mut freed = Vec::with_capacity(live);
    for i in 0..2 * live {
        let a = alloc
            .allocate(BACKGROUND[(i / 2) % BACKGROUND.len()], StreamId::DEFAULT)
            .expect("background allocation");
        if i % 2 == 0 {
            kept.push(a);
        } else {
            freed.push(a);
        }
    }
    for a in freed {
        alloc.deallocate(a).expect("background free");
    }
    kept
}

/// A timed pair that reached the driver: `(allocator, case, driver calls)`. It would not be
/// measuring the cached path.
pub type DriverNote = (String, String, u64);

/// Measures every size on one allocator holding `live` other allocations. Returns the sizes whose
/// timed pairs made driver calls (only the expandable policies fill `stats().calls`).
pub fn measure<A: Allocator + ?Sized>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    alloc: &A,
    live: usize,
) -> Vec<DriverNote> {
    let mut notes = Vec::new();
    let background = fill(alloc, live);
    for (size, label) in SIZES {
        // Untimed first pair: maps (or carves) the memory, which later pairs then find cached.
        let first = alloc
            .allocate(size, StreamId::DEFAULT)
            .expect("warm-up allocation");
        alloc.deallocate(first).expect("warm-up free");
        let before = alloc.stats().calls.total();
        group.bench_function(BenchmarkId::new(name, case(label, live)), |b| {
            b.iter(|| {
                let a = alloc
                    .allocate(black_box(size), StreamId::DEFAULT)
                    .expect("cached allocation");
                alloc.deallocate(black_box(a)).expect("cached free");
            })
        });
        let driver_calls = alloc.stats().calls.total() - before;
        if driver_calls > 0 {
            println!("note: {name} {label} live{live}: {driver_calls} driver calls while timed (not purely cached)");
            notes.push((name.to_string(), case(label, live), driver_calls));
        }
    }
    for a in background {
        alloc.deallocate(a).expect("background free");
    }
    notes
}

/// Measures the three allocators (expandable, classic, PyTorch's expandable policy), one after
/// the other, each on a fresh backend from `backend` holding `live` other allocations.
pub fn measure_all<B: Backend>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    live: usize,
    backend: impl Fn() -> B,
) -> Vec<DriverNote> {
    let mut notes = Vec::new();
    let expandable =
        ExpandableAllocator::new(backend(), ExpandableConfig::default()).expect("expandable");
    notes.extend(measure(group, "expandable", &expandable, live));
    drop(expandable);
    let classic = ClassicAllocator::with_alloc_conf(backend(), "").expect("classic");
    notes.extend(measure(group, "classic", &classic, live));
    drop(classic);
    let pytorch = ExpandableAllocator::new(backend(), ExpandableConfig::pytorch_expandable())
        .expect("pytorch-expandable");
    notes.extend(measure(group, "pytorch-expandable", &pytorch, live));
    notes
}

/// The side output: the timed pairs that reached the driver (none expected).
pub fn driver_notes(notes: Vec<DriverNote>) -> Json {
    let rows = notes.into_iter().map(|(allocator, case, calls)| {
        Json::obj([
            ("allocator", allocator.into()),
            ("case", case.into()),
            ("driver_calls", calls.into()),
        ])
    });
    Json::obj([("driver_calls_while_timed", Json::Arr(rows.collect()))])
}
