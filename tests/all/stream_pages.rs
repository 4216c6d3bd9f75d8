//! Note [Stream pages] (`src/expandable/growth.rs`): the large page a growth maps shrinks so
//! that one page per stream that took large-pool memory stays within `stream_page_share` of the
//! device, never below `stream_page_floor`; one stream, or a device large for its streams,
//! keeps 20 MiB pages.

use crate::expandable_pressure::on_device;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, SimBackend, StreamId};

const MB: usize = 1 << 20;
const GB: usize = 1 << 30;

/// Memory mapped for a 30 MiB block on a fresh stream after `streams` other streams each took
/// one 30 MiB block of the large pool (and one stream one 512 B block of the small pool, which
/// must not count).
fn mapped_for_the_last(capacity: usize, config: ExpandableConfig, streams: u64) -> u64 {
    let a: ExpandableAllocator<SimBackend> = on_device(capacity, config);
    let mut kept: Vec<Allocation> = (1..=streams)
        .map(|s| a.allocate(30 * MB, StreamId::sim(s)).unwrap())
        .collect();
    kept.push(a.allocate(512, StreamId::sim(streams + 1)).unwrap());
    let before = a.stats().reserved_bytes.large_pool.current;
    kept.push(a.allocate(30 * MB, StreamId::sim(streams + 2)).unwrap());
    a.check_invariants().unwrap();
    let after = a.stats().reserved_bytes.large_pool.current;
    for k in kept {
        a.deallocate(k).unwrap();
    }
    after - before
}

#[test]
fn pages_shrink_with_the_streams_on_a_device_small_for_them() {
    let d = ExpandableConfig::default;
    // One stream: two 20 MiB pages for 30 MiB, whatever the device.
    assert_eq!(mapped_for_the_last(GB, d(), 0), 40 * MB as u64);
    // A second stream on 1 GiB: 3 % ÷ 2 streams = 15.36 MiB, a 14 MiB page (three: 42 MiB).
    assert_eq!(mapped_for_the_last(GB, d(), 1), 42 * MB as u64);
    // Five streams on 1 GiB: 6.1 MiB, below the 8 MiB floor: four 8 MiB pages.
    assert_eq!(mapped_for_the_last(GB, d(), 4), 32 * MB as u64);
    // Five streams on 80 GiB: 491 MiB a stream, so the page stays 20 MiB.
    assert_eq!(mapped_for_the_last(80 * GB, d(), 4), 40 * MB as u64);
    // Off, and PyTorch's policy: 20 MiB pages.
    let off = ExpandableConfig {
        stream_page_share: 0.0,
        ..d()
    };
    assert_eq!(mapped_for_the_last(GB, off, 4), 40 * MB as u64);
    let pytorch = ExpandableConfig::pytorch_expandable();
    assert_eq!(mapped_for_the_last(GB, pytorch, 4), 40 * MB as u64);
    // A lower floor lets the page follow the share: 6 MiB pages (five: 30 MiB).
    let floor = ExpandableConfig {
        stream_page_floor: 2 * MB,
        ..d()
    };
    assert_eq!(mapped_for_the_last(GB, floor, 4), 30 * MB as u64);
}

#[test]
fn the_settings_are_keys_and_out_of_range_shares_are_refused() {
    let c = ExpandableConfig::default()
        .with_settings("stream_page_share:0.1,stream_page_floor_mb:4")
        .unwrap();
    assert_eq!((c.stream_page_share, c.stream_page_floor), (0.1, 4 * MB));
    let err = ExpandableConfig::default()
        .with_settings("stream_page_share:1.5")
        .unwrap_err();
    assert!(err.to_string().contains("stream_page_share"), "{err}");
}
