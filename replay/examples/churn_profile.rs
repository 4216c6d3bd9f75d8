//! The churn bench's trace (`replay/benches/churn.rs`: `workloads::rmm_random` on a 16 GiB Sim)
//! outside criterion: a target for `perf record` and `valgrind --tool=cachegrind`, and a split
//! of where the time goes, per kind of call (served without growth, served by a growth, failed,
//! free).
//!
//! ```sh
//! cargo run --release -p vmm-replay --example churn_profile -- [expandable|classic|pytorch-expandable] [max MiB] [ops] [reps] [settings]
//! ```
//!
//! `reps` replays the same trace again on a fresh allocator each time (default 5); `settings`,
//! for the two expandable policies, are `vmm-replay --conf expandable=...`'s (e.g.
//! `best_fit_growth:false`).

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use vmm_alloc::backend::SimConfig;
use vmm_alloc::{
    Allocator, ClassicAllocator, ExpandableAllocator, ExpandableConfig, SimBackend, StreamId,
};
use vmm_replay::{workloads, Event, Trace};

/// Time and count of one kind of call.
#[derive(Default)]
struct Split {
    n: u64,
    t: Duration,
}

impl Split {
    fn add(&mut self, t: Duration) {
        self.n += 1;
        self.t += t;
    }

    fn line(&self, what: &str, total: Duration) {
        let per = self.t.as_nanos() as f64 / self.n.max(1) as f64;
        let share = 100.0 * self.t.as_secs_f64() / total.as_secs_f64().max(1e-12);
        println!(
            "  {what:<22} {:>9} calls {:>10.1} ns each {share:>5.1} %",
            self.n, per
        );
    }
}

#[derive(Default)]
struct Splits {
    served: Split,
    grown: Split,
    failed: Split,
    free: Split,
}

/// Replays `trace` once through `alloc`; `grows` reads the allocator's growth count.
fn run<A: Allocator>(trace: &Trace, alloc: &A, splits: &mut Splits) {
    let mut live = FxHashMap::default();
    for e in &trace.events {
        match *e {
            Event::Alloc { id, size, .. } => {
                let before = alloc.stats().num_device_alloc;
                let t = Instant::now();
                let got = alloc.allocate(size as usize, StreamId::DEFAULT);
                let t = t.elapsed();
                match got {
                    Ok(a) => {
                        if alloc.stats().num_device_alloc != before {
                            splits.grown.add(t);
                        } else {
                            splits.served.add(t);
                        }
                        live.insert(id, a);
                    }
                    Err(_) => splits.failed.add(t),
                }
            }
            Event::Free { id } => {
                if let Some(a) = live.remove(&id) {
                    let t = Instant::now();
                    alloc.deallocate(a).expect("free");
                    splits.free.add(t.elapsed());
                }
            }
            _ => {}
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let policy = args.first().cloned().unwrap_or_else(|| "expandable".into());
    let arg = |i: usize, default: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    let (max_mib, ops, reps) = (arg(1, 256), arg(2, 100_000), arg(3, 5));
    let trace = workloads::rmm_random(1, max_mib << 20, ops);
    let mut splits = Splits::default();
    let start = Instant::now();
    for _ in 0..reps {
        let sim = SimBackend::with_config(SimConfig {
            capacity: 16 << 30,
            ..SimConfig::default()
        })
        .expect("sim");
        match policy.as_str() {
            "classic" => {
                let alloc = ClassicAllocator::with_alloc_conf(sim, "").expect("classic");
                run(&trace, &alloc, &mut splits);
            }
            other => {
                let base = if other == "pytorch-expandable" {
                    ExpandableConfig::pytorch_expandable()
                } else {
                    ExpandableConfig::default()
                };
                let settings = args.get(4).map_or("", String::as_str);
                let config = base.with_settings(settings).expect("settings");
                let alloc = ExpandableAllocator::new(sim, config).expect("expandable");
                run(&trace, &alloc, &mut splits);
                if reps == 1 {
                    println!("{:?}", alloc.stats().calls);
                }
            }
        }
    }
    let total = start.elapsed();
    println!(
        "{policy} max{max_mib}MiB/ops{ops}: {:?} per run",
        total / reps as u32
    );
    splits.served.line("served, no growth", total);
    splits.grown.line("served by a growth", total);
    splits.failed.line("failed", total);
    splits.free.line("free", total);
}
