//! Runs one seeded, fragmentation-heavy workload under memory pressure through our expandable
//! allocator and through PyTorch's expandable policy, on the Sim backend, and prints what each
//! needed: peak reserved, handles created, retries, OOMs, bytes remapped.
//!
//! The workload: training-like steps whose batch size varies, each allocating activations layer by
//! layer (sizes from 1 KiB to 96 MiB) and freeing them in reverse, while every few steps a
//! long-lived tensor is kept, so free memory ends up scattered between live blocks, on two streams.
//!
//! Usage: `cargo run --release --example policies [capacity_gib]` (default 2.5).

use vmm_alloc::backend::{Backend, CallKind, SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;

/// A small seeded generator (xorshift64*), so both policies see the same requests.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Outcome {
    peak_reserved: u64,
    peak_allocated: u64,
    creates: u64,
    releases: u64,
    retries: u64,
    ooms: u64,
    remapped: u64,
}

fn run(config: ExpandableConfig, capacity: usize) -> Outcome {
    let sim = SimBackend::with_config(SimConfig {
        capacity,
        ..SimConfig::default()
    })
    .expect("valid sim config");
    let alloc = ExpandableAllocator::new(sim.clone(), config).expect("valid config");
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let mut kept: Vec<Allocation> = Vec::new();
    let mut ooms = 0;
    for step in 0..400 {
        let stream = StreamId::sim(step % 2);
        let batch = 1 + rng.below(8) as usize;
        let mut acts = Vec::new();
        for _layer in 0..24 {
            let size = match rng.below(10) {
                0..=3 => 1024 + rng.below(MB as u64) as usize,
                4..=7 => batch * (2 * MB + rng.below(6 * MB as u64) as usize),
                _ => batch * (8 * MB + rng.below(4 * MB as u64) as usize),
            };
            match alloc.allocate(size, stream) {
                Ok(a) => acts.push(a),
                Err(_) => ooms += 1,
            }
        }
        if step % 5 == 0 && !acts.is_empty() {
            let i = rng.below(acts.len() as u64) as usize;
            kept.push(acts.swap_remove(i));
        }
        if kept.len() > 24 {
            let i = rng.below(kept.len() as u64) as usize;
            alloc
                .deallocate(kept.swap_remove(i))
                .expect("live allocation");
        }
        while let Some(a) = acts.pop() {
            alloc.deallocate(a).expect("live allocation");
        }
    }
    let stats = alloc.stats();
    let calls = sim.calls();
    Outcome {
        peak_reserved: stats.reserved_bytes.all.peak,
        peak_allocated: stats.allocated_bytes.all.peak,
        creates: calls.calls(CallKind::Create),
        releases: calls.calls(CallKind::Release),
        retries: stats.num_alloc_retries,
        ooms,
        remapped: stats.remapped_bytes,
    }
}

fn main() {
    let gib: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2.5);
    let capacity = ((gib * (1u64 << 30) as f64) as usize).next_multiple_of(2 * MB);
    println!("workload: 400 steps x 24 layers, 2 streams, Sim device of {gib} GiB\n");
    println!(
        "| policy | peak allocated | peak reserved | handles created | handles released | free-all retries | OOMs | remapped |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, config) in [
        ("pytorch-expandable", ExpandableConfig::pytorch_expandable()),
        ("expandable (ours)", ExpandableConfig::default()),
    ] {
        let o = run(config, capacity);
        println!(
            "| {name} | {} MiB | {} MiB | {} | {} | {} | {} | {} MiB |",
            o.peak_allocated >> 20,
            o.peak_reserved >> 20,
            o.creates,
            o.releases,
            o.retries,
            o.ooms,
            o.remapped >> 20
        );
    }
}
