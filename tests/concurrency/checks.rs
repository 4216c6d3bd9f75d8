//! Checks that hold at any instant (stats identities, a snapshot's own consistency) and those
//! that hold once every thread is done (nothing live, the cache empties, the backend is clean).

use vmm_alloc::snapshot::{BlockState, Snapshot};
use vmm_alloc::stats::{Stat, StatArray};
use vmm_alloc::MemoryStats;

/// What a snapshot adds up to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub mapped_bytes: u64,
}

/// A snapshot is self-consistent: segments disjoint, each tiled exactly by its blocks in address
/// order, 512-byte aligned, its allocated and mapped sizes the sums of its blocks.
pub fn check_snapshot(s: &Snapshot) -> Result<Totals, String> {
    let mut totals = Totals::default();
    let mut segs: Vec<_> = s.segments.iter().collect();
    segs.sort_by_key(|g| g.address);
    for pair in segs.windows(2) {
        let end = pair[0].address.get() + pair[0].total_size as u64;
        if end > pair[1].address.get() {
            return Err(format!(
                "segments at {} (+{:#x}) and {} overlap",
                pair[0].address, pair[0].total_size, pair[1].address
            ));
        }
    }
    for g in segs {
        let (mut at, mut allocated, mut mapped) = (g.address.get(), 0, 0);
        for b in &g.blocks {
            if b.address.get() != at || b.size == 0 || !b.size.is_multiple_of(512) {
                return Err(format!(
                    "segment {}: block {b:?} does not follow at {at:#x} (blocks must tile the segment)",
                    g.address
                ));
            }
            at += b.size as u64;
            if b.state == BlockState::ActiveAllocated {
                allocated += b.size;
                totals.allocations += 1;
            }
            if b.state != BlockState::Unmapped {
                mapped += b.size;
            }
        }
        if at != g.address.get() + g.total_size as u64 {
            return Err(format!(
                "segment {}: blocks end at {at:#x}, the segment at {:#x}",
                g.address,
                g.address.get() + g.total_size as u64
            ));
        }
        if allocated != g.allocated_size || mapped != g.mapped_size {
            return Err(format!(
                "segment {}: says {} B allocated and {} B mapped, its blocks {allocated} and {mapped}",
                g.address, g.allocated_size, g.mapped_size
            ));
        }
        totals.allocated_bytes += allocated as u64;
        totals.mapped_bytes += mapped as u64;
    }
    Ok(totals)
}

fn check_stat(name: &str, s: &Stat) -> Result<(), String> {
    // `decrease` saturates at 0: a stat that went negative shows as current != allocated - freed.
    if s.allocated.checked_sub(s.freed) != Some(s.current) || s.peak < s.current {
        return Err(format!(
            "{name}: {s:?} (current must be allocated - freed, at most peak)"
        ));
    }
    Ok(())
}

fn check_array(name: &str, a: &StatArray) -> Result<(), String> {
    check_stat(&format!("{name}.all"), &a.all)?;
    check_stat(&format!("{name}.small_pool"), &a.small_pool)?;
    check_stat(&format!("{name}.large_pool"), &a.large_pool)?;
    if a.all.current != a.small_pool.current + a.large_pool.current {
        return Err(format!("{name}: all != small + large: {a:?}"));
    }
    Ok(())
}

/// Identities every [`MemoryStats`] read under the allocator's lock must meet.
pub fn check_stats(s: &MemoryStats, capacity: usize) -> Result<(), String> {
    for (name, a) in [
        ("allocation", &s.allocation),
        ("segment", &s.segment),
        ("active", &s.active),
        ("allocated_bytes", &s.allocated_bytes),
        ("reserved_bytes", &s.reserved_bytes),
        ("active_bytes", &s.active_bytes),
        ("requested_bytes", &s.requested_bytes),
    ] {
        check_array(name, a)?;
    }
    let (alloc, active, reserved) = (
        s.allocated_bytes.all.current,
        s.active_bytes.all.current,
        s.reserved_bytes.all.current,
    );
    if !(alloc <= active && active <= reserved && reserved <= capacity as u64) {
        return Err(format!(
            "allocated {alloc} <= active {active} <= reserved {reserved} <= capacity {capacity} broken"
        ));
    }
    if s.allocation.all.current > s.active.all.current {
        return Err("more allocations than active blocks".into());
    }
    Ok(())
}
