//! Hostile input: what a careless or malicious caller sends to every public entry point, beyond
//! what the other suites already send (`tests/all` models: foreign, interior and freed pointers,
//! sizes 0 and `usize::MAX`; `tests/all/pytorch_parity.rs`: PyTorch's config errors;
//! `tests/conformance`: backend rule breaking; hostile trace files are the replay crate's:
//! `replay/tests/traces/pickle_hostile.rs`, `replay/tests/trace_formats/`,
//! `replay/tests/cli/bad_input.rs`).
//!
//! Every case asserts a clear error value whose message names the problem, no panic, no state
//! change (statistics, backend call counts and snapshot equal before and after), and, for input
//! that claims huge sizes, an error of the right kind instead of the work or memory the claim
//! asks for.

mod allocators;
mod configs;

use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocator, ExpandableAllocator};

pub const MB: usize = 1 << 20;
pub const CAPACITY: usize = 256 * MB;

pub fn sim(capacity: usize) -> SimBackend {
    SimBackend::with_config(SimConfig {
        capacity,
        ..SimConfig::default()
    })
    .unwrap()
}

/// The three allocators under test, each over its own backend (kept by the caller).
pub fn allocators(conf: &str) -> Vec<(&'static str, SimBackend, Box<dyn Allocator>)> {
    let (a, b, c) = (sim(CAPACITY), sim(CAPACITY), sim(CAPACITY));
    let cfg = |base: ExpandableConfig| base.with_alloc_conf(conf).unwrap();
    vec![
        (
            "expandable",
            a.clone(),
            Box::new(ExpandableAllocator::new(a, cfg(ExpandableConfig::default())).unwrap()),
        ),
        (
            "pytorch-expandable",
            b.clone(),
            Box::new(
                ExpandableAllocator::new(b, cfg(ExpandableConfig::pytorch_expandable())).unwrap(),
            ),
        ),
        (
            "classic",
            c.clone(),
            Box::new(ClassicAllocator::with_alloc_conf(c, conf).unwrap()),
        ),
    ]
}
