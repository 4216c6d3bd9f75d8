//! The workloads shaped like whole programs of kinds no shared trace has ([`workloads::PROGRAMS`]:
//! a training loop calling `empty_cache()` every step, QLoRA fine-tuning, 3-D U-Net training,
//! mixture-of-experts training;
//! [`workloads::SERVERS`]: inference servers with a stream per request): well formed,
//! deterministic, and what each allocator needs on them.

use super::builtin_workloads::check_sane;
use super::*;
use vmm_alloc::backend::CallKind;
use vmm_replay::replay::{min_capacity, replay, Policy, ReplayOptions, ReplayOutcome};

const MIB: usize = 1 << 20;

/// Min capacity of `trace` (up to 32 GiB, 2 MiB steps) for classic, and with the run at it for
/// pytorch-expandable and ours; printed.
fn min_capacities(trace: &Trace) -> (usize, (usize, ReplayOutcome), (usize, ReplayOutcome)) {
    let opts = ReplayOptions::default();
    let min = |policy| {
        min_capacity(trace, policy, &opts, 32 << 30, 2 * MIB)
            .unwrap()
            .unwrap()
    };
    let (classic, _) = min(Policy::Classic);
    let (theirs, at_theirs) = min(Policy::PytorchExpandable);
    let (ours, at_ours) = min(Policy::Expandable);
    eprintln!(
        "{}: min ours {} MiB, pytorch-expandable {}, classic {}; calls {} vs {}",
        trace.name,
        ours / MIB,
        theirs / MIB,
        classic / MIB,
        at_ours.driver_calls,
        at_theirs.driver_calls
    );
    (classic, (theirs, at_theirs), (ours, at_ours))
}

#[test]
fn program_workloads_are_sane_and_deterministic() {
    for name in workloads::PROGRAMS.into_iter().chain(workloads::SERVERS) {
        let (a, b, c) = (
            workloads::by_name(name, 7, 0, 0).unwrap(),
            workloads::by_name(name, 7, 0, 0).unwrap(),
            workloads::by_name(name, 8, 0, 0).unwrap(),
        );
        assert_eq!(a, b, "{name}");
        assert_ne!(a.events, c.events, "{name}");
        let (end, _) = check_sane(&a);
        let peak = a.peak_live_bytes();
        assert!(a.name.starts_with(name), "{}", a.name);
        assert!((GIB..=40 * GIB).contains(&peak), "{name}: peak {peak}");
        assert!(end < peak, "{name}: something is freed");
    }
    let empties = |t: &Trace| {
        t.events
            .iter()
            .filter(|e| matches!(e, Event::EmptyCache))
            .count()
    };
    let t = workloads::by_name("empty-cache-training", 1, 0, 0).unwrap();
    assert_eq!(empties(&t), 30, "one empty_cache() per step");
}

/// Min capacity per allocator on seeds 1-3 of each program workload (Sim; POLICY.md,
/// "Programs of other kinds"): ours needs less than classic and no more than
/// pytorch-expandable on every one, with no more driver calls and stream synchronizations than
/// pytorch-expandable at each one's minimum. `qlora` seed 2 needed 38 MiB more than pytorch-expandable before the harvest
/// order took one stream's lowest free pages first (Note [Harvest order] in vmm-alloc's
/// `expandable/growth.rs`): 8300 MiB against 8262, now 8258.
#[test]
fn program_workloads_fit_in_less_than_classic_and_as_little_as_pytorch_expandable() {
    for name in workloads::PROGRAMS {
        for seed in 1..=3 {
            let trace = workloads::by_name(name, seed, 0, 0).unwrap();
            let (classic, (theirs, at_theirs), (ours, at_ours)) = min_capacities(&trace);
            assert!(ours < classic, "{}: ours {ours} vs {classic}", trace.name);
            assert!(
                ours <= theirs,
                "{}: ours {ours} > pytorch-expandable {theirs}",
                trace.name
            );
            assert!(
                at_ours.driver_calls <= at_theirs.driver_calls,
                "{}: {} calls vs {}",
                trace.name,
                at_ours.driver_calls,
                at_theirs.driver_calls
            );
            let syncs = |o: &ReplayOutcome| o.calls.calls(CallKind::Synchronize);
            assert!(
                syncs(&at_ours) <= syncs(&at_theirs),
                "{}: {} synchronizations vs {}",
                trace.name,
                syncs(&at_ours),
                syncs(&at_theirs)
            );
        }
    }
}

/// The inference servers (seeds 1-2 of 10, 4 and 32 streams): each stream's requests really run on
/// it, and ours needs less than classic with fewer driver calls than pytorch-expandable at each
/// one's minimum. What does not hold yet, and is shown in POLICY.md ("Inference servers",
/// "Many streams") and the README's scorecard rather than asserted: on some seeds ours needs
/// more than pytorch-expandable, or synchronizes more.
#[test]
fn inference_servers_fit_in_less_than_classic_with_fewer_calls_than_pytorch_expandable() {
    for (name, streams) in workloads::SERVERS.into_iter().zip([10, 4, 32]) {
        for seed in 1..=2 {
            let trace = workloads::by_name(name, seed, 0, 0).unwrap();
            let used: std::collections::BTreeSet<u64> = trace
                .events
                .iter()
                .filter_map(|e| match e {
                    Event::Alloc { stream, .. } => Some(*stream),
                    _ => None,
                })
                .collect();
            assert_eq!(used.len(), streams, "{}: streams used", trace.name);
            let (classic, (_, at_theirs), (ours, at_ours)) = min_capacities(&trace);
            assert!(ours < classic, "{}: ours {ours} vs {classic}", trace.name);
            assert!(
                at_ours.driver_calls < at_theirs.driver_calls,
                "{}: {} calls vs {}",
                trace.name,
                at_ours.driver_calls,
                at_theirs.driver_calls
            );
        }
    }
}

/// With room to spare (80 GiB, none of these programs near it), ours never makes more driver
/// calls than pytorch-expandable nor reserves more (issue 19, goals 2 and 3 at 80 GiB): the
/// cases where reusing the last free block at any fill had cost one to three growths more
/// (`reuse_last_free_above`, Note [Last free] in the library's `expandable/last_free.rs`).
#[test]
fn with_room_to_spare_ours_makes_no_more_calls_and_reserves_no_more_than_pytorch_expandable() {
    let opts = ReplayOptions::default();
    for (name, seed) in [
        ("qlora", 2),
        ("qlora", 14),
        ("inference-server", 7),
        ("inference-server-4", 7),
    ] {
        let trace = workloads::by_name(name, seed, 0, 0).unwrap();
        let run = |policy| replay(&trace, policy, &opts).unwrap();
        let (ours, theirs) = (run(Policy::Expandable), run(Policy::PytorchExpandable));
        assert_eq!((ours.ooms, theirs.ooms), (0, 0), "{name} {seed}");
        assert!(
            ours.driver_calls <= theirs.driver_calls,
            "{name} {seed}: {} calls against pytorch-expandable's {}",
            ours.driver_calls,
            theirs.driver_calls
        );
        assert!(
            ours.peak_reserved_bytes <= theirs.peak_reserved_bytes,
            "{name} {seed}: {} bytes reserved against pytorch-expandable's {}",
            ours.peak_reserved_bytes,
            theirs.peak_reserved_bytes
        );
    }
}

/// Mixture-of-experts training (seeds 1-3): token routing gives every expert's tensors a size
/// no earlier request had, in every layer of every step, the shape that strands memory in a
/// caching allocator (classic needs 5-11 % more than the peak live here). On one stream ours
/// fits at the peak live itself (rounded up to the 2 MiB step of the search) and, there,
/// creates each physical byte once, where pytorch-expandable, releasing and creating pages
/// under pressure, creates more than it reserves.
#[test]
fn moe_training_fits_ours_at_its_peak_live_and_creates_each_byte_once() {
    for seed in 1..=3 {
        let trace = workloads::by_name("moe-training", seed, 0, 0).unwrap();
        let (classic, (theirs, at_theirs), (ours, at_ours)) = min_capacities(&trace);
        let live = trace.peak_live_bytes() as usize;
        let at_live = live.div_ceil(2 * MIB) * 2 * MIB;
        assert_eq!(
            ours, at_live,
            "{}: ours {ours}, peak live {live}",
            trace.name
        );
        assert!(ours <= theirs && ours < classic, "{}", trace.name);
        assert_eq!(
            at_ours.bytes_created, at_ours.peak_reserved_bytes,
            "{}: every byte created once",
            trace.name
        );
        assert!(
            at_theirs.bytes_created > at_theirs.peak_reserved_bytes,
            "{}: pytorch-expandable re-creates",
            trace.name
        );
    }
}
