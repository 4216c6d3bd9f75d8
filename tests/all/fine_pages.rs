//! Note [Fine pages] (`src/expandable/growth.rs`): with `fine_pages_above`, a large-pool growth
//! that takes the allocator above that fraction of the device maps 2 MiB pages instead of
//! 20 MiB ones, so that what is mapped near the device's end can be remapped piecewise.

use crate::expandable_pressure::on_device;
use vmm_alloc::backend::CallKind;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocator, StreamId};

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn fine_above(fraction: f64) -> ExpandableConfig {
    ExpandableConfig {
        fine_pages_above: fraction,
        ..ExpandableConfig::default()
    }
}

#[test]
fn pages_are_fine_only_above_the_fraction() {
    // 40 MiB stays below half of a 100 MiB device (two 20 MiB pages); the next 30 MiB takes the
    // allocator above it (fifteen 2 MiB pages, where 20 MiB pages would map 40 MiB).
    let run = |config: ExpandableConfig| {
        let a = on_device(100 * MB, config);
        let x = a.allocate(40 * MB, S0).unwrap();
        let first = a.stats().calls.calls(CallKind::Create);
        let y = a.allocate(30 * MB, S0).unwrap();
        a.check_invariants().unwrap();
        let s = a.stats();
        a.deallocate(x).unwrap();
        a.deallocate(y).unwrap();
        (
            first,
            s.calls.calls(CallKind::Create),
            s.reserved_bytes.all.current,
        )
    };
    assert_eq!(run(ExpandableConfig::default()), (2, 4, 80 * MB as u64));
    assert_eq!(run(fine_above(0.5)), (2, 17, 70 * MB as u64));
    assert_eq!(
        run(fine_above(1.0)),
        run(ExpandableConfig::default()),
        "1 is off"
    );
}

#[test]
fn fine_pages_serve_on_a_full_device_what_20_mib_pages_cannot() {
    // On 60 MiB: a and b (10 MiB each), then c (30 MiB) fill the device; a is freed and 20 MiB
    // asked for. With 20 MiB pages a's bytes share a page with b and no page is fully free: out
    // of memory (unless the alias rescue maps b's page's free head and c's last page's free
    // tail side by side: Note [Alias rescue]). With 2 MiB pages a's five pages are remapped to
    // the growth.
    let run = |config: ExpandableConfig| {
        let alloc = on_device(60 * MB, config);
        let a = alloc.allocate(10 * MB, S0).unwrap();
        let b = alloc.allocate(10 * MB, S0).unwrap();
        let c = alloc.allocate(30 * MB, S0).unwrap();
        alloc.deallocate(a).unwrap();
        let d = alloc.allocate(20 * MB, S0);
        alloc.check_invariants().unwrap();
        let served = d.is_ok();
        let remapped = alloc.stats().remapped_bytes;
        for x in [Some(b), Some(c), d.ok()].into_iter().flatten() {
            alloc.deallocate(x).unwrap();
        }
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
        (served, remapped)
    };
    let no_rescue = |c: ExpandableConfig| ExpandableConfig {
        alias_rescue: false,
        ..c
    };
    assert_eq!(run(no_rescue(ExpandableConfig::default())), (false, 0));
    assert_eq!(
        run(ExpandableConfig::default()),
        (true, 0),
        "rescued, nothing remapped"
    );
    assert_eq!(run(no_rescue(fine_above(0.0))), (true, 10 * MB as u64));
}

#[test]
fn a_fraction_outside_zero_to_one_is_refused() {
    let e = ExpandableConfig::default()
        .with_settings("fine_pages_above:1.5")
        .unwrap_err();
    assert!(e.to_string().contains("fine_pages_above"), "{e}");
}
