//! Note [Give back before foreign sync] (`src/expandable/growth.rs`): with
//! `give_back_before_foreign_sync`, a pressured growth that could only go on by synchronizing
//! another stream to remap its free pages gives every free page back and retries instead (as
//! PyTorch's policy does), while the growing stream's own free pages are still remapped without
//! a synchronization.
//!
//! The scenario, on a 100 MiB device of 20 MiB pages: stream O holds four 20 MiB blocks and the
//! default stream one, so the device is full; O frees two, and the default stream asks for
//! 20 MiB.

use crate::expandable_pressure::{on_device, other_stream_frees, other_stream_frees_two_pages};
use vmm_alloc::backend::{Backend, CallKind};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::stats::MemoryStats;
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, SimBackend, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn give_back() -> ExpandableConfig {
    ExpandableConfig {
        give_back_before_foreign_sync: true,
        // Released, not kept for O's next growth (Note [Kept pages]): checked below.
        keep_after_retry: false,
        ..ExpandableConfig::default()
    }
}

/// The statistics after the default stream's request, and the device's free bytes then.
fn foreign_pages_needed(config: ExpandableConfig) -> (MemoryStats, usize) {
    page_request(other_stream_frees_two_pages(config))
}

/// The default stream asks for a page on the full device of `other_stream_frees`: the
/// statistics after it and the device's free bytes then, everything freed after.
fn page_request(
    (a, o, s1): (ExpandableAllocator<SimBackend>, Vec<Allocation>, Allocation),
) -> (MemoryStats, usize) {
    let device = a.with_backend(|s| s.capacity());
    let s2 = a.allocate(20 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    let stats = a.stats();
    let free = device - a.with_backend(|s| s.live()).physical_bytes;
    for b in o.into_iter().chain([s1, s2]) {
        a.deallocate(b).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(a.with_backend(|s| s.live()).physical_bytes, 0);
    (stats, free)
}

#[test]
fn another_streams_pages_are_given_back_instead_of_remapped() {
    let (remapped, free_remapped) = foreign_pages_needed(ExpandableConfig::default());
    let (given, free_given) = foreign_pages_needed(give_back());
    // The default: one of O's pages is remapped after O's synchronization, the other stays
    // mapped and free on O.
    assert_eq!(remapped.remapped_bytes, 20 * MB as u64);
    assert_eq!(remapped.num_alloc_retries, 0);
    assert_eq!(remapped.calls.calls(CallKind::Synchronize), 1);
    assert_eq!(free_remapped, 0, "the device stays full");
    // Given back: both of O's free pages go back to the device (one synchronization of O), and
    // the request is served by a new page.
    assert_eq!(given.remapped_bytes, 0, "nothing remapped");
    assert_eq!(given.num_alloc_retries, 1, "PyTorch's give-back-and-retry");
    assert_eq!(given.calls.calls(CallKind::Synchronize), 1);
    assert_eq!(free_given, 20 * MB, "O's second free page went back too");
    assert_eq!(given.num_ooms, 0);
    // Kept (the default): the same decisions, O's second page held for the growth that would
    // create a page of its length.
    let (kept, free_kept) = foreign_pages_needed(ExpandableConfig {
        keep_after_retry: true,
        ..give_back()
    });
    assert_eq!(
        (
            kept.num_alloc_retries,
            kept.calls.calls(CallKind::Synchronize)
        ),
        (1, 1)
    );
    assert_eq!(
        (free_kept, kept.handle_cache_bytes),
        (0, 20 * MB as u64),
        "O's second page kept"
    );
    assert_eq!(
        given.allocated_bytes.all.current, remapped.allocated_bytes.all.current,
        "the same blocks are live"
    );
}

#[test]
fn the_growing_streams_own_pages_are_still_remapped_without_a_synchronization() {
    // One stream fills the device, frees two separate pages and asks for two pages' worth: both
    // of its own free pages are remapped (parked), with or without the setting.
    let run = |config: ExpandableConfig| {
        let a = on_device(100 * MB, config);
        let mut b: Vec<_> = (0..5).map(|_| a.allocate(20 * MB, S0).unwrap()).collect();
        a.deallocate(b.remove(3)).unwrap();
        a.deallocate(b.remove(1)).unwrap();
        let big = a.allocate(40 * MB, S0).unwrap();
        a.check_invariants().unwrap();
        let stats = a.stats();
        for x in b.into_iter().chain([big]) {
            a.deallocate(x).unwrap();
        }
        stats
    };
    let (default, given) = (run(ExpandableConfig::default()), run(give_back()));
    assert_eq!(given.remapped_bytes, 40 * MB as u64);
    assert_eq!(
        given.num_alloc_retries, 0,
        "no give-back for the own stream's pages"
    );
    assert_eq!(given.calls.calls(CallKind::Synchronize), 0);
    assert_eq!(
        given.calls, default.calls,
        "the setting changes nothing on one stream"
    );
}

/// The default `give_back_below_free_pages` (5 %), on a 500 MiB device of 20 MiB pages full of
/// another stream's 24 one-page blocks and one of the default stream's: when that stream has
/// freed the blocks at `freed` (whole pages apart, none merging with another) and the default
/// stream asks for a page, returns the statistics.
fn mosaic(config: ExpandableConfig, freed: &[usize]) -> MemoryStats {
    page_request(other_stream_frees(config, 24, freed)).0
}

/// The per-stream rule alone (the rule over every stream off).
fn per_stream_only() -> ExpandableConfig {
    ExpandableConfig {
        give_back_below_all_free_pages: 0.0,
        ..ExpandableConfig::default()
    }
}

/// One whole free page of 24 mapped (4 %) is not worth a synchronization of the stream that
/// holds it: every free page is given back and the request retried (PyTorch's last resort);
/// two of 24 (8 %), or the setting at 0, and the page is remapped after the synchronization.
#[test]
fn a_stream_with_few_whole_free_pages_is_given_back_instead_of_synchronized_for_them() {
    let few = mosaic(per_stream_only(), &[1]);
    assert_eq!(few.num_alloc_retries, 1, "given back and retried");
    assert_eq!(few.remapped_bytes, 0);
    assert_eq!(few.num_ooms, 0);
    assert_eq!(few.calls.calls(CallKind::Synchronize), 1);
    let more = mosaic(per_stream_only(), &[1, 6]);
    assert_eq!(more.num_alloc_retries, 0, "8 % free: remapped");
    assert_eq!(more.remapped_bytes, 20 * MB as u64);
    assert_eq!(more.calls.calls(CallKind::Synchronize), 1);
    let off = mosaic(
        ExpandableConfig {
            give_back_below_free_pages: 0.0,
            ..per_stream_only()
        },
        &[1],
    );
    assert_eq!(off.num_alloc_retries, 0, "off: remapped");
    assert_eq!(off.remapped_bytes, 20 * MB as u64);
    assert_eq!(off.num_ooms, 0);
}

/// The default `give_back_below_all_free_pages` (15 %) judges the whole device: two whole free
/// pages of the 25 mapped (8 %), enough for the per-stream rule, are a mosaic across the
/// device, so every free page is given back instead of synchronizing stream 9 for one of
/// them; four of 25 (16 %) are worth the synchronization and the page is remapped.
#[test]
fn a_device_with_few_whole_free_pages_overall_is_given_back_instead_of_synchronized() {
    let two = mosaic(ExpandableConfig::default(), &[1, 6]);
    assert_eq!(two.num_alloc_retries, 1, "8 % of the device: given back");
    assert_eq!(two.remapped_bytes, 0);
    assert_eq!(two.num_ooms, 0);
    assert_eq!(two.calls.calls(CallKind::Synchronize), 1);
    let four = mosaic(ExpandableConfig::default(), &[1, 6, 11, 16]);
    assert_eq!(four.num_alloc_retries, 0, "16 % of the device: remapped");
    assert_eq!(four.remapped_bytes, 20 * MB as u64);
    assert_eq!(four.calls.calls(CallKind::Synchronize), 1);
    assert_eq!(four.num_ooms, 0);
}
