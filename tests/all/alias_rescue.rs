//! Note [Alias rescue] (`src/expandable/rescue.rs`): where the last resort cannot serve a large
//! request, the free tail of one partly used page and the free head of another, each mapped a
//! second time, serve it.
//!
//! The scenario, on a 100 MiB device of 20 MiB pages, one stream: blocks of 16 and 8 MiB
//! alternate (X0 Y0 X1 Y1 X2 Y2 X3, then Y3 of 12 MiB) and fill the device; Y0, Y1 and Y2 are
//! freed. 24 MiB are free, in three ranges of 8 MiB, and no page is wholly free:
//!
//! ```text
//!  page  0 [0,20)      1 [20,40)     2 [40,60)     3 [60,80)       4 [80,100)
//!        X0 16 | Y0 4  Y0 4 | X1 16  Y1 8 | X2 12  X2 4 | Y2 8 | X3 8  X3 8 | Y3 12
//! ```
//!
//! A 12 MiB request fits no range and the device has no room; page 0's free tail (4 MiB) and
//! page 2's free head (8 MiB), mapped side by side in a new reservation, hold it exactly.

use crate::expandable_pressure::on_device;
use vmm_alloc::backend::{Backend, CallKind, HostBackend, HostConfig, SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::snapshot::BlockState;
use vmm_alloc::{AllocError, Allocation, Allocator, DevAddr, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// The device full of partly used pages, with Y0, Y1 and Y2 freed; returns the live blocks
/// X0, X1, X2, X3 and Y3.
pub(crate) fn mosaic<B: Backend>(a: &ExpandableAllocator<B>) -> Vec<Allocation> {
    let sizes = [16, 8, 16, 8, 16, 8, 16, 12];
    let blocks: Vec<Allocation> = sizes
        .iter()
        .map(|&mb| a.allocate(mb * MB, S0).unwrap())
        .collect();
    for (i, b) in blocks.iter().enumerate() {
        assert_eq!(
            b.ptr().get() - blocks[0].ptr().get(),
            sizes[..i].iter().sum::<usize>() as u64 * MB as u64
        );
    }
    let mut live = Vec::new();
    for (i, b) in blocks.into_iter().enumerate() {
        if i % 2 == 1 && i < 6 {
            a.deallocate(b).unwrap();
        } else {
            live.push(b);
        }
    }
    a.check_invariants().unwrap();
    live
}

/// Frees `blocks` and empties the cache, checking the invariants before and after.
pub(crate) fn free_all<B: Backend>(
    a: &ExpandableAllocator<B>,
    blocks: impl IntoIterator<Item = Allocation>,
) {
    a.check_invariants().unwrap();
    for b in blocks {
        a.deallocate(b).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
}

/// `n` requests of 8 MiB on `stream`; returns them and where each lies, in MiB from X0.
fn eights<B: Backend>(
    a: &ExpandableAllocator<B>,
    live: &[Allocation],
    n: usize,
    stream: StreamId,
) -> (Vec<Allocation>, Vec<u64>) {
    let ys: Vec<Allocation> = (0..n)
        .map(|_| a.allocate(8 * MB, stream).unwrap())
        .collect();
    let at = ys
        .iter()
        .map(|y| (y.ptr().get() - live[0].ptr().get()) / MB as u64)
        .collect();
    a.check_invariants().unwrap();
    (ys, at)
}

fn without_rescue() -> ExpandableConfig {
    ExpandableConfig {
        alias_rescue: false,
        ..ExpandableConfig::default()
    }
}

#[test]
fn two_free_ends_of_partly_used_pages_serve_a_request_nothing_else_can() {
    // Without the rescue: PyTorch's last resort finds no whole free page, and the request fails.
    let a = on_device(100 * MB, without_rescue());
    let _live = mosaic(&a);
    assert!(matches!(
        a.allocate(12 * MB, S0),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(a.stats().num_ooms, 1);

    // Without parking (Note [Parked rescue], the test after this one), as PyTorch's policy
    // would tear it down: synchronized first.
    let a = on_device(
        100 * MB,
        ExpandableConfig {
            park_remaps: false,
            ..ExpandableConfig::default()
        },
    );
    let live = mosaic(&a);
    let before = a.stats();
    let c = a.allocate(12 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!(s.num_ooms, 0);
    assert_eq!(s.num_alloc_retries, 1, "the last resort ran first");
    // Nothing new: two maps of handles that already hold memory, no create.
    assert_eq!(
        s.calls.calls(CallKind::Create),
        before.calls.calls(CallKind::Create)
    );
    assert_eq!(
        s.calls.calls(CallKind::Map) - before.calls.calls(CallKind::Map),
        2
    );
    assert_eq!(s.reserved_bytes.all.current, 100 * MB as u64);
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 100 * MB);
    assert_eq!(
        s.allocated_bytes.all.current,
        (16 * 4 + 12 + 12) as u64 * MB as u64
    );
    // The block lies in a reservation of its own, shown as a segment: page 0's live bytes,
    // the block, page 2's live bytes; the lent ends show unmapped at home.
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 2);
    let rescue = snap
        .segments
        .iter()
        .find(|seg| seg.blocks.iter().any(|b| b.address == c.ptr()))
        .unwrap();
    let states: Vec<(usize, BlockState)> = rescue
        .blocks
        .iter()
        .map(|b| (b.size / MB, b.state))
        .collect();
    assert_eq!(
        states,
        [
            (16, BlockState::Unmapped),
            (12, BlockState::ActiveAllocated),
            (12, BlockState::Unmapped)
        ]
    );
    let mapped: usize = snap.segments.iter().map(|s| s.mapped_size).sum();
    assert_eq!(mapped, 100 * MB, "each physical byte shown mapped once");
    // Freed, the rescue waits for its stream's queued work: no synchronization at the free.
    let syncs = a.stats().calls.calls(CallKind::Synchronize);
    a.deallocate(c).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().calls.calls(CallKind::Synchronize), syncs);
    assert_eq!(
        a.snapshot().segments.len(),
        2,
        "still mapped, its block inactive"
    );
    // Y2's place serves 8 MiB at once; the next 8 MiB would grow, so the stream is synchronized
    // and the rescue torn down first: its ends are free at home again, Y0's and Y1's places,
    // with no retry and nothing new created.
    let retries = a.stats().num_alloc_retries;
    let creates = a.stats().calls.calls(CallKind::Create);
    let (ys, at) = eights(&a, &live, 3, S0);
    assert_eq!(at, [64, 16, 40]);
    a.check_invariants().unwrap();
    assert_eq!(a.snapshot().segments.len(), 1);
    assert_eq!(a.stats().segment.all.current, 1);
    assert_eq!(a.stats().calls.calls(CallKind::Synchronize), syncs + 1);
    assert_eq!(a.stats().num_alloc_retries, retries);
    assert_eq!(a.stats().calls.calls(CallKind::Create), creates);
    for y in ys {
        a.deallocate(y).unwrap();
    }
    let again = a.allocate(12 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    for b in live.into_iter().chain([again]) {
        a.deallocate(b).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
}

/// Note [Rescue space]: the rescue maps in the addresses its segment reserved after its own, so
/// it makes no reservation; its teardown frees none, and the segment's one reservation goes
/// with the segment.
#[test]
fn a_rescue_maps_in_its_segments_rescue_space_without_a_reservation_of_its_own() {
    let a = on_device(100 * MB, ExpandableConfig::default());
    let live = mosaic(&a);
    let reserves = a.stats().calls.calls(CallKind::Reserve);
    let va = a.with_backend(|b| b.live());
    assert_eq!(va.reservations, 1);
    let c = a.allocate(12 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().alias_rescues, 1);
    assert_eq!(a.stats().calls.calls(CallKind::Reserve), reserves);
    assert_eq!(a.with_backend(|b| b.live()).reservations, 1);
    // Shown as a segment of its own, starting where the home segment's addresses end.
    let snap = a.snapshot();
    let holds_c =
        |seg: &&vmm_alloc::snapshot::SegmentInfo| seg.blocks.iter().any(|b| b.address == c.ptr());
    let rescue = snap.segments.iter().find(holds_c).unwrap();
    let home = snap.segments.iter().find(|s| !holds_c(s)).unwrap();
    assert_eq!(
        rescue.address.get(),
        home.address.get() + home.total_size as u64
    );
    free_all(&a, live.into_iter().chain([c]));
    let s = a.stats();
    assert_eq!(s.calls.calls(CallKind::Reserve), 1);
    assert_eq!(s.calls.calls(CallKind::FreeReservation), 1);
    let left = a.with_backend(|b| b.live());
    assert_eq!((left.reservations, left.mappings, left.handles), (0, 0, 0));
}

/// Where the driver refuses a segment's addresses with the rescue space, the segment is
/// reserved without it (and so is every later one, at no failed call more), and a rescue
/// reserves its own range, as before Note [Rescue space].
#[test]
fn without_addresses_for_a_rescue_space_a_rescue_reserves_its_own() {
    // 100 MiB of memory; segments of 4.5 x the device: 460 MiB of addresses, 520 with the
    // space (an eighth, 58 MiB, but three 20 MiB pages at least); 510 MiB in all to reserve.
    let sim = SimBackend::with_config(SimConfig {
        capacity: 100 * MB,
        va_limit: 510 * MB as u64,
        ..SimConfig::default()
    })
    .unwrap();
    let config = ExpandableConfig {
        va_factor: 4.5,
        ..ExpandableConfig::default()
    };
    let a = ExpandableAllocator::new(sim, config).unwrap();
    let live = mosaic(&a);
    let s = a.stats();
    assert_eq!(
        s.calls.failures(CallKind::Reserve),
        1,
        "the space refused once"
    );
    assert_eq!(a.with_backend(|b| b.live()).reserved_va_bytes, 460 * MB);
    let c = a.allocate(12 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().alias_rescues, 1);
    assert_eq!(
        a.with_backend(|b| b.live()).reservations,
        2,
        "the rescue's own"
    );
    free_all(&a, live.into_iter().chain([c]));
    assert_eq!(a.with_backend(|b| b.live()).reservations, 0);
    // The next segment asks for no space: no failed reservation more.
    let b = a.allocate(20 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().calls.failures(CallKind::Reserve), 1);
    assert_eq!(a.with_backend(|b| b.live()).reserved_va_bytes, 460 * MB);
    free_all(&a, [b]);
    let left = a.with_backend(|b| b.live());
    assert_eq!((left.reservations, left.mappings, left.handles), (0, 0, 0));
}

/// Note [Parked rescue]: a freed rescue whose ends its own stream lent gives them back home
/// with no synchronization (the work that will use them is queued on that stream, after the
/// rescued block's); its reservation stays mapped, parked, until the stream is synchronized
/// for a request that must grow, a last resort or `empty_cache`.
#[test]
fn a_freed_rescue_of_its_own_streams_ends_is_parked_without_a_synchronization() {
    let a = on_device(100 * MB, ExpandableConfig::default());
    let live = mosaic(&a);
    let c = a.allocate(12 * MB, S0).unwrap();
    a.deallocate(c).unwrap();
    let syncs = a.stats().calls.calls(CallKind::Synchronize);
    let (retries, creates) = (
        a.stats().num_alloc_retries,
        a.stats().calls.calls(CallKind::Create),
    );
    // Y2's place, then Y0's and Y1's: the second request fits nothing until the ends are home.
    let (ys, at) = eights(&a, &live, 3, S0);
    assert_eq!(at, [64, 16, 40], "the ends serve as before");
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!(
        s.calls.calls(CallKind::Synchronize),
        syncs,
        "no synchronization"
    );
    assert_eq!(
        (s.num_alloc_retries, s.calls.calls(CallKind::Create)),
        (retries, creates)
    );
    assert_eq!(
        a.snapshot().segments.len(),
        2,
        "the rescue, parked, still mapped"
    );
    assert_eq!(
        (s.parked_pages, s.parked_bytes, s.alias_bytes),
        (2, 40 * MB as u64, 0),
        "its two aliases are parked mappings now"
    );
    assert_eq!(s.reserved_bytes.all.current, 100 * MB as u64);
    // Freed, the 8 MiB blocks hold no 12 MiB range: the request must grow, so the parked rescue
    // is torn down first (the stream synchronized now), and the request is rescued anew.
    for y in ys {
        a.deallocate(y).unwrap();
    }
    let again = a.allocate(12 * MB, S0).unwrap();
    let s = a.stats();
    assert_eq!(s.calls.calls(CallKind::Synchronize), syncs + 1);
    assert_eq!((s.parked_pages, s.parked_bytes), (0, 0));
    assert_eq!(s.alias_bytes, 40 * MB as u64, "the new rescue's aliases");
    free_all(&a, live.into_iter().chain([again]));
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
}

/// Where another stream holds memory, a freed rescue goes home only once its stream is
/// synchronized, whoever lent its ends (Note [Parked rescue]): ends lent by another stream's
/// pages may still be in use by the rescued block's queued work, and the home stream's next work
/// is not ordered after it; and a synchronization that makes the stream quiet is what lets the
/// other streams' growths take its free pages without one of their own.
#[test]
fn with_another_stream_a_freed_rescue_is_torn_down_after_a_synchronization() {
    const S1: StreamId = StreamId::sim(1);
    // Stream 1's request, rescued from stream 0's ends; then stream 0's, with stream 1 holding
    // a page of its own on a device 20 MiB larger.
    for own in [false, true] {
        let a = on_device(
            if own { 120 * MB } else { 100 * MB },
            ExpandableConfig::default(),
        );
        let live = mosaic(&a);
        let other = own.then(|| a.allocate(20 * MB, S1).unwrap());
        let c = a.allocate(12 * MB, if own { S0 } else { S1 }).unwrap();
        a.deallocate(c).unwrap();
        let syncs = a.stats().calls.calls(CallKind::Synchronize);
        // Stream 0: Y2's place, then a request that fits nothing until the ends are home.
        let (ys, at) = eights(&a, &live, 2, S0);
        assert_eq!(at, [64, 16]);
        let s = a.stats();
        assert_eq!(
            s.calls.calls(CallKind::Synchronize),
            syncs + 1,
            "the rescue's stream synchronized before its ends went home (own ends: {own})"
        );
        assert_eq!((s.parked_pages, s.parked_bytes), (0, 0), "nothing parked");
        assert_eq!(
            a.snapshot().segments.len(),
            1 + usize::from(own),
            "the rescue torn down"
        );
        free_all(&a, live.into_iter().chain(ys).chain(other));
        assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
    }
}

#[test]
fn a_rescue_maps_new_memory_between_the_ends_where_the_device_has_room() {
    // A 108 MiB device: after the mosaic 8 MiB are left, less than a page. A 20 MiB request:
    // page 0's tail (4), 8 MiB new, page 2's head (8).
    let a = on_device(108 * MB, ExpandableConfig::default());
    let live = mosaic(&a);
    let before = a.stats();
    let c = a.allocate(20 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!(s.num_ooms, 0);
    assert_eq!(
        s.calls.calls(CallKind::Create) - before.calls.calls(CallKind::Create),
        1
    );
    assert_eq!(s.reserved_bytes.all.current, 108 * MB as u64);
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 108 * MB);
    // 2 MiB more than the ends and the device's room hold cannot be rescued.
    a.deallocate(c).unwrap();
    a.check_invariants().unwrap();
    assert!(matches!(
        a.allocate(20 * MB + 2 * MB, S0),
        Err(AllocError::OutOfMemory(_))
    ));
    a.check_invariants().unwrap();
    for b in live {
        a.deallocate(b).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
}

/// Note [Rescue from the cache]: the rescue's new bytes come from the handles the last resort
/// just unmapped into the cache before any is created. A 120 MiB device: the mosaic, then a
/// 20 MiB block Z on page 5, freed. A 32 MiB request fits no free range; the growth at page 5
/// cannot map the 12 MiB beyond it (the device is full), the last resort unmaps page 5 into
/// the cache, and the growth again cannot map 32 MiB from 20. Rescued: page 0's tail (4), page
/// 5's cached handle (20), page 2's head (8). Before, the rescue released the cached handle
/// and created another of the same length.
#[test]
fn a_rescue_maps_the_cached_handles_before_creating_any() {
    let a = on_device(120 * MB, ExpandableConfig::default());
    let live = mosaic(&a);
    let z = a.allocate(20 * MB, S0).unwrap();
    a.deallocate(z).unwrap();
    let before = a.stats();
    let c = a.allocate(32 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!((s.alias_rescues, s.num_ooms), (1, 0));
    let calls = |kind| s.calls.calls(kind) - before.calls.calls(kind);
    assert_eq!(
        (calls(CallKind::Create), calls(CallKind::Release)),
        (0, 0),
        "the cached handle mapped, none created or released"
    );
    assert_eq!(s.bytes_created, before.bytes_created);
    assert_eq!(s.handle_reuses, before.handle_reuses + 1);
    assert_eq!(s.reserved_bytes.all.current, 120 * MB as u64);
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 120 * MB);
    free_all(&a, live.into_iter().chain([c]));
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
}

/// Note [Rescue revived]: the next request of the freed rescue's length on its stream is served
/// from it, mapped still: no call, no synchronization; a request of another length tears it
/// down first.
#[test]
fn a_freed_rescue_serves_the_next_request_of_its_length_without_a_call() {
    let a = on_device(100 * MB, ExpandableConfig::default());
    let live = mosaic(&a);
    let c = a.allocate(12 * MB, S0).unwrap();
    let at = c.ptr();
    a.deallocate(c).unwrap();
    a.check_invariants().unwrap();
    let before = a.stats();
    // Y2's place holds 8 MiB without growing: the rescue stays as it is.
    let y = a.allocate(8 * MB, S0).unwrap();
    let again = a.allocate(12 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!(again.ptr(), at, "the same block");
    assert_eq!(s.calls.total(), before.calls.total(), "no driver call");
    assert_eq!((s.alias_rescues, s.alias_revivals), (1, 1));
    assert_eq!(
        (s.num_ooms, s.num_alloc_retries),
        (0, before.num_alloc_retries)
    );
    assert_eq!(s.reserved_bytes.all.current, 100 * MB as u64);
    // Freed again; a 10 MiB request is not its length: the rescue is torn down first (its
    // stream synchronized, its reservation unmapped), and as no free range at home is longer
    // than 8 MiB, 10 MiB are rescued anew from the same two ends.
    a.deallocate(again).unwrap();
    let syncs = s.calls.calls(CallKind::Synchronize);
    let other = a.allocate(10 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!((s.alias_rescues, s.alias_revivals), (2, 1));
    assert_eq!(
        s.calls.calls(CallKind::Synchronize),
        syncs + 1,
        "the teardown's"
    );
    free_all(&a, live.into_iter().chain([y, other]));
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
}

/// An OOM the rescue could not prevent pauses it until `empty_cache` (Note [Alias rescue]):
/// a program that catches OOMs and goes on at a full device's edge gets PyTorch's behaviour,
/// unless `rescue_after_oom`.
#[test]
fn an_oom_raised_pauses_the_rescue_until_empty_cache() {
    for after_oom in [false, true] {
        let conf = ExpandableConfig {
            rescue_after_oom: after_oom,
            ..ExpandableConfig::default()
        };
        let a = on_device(100 * MB, conf);
        let live = mosaic(&a);
        // 14 MiB: more than the largest tail (4) and head (8) hold, and no room: raised.
        assert!(matches!(
            a.allocate(14 * MB, S0),
            Err(AllocError::OutOfMemory(_))
        ));
        a.check_invariants().unwrap();
        let before = a.stats();
        assert_eq!(before.num_ooms, 1);
        assert_eq!(before.alias_rescues, 0);
        // 12 MiB, which the rescue serves on a fresh allocator (the first test).
        let c = a.allocate(12 * MB, S0);
        a.check_invariants().unwrap();
        let c = if after_oom {
            let c = c.unwrap();
            assert_eq!(a.stats().alias_rescues, 1);
            c
        } else {
            assert!(matches!(c, Err(AllocError::OutOfMemory(_))), "paused");
            let s = a.stats();
            assert_eq!((s.num_ooms, s.alias_rescues), (2, 0));
            assert_eq!(
                s.calls.calls(CallKind::Reserve),
                before.calls.calls(CallKind::Reserve),
                "no rescue tried"
            );
            // The program empties the cache and tries again: rescued.
            a.empty_cache().unwrap();
            let c = a.allocate(12 * MB, S0).unwrap();
            assert_eq!(a.stats().alias_rescues, 1);
            c
        };
        free_all(&a, live.into_iter().chain([c]));
        assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
    }
}

/// On real memory (memfd pages mapped twice): what the rescued block holds reads back, and the
/// live blocks on the aliased pages keep their bytes.
#[test]
fn a_rescued_block_keeps_real_bytes_right() {
    let host = HostBackend::with_config(HostConfig {
        capacity: 100 * MB,
        ..HostConfig::default()
    })
    .unwrap();
    let a = ExpandableAllocator::new(host, ExpandableConfig::default()).unwrap();
    let live = mosaic(&a);
    let fill = |at: DevAddr, len: usize, byte: u8| {
        a.with_backend(|h| h.write(at, &vec![byte; len])).unwrap();
    };
    let read = |at: DevAddr, len: usize| {
        let mut out = vec![0u8; len];
        a.with_backend(|h| h.read(at, &mut out)).unwrap();
        out
    };
    for (i, b) in live.iter().enumerate() {
        fill(b.ptr(), b.size(), 0xA0 + i as u8);
    }
    let c = a.allocate(12 * MB, S0).unwrap();
    fill(c.ptr(), 12 * MB, 0xCC);
    assert!(read(c.ptr(), 12 * MB).iter().all(|&x| x == 0xCC));
    for (i, b) in live.iter().enumerate() {
        assert!(
            read(b.ptr(), b.size()).iter().all(|&x| x == 0xA0 + i as u8),
            "live block {i} kept its bytes"
        );
    }
    // The lent ends are the block's bytes at home: page 0's tail and page 2's head.
    let home = live[0].ptr().get();
    assert!(read(DevAddr::new(home + 16 * MB as u64), 4 * MB)
        .iter()
        .all(|&x| x == 0xCC));
    assert!(read(DevAddr::new(home + 40 * MB as u64), 8 * MB)
        .iter()
        .all(|&x| x == 0xCC));
    free_all(&a, live.into_iter().chain([c]));
}
