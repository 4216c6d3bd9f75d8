//! A reference model of [`ClassicAllocator`](crate::classic::ClassicAllocator) (feature
//! `testkit-proptest`): [`run`] applies a sequence of [`Op`]s to the allocator on a
//! [`SimBackend`](crate::SimBackend) under a `PYTORCH_CUDA_ALLOC_CONF` string, and checks after
//! every step, against a plain model written apart from the allocator, what PyTorch's rules
//! predict: the placement of each allocation (best fit per stream and pool, oversize limits,
//! `should_split`, segment sizes by [`super::pytorch_rounding`]), the stats, the snapshot,
//! pending frees kept from reuse until their streams' events complete, refused inputs changing
//! nothing, and the allocator's own invariant checker.
//!
//! [`op_strategy`] and [`conf_strategy`] draw sequences and configuration strings with proptest;
//! a failed check is a [`TestCaseError`](proptest::test_runner::TestCaseError) naming the step.
//!
//! ```
//! use proptest::strategy::{Strategy, ValueTree};
//! use proptest::test_runner::TestRunner;
//! use vmm_alloc::testkit::classic_model::{op_strategy, run};
//!
//! let mut runner = TestRunner::deterministic();
//! let ops = proptest::collection::vec(op_strategy(), 40);
//! let ops = ops.new_tree(&mut runner).unwrap().current();
//! let reached = run("max_split_size_mb:40", 256, &ops, true).unwrap();
//! assert!(reached.fresh > 0);
//! ```

mod ops;
mod reference;

pub use ops::{conf_strategy, op_strategy, run, Bad, Op, Reached};
