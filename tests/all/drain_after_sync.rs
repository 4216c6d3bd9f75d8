//! Note [Drain after sync] (`src/expandable/growth.rs`): once a remap has synchronized another
//! stream, `drain_after_sync` unmaps every fully-free page of that stream at once, so the next
//! growth finds the memory on the device instead of synchronizing that stream again.
//!
//! The scenario, on a 100 MiB device of 20 MiB pages: stream O holds four 20 MiB blocks and the
//! default stream one, so the device is full; O frees two, the default stream asks for 20 MiB
//! (a remap of O's page, after O's synchronization), O frees a third, the default stream asks
//! for 20 MiB again.

use crate::expandable_pressure::other_stream_frees_two_pages;
use vmm_alloc::backend::{Backend, CallKind};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// Synchronizations the scenario costs with `config`, and the device's free bytes at its end.
fn scenario(config: ExpandableConfig) -> (u64, usize) {
    let (a, mut o, s1) = other_stream_frees_two_pages(config);
    let s2 = a.allocate(20 * MB, S0).unwrap();
    a.deallocate(o.remove(0)).unwrap();
    let s3 = a.allocate(20 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    let syncs = a.stats().calls.calls(CallKind::Synchronize);
    let live = a.with_backend(|s| s.live());
    for b in o.into_iter().chain([s1, s2, s3]) {
        a.deallocate(b).unwrap();
    }
    a.check_invariants().unwrap();
    (syncs, 100 * MB - live.physical_bytes)
}

#[test]
fn draining_the_synchronized_stream_saves_the_next_synchronization() {
    let drain = ExpandableConfig {
        drain_after_sync: true,
        ..ExpandableConfig::default()
    };
    let (with, free_with) = scenario(drain);
    let (without, free_without) = scenario(ExpandableConfig::default());
    assert_eq!(without, 2, "each growth synchronizes the other stream");
    assert_eq!(
        with, 1,
        "the second growth creates from the memory drained at the first"
    );
    assert_eq!(
        free_with, free_without,
        "the same memory in use at the end: {free_with}"
    );
}
