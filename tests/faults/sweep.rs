//! The sweeps: one test per allocator on Sim, and the Host sweep with data patterns.

use std::io::Write;

use vmm_alloc::backend::{CallKind, HostBackend, HostConfig, SimBackend, SimConfig};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::testkit::{FaultError, Trigger};
use vmm_alloc::ExpandableAllocator;

use crate::harness::{Fault, Make, Run, Tally, Under};
use crate::script::{script, Op};
use vmm_alloc::testkit::EmulatedBackend;

const MB: usize = 1 << 20;
/// The Sim device: small enough that the fill bursts reach it.
const SIM_CAPACITY: usize = 256 * MB;
const HOST_CAPACITY: usize = 128 * MB;
const SEED: u64 = 0x5EED_FA17;
/// A persistent fault is removed after it has hit this many steps.
const PERSIST: usize = 4;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn sim_ops() -> usize {
    env("VMM_FAULT_SWEEP_OPS", 300)
}

fn check_every() -> usize {
    env("VMM_FAULT_SWEEP_CHECK_EVERY", 8)
}

fn sim() -> SimBackend {
    SimBackend::with_config(SimConfig {
        capacity: SIM_CAPACITY,
        ..SimConfig::default()
    })
    .unwrap()
}

fn host() -> HostBackend {
    HostBackend::with_config(HostConfig {
        capacity: HOST_CAPACITY,
        ..HostConfig::default()
    })
    .unwrap()
}

/// The calls the allocators make: every kind but construction's and the test's own reads and
/// writes.
fn kinds() -> Vec<CallKind> {
    CallKind::ALL
        .into_iter()
        .filter(|k| !matches!(k, CallKind::Init | CallKind::Write | CallKind::Read))
        .collect()
}

/// The error flavours that make sense for a kind: every call can fail; those that obtain memory
/// or address space can also run out of it.
fn flavours(kind: CallKind) -> &'static [FaultError] {
    match kind {
        CallKind::Reserve | CallKind::Create | CallKind::Map | CallKind::SetAccess => {
            &[FaultError::Injected, FaultError::OutOfMemory]
        }
        _ => &[FaultError::Injected],
    }
}

/// Runs the script once without faults (counting calls by kind), then once per kind of `kinds`,
/// n, trigger and flavour; returns the tally and prints its summary line.
fn sweep<B: EmulatedBackend>(
    name: &str,
    kinds: &[CallKind],
    new_backend: &dyn Fn() -> B,
    make: &Make<B>,
    script: &[Op],
) -> Tally {
    let started = std::time::Instant::now();
    let mut tally = Tally::default();
    let base = Run::new(
        new_backend(),
        make,
        format!("{name}, no fault"),
        &mut tally.failures,
    )
    .go(script, None, 0, 1);
    let counts = base.script_calls;
    for &kind in kinds {
        for n in 1..=counts.calls(kind) {
            for trigger in [Trigger::Nth(n), Trigger::From(n)] {
                for &error in flavours(kind) {
                    let fault = Fault {
                        kind,
                        trigger,
                        error,
                    };
                    let what = format!("{name}, {kind:?} {trigger:?} {error:?}");
                    let out = Run::new(new_backend(), make, what, &mut tally.failures).go(
                        script,
                        Some(fault),
                        PERSIST,
                        check_every(),
                    );
                    tally.cases += 1;
                    tally.unreached += u64::from(out.fired == 0);
                    tally.injected += out.fired;
                    tally.errors += out.errors;
                    tally.recovered += out.recovered;
                }
            }
        }
    }
    let _ = writeln!(
        std::io::stderr(),
        "fault sweep {name}: {} ops; calls {counts}; {} cases ({} unreached), {} faults injected, {} errors returned, {} steps succeeded another way; {} failure(s); {:.1} s",
        script.len(),
        tally.cases,
        tally.unreached,
        tally.injected,
        tally.errors,
        tally.recovered,
        tally.failures.len(),
        started.elapsed().as_secs_f64()
    );
    tally
}

fn assert_clean(t: &Tally) {
    if let Ok(path) = std::env::var("VMM_FAULT_SWEEP_LOG") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        for line in &t.failures {
            let _ = writeln!(f, "{line}");
        }
    }
    assert!(
        t.failures.is_empty(),
        "{} broken promise(s), the first ones:\n{}",
        t.failures.len(),
        t.failures
            .iter()
            .take(12)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn expandable<B: EmulatedBackend>(config: ExpandableConfig) -> Box<Make<B>> {
    Box::new(move |b: B| -> Box<dyn Under> {
        Box::new(ExpandableAllocator::new(b, config.clone()).unwrap())
    })
}

fn classic<B: EmulatedBackend>() -> Box<Make<B>> {
    Box::new(|b: B| -> Box<dyn Under> {
        Box::new(ClassicAllocator::with_alloc_conf(b, "").unwrap())
    })
}

/// The sweep must actually reach the paths it is for: every growth step, remap or the retry,
/// pending frees, OOM.
fn reaches(t: &Tally, min_cases: u64) {
    assert!(t.cases >= min_cases, "only {} cases", t.cases);
    assert!(t.errors > 0 && t.recovered > 0, "{t:?}");
}

fn expandable_sweep(config: ExpandableConfig, name: &str, kinds: &[CallKind]) {
    let s = script(sim_ops(), SIM_CAPACITY, SEED);
    let t = sweep(
        &format!("{name} (Sim)"),
        kinds,
        &sim,
        &*expandable(config),
        &s,
    );
    assert_clean(&t);
    reaches(&t, 300);
}

#[test]
fn expandable_default_on_sim() {
    expandable_sweep(ExpandableConfig::default(), "expandable default", &kinds());
}

#[test]
fn expandable_pytorch_on_sim() {
    expandable_sweep(
        ExpandableConfig::pytorch_expandable(),
        "expandable pytorch_expandable",
        &kinds(),
    );
}

#[test]
fn classic_on_sim() {
    let s = script(sim_ops(), SIM_CAPACITY, SEED);
    let t = sweep("classic (Sim)", &kinds(), &sim, &*classic(), &s);
    assert_clean(&t);
    reaches(&t, 500);
}

/// Host: real bytes. A shorter script on a smaller device, the three allocators one after the
/// other; every live allocation's pattern is checked at every faulted step.
#[test]
fn all_allocators_keep_data_on_host() {
    let s = script(sim_ops() / 4, HOST_CAPACITY, SEED ^ 0x4057);
    let mut all = Tally::default();
    let all_kinds = kinds();
    for (name, kinds, make) in [
        (
            "expandable default (Host)",
            &all_kinds[..],
            expandable::<HostBackend>(ExpandableConfig::default()),
        ),
        (
            "expandable pytorch_expandable (Host)",
            &all_kinds[..],
            expandable(ExpandableConfig::pytorch_expandable()),
        ),
        ("classic (Host)", &all_kinds[..], classic()),
    ] {
        all.absorb(sweep(name, kinds, &host, &*make, &s));
    }
    assert_clean(&all);
    reaches(&all, 100);
}
