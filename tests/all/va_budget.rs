//! Note [Address space budget] (`src/expandable/growth.rs`): the process's virtual address space
//! is shared by every segment, and a request must not fail for want of it while a shorter
//! reservation would hold it; where even that is refused, the error says which resource ran out.

use vmm_alloc::backend::{Backend, CallKind, SimConfig};
use vmm_alloc::{Allocator, ExpandableAllocator, ExpandableConfig, SimBackend, StreamId};

const MB: usize = 1 << 20;
const GB: usize = 1 << 30;

fn sim(capacity: usize, va_limit: usize) -> SimBackend {
    SimBackend::with_config(SimConfig {
        capacity,
        va_limit: va_limit as u64,
        ..SimConfig::default()
    })
    .unwrap()
}

/// An 8 GiB device whose process has 24 GiB of addresses: two segments of 9 GiB (1.125 × the
/// device) fit, a third does not. Six streams each ask for 30 MiB, as a server's streams would:
/// every request is served, the later ones from segments of their request alone, and each
/// stream can still grow.
#[test]
fn streams_beyond_the_address_space_budget_get_shorter_segments() {
    let sim = sim(8 * GB, 24 * GB);
    let alloc = ExpandableAllocator::new(sim.clone(), ExpandableConfig::default()).unwrap();
    let blocks: Vec<_> = (0..6)
        .map(|s| alloc.allocate(30 * MB, StreamId::sim(s)))
        .collect::<Result<_, _>>()
        .expect("every stream's request is served while the device is nearly empty");
    let full = (9 * GB).next_multiple_of(20 * MB); // in 20 MiB pages
    let lens: Vec<usize> = alloc
        .snapshot()
        .segments
        .iter()
        .map(|s| s.total_size)
        .collect();
    assert_eq!(lens.len(), 6, "one segment per stream: {lens:?}");
    assert_eq!(lens.iter().filter(|&&l| l == full).count(), 2, "{lens:?}");
    assert_eq!(
        lens.iter().filter(|&&l| l == 40 * MB).count(),
        4,
        "the others reserve the request alone, in 20 MiB pages: {lens:?}"
    );
    let calls = sim.calls();
    assert!(
        calls.failures(CallKind::Reserve) > 0,
        "the refused reservations are counted as failed driver calls"
    );
    assert_eq!(
        calls.calls(CallKind::Reserve) - calls.failures(CallKind::Reserve),
        6
    );
    // A stream with a short segment grows by reserving another, also short.
    for s in 2..6 {
        let more = alloc.allocate(2 * GB, StreamId::sim(s)).unwrap();
        alloc.deallocate(more).unwrap();
    }
    for b in blocks {
        alloc.deallocate(b).unwrap();
    }
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.snapshot().segments.len(), 0);
}

/// PyTorch's policy fails the third stream's request, with the device nearly empty (its PR
/// #192269); ours' `va_fallback:false` is that policy's behaviour.
#[test]
fn without_the_fallback_a_stream_beyond_the_budget_fails_as_pytorchs_does() {
    for config in [
        ExpandableConfig::pytorch_expandable(),
        ExpandableConfig::default()
            .with_settings("va_fallback:false")
            .unwrap(),
    ] {
        let alloc = ExpandableAllocator::new(sim(8 * GB, 24 * GB), config).unwrap();
        let held: Vec<_> = (0..2)
            .map(|s| alloc.allocate(30 * MB, StreamId::sim(s)).unwrap())
            .collect();
        let err = alloc
            .allocate(30 * MB, StreamId::sim(2))
            .unwrap_err()
            .to_string();
        assert!(err.contains("virtual address space ran out"), "{err}");
        for b in held {
            alloc.deallocate(b).unwrap();
        }
    }
}

/// Addresses for one segment of 64 MiB and nothing more: a second stream's request fails with an
/// out-of-memory that says the address space ran out, not the device's memory, and changes
/// nothing.
#[test]
fn a_request_no_reservation_can_hold_fails_saying_the_address_space_ran_out() {
    let sim = sim(8 * GB, 64 * MB);
    let alloc = ExpandableAllocator::new(sim.clone(), ExpandableConfig::default()).unwrap();
    let first = alloc.allocate(30 * MB, StreamId::sim(0)).unwrap();
    let before = (alloc.snapshot(), alloc.stats().allocated_bytes);
    let err = alloc.allocate(50 * MB, StreamId::sim(1)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("CUDA out of memory. Tried to allocate"),
        "{text}"
    );
    assert!(text.contains("virtual address space ran out"), "{text}");
    assert_eq!((alloc.snapshot(), alloc.stats().allocated_bytes), before);
    // A request the device's memory cannot hold says nothing of addresses.
    let err = alloc
        .allocate(20 * GB, StreamId::sim(0))
        .unwrap_err()
        .to_string();
    assert!(!err.contains("address space"), "{err}");
    alloc.deallocate(first).unwrap();
}
