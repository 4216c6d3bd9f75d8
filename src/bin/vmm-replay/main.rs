//! `vmm-replay` (being written).
fn main() {}
