//! Note [Parked pages] (`src/expandable/parked.rs`): a growth remaps fully-free pages of its own
//! stream without synchronizing the stream, leaving the old mapping parked until a
//! synchronization happens anyway; pages of other streams still wait for one.
//!
//! The scenario: a 100 MiB device, 40 MiB blocks `a` and `b` (two 20 MiB pages each), `a`
//! freed, then a 60 MiB request `c`: the segment's free pages lie before `b`, so `c` grows the
//! segment at its end, where 20 MiB are left in the device and 40 MiB must come from `a`'s pages.

use crate::expandable_pressure::on_device;
use vmm_alloc::backend::{Backend, CallKind, HostBackend, HostConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocator, DevAddr, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn syncs<B: Backend>(a: &ExpandableAllocator<B>) -> u64 {
    a.stats().calls.calls(CallKind::Synchronize)
}

fn no_parking() -> ExpandableConfig {
    ExpandableConfig {
        park_remaps: false,
        ..ExpandableConfig::default()
    }
}

/// The growth fits either way; parked, it costs no synchronization (the old way: one). The
/// parked mappings are real mappings (the backend counts them) holding no memory of their own,
/// and `empty_cache` gives everything back once nothing is live.
#[test]
fn a_growth_remaps_its_own_streams_free_pages_without_a_synchronization() {
    for (config, expected_syncs, parked) in
        [(ExpandableConfig::default(), 0, 2), (no_parking(), 1, 0)]
    {
        let a = on_device(100 * MB, config);
        let first = a.allocate(40 * MB, S0).unwrap();
        let b = a.allocate(40 * MB, S0).unwrap();
        a.deallocate(first).unwrap();
        let c = a.allocate(60 * MB, S0).unwrap();
        a.check_invariants().unwrap();
        assert_eq!(syncs(&a), expected_syncs);
        assert_eq!(a.stats().reserved_bytes.all.current, 100 * MB as u64);
        let live = a.with_backend(|s| s.live());
        assert_eq!(live.physical_bytes, 100 * MB, "no memory beyond the device");
        assert_eq!(
            live.mappings,
            5 + parked,
            "b: 2 pages, c: 3, and the parked ones"
        );
        a.deallocate(b).unwrap();
        a.deallocate(c).unwrap();
        a.empty_cache().unwrap();
        a.check_invariants().unwrap();
        let live = a.with_backend(|s| s.live());
        assert_eq!((live.mappings, live.physical_bytes), (0, 0), "{live}");
    }
}

/// Free pages of another stream are never parked: work queued there is not ordered with the
/// growing stream's, so the growth synchronizes that stream before it takes them.
#[test]
fn pages_of_another_stream_still_wait_for_a_synchronization() {
    let other = StreamId::sim(7);
    // 20 MiB pages with two streams on 100 MiB (Note [Stream pages] would shrink them).
    let config = ExpandableConfig {
        stream_page_share: 0.0,
        ..ExpandableConfig::default()
    };
    let a = on_device(100 * MB, config);
    let first = a.allocate(40 * MB, other).unwrap();
    let b = a.allocate(40 * MB, S0).unwrap();
    a.deallocate(first).unwrap();
    let c = a.allocate(60 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(syncs(&a), 1);
    let live = a.with_backend(|s| s.live());
    assert_eq!(
        live.mappings, 5,
        "nothing parked: the other stream's pages were unmapped"
    );
    a.deallocate(b).unwrap();
    a.deallocate(c).unwrap();
}

/// A later synchronization of the stream (here: the one `empty_cache` makes for the free
/// pages) unmaps the parked pages with no synchronization of their own, and a growth may then
/// map over their addresses again.
#[test]
fn a_synchronization_unmaps_the_parked_pages() {
    let a = on_device(100 * MB, ExpandableConfig::default());
    let first = a.allocate(40 * MB, S0).unwrap();
    let b = a.allocate(40 * MB, S0).unwrap();
    a.deallocate(first).unwrap();
    let c = a.allocate(60 * MB, S0).unwrap();
    a.deallocate(c).unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(
        syncs(&a),
        1,
        "one, for empty_cache's unmapping of c's pages"
    );
    let live = a.with_backend(|s| s.live());
    assert_eq!(
        (live.mappings, live.physical_bytes),
        (2, 40 * MB),
        "b alone: {live}"
    );
    // The addresses `a`'s pages were parked at are a hole again: a 40 MiB block lands there.
    let again = a.allocate(40 * MB, S0).unwrap();
    assert!(
        again.ptr().get() < b.ptr().get(),
        "reused the segment's start"
    );
    a.check_invariants().unwrap();
    a.deallocate(again).unwrap();
    a.deallocate(b).unwrap();
}

/// Real bytes (memfd + mmap): the remapped handle is the freed block's memory, now at the new
/// block's addresses; what is written there reads back, and the live block beside it is intact.
#[test]
fn parked_pages_keep_real_bytes_right() {
    let host = HostBackend::with_config(HostConfig {
        capacity: 100 * MB,
        ..HostConfig::default()
    })
    .unwrap();
    let a = ExpandableAllocator::new(host, ExpandableConfig::default()).unwrap();
    let first = a.allocate(40 * MB, S0).unwrap();
    let b = a.allocate(40 * MB, S0).unwrap();
    let fill = |at: DevAddr, len: usize, byte: u8| {
        a.with_backend(|h| h.write(at, &vec![byte; len])).unwrap();
    };
    let read = |at: DevAddr, len: usize| {
        let mut out = vec![0u8; len];
        a.with_backend(|h| h.read(at, &mut out)).unwrap();
        out
    };
    fill(first.ptr(), 40 * MB, 0xAA);
    fill(b.ptr(), 40 * MB, 0xBB);
    a.deallocate(first).unwrap();
    let c = a.allocate(60 * MB, S0).unwrap();
    assert_eq!(syncs(&a), 0, "remapped by parking");
    fill(c.ptr(), 60 * MB, 0xCC);
    assert!(read(c.ptr(), 60 * MB).iter().all(|&x| x == 0xCC));
    assert!(read(b.ptr(), 40 * MB).iter().all(|&x| x == 0xBB));
    a.check_invariants().unwrap();
    a.deallocate(b).unwrap();
    a.deallocate(c).unwrap();
}
