//! `expandable`: `ExpandableAllocator` under long operation sequences.
//!
//! Two kinds of case, drawn at random:
//! * the test kit's reference model (`vmm_alloc::testkit::expandable_model`, as the crate's tests run it), on Sim at
//!   capacities from tight to roomy and on Host with data patterns, with sequences longer than
//!   CI's, and sometimes `cuMemCreate` answering out-of-memory from some call on (another process
//!   filling the device), which the model must still predict;
//! * the fault driver ([`crate::faults`]): any backend call failing, transiently, persistently or
//!   at random, with the invariants that must survive any failure.

use std::time::Instant;

use proptest::prelude::*;
use vmm_alloc::backend::{CallKind, HostBackend, HostConfig, SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::testkit::{FaultError, FaultPlan, Trigger};
use vmm_alloc::ExpandableAllocator;

use crate::faults::{self, arm};
use crate::runner::{Campaign, Tally};
use crate::sequence::{Ops, Seq};
use vmm_alloc::testkit::expandable_model as model;
use vmm_alloc::testkit::EmulatedBackend;

/// Fault kinds this campaign does not inject: none. (ReleaseEvent and Release were spared, and
/// faults kept away from `empty_cache`, until the bugs they hit were fixed: a lost event, a lost
/// handle in a growth's rollback, stale cache stats after a failed `empty_cache`; reproducers in
/// `tests/faults/expandable_bugs.rs`.)
const SPARED: &[CallKind] = &[];

/// Whether faults may hit `empty_cache`.
const EMPTY_CACHE_FAULTS: bool = true;

/// How a case's run is set up. `create_oom` (model cases): `cuMemCreate` fails with
/// out-of-memory at or from that call on, as when another process fills the device.
#[derive(Clone, Debug)]
pub struct Settings {
    host: bool,
    capacity_mb: usize,
    create_oom: Option<Trigger>,
    config: ExpandableConfig,
}

/// One case: a reference-model sequence or a fault-driver sequence.
pub type Case = Seq<Settings, model::Op>;

/// The campaign.
pub struct Expandable;

/// Sim or Host, chosen per case.
enum Device {
    Sim(SimBackend),
    Host(HostBackend),
}

fn device(host: bool, capacity_mb: usize) -> Result<Device, String> {
    let capacity = capacity_mb << 20;
    Ok(if host {
        Device::Host(
            HostBackend::with_config(HostConfig {
                capacity,
                ..HostConfig::default()
            })
            .map_err(|e| format!("host backend: {e}"))?,
        )
    } else {
        Device::Sim(
            SimBackend::with_config(SimConfig {
                capacity,
                ..SimConfig::default()
            })
            .map_err(|e| format!("sim backend: {e}"))?,
        )
    })
}

/// Runs one case's operations on `b`.
fn run_on<B: EmulatedBackend>(
    b: B,
    s: &Settings,
    ops: &Ops<model::Op>,
    tally: &mut Tally,
) -> Result<(), String> {
    match ops {
        Ops::Model(ops) => {
            if let Some(t) = s.create_oom {
                arm(
                    &b,
                    FaultPlan::new().fail(CallKind::Create, t, FaultError::OutOfMemory),
                );
            }
            tally.ops += ops.len() as u64;
            let result = model::run(b.clone(), s.config.clone(), ops).map(drop);
            tally.faults += arm(&b, FaultPlan::new());
            result.map_err(|e| e.to_string())
        }
        Ops::Faults(ops) => faults::run(
            b,
            |b| ExpandableAllocator::new(b, s.config.clone()),
            &|a: &ExpandableAllocator<B>| a.check_invariants().map_err(|e| e.to_string()),
            EMPTY_CACHE_FAULTS,
            ops,
            tally,
        ),
    }
}

impl Campaign for Expandable {
    type Case = Case;

    fn name(&self) -> &'static str {
        "expandable"
    }

    fn strategy(&self) -> BoxedStrategy<Case> {
        let create_oom = prop::option::weighted(
            0.3,
            prop_oneof![
                (1u64..40).prop_map(Trigger::Nth),
                (1u64..40).prop_map(Trigger::From)
            ],
        );
        let settings = |hosts: Vec<bool>, capacities: Vec<usize>| {
            (
                prop::sample::select(hosts),
                prop::sample::select(capacities),
                create_oom.clone(),
                model::config_strategy(),
            )
                .prop_map(|(host, capacity_mb, create_oom, config)| Settings {
                    host,
                    capacity_mb,
                    create_oom,
                    config,
                })
        };
        let model =
            |n: usize| prop::collection::vec(model::op_strategy(), 1..n).prop_map(Ops::Model);
        let faulty =
            prop::collection::vec(faults::fop_strategy(SPARED), 1..200).prop_map(Ops::Faults);
        // Host cases are slower (real memory, data checked): fewer and shorter.
        let sim_model = (settings(vec![false], vec![64, 128, 512, 4096]), model(400));
        let host_model = (settings(vec![true], vec![64, 256]), model(150));
        let faults = (settings(vec![false, true], vec![64, 128, 512]), faulty);
        prop_oneof![3 => sim_model, 1 => host_model, 3 => faults]
            .prop_map(|(settings, ops)| Seq { settings, ops })
            .boxed()
    }

    fn run(&self, case: &Case, tally: &mut Tally) -> Result<(), String> {
        let s = &case.settings;
        match device(s.host, s.capacity_mb)? {
            Device::Sim(b) => run_on(b, s, &case.ops, tally),
            Device::Host(b) => run_on(b, s, &case.ops, tally),
        }
    }

    fn minimize(&self, case: Case, fails: &dyn Fn(&Case) -> bool, deadline: Instant) -> Case {
        case.minimize(fails, deadline)
    }

    fn show(&self, case: &Case) -> String {
        case.show()
    }
}
