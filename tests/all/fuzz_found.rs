//! Sequences the fuzzing campaign (`cargo run --release -p vmm-alloc-fuzz -- expandable`) found
//! failing, shrunk, each replayed through the reference model as the campaign ran it.

use vmm_alloc::backend::CallKind;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::testkit::expandable_model::{run, Op};
use vmm_alloc::testkit::{EmulatedBackend, FaultError, FaultPlan, Trigger};

use crate::expandable_regressions::sim;

const MB: usize = 1 << 20;

fn alloc(size: usize, stream: u64) -> Op {
    Op::Alloc { size, stream }
}

fn free(pick: usize) -> Op {
    Op::Free { pick }
}

#[test]
fn seed_1795863365874954034() {
    let backend = sim(64 * MB);
    backend.set_faults(FaultPlan::new().fail(
        CallKind::Create,
        Trigger::From(30),
        FaultError::OutOfMemory,
    ));
    let mut config = ExpandableConfig::default();
    config.roundup_power2_divisions[..3].copy_from_slice(&[2, 4, 8]);
    let ops = [
        Op::Squeeze { mb: 1 },
        alloc(1048577, 0),
        alloc(1, 0),
        alloc(1, 1),
        free(0),
        Op::Unsqueeze,
        alloc(1, 0),
        alloc(1, 2),
        alloc(1, 0),
        alloc(1, 0),
        free(63),
        free(22),
        free(8),
        alloc(16777217, 1),
        free(0),
        alloc(3670017, 2),
        alloc(4194305, 2),
        alloc(9175041, 2),
        alloc(524289, 2),
        alloc(1, 0),
        free(3),
        free(27),
        free(6),
        free(2),
        Op::Squeeze { mb: 25 },
        free(0),
        free(0),
        free(0),
        alloc(1, 2),
        Op::EmptyCache,
        alloc(1048577, 1),
        alloc(37748737, 0),
        Op::Hold { stream: 1 },
        alloc(1048577, 0),
        alloc(1, 0),
        free(9),
        free(1),
        free(3),
        alloc(1, 1),
        Op::EmptyCache,
        alloc(524289, 0),
        Op::RecordStream {
            pick: 51,
            stream: 1,
        },
        alloc(33554433, 2),
        alloc(1, 0),
        free(33),
        alloc(393217, 0),
        alloc(524289, 0),
        alloc(524289, 0),
    ];
    if let Err(e) = run(backend, config, &ops) {
        panic!("{e}");
    }
}
