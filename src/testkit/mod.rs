//! Test controls for the emulated backends, for this crate's tests, its fuzz campaigns and any
//! user's tests of code written against the library (feature `testkit`).
//!
//! **Internal, not semver-stable.** This module serves testing only; it may change in any
//! release, minor and patch included. Production code never needs it.
//!
//! * [`EmulatedBackend`]: what a test may do to a [`SimBackend`] or [`HostBackend`] beyond the
//!   [`Backend`] contract: inject faults with a [`FaultPlan`], hold a stream's work and complete
//!   its events by hand, read the capacity. The ledger of what a backend holds is
//!   [`Backend::live`]; its call counts, [`Backend::calls`].
//! * [`Observed`]: wraps any backend and tells an [`Observer`] about every state-changing call
//!   that succeeded; [`MappingLog`] is a ready-made observer (what is mapped, and the unmaps and
//!   synchronizes in call order).
//! * [`pytorch_rounding`]: PyTorch's request rounding and segment sizes, written out apart from
//!   the crate's own port, to check the allocators against.
//! * [`expandable_model`], [`classic_model`] (feature `testkit-proptest`): reference models that
//!   run random operation sequences on an allocator and check each step against what must hold.
//!
//! ```
//! use vmm_alloc::testkit::{EmulatedBackend, FaultError, FaultPlan, Trigger};
//! use vmm_alloc::backend::{Backend, CallKind, SimBackend};
//! let sim = SimBackend::new();
//! sim.set_faults(FaultPlan::new().fail(CallKind::Create, Trigger::Nth(1), FaultError::OutOfMemory));
//! assert!(sim.create(sim.granularity()).is_err());
//! assert_eq!(sim.clear_faults(), 1);
//! assert!(sim.live().is_empty());
//! ```

#[cfg(feature = "testkit-proptest")]
pub mod classic_model;
#[cfg(feature = "testkit-proptest")]
pub mod expandable_model;
mod observed;
pub mod pytorch_rounding;

pub use crate::backend::fault::{FaultError, FaultPlan, Trigger};
pub use observed::{Call, MappingLog, MappingState, Observed, Observer, Seen};

#[cfg(target_os = "linux")]
#[allow(unused_imports)] // named by the docs above
use crate::backend::HostBackend;
#[allow(unused_imports)] // named by the docs above
use crate::backend::SimBackend;
use crate::backend::{Backend, BackendError, EventId, StreamId};

/// The controls of an emulated backend (Sim, Host, or a wrapper of one such as [`Observed`]).
///
/// Cloning shares the state, as for every backend: a test keeps a clone to control the one an
/// allocator holds.
pub trait EmulatedBackend: Backend + Clone + 'static {
    /// A new backend of this kind with its default settings but `capacity` bytes of physical
    /// memory (a multiple of the default granularity), or why that is invalid.
    fn with_capacity(capacity: usize) -> Result<Self, BackendError>;

    /// Installs a fault plan, replacing any previous one (whose call counting restarts).
    fn set_faults(&self, plan: FaultPlan);

    /// Removes the fault plan; returns how many faults it injected.
    fn clear_faults(&self) -> u64;

    /// Faults injected so far by the current plan.
    fn faults_fired(&self) -> u64;

    /// From now on, events recorded on `stream` stay pending (its "work" is still running).
    fn hold_stream(&self, stream: StreamId);

    /// Stops holding `stream` and completes its pending events.
    fn release_stream(&self, stream: StreamId);

    /// How many times every event of `stream` was completed at once, by `synchronize` or by
    /// [`EmulatedBackend::release_stream`]: a test can tell that a stream's work is known to be
    /// done.
    fn stream_generation(&self, stream: StreamId) -> u64;

    /// Completes one pending event; false if it is not live.
    fn complete_event(&self, event: EventId) -> bool;

    /// Events recorded on `stream` that have not completed.
    fn pending_events(&self, stream: StreamId) -> usize;

    /// The physical memory the backend hands out, in bytes (its configured capacity).
    fn capacity(&self) -> usize;
}
