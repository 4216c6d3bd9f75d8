//! Code the benches and tests of vmm-alloc and vmm-replay share, one copy named by `use`:
//!
//! * [`bench_extra`]: the benches' side outputs (`<target>/bench-extra/<bench>.json`);
//! * [`bench_growth`], [`bench_hot`], [`bench_threads`]: the growth, hot-path and threads
//!   measurements, run on Sim and Host by the library's benches and on Cuda by
//!   `replay/benches/gpu.rs`;
//! * with feature `replay`: `shared_trace` (the recorded trace the replay benches use) and
//!   `fixtures` (traces and checks several replay test binaries use).
//!
//! Not published: a development dependency of this workspace's crates only.

pub mod bench_extra;
pub mod bench_growth;
pub mod bench_hot;
pub mod bench_threads;
#[cfg(feature = "replay")]
pub mod fixtures;
#[cfg(feature = "replay")]
pub mod shared_trace;
