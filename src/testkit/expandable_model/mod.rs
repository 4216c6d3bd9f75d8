//! A reference model of [`ExpandableAllocator`](crate::ExpandableAllocator) (feature
//! `testkit-proptest`): [`run`] applies a sequence of [`Op`]s to the allocator on any
//! [`EmulatedBackend`](super::EmulatedBackend), through an [`Observed`](super::Observed)
//! wrapper, and checks after every step, against a plain model written apart from the allocator,
//! what must hold: every live allocation where the model says, no two overlapping, each block's
//! size by PyTorch's rounding rule ([`super::pytorch_rounding`]), the stats, the snapshot, the
//! device's own view of what is mapped, pending frees kept from reuse until their streams'
//! events complete, refused inputs changing nothing, and, on a backend with bytes (Host), every
//! live allocation's contents.
//!
//! [`op_strategy`] and [`config_strategy`] draw sequences and configurations with proptest; a
//! failed check is a [`TestCaseError`](proptest::test_runner::TestCaseError) naming the step.
//!
//! ```
//! use proptest::strategy::{Strategy, ValueTree};
//! use proptest::test_runner::TestRunner;
//! use vmm_alloc::testkit::expandable_model::{config_strategy, op_strategy, run};
//! use vmm_alloc::testkit::EmulatedBackend;
//! use vmm_alloc::SimBackend;
//!
//! let mut runner = TestRunner::deterministic();
//! let ops = proptest::collection::vec(op_strategy(), 40);
//! let ops = ops.new_tree(&mut runner).unwrap().current();
//! let config = config_strategy().new_tree(&mut runner).unwrap().current();
//! let reached = run(SimBackend::with_capacity(256 << 20)?, config, &ops).unwrap();
//! assert!(reached.stats.num_device_alloc > 0);
//! # Ok::<(), vmm_alloc::BackendError>(())
//! ```

mod ops;
mod reference;

pub use ops::{config_strategy, op_strategy, run, Bad, Op, Reached};
