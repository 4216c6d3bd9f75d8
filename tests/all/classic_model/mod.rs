//! Property tests of `ClassicAllocator`: random operation sequences on Sim, under
//! `PYTORCH_CUDA_ALLOC_CONF` strings in PyTorch's grammar and capacities from tight to roomy,
//! checked after every step against the test kit's plain reference model
//! (`vmm_alloc::testkit::classic_model`): the invariants of
//! the expandable allocator's model that apply to device allocations (no page mappings here), and
//! the placement PyTorch's rules predict (best fit, oversize limits, `should_split`, segment
//! sizes).
//!
//! `PROPTEST_CASES=10000 cargo test --release --test all classic` runs them harder.

mod reach;

use proptest::prelude::*;
use proptest::test_runner::{TestError, TestRunner};

use vmm_alloc::testkit::classic_model::{conf_strategy, op_strategy, run, Op};

/// 64 cases unless `PROPTEST_CASES` says otherwise (a literal `cases:` would shadow it), and
/// shrinking until proptest can shrink no more (its default budget stops long before).
fn classic_config() -> ProptestConfig {
    let env = std::env::var("PROPTEST_CASES").ok();
    ProptestConfig {
        cases: env.and_then(|v| v.parse().ok()).unwrap_or(64),
        max_shrink_iters: 1_000_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Proptest deletes each op of a failing sequence once, in order, and an op that could not go
/// alone (a later pick still counted on it) is never tried again. This deletes runs of ops (halves
/// down to single ops), pairs once the sequence is short, and lowers picks (which then name other
/// allocations), until none of that keeps it failing.
fn shortest(conf: &str, capacity_mb: usize, mut ops: Vec<Op>, free_all: bool) -> Vec<Op> {
    let fails = |ops: &[Op]| run(conf, capacity_mb, ops, free_all).is_err();
    let without = |ops: &[Op], skip: &dyn Fn(usize) -> bool| -> Vec<Op> {
        let kept = ops.iter().enumerate().filter(|&(i, _)| !skip(i));
        kept.map(|(_, op)| op.clone()).collect()
    };
    loop {
        let before = ops.len();
        let mut run_len = ops.len().div_ceil(2).max(1);
        while run_len >= 1 && !ops.is_empty() {
            let mut at = 0;
            while at < ops.len() {
                let fewer = without(&ops, &|i| (at..at + run_len).contains(&i));
                if fails(&fewer) {
                    ops = fewer;
                } else {
                    at += run_len;
                }
            }
            run_len /= 2;
        }
        if ops.len() <= 24 {
            'pairs: for a in 0..ops.len() {
                for b in a + 1..ops.len() {
                    let fewer = without(&ops, &|i| i == a || i == b);
                    if fails(&fewer) {
                        ops = fewer;
                        break 'pairs;
                    }
                }
            }
        }
        let mut lowered = false;
        for i in 0..ops.len() {
            let Some(pick) = ops[i].pick_mut().map(|p| *p) else {
                continue;
            };
            for lower in 0..pick.min(8) {
                let mut other = ops.clone();
                *other[i].pick_mut().expect("a pick") = lower;
                if fails(&other) {
                    (ops, lowered) = (other, true);
                    break;
                }
            }
        }
        if !lowered && ops.len() == before {
            return ops;
        }
    }
}

#[test]
fn classic_matches_model_on_sim() {
    let strategy = (
        conf_strategy(),
        prop::sample::select(vec![48usize, 96, 256, 1024]),
        proptest::collection::vec(op_strategy(), 1..150),
        any::<bool>(),
    );
    let mut runner = TestRunner::new(classic_config());
    let result = runner.run(&strategy, |(conf, capacity_mb, ops, free_all)| {
        run(&conf, capacity_mb, &ops, free_all).map(drop)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(_, (conf, capacity_mb, ops, free_all))) => {
            let ops = shortest(&conf, capacity_mb, ops, free_all);
            let why = run(&conf, capacity_mb, &ops, free_all).err();
            panic!(
                "{why:?}\nshortest failing input: conf = {conf:?}, capacity_mb = {capacity_mb}, free_all = {free_all}, ops = {ops:#?}"
            );
        }
        Err(e) => panic!("{e}"),
    }
}
