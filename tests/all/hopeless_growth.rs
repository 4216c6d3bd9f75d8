//! Note [Hopeless growth] (`src/expandable/hopeless.rs`): a growth that cannot get the memory it
//! must map fails before any driver call, and one that can still gets it.
//!
//! The scenario, on a 100 MiB device of 20 MiB pages, one stream: five 20 MiB blocks fill it;
//! the second is freed, so one whole page is free.

use crate::expandable_pressure::on_device;
use vmm_alloc::backend::CallKind::{self, Create, FreeReservation, Map, Release, Reserve, Unmap};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{AllocError, Allocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// How many calls of each of `kinds` the allocator made.
fn counts<B: vmm_alloc::backend::Backend>(
    a: &vmm_alloc::ExpandableAllocator<B>,
    kinds: &[CallKind],
) -> Vec<u64> {
    let s = a.stats();
    kinds.iter().map(|&k| s.calls.calls(k)).collect()
}

#[test]
fn a_request_no_growth_can_hold_makes_no_reservation_map_or_create() {
    // Without the rescue, which would try the ends of partly used pages after the last resort.
    let a = on_device(
        100 * MB,
        ExpandableConfig {
            alias_rescue: false,
            ..ExpandableConfig::default()
        },
    );
    let mut blocks: Vec<_> = (0..5).map(|_| a.allocate(20 * MB, S0).unwrap()).collect();
    a.deallocate(blocks.remove(1)).unwrap();
    a.check_invariants().unwrap();
    let growth = [Reserve, FreeReservation, Create, Map];
    let before = counts(&a, &growth);
    let unmaps = counts(&a, &[Unmap, Release]);
    // 40 MiB: the free page and no room hold 20. Both growths (before and after the last
    // resort) fail at once; the last resort gives the free page back (one unmap, one release).
    assert!(matches!(
        a.allocate(40 * MB, S0),
        Err(AllocError::OutOfMemory(_))
    ));
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries), (1, 1));
    assert_eq!(counts(&a, &growth), before, "no reservation, create or map");
    let after: Vec<u64> = counts(&a, &[Unmap, Release]);
    assert_eq!(
        after,
        [unmaps[0] + 1, unmaps[1] + 1],
        "the last resort's release"
    );
    assert_eq!(s.reserved_bytes.all.current, 80 * MB as u64);
    // 20 MiB is not hopeless: the device's room holds it again, and the growth maps it.
    let b = a.allocate(20 * MB, S0).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().reserved_bytes.all.current, 100 * MB as u64);
    blocks.push(b);
    // A request the free page holds only once it is harvested: freed, the page stays mapped
    // and free, and a 20 MiB request on another stream remaps it (it is not hopeless).
    let b = blocks.pop().unwrap();
    a.deallocate(b).unwrap();
    let other = a.allocate(20 * MB, StreamId::sim(7)).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().num_ooms, 1);
    assert!(a.stats().remapped_bytes >= 20 * MB as u64);
    for b in blocks.into_iter().chain([other]) {
        a.deallocate(b).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
}
