//! The mechanism layer: what both allocators need and neither decides (DESIGN.md, "The
//! workspace": policies above, mechanism below, backends under both).
//!
//! `classic/` and `expandable/` are policies: where a block goes, when a segment grows, what is
//! given back under pressure. Everything here is the same for both, written once:
//!
//! * [`request`]: the checks every request passes first (size 0, more than 1 EB) and its rounding
//!   and pool, as PyTorch's `malloc` does them;
//! * [`counters`]: the backend-call counters and the block counters with PyTorch's stat names;
//! * [`stream_uses`]: the other streams a block was used on (`record_stream`) and the events
//!   recorded for them when it is freed;
//! * [`deferred`]: one list of what the backend refused to take back (events, mappings, handles,
//!   reservations), retried later and given back at teardown;
//! * [`oom`]: PyTorch's out-of-memory report;
//! * [`owner`]: which allocator made an allocation, checked when it is given back;
//! * [`violation`]: the typed invariant violations both allocators' checkers report.
//!
//! Named *mechanism* after the layer's name in DESIGN.md; `common` would say nothing about what
//! belongs here, and a module per concern at the crate root would hide that they form one layer.
//! Nothing here imports `classic` or `expandable`.

pub(crate) mod counters;
pub(crate) mod deferred;
pub(crate) mod oom;
pub(crate) mod owner;
pub(crate) mod request;
pub(crate) mod stream_uses;
pub(crate) mod violation;
