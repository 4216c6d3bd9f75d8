//! Replay throughput: events per second through `vmm_replay::replay::replay` on Sim, for each
//! allocator (issue 7, benchmark 4; the target is at least 5 million events per second).
//!
//! Two traces: the built-in `transformer_training(1)`, always, and the largest file in
//! `../shared/traces/pytorch` (by size; its device with the most events), when that directory
//! exists; without it a line saying so is printed and that part is skipped. Criterion reports
//! the throughput in elements, one element per replayed event (initial blocks included). The
//! traces and their event counts, and why the shared one was skipped, go to
//! `<target>/bench-extra/replay.json`.
//! Names: `replay/<allocator>/<trace>`.

// The bench helpers shared with the library's benches, and the shared trace.
use vmm_dev_support::{bench_extra as extra, shared_trace};

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use extra::Json;
use vmm_replay::replay::{replay, Policy, ReplayOptions};
use vmm_replay::workloads;

fn replay_throughput(c: &mut Criterion) {
    let mut traces = vec![workloads::transformer_training(1)];
    let mut skipped = Json::Null;
    match shared_trace::largest() {
        Ok(t) => traces.push(t),
        Err(why) => {
            println!("replay: SKIPPED the shared trace ({why})");
            skipped = why.into();
        }
    }
    // The default device (80 GiB), as vmm-replay uses: the recorded programs fit in it.
    let opts = ReplayOptions::default();
    let listed = traces.iter().map(|t| {
        let events = t.initial.len() + t.events.len();
        Json::obj([("trace", t.name.clone().into()), ("events", events.into())])
    });
    extra::write(
        "replay",
        &Json::obj([
            ("traces", Json::Arr(listed.collect())),
            ("shared_trace_skipped", skipped),
        ]),
    );
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

/// `vmm-replay advise`'s full sweep (every candidate, minimum capacity included) on the largest
/// shared trace at the capacity it states by default, on every core: `advise/sweep/<trace>`.
/// The target (issue 20): under 30 s on the 2-core development machine.
fn advise_sweep(c: &mut Criterion) {
    use vmm_replay::advise::{candidates_for, default_capacity, sweep};
    let Ok(trace) = shared_trace::largest() else {
        println!("advise: SKIPPED (no shared traces)");
        return;
    };
    let (capacity, _) = default_capacity(&trace);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let list = candidates_for(&trace);
    let mut group = c.benchmark_group("advise");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    group.bench_function(BenchmarkId::new("sweep", &trace.name), |b| {
        b.iter(|| sweep(&trace, &list, capacity as usize, threads, &|| {}).expect("sweep"))
    });
    group.finish();
}

criterion_group!(benches, replay_throughput, advise_sweep);
criterion_main!(benches);
