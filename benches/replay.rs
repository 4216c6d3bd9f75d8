//! Replay throughput: events per second through `trace::replay::replay` on Sim, for each
//! allocator (issue 7, benchmark 4; the target is at least 5 million events per second).
//!
//! Two traces: the built-in `transformer_training(1)`, always, and the largest file in
//! `../shared/traces/pytorch` (by size; its device with the most events), when that directory
//! exists; without it a line saying so is printed and that part is skipped. Criterion reports
//! the throughput in elements, one element per replayed event (initial blocks included).
//! Names: `replay/<allocator>/<trace>`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use vmm_alloc::trace::replay::{replay, Policy, ReplayOptions};
use vmm_alloc::trace::snapshot::read_snapshot_file;
use vmm_alloc::trace::{workloads, Trace};

/// The largest shared PyTorch trace, or why there is none.
fn largest_shared_trace() -> Result<Trace, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/pytorch");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let largest: Option<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "pickle"))
        .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
        .max();
    let (_, path) = largest.ok_or_else(|| format!("{}: no .pickle file", dir.display()))?;
    let traces = read_snapshot_file(&path).map_err(|e| format!("{}: {e:?}", path.display()))?;
    traces
        .into_iter()
        .max_by_key(|t| t.events.len())
        .ok_or_else(|| format!("{}: no device trace", path.display()))
}

fn replay_throughput(c: &mut Criterion) {
    let mut traces = vec![workloads::transformer_training(1)];
    match largest_shared_trace() {
        Ok(t) => traces.push(t),
        Err(why) => println!("replay: SKIPPED the shared trace ({why})"),
    }
    // The default device (80 GiB), as vmm-replay uses: the recorded programs fit in it.
    let opts = ReplayOptions::default();
    let mut group = c.benchmark_group("replay");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for trace in &traces {
        let events = (trace.initial.len() + trace.events.len()) as u64;
        println!("replay: {} has {events} events", trace.name);
        group.throughput(Throughput::Elements(events));
        for policy in [
            Policy::Expandable,
            Policy::Classic,
            Policy::PytorchExpandable,
        ] {
            group.bench_function(BenchmarkId::new(policy.name(), &trace.name), |b| {
                b.iter(|| replay(trace, policy, &opts).expect("replay"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, replay_throughput);
criterion_main!(benches);
