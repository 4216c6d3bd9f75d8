//! The replay loop's error path: an error that is not an out-of-memory stops the replay and names
//! the event it happened at.

use super::*;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocation, ExpandableAllocator, StreamId};

/// Ours on the Sim backend, failing its `fail_at`-th call of `allocate` (counting from 0) the way a
/// driver error would surface: not an out-of-memory.
struct FailsOnce {
    inner: ExpandableAllocator<SimBackend>,
    calls: std::sync::atomic::AtomicUsize,
    fail_at: usize,
}

impl Allocator for FailsOnce {
    fn allocate(&self, size: usize, stream: StreamId) -> Result<Allocation, AllocError> {
        let n = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n == self.fail_at {
            return Err(AllocError::InvalidPointer(vmm_alloc::units::DevAddr::new(
                0xdead,
            )));
        }
        self.inner.allocate(size, stream)
    }
    fn deallocate(&self, allocation: Allocation) -> Result<(), AllocError> {
        self.inner.deallocate(allocation)
    }
    fn deallocate_ptr(&self, ptr: vmm_alloc::units::DevAddr) -> Result<(), AllocError> {
        self.inner.deallocate_ptr(ptr)
    }
    fn record_stream(
        &self,
        ptr: vmm_alloc::units::DevAddr,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        self.inner.record_stream(ptr, stream)
    }
    fn empty_cache(&self) -> Result<(), AllocError> {
        self.inner.empty_cache()
    }
    fn stats(&self) -> vmm_alloc::stats::MemoryStats {
        self.inner.stats()
    }
    fn reset_peak_stats(&self) {
        self.inner.reset_peak_stats()
    }
    fn snapshot(&self) -> vmm_alloc::snapshot::Snapshot {
        self.inner.snapshot()
    }
}

fn failing_replay(trace: &Trace, fail_at: usize) -> ReplayError {
    let alloc = FailsOnce {
        inner: ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).unwrap(),
        calls: Default::default(),
        fail_at,
    };
    let opts = ReplayOptions::default();
    let out = drive(
        trace,
        Policy::Expandable,
        &opts,
        opts.capacity,
        &alloc,
        None,
        &mut |_| {},
        String::new(),
    );
    out.expect_err("the injected error stops the replay")
}

#[test]
fn an_error_names_the_event_it_happened_at() {
    let trace = crate::workloads::small_after_large(1);
    // The third allocation: events 0 and 1 are allocations, 2 a free, 3 an allocation.
    let allocs: Vec<usize> = (trace.events.iter().enumerate())
        .filter(|(_, e)| matches!(e, Event::Alloc { .. }))
        .map(|(i, _)| i)
        .collect();
    let e = failing_replay(&trace, 2);
    let Event::Alloc { id, size, stream } = trace.events[allocs[2]] else {
        unreachable!()
    };
    assert_eq!(
        e.event,
        Some((
            allocs[2] as u64,
            format!("allocation {id} of {size} bytes on stream {stream}")
        ))
    );
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!(
            "event {} (allocation {id} of {size} bytes",
            allocs[2]
        )),
        "{shown}"
    );
    assert!(
        shown.contains(
            &AllocError::InvalidPointer(vmm_alloc::units::DevAddr::new(0xdead)).to_string()
        ),
        "{shown}"
    );
}

#[test]
fn an_error_in_the_initial_blocks_names_the_block() {
    let mut trace = crate::workloads::small_after_large(1);
    trace.initial = vec![
        crate::InitialBlock {
            id: 1_000_000,
            size: 4096,
            stream: 0,
        },
        crate::InitialBlock {
            id: 1_000_001,
            size: 8192,
            stream: 3,
        },
    ];
    let e = failing_replay(&trace, 1);
    assert_eq!(
        e.event,
        Some((
            1,
            "initial block 1000001 of 8192 bytes on stream 3".to_string()
        ))
    );
}
