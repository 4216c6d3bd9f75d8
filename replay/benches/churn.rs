//! Churn: RMM's `random_allocations` shape replayed through each allocator (issue 7,
//! benchmark 2).
//!
//! `workloads::rmm_random` builds the trace (73 % allocation probability, sizes uniform in
//! [1 B, max]) for max ∈ {1, 64, 256} MiB and 10,000 and 100,000 operations; each run replays it
//! on a fresh 16 GiB Sim device with `vmm_replay::replay::replay`, so the time covers building the
//! allocator, every allocation and free, and tearing it down. What each allocator needed (OOMs,
//! peak reserved) does not vary between runs: it is printed once, before the timing, and written
//! to `<target>/bench-extra/churn.json`.
//! Names: `churn/<allocator>/max<M>MiB/ops<N>`.

// The bench helpers shared with the library's benches.
use vmm_dev_support::bench_extra as extra;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use extra::Json;
use vmm_replay::replay::{replay, Policy, ReplayOptions};
use vmm_replay::workloads;

const MIB: u64 = 1 << 20;
/// Fixed, so every run and every machine replays the same trace.
const SEED: u64 = 1;

fn churn(c: &mut Criterion) {
    let opts = ReplayOptions {
        capacity: 16 << 30,
        ..ReplayOptions::default()
    };
    let mut group = c.benchmark_group("churn");
    // A 100,000-operation run takes tens of milliseconds: ten samples are enough.
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let mut runs = Vec::new();
    for max_mib in [1, 64, 256] {
        for ops in [10_000, 100_000] {
            let trace = workloads::rmm_random(SEED, max_mib * MIB, ops);
            let param = format!("max{max_mib}MiB/ops{ops}");
            for policy in [
                Policy::Expandable,
                Policy::Classic,
                Policy::PytorchExpandable,
            ] {
                let out = replay(&trace, policy, &opts).expect("replay");
                let needed = extra::Needed {
                    events: out.events,
                    ooms: out.ooms,
                    peak_reserved: out.peak_reserved_bytes,
                    peak_live: out.peak_live_bytes,
                };
                runs.push(needed.report("churn", policy.name(), &param));
                group.bench_function(BenchmarkId::new(policy.name(), &param), |b| {
                    b.iter(|| replay(&trace, policy, &opts).expect("replay"))
                });
            }
        }
    }
    group.finish();
    extra::write(
        "churn",
        &Json::obj([
            ("capacity_bytes", opts.capacity.into()),
            ("runs", Json::Arr(runs)),
        ]),
    );
}

criterion_group!(benches, churn);
criterion_main!(benches);
