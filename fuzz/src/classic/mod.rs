//! `classic`: `ClassicAllocator` under long operation sequences.
//!
//! Two kinds of case, drawn at random:
//! * the test kit's reference model (`vmm_alloc::testkit::classic_model`, as the crate's tests run it): exact
//!   placements, stats and PyTorch's rules under `PYTORCH_CUDA_ALLOC_CONF` strings, on Sim, with
//!   sequences longer than CI's;
//! * the fault driver ([`crate::faults`]) on Sim and on Host (data patterns), under the same
//!   configuration strings.

use std::time::Instant;

use proptest::prelude::*;
use vmm_alloc::backend::{HostBackend, HostConfig, SimBackend, SimConfig};
use vmm_alloc::classic::ClassicAllocator;

use crate::faults::{self, FOp};
use crate::runner::{Campaign, Tally};
use crate::sequence::{Ops, Seq};
use vmm_alloc::testkit::classic_model as model;
use vmm_alloc::testkit::EmulatedBackend;

/// How a case's run is set up. Model cases run on Sim (the model builds its own backend);
/// `free_all`: they free everything before dropping the allocator, or drop it with live blocks.
#[derive(Clone, Debug)]
pub struct Settings {
    host: bool,
    capacity_mb: usize,
    free_all: bool,
    conf: String,
}

/// One case: a reference-model sequence or a fault-driver sequence.
pub type Case = Seq<Settings, model::Op>;

/// The campaign.
pub struct Classic;

fn faults_on<B: EmulatedBackend>(
    b: B,
    conf: &str,
    ops: &[FOp],
    tally: &mut Tally,
) -> Result<(), String> {
    faults::run(
        b,
        |b| ClassicAllocator::with_alloc_conf(b, conf),
        &|a: &ClassicAllocator<B>| a.check_invariants().map_err(|e| e.to_string()),
        true,
        ops,
        tally,
    )
}

impl Campaign for Classic {
    type Case = Case;

    fn name(&self) -> &'static str {
        "classic"
    }

    fn strategy(&self) -> BoxedStrategy<Case> {
        let settings = |host: prop::bool::Weighted, capacities: Vec<usize>| {
            (
                host,
                prop::sample::select(capacities),
                any::<bool>(),
                model::conf_strategy(),
            )
                .prop_map(|(host, capacity_mb, free_all, conf)| Settings {
                    host,
                    capacity_mb,
                    free_all,
                    conf,
                })
        };
        let model = (
            settings(prop::bool::weighted(0.0), vec![48, 96, 256, 1024]),
            prop::collection::vec(model::op_strategy(), 1..400).prop_map(Ops::Model),
        );
        // Host (real memory, data checked) in a third of the fault cases.
        let faulty = (
            settings(prop::bool::weighted(0.3), vec![48, 96, 256]),
            prop::collection::vec(faults::fop_strategy(&[]), 1..200).prop_map(Ops::Faults),
        );
        prop_oneof![model, faulty]
            .prop_map(|(settings, ops)| Seq { settings, ops })
            .boxed()
    }

    fn run(&self, case: &Case, tally: &mut Tally) -> Result<(), String> {
        let s = &case.settings;
        let capacity = s.capacity_mb << 20;
        match &case.ops {
            Ops::Model(ops) => {
                tally.ops += ops.len() as u64;
                model::run(&s.conf, s.capacity_mb, ops, s.free_all)
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            Ops::Faults(ops) if s.host => {
                let b = HostBackend::with_config(HostConfig {
                    capacity,
                    ..HostConfig::default()
                })
                .map_err(|e| format!("host backend: {e}"))?;
                faults_on(b, &s.conf, ops, tally)
            }
            Ops::Faults(ops) => {
                let b = SimBackend::with_config(SimConfig {
                    capacity,
                    ..SimConfig::default()
                })
                .map_err(|e| format!("sim backend: {e}"))?;
                faults_on(b, &s.conf, ops, tally)
            }
        }
    }

    fn minimize(&self, case: Case, fails: &dyn Fn(&Case) -> bool, deadline: Instant) -> Case {
        case.minimize(fails, deadline)
    }

    fn show(&self, case: &Case) -> String {
        case.show()
    }
}
