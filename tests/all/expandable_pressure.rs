//! Issue 19's mechanisms, each shown on the smallest sequence where it decides whether a run
//! fits: exact tails under pressure (a page's unused tail), remapping before growing into the
//! headroom, and the headroom itself. PyTorch's preset is the baseline each is measured against.

use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// The several-streams scenario of `drain_after_sync.rs` and `give_back_before_foreign_sync.rs`,
/// on a 100 MiB device of 20 MiB pages: stream 9 holds four 20 MiB blocks and the default stream
/// one, so the device is full; stream 9 frees two. Returns the allocator, stream 9's two blocks
/// left and the default stream's block.
pub(crate) fn other_stream_frees_two_pages(
    config: ExpandableConfig,
) -> (ExpandableAllocator<SimBackend>, Vec<Allocation>, Allocation) {
    other_stream_frees(config, 4, &[0, 1])
}

/// On a device of `blocks + 1` pages of 20 MiB, stream 9 holds `blocks` one-page blocks and the
/// default stream one, so the device is full; stream 9 frees those at `freed` (indices in
/// allocation order, freed in that order). Returns the allocator, stream 9's blocks left and the
/// default stream's block.
pub(crate) fn other_stream_frees(
    config: ExpandableConfig,
    blocks: usize,
    freed: &[usize],
) -> (ExpandableAllocator<SimBackend>, Vec<Allocation>, Allocation) {
    let other = StreamId::sim(9);
    let a = on_device((blocks + 1) * 20 * MB, config);
    let mut o: Vec<_> = (0..blocks)
        .map(|_| Some(a.allocate(20 * MB, other).unwrap()))
        .collect();
    let s1 = a.allocate(20 * MB, S0).unwrap();
    for &i in freed {
        a.deallocate(o[i].take().expect("each block freed once"))
            .unwrap();
    }
    (a, o.into_iter().flatten().collect(), s1)
}

/// Ours on a Sim device of `capacity` bytes.
pub(crate) fn on_device(
    capacity: usize,
    config: ExpandableConfig,
) -> ExpandableAllocator<SimBackend> {
    let sim = SimBackend::with_config(SimConfig {
        capacity,
        ..SimConfig::default()
    })
    .unwrap();
    ExpandableAllocator::new(sim, config).unwrap()
}

fn held(a: &ExpandableAllocator<SimBackend>) -> u64 {
    a.held_bytes()
}

/// Three 21 MiB blocks live together need 63 MiB. With 20 MiB pages PyTorch rounds each growth
/// up to a page: the third growth asks for 80 MiB in all and fails on a 64 MiB device (nothing is
/// free to give back). Ours maps, under pressure, only what each block needs.
#[test]
fn exact_tails_under_pressure_fit_where_page_rounding_does_not() {
    let run = |config: ExpandableConfig| {
        let a = on_device(64 * MB, config);
        let blocks: Vec<_> = (0..3).map(|_| a.allocate(21 * MB, S0)).collect();
        let ok = blocks.iter().all(Result::is_ok);
        let h = held(&a);
        a.check_invariants().unwrap();
        for b in blocks.into_iter().flatten() {
            a.deallocate(b).unwrap();
        }
        (ok, h)
    };
    let (pytorch_ok, _) = run(ExpandableConfig::pytorch_expandable());
    assert!(!pytorch_ok, "20 MiB pages need 80 MiB for 63 MiB of blocks");
    // The exact tail alone, with no headroom: pressure is the device's end.
    let tail_only = ExpandableConfig {
        headroom_bytes: 0,
        headroom_fraction: 0.0,
        ..ExpandableConfig::default()
    };
    let (ok, h) = run(tail_only);
    assert!(ok, "exact tails fit 3 × 21 MiB on 64 MiB");
    assert!(h <= 64 * MB as u64, "held {h}");
    let (ok, h) = run(ExpandableConfig::default());
    assert!(ok && h == 64 * MB as u64, "default: fits, held {h}");
}

/// Without pressure pages stay large: a growth far from the headroom maps whole 20 MiB pages
/// (few driver calls), exactly as PyTorch.
#[test]
fn pages_stay_large_without_pressure() {
    let a = on_device(80 << 30, ExpandableConfig::default());
    let b = a.allocate(21 * MB, S0).unwrap();
    assert_eq!(held(&a), 40 * MB as u64);
    a.deallocate(b).unwrap();
}

/// In the headroom, free pages freed since their stream's last synchronization are not remapped
/// (that would cost a synchronization PyTorch's policy does not pay there, and they are not
/// parked there either: Note [Parked pages]), and while a whole page still fits in the device
/// the growth creates a whole page, as PyTorch does: a cut tail would save nothing here and
/// cost the next request a growth. Only where the page would not fit is the last handle cut to
/// what the request needs (10 MiB on a device with 10 MiB left, where PyTorch fails).
#[test]
fn in_the_headroom_pages_stay_whole_until_the_device_end() {
    use vmm_alloc::backend::CallKind;
    let config = ExpandableConfig {
        headroom_bytes: 96 * MB,
        headroom_fraction: 0.0,
        ..ExpandableConfig::default()
    };
    let run = |config: ExpandableConfig, device: usize| {
        let a = on_device(device, config);
        let small: Vec<_> = (0..20).map(|_| a.allocate(MB, S0).unwrap()).collect();
        let large = a.allocate(20 * MB, S0).unwrap();
        let keep = a.allocate(MB, S0).unwrap(); // a small page stays partly used
        for s in small {
            a.deallocate(s).unwrap();
        }
        a.deallocate(large).unwrap();
        let before = held(&a);
        let big = a.allocate(30 * MB, S0);
        let after = held(&a);
        a.check_invariants().unwrap();
        let syncs = a.stats().calls.calls(CallKind::Synchronize);
        let grown = big
            .as_ref()
            .ok()
            .map(|_| (after as i64 - before as i64, syncs));
        if let Ok(big) = big {
            a.deallocate(big).unwrap();
        }
        a.deallocate(keep).unwrap();
        grown
    };
    // 42 MiB held (11 small pages, one large page), 20 MiB of it free in the large segment.
    let page = 20 * MB as i64;
    assert_eq!(run(config.clone(), 128 * MB), Some((page, 0)));
    let pytorch = ExpandableConfig::pytorch_expandable;
    assert_eq!(run(pytorch(), 128 * MB), Some((page, 0)));
    // 52 MiB device: 10 MiB left, a whole page does not fit. Ours cuts the tail; PyTorch
    // synchronizes, gives back the ten free small pages and creates a whole page.
    let headroom = ExpandableConfig {
        headroom_bytes: 16 * MB,
        ..config
    };
    assert_eq!(run(headroom, 52 * MB), Some((page / 2, 0)));
    let (grown, syncs) = run(pytorch(), 52 * MB).expect("PyTorch fits after releasing");
    assert_eq!(grown, 0, "20 MiB released, 20 MiB created");
    assert!(syncs > 0, "PyTorch synchronizes before unmapping");
}

/// The headroom: with no pressure from the trace, ours never takes the device's last free bytes
/// while it holds free pages it can remap; PyTorch fills the device before giving any back.
#[test]
fn headroom_keeps_the_last_free_bytes_free() {
    let device = 256 * MB;
    let config = ExpandableConfig {
        headroom_bytes: 48 * MB,
        headroom_fraction: 0.0,
        ..ExpandableConfig::default()
    };
    let run = |config: ExpandableConfig| {
        let a = on_device(device, config);
        let mut peak = 0;
        // A moving working set of 160 MiB: blocks freed at the front, allocated at the back.
        let mut live = std::collections::VecDeque::new();
        for i in 0..64 {
            live.push_back(a.allocate((20 + (i % 3) * 10) * MB, S0).unwrap());
            while live.iter().map(|b| b.size()).sum::<usize>() > 160 * MB {
                a.deallocate(live.pop_front().unwrap()).unwrap();
            }
            peak = peak.max(held(&a));
        }
        a.check_invariants().unwrap();
        for b in live {
            a.deallocate(b).unwrap();
        }
        peak
    };
    let ours = run(config);
    let pytorch = run(ExpandableConfig::pytorch_expandable());
    assert!(ours <= (device - 48 * MB) as u64, "ours held {ours}");
    assert!(ours <= pytorch, "ours {ours} > pytorch {pytorch}");
}

/// Note [Free holes]: a request larger than a free hole in a segment's interior grows the
/// segment at its end, however much free memory the interior holds (on `nca2d-peso-inference`
/// a 7012 MiB request found 14.78 GiB free in 5 ranges and grew by 4600 MiB). Here: 100 MiB
/// freed between live blocks, then a 140 MiB request. By default (and in PyTorch) the segment
/// grows to 340 MiB for 240 MiB live; with `remap_before_create` the hole's five fully-free
/// pages are remapped to the growth and 240 MiB are held, at the cost of one stream
/// synchronization, or of none where the pages are parked (Note [Parked pages]: they are the
/// growing stream's own).
#[test]
fn remap_before_create_reuses_a_hole_too_small_for_the_request() {
    use vmm_alloc::backend::CallKind;
    let run = |config: ExpandableConfig| {
        let a = on_device(80 << 30, config);
        let first = a.allocate(100 * MB, S0).unwrap();
        let second = a.allocate(100 * MB, S0).unwrap();
        a.deallocate(first).unwrap();
        let third = a.allocate(140 * MB, S0).unwrap();
        a.check_invariants().unwrap();
        let out = (held(&a), a.stats().calls.calls(CallKind::Synchronize));
        a.deallocate(second).unwrap();
        a.deallocate(third).unwrap();
        out
    };
    assert_eq!(
        run(ExpandableConfig::pytorch_expandable()),
        (340 * MB as u64, 0)
    );
    assert_eq!(run(ExpandableConfig::default()), (340 * MB as u64, 0));
    let remap = ExpandableConfig {
        remap_before_create: true,
        ..ExpandableConfig::default()
    };
    assert_eq!(run(remap.clone()), (240 * MB as u64, 0));
    let unparked = ExpandableConfig {
        park_remaps: false,
        ..remap
    };
    assert_eq!(run(unparked), (240 * MB as u64, 1));
}

/// Note [Borrowing]: on a 24 MiB device, a 12 MiB block and a kept 6 MiB block share a 20 MiB
/// large page (mapped before any pressure); the 12 MiB block is freed, so 14 MiB of the page lie
/// free beside a live block and no remap can take them. The small page (2 MiB) is full: three
/// more 1 MiB requests need two more small pages, 26 MiB in all. PyTorch's policy (and ours
/// without borrowing) runs out of memory on the third; ours places all three in the large
/// pool's free ranges, with no driver call, and counts them in the large pool, whose memory
/// holds them.
#[test]
fn a_small_request_under_pressure_borrows_a_free_range_of_the_large_pool() {
    let run = |config: ExpandableConfig| {
        let a = on_device(24 * MB, config);
        let mut live: Vec<_> = (0..2).map(|_| a.allocate(MB, S0).unwrap()).collect();
        let big = a.allocate(12 * MB, S0).unwrap();
        live.push(a.allocate(6 * MB, S0).unwrap());
        assert_eq!(held(&a), 22 * MB as u64, "one small page, one large page");
        a.deallocate(big).unwrap();
        let calls = a.stats().calls.total();
        let more: Vec<_> = (0..3).map(|_| a.allocate(MB, S0)).collect();
        a.check_invariants().unwrap();
        let fits = more.iter().all(Result::is_ok);
        let s = a.stats();
        let out = (
            fits,
            s.allocated_bytes.large_pool.current,
            s.calls.total() - calls,
        );
        let h = held(&a);
        for b in live.into_iter().chain(more.into_iter().flatten()) {
            a.deallocate(b).unwrap();
        }
        let s = a.stats();
        assert_eq!(s.allocated_bytes.all.current, 0);
        assert_eq!(s.allocated_bytes.large_pool.current, 0);
        a.check_invariants().unwrap();
        (out, h)
    };
    let ((pytorch_fits, _, _), _) = run(ExpandableConfig::pytorch_expandable());
    assert!(!pytorch_fits, "PyTorch's pools never share: 26 MiB needed");
    let no_borrow = ExpandableConfig {
        borrow_across_pools: false,
        ..ExpandableConfig::default()
    };
    assert!(!run(no_borrow).0 .0, "without borrowing: out of memory");
    let ((fits, large_bytes, calls), h) = run(ExpandableConfig::default());
    assert!(fits, "borrowing fits the three requests");
    assert_eq!(
        large_bytes,
        9 * MB as u64,
        "the 6 MiB block and the borrowed 3 × 1 MiB"
    );
    assert_eq!(calls, 0, "no driver call: free ranges served them");
    assert_eq!(h, 22 * MB as u64, "nothing mapped");
}

/// Note [Headroom], `tail_takes_rest`: a stream alone at the device's end takes what is left
/// with its first tail, and its next requests land there; with another stream holding memory
/// each request's tail stays exact, leaving the rest to any stream. The device has 16 MiB left
/// after two pages; the default stream then asks for 4, 6 and 6 MiB (the end of
/// `cs336-forward-fp32-ctx128-e` at its minimum capacity).
#[test]
fn a_stream_alone_at_the_device_end_takes_the_rest_with_one_growth() {
    use vmm_alloc::backend::CallKind;
    // (growths at the end, bytes held after) on a device of `pages` 20 MiB pages + 16 MiB,
    // where stream 9 first takes `pages - 2` of them.
    let run = |config: ExpandableConfig, pages: usize| {
        let a = on_device(pages * 20 * MB + 16 * MB, config);
        let other: Vec<_> = (0..pages - 2)
            .map(|_| a.allocate(20 * MB, StreamId::sim(9)).unwrap())
            .collect();
        let first = a.allocate(40 * MB, S0).unwrap();
        let before = a.stats().calls.calls(CallKind::Create);
        let end: Vec<_> = [4, 6, 6]
            .iter()
            .map(|&mb| a.allocate(mb * MB, S0).expect("the device holds them"))
            .collect();
        let growths = a.stats().calls.calls(CallKind::Create) - before;
        let h = held(&a);
        a.check_invariants().unwrap();
        for b in end.into_iter().chain(other).chain([first]) {
            a.deallocate(b).unwrap();
        }
        (growths, h)
    };
    // 20 MiB pages with two streams on a device this small (Note [Stream pages] would shrink
    // them): the rule under test is the tail's.
    let pages20 = || ExpandableConfig {
        stream_page_share: 0.0,
        ..ExpandableConfig::default()
    };
    let alone = run(pages20(), 2);
    assert_eq!(alone, (1, 56 * MB as u64), "one 16 MiB handle");
    let exact = ExpandableConfig {
        tail_takes_rest: false,
        ..pages20()
    };
    assert_eq!(run(exact, 2), (3, 56 * MB as u64), "4, 6 and 6 MiB");
    let shared = run(pages20(), 3);
    assert_eq!(shared, (3, 76 * MB as u64), "another stream holds memory");
}
