//! Note [Harvest order] (`src/expandable/growth.rs`): a growth on a full device takes the
//! fully-free pages of its own stream lowest address first, the memory farthest below where the
//! segment grows; with another stream's free pages among the candidates, or with the switch off,
//! the highest first.
//!
//! The scenario (20 MiB pages, a 200 MiB device): `a` (40 MiB) low, `b` (40 MiB) higher, live
//! blocks between and after them, 180 MiB mapped; `a` and `b` freed; then a 60 MiB request, which
//! no free range holds, grows the segment's end by three pages: one the device still has, two
//! remapped from `a`'s or `b`'s range. The range left whole serves the next 40 MiB request.

use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// Runs the scenario with `config`, first letting stream 3 leave a free page of its own when
/// `foreign` is set; returns the addresses of `a` and `b` and where the 40 MiB request landed.
fn after_pressured_growth(config: ExpandableConfig, foreign: bool) -> (u64, u64, u64) {
    let sim = SimBackend::with_config(SimConfig {
        capacity: 200 * MB,
        ..SimConfig::default()
    })
    .unwrap();
    let alloc = ExpandableAllocator::new(sim, config).unwrap();
    let mut live: Vec<Allocation> = Vec::new();
    if foreign {
        let other = alloc.allocate(20 * MB, StreamId::sim(3)).unwrap();
        alloc.deallocate(other).unwrap();
    }
    let lay = |mb: usize| alloc.allocate(mb * MB, S0).unwrap();
    let a = lay(40);
    live.push(lay(20));
    let b = lay(40);
    live.push(lay(20));
    live.push(lay(if foreign { 40 } else { 60 }));
    let (at_a, at_b) = (a.ptr().get(), b.ptr().get());
    assert!(at_a < at_b);
    alloc.deallocate(a).unwrap();
    alloc.deallocate(b).unwrap();
    live.push(alloc.allocate(60 * MB, S0).expect("served by remapping"));
    let next = alloc.allocate(40 * MB, S0).expect("the range left whole");
    let at = next.ptr().get();
    live.push(next);
    alloc.check_invariants().unwrap();
    for b in live {
        alloc.deallocate(b).unwrap();
    }
    alloc.check_invariants().unwrap();
    (at_a, at_b, at)
}

#[test]
fn a_full_device_growth_takes_its_own_streams_lowest_free_pages_first() {
    let (_, at_b, at) = after_pressured_growth(ExpandableConfig::default(), false);
    assert_eq!(
        at, at_b,
        "a's pages (the lowest) were remapped; b's range stayed whole"
    );
}

/// The default with `harvest_lowest_first` off.
fn highest_first() -> ExpandableConfig {
    ExpandableConfig {
        harvest_lowest_first: false,
        ..ExpandableConfig::default()
    }
}

#[test]
fn with_the_switch_off_the_highest_free_pages_go_first() {
    let (at_a, _, at) = after_pressured_growth(highest_first(), false);
    assert_eq!(
        at, at_a,
        "b's pages (the highest) were remapped; a's range stayed whole"
    );
}

/// Another stream's free page among the candidates: the address order across streams is the
/// default's, the same as with the switch off.
#[test]
fn with_another_streams_free_page_among_the_candidates_the_order_is_unchanged() {
    // Which of the two ranges stayed whole (addresses differ between two Sims).
    let whole = |(at_a, at_b, at): (u64, u64, u64)| {
        assert!(
            at == at_a || at == at_b,
            "the 40 MiB request went into a or b"
        );
        if at == at_a {
            "a"
        } else {
            "b"
        }
    };
    let on = whole(after_pressured_growth(ExpandableConfig::default(), true));
    let without = whole(after_pressured_growth(highest_first(), true));
    assert_eq!(on, without);
}
