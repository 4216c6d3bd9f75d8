//! Note [Pages put back] (`src/expandable/put_back.rs`): the free pages the last resort unmapped
//! and the request did not keep are mapped back where they were, not released and created again.
//!
//! The scenario: the alias rescue's mosaic (`alias_rescue.rs`: five 20 MiB pages, each partly
//! used, Y0, Y1 and Y2 freed) on a 120 MiB device, plus page 5 mapped and free. A 32 MiB request
//! fits no free range and the device has no room: the last resort unmaps page 5 into the handle
//! cache, and the rescue serves the request from page 0's free tail (4 MiB), page 5's handle
//! (20) and page 2's free head (8). The rescued block is freed; two 6 MiB requests follow: the
//! first fits Y2, the second fits nothing until the dead rescue is torn down and its two ends
//! are free at home again.
//!
//! Another stream's pages the last resort unmapped are not put back; with `keep_after_retry`
//! they stay cached for that stream's next growth instead of being released and created again.

use crate::alias_rescue::{free_all, mosaic};
use crate::expandable_pressure::on_device;
use vmm_alloc::backend::{Backend, CallKind, SimBackend};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::testkit::{EmulatedBackend, FaultError, FaultPlan, Trigger};
use vmm_alloc::{Allocator, ExpandableAllocator, MemoryStats, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// Runs the scenario up to the second 6 MiB request; returns the allocator, page 5's address,
/// the statistics before that request, and the live blocks.
fn rescued_then_torn_down(
    config: ExpandableConfig,
) -> (
    ExpandableAllocator<SimBackend>,
    u64,
    MemoryStats,
    Vec<vmm_alloc::Allocation>,
) {
    let a = on_device(120 * MB, config);
    let mut live = mosaic(&a);
    let z = a.allocate(20 * MB, S0).unwrap();
    let page5 = z.ptr().get();
    a.deallocate(z).unwrap();
    let c = a.allocate(32 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!(
        (s.alias_rescues, s.num_alloc_retries, s.num_ooms),
        (1, 1, 0)
    );
    assert_eq!(s.reserved_bytes.all.current, 120 * MB as u64);
    a.deallocate(c).unwrap();
    live.push(a.allocate(6 * MB, S0).unwrap());
    let before = a.stats();
    live.push(a.allocate(6 * MB, S0).unwrap());
    a.check_invariants().unwrap();
    (a, page5, before, live)
}

#[test]
fn a_torn_down_rescue_maps_the_last_resorts_page_back_where_it_was() {
    let (a, page5, before, live) = rescued_then_torn_down(ExpandableConfig::default());
    let s = a.stats();
    let calls = |s: &MemoryStats, kind| s.calls.calls(kind) - before.calls.calls(kind);
    assert_eq!(
        (calls(&s, CallKind::Release), calls(&s, CallKind::Create)),
        (0, 0),
        "page 5's handle is neither released nor created again"
    );
    assert_eq!(calls(&s, CallKind::Map), 1, "page 5 mapped back");
    assert_eq!(
        s.reserved_bytes.all.current,
        100 * MB as u64 + 20 * MB as u64,
        "the five partly used pages and page 5, free"
    );
    // A whole page is then served from page 5, where it was, with no call at all.
    let total = s.calls.total();
    let p = a.allocate(20 * MB, S0).unwrap();
    assert_eq!(p.ptr().get(), page5);
    assert_eq!(a.stats().calls.total(), total);
    assert_eq!(a.stats().bytes_created, before.bytes_created);
    free_all(&a, live.into_iter().chain([p]));
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
}

#[test]
fn without_the_setting_the_page_is_released_and_created_again() {
    // Without parking too: with no page to put back the freed rescue would be parked (Note
    // [Parked rescue]), its handle kept mapped for the growth after it.
    let config = ExpandableConfig {
        put_back_after_retry: false,
        park_remaps: false,
        ..ExpandableConfig::default()
    };
    let (a, page5, before, live) = rescued_then_torn_down(config);
    let s = a.stats();
    let calls = |s: &MemoryStats, kind| s.calls.calls(kind) - before.calls.calls(kind);
    assert_eq!(calls(&s, CallKind::Release), 1, "page 5's handle released");
    assert_eq!(s.reserved_bytes.all.current, 100 * MB as u64);
    let p = a.allocate(20 * MB, S0).unwrap();
    assert_eq!(p.ptr().get(), page5, "grown where page 5 was");
    let s = a.stats();
    assert_eq!(calls(&s, CallKind::Create), 1, "and created again");
    assert_eq!(s.bytes_created, before.bytes_created + 20 * MB as u64);
    free_all(&a, live.into_iter().chain([p]));
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
}

/// Stream 1 maps the whole 64 MiB device (2 MiB pages) and frees it; stream 0 then needs 4 MiB:
/// the growth finds no room (`remap_defrag` off, so nothing is harvested before), and the last
/// resort unmaps stream 1's 32 free pages, two of which serve the request.
fn other_streams_pages_unmapped(
    config: ExpandableConfig,
) -> (ExpandableAllocator<SimBackend>, vmm_alloc::Allocation) {
    let a = on_device(
        64 * MB,
        ExpandableConfig {
            large_page: 2 * MB,
            remap_defrag: false,
            ..config
        },
    );
    let other = a.allocate(64 * MB, S1).unwrap();
    a.deallocate(other).unwrap();
    let x = a.allocate(4 * MB, S0).unwrap();
    let s = a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms),
        (1, 0),
        "the last resort served it"
    );
    a.check_invariants().unwrap();
    (a, x)
}

const S1: StreamId = StreamId::sim(1);

/// Ours with `keep_after_retry`.
fn keep() -> ExpandableConfig {
    ExpandableConfig {
        keep_after_retry: true,
        ..ExpandableConfig::default()
    }
}

#[test]
fn another_streams_pages_stay_cached_and_serve_its_next_growth() {
    let (a, x) = other_streams_pages_unmapped(keep());
    let s = a.stats();
    assert_eq!(s.calls.calls(CallKind::Release), 0, "nothing released");
    assert_eq!(
        s.handle_cache_bytes,
        60 * MB as u64,
        "stream 1's pages the request did not take stay cached"
    );
    let live = a.with_backend(|b| b.live());
    assert_eq!(
        live.physical_bytes,
        64 * MB,
        "the allocator holds what it held before the call, no more"
    );
    // Stream 1 grows again: its pages come from the cache, with no create and no release.
    let before = a.stats();
    let y = a.allocate(60 * MB, S1).unwrap();
    let s = a.stats();
    let calls = |kind| s.calls.calls(kind) - before.calls.calls(kind);
    assert_eq!((calls(CallKind::Create), calls(CallKind::Release)), (0, 0));
    assert_eq!(calls(CallKind::Map), 30, "the 30 cached pages mapped");
    assert_eq!(s.bytes_created, before.bytes_created);
    assert_eq!(s.handle_cache_bytes, 0);
    free_all(&a, [x, y]);
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
}

#[test]
fn kept_pages_are_given_back_by_empty_cache_and_by_an_oom() {
    let (a, x) = other_streams_pages_unmapped(keep());
    a.empty_cache().unwrap();
    assert_eq!(
        a.stats().handle_cache_bytes,
        0,
        "empty_cache gives them back"
    );
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 4 * MB);
    free_all(&a, [x]);

    let (a, x) = other_streams_pages_unmapped(keep());
    // 62 MiB more on stream 0 cannot fit beside its 4: the OOM gives every free byte back.
    assert!(a.allocate(62 * MB, S0).unwrap_err().is_out_of_memory());
    a.check_invariants().unwrap();
    assert_eq!(a.stats().handle_cache_bytes, 0, "an OOM gives them back");
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 4 * MB);
    free_all(&a, [x]);
}

#[test]
fn without_the_setting_another_streams_pages_are_released() {
    // PyTorch's way, with `put_back_after_retry` on or off.
    for put_back_after_retry in [true, false] {
        let config = ExpandableConfig {
            put_back_after_retry,
            keep_after_retry: false,
            ..ExpandableConfig::default()
        };
        let (a, x) = other_streams_pages_unmapped(config);
        let s = a.stats();
        assert_eq!(s.calls.calls(CallKind::Release), 30);
        assert_eq!(s.handle_cache_bytes, 0);
        let before = a.stats();
        let y = a.allocate(60 * MB, S1).unwrap();
        let s = a.stats();
        assert_eq!(
            s.calls.calls(CallKind::Create) - before.calls.calls(CallKind::Create),
            30,
            "created again"
        );
        free_all(&a, [x, y]);
    }
}

/// Stream 1 maps the whole 64 MiB device in 4 MiB pages and frees it; stream 0 then needs
/// 4 MiB: the last resort unmaps stream 1's 16 pages, one serves the request, and the other 15
/// (60 MiB) are kept for stream 1. Returns the allocator and the block.
fn fifteen_pages_kept() -> (ExpandableAllocator<SimBackend>, vmm_alloc::Allocation) {
    let a = on_device(
        64 * MB,
        ExpandableConfig {
            large_page: 4 * MB,
            remap_defrag: false,
            ..keep()
        },
    );
    let other = a.allocate(64 * MB, S1).unwrap();
    a.deallocate(other).unwrap();
    let x = a.allocate(4 * MB, S0).unwrap();
    assert_eq!(a.stats().num_alloc_retries, 1, "the last resort served it");
    assert_eq!(
        a.stats().handle_cache_bytes,
        60 * MB as u64,
        "15 pages kept"
    );
    (a, x)
}

/// Note [Kept pages]: kept pages count as the device's room, so a create the limit allows may
/// still be refused where memory outside the allocator (another process, a library's
/// workspace) took it. The create is then retried once every kept page is released: the
/// request is served, nothing leaks, and no OOM reaches the caller.
#[test]
fn a_create_the_driver_refuses_releases_the_kept_pages_and_succeeds() {
    // Control: a small-pool request (2 MiB pages, a length no kept page has) releases one kept
    // page for its room and creates.
    let (a, x) = fifteen_pages_kept();
    let before = a.stats();
    let y = a.allocate(512 << 10, S0).unwrap();
    let s = a.stats();
    let calls = |kind| s.calls.calls(kind) - before.calls.calls(kind);
    assert_eq!((calls(CallKind::Create), calls(CallKind::Release)), (1, 1));
    assert_eq!(s.handle_cache_bytes, 56 * MB as u64, "14 pages still kept");
    free_all(&a, [x, y]);

    // The same request with the driver refusing the first create (memory taken outside).
    let (a, x) = fifteen_pages_kept();
    let before = a.stats();
    a.with_backend(|b| {
        b.set_faults(FaultPlan::new().fail(
            CallKind::Create,
            Trigger::Nth(1),
            FaultError::OutOfMemory,
        ))
    });
    let y = a.allocate(512 << 10, S0).unwrap();
    assert_eq!(
        a.with_backend(|b| b.clear_faults()),
        1,
        "the refusal was injected"
    );
    a.check_invariants().unwrap();
    let s = a.stats();
    let calls = |kind| s.calls.calls(kind) - before.calls.calls(kind);
    assert_eq!(
        (calls(CallKind::Create), calls(CallKind::Release)),
        (2, 15),
        "one kept page for room, the other 14 after the refusal, then the create again"
    );
    assert_eq!(s.handle_cache_bytes, 0, "no page kept");
    assert_eq!(s.num_ooms, before.num_ooms, "no OOM reached the caller");
    assert_eq!(
        a.with_backend(|b| b.live()).physical_bytes,
        6 * MB,
        "the 4 MiB page and the 2 MiB small page, nothing else"
    );
    free_all(&a, [x, y]);
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
}
