//! Note [Kept pages] (`src/expandable/kept.rs`): other streams' pages a served last resort
//! unmapped are kept for the growths that would create a page of their length, and count as
//! the device's room for every decision. So the allocator decides exactly as without the
//! setting, and only the driver calls that create and release those pages go.

use crate::expandable_pressure::on_device;
use vmm_alloc::backend::{Backend, CallKind, SimBackend};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;

/// What a caller sees of one step: served or not, and where; then what the allocator maps.
#[derive(Debug, PartialEq)]
struct Step {
    served: Option<u64>,
    reserved: u64,
    syncs: u64,
}

/// A seeded mix of allocations (1-48 MiB) and frees on 4 streams of a 192 MiB device, tight
/// enough that last resorts unmap other streams' pages; returns every step and the run's
/// creates and releases.
fn run(seed: u64, keep_after_retry: bool) -> (Vec<Step>, u64, u64) {
    let a: ExpandableAllocator<SimBackend> = on_device(
        192 * MB,
        ExpandableConfig {
            keep_after_retry,
            ..ExpandableConfig::default()
        },
    );
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut live = Vec::new();
    let mut steps = Vec::new();
    // Addresses relative to the first block's: each Sim device reserves its own addresses.
    let mut base = None;
    for _ in 0..3_000 {
        let r = next();
        let served = if r % 3 == 0 && !live.is_empty() {
            let i = (next() as usize) % live.len();
            a.deallocate(live.swap_remove(i)).unwrap();
            None
        } else {
            let size = 1 + (next() as usize) % (48 * MB);
            let stream = StreamId::sim(next() % 4);
            match a.allocate(size, stream) {
                Ok(x) => {
                    let at = x.ptr().get() - *base.get_or_insert(x.ptr().get());
                    live.push(x);
                    Some(at)
                }
                Err(e) => {
                    assert!(e.is_out_of_memory(), "{e}");
                    None
                }
            }
        };
        let s = a.stats();
        steps.push(Step {
            served,
            reserved: s.reserved_bytes.all.current,
            syncs: s.calls.calls(CallKind::Synchronize),
        });
        a.check_invariants().unwrap();
    }
    let s = a.stats();
    let calls = (
        s.calls.calls(CallKind::Create),
        s.calls.calls(CallKind::Release),
    );
    for x in live {
        a.deallocate(x).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(a.with_backend(|b| b.live()).physical_bytes, 0);
    (steps, calls.0, calls.1)
}

#[test]
fn kept_pages_change_no_decision_and_save_creates() {
    let (mut saved, mut retried) = (0, 0);
    for seed in 1..=6 {
        let (without, c0, r0) = run(seed, false);
        let (with, c1, r1) = run(seed, true);
        for (i, (x, y)) in without.iter().zip(&with).enumerate() {
            assert_eq!(x, y, "seed {seed}: step {i} decided differently");
        }
        assert!(
            c1 <= c0 && r1 <= r0,
            "seed {seed}: {c1} creates, {r1} releases against {c0}, {r0}"
        );
        saved += c0 - c1;
        retried += u64::from(c0 != c1);
    }
    assert!(
        retried > 0 && saved > 0,
        "no seed kept a page: the scenario lost its pressure"
    );
}
