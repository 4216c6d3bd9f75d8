//! A picture of an allocator's memory: segments and the blocks inside them.

use crate::backend::StreamId;
use crate::stats::PoolKind;
use crate::units::DevAddr;

/// The state of a block, with the names of PyTorch's snapshots.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BlockState {
    /// A live allocation (`active_allocated`).
    ActiveAllocated,
    /// Freed, waiting for other streams' work before reuse (`active_pending_free`).
    ActivePendingFree,
    /// Free and mapped, ready for reuse (`inactive`).
    Inactive,
    /// Reserved address space with no physical memory behind it (expandable segments only).
    Unmapped,
}

/// One block of a segment.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BlockInfo {
    /// Its first address.
    pub address: DevAddr,
    /// Its size in bytes.
    pub size: usize,
    /// Bytes the user asked for (0 unless allocated or pending).
    pub requested_size: usize,
    /// What it is.
    pub state: BlockState,
}

/// One segment: a VA reservation (expandable) or a device allocation (classic).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SegmentInfo {
    /// Its first address.
    pub address: DevAddr,
    /// Bytes of address space it spans.
    pub total_size: usize,
    /// Bytes of it backed by physical memory.
    pub mapped_size: usize,
    /// Bytes of it in live allocations.
    pub allocated_size: usize,
    /// The stream it serves.
    pub stream: StreamId,
    /// Its pool.
    pub pool: PoolKind,
    /// Every block, in address order, tiling the segment.
    pub blocks: Vec<BlockInfo>,
}

/// Every segment of an allocator, in address order.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Snapshot {
    /// The segments.
    pub segments: Vec<SegmentInfo>,
}
