//! Invariant violations: what an allocator's checker (`check_invariants`) reports.
//!
//! Each variant names one invariant and carries where it broke (the segment, the address) and
//! the values that disagree, so a failing property test says which rule and which place without
//! a debugger. A violation is always a bug in the allocator, never a user error.

use std::fmt;

use crate::stats::PoolKind;
use crate::units::DevAddr;

/// An internal invariant of an allocator that does not hold: a bug in the allocator.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvariantViolation {
    /// A segment is filed under an address other than its start.
    SegmentKey {
        /// The key it is filed under.
        key: DevAddr,
        /// Where it starts.
        start: DevAddr,
    },
    /// A mapped chunk (or a stuck one) overlaps another or leaves its segment, or its length is
    /// not a whole number of granules.
    ChunkPlacement {
        /// The segment.
        segment: DevAddr,
        /// The chunk's address.
        at: DevAddr,
        /// Its length.
        len: usize,
    },
    /// What a segment records as mapped disagrees with its chunks.
    MappedBytes {
        /// The segment.
        segment: DevAddr,
        /// What it records.
        recorded: usize,
        /// What its chunks add up to.
        chunks: usize,
    },
    /// The blocks (pieces) of a segment do not tile it in address order from its start to its
    /// end, without overlap or hole.
    Tiling {
        /// The segment.
        segment: DevAddr,
        /// Where the tiling breaks.
        at: DevAddr,
    },
    /// Two neighbours of one segment that must have been merged (two free ranges, two gaps)
    /// touch.
    Unmerged {
        /// The segment.
        segment: DevAddr,
        /// Where the second one starts.
        at: DevAddr,
    },
    /// A free range or a block lies (partly) outside mapped memory.
    Unmapped {
        /// Its address.
        at: DevAddr,
        /// Its length.
        len: usize,
    },
    /// A free range or free block is missing from the index best fit searches, or sits in the
    /// wrong one (another stream's or pool's, or under another size).
    NotIndexed {
        /// Its address.
        at: DevAddr,
        /// Its length.
        len: usize,
    },
    /// An index holds a different number of entries than there are free ranges.
    IndexCount {
        /// Entries in the index.
        indexed: usize,
        /// Free ranges in the segments.
        free: usize,
    },
    /// A block's bookkeeping disagrees with the segment it lies in (its piece, its stream or
    /// pool, the map of live blocks).
    BlockRecord {
        /// The block's address.
        at: DevAddr,
    },
    /// A live block is misaligned, smaller than its request, or outside every segment.
    BlockPlacement {
        /// The block's address.
        at: DevAddr,
        /// Its length.
        len: usize,
    },
    /// Two blocks overlap.
    Overlap {
        /// The first block's address.
        first: DevAddr,
        /// The second's, inside the first.
        second: DevAddr,
    },
    /// A segment's free, live and pending bytes do not add up to its mapped bytes.
    Conservation {
        /// The segment.
        segment: DevAddr,
        /// Free bytes.
        free: usize,
        /// Bytes in live blocks.
        live: usize,
        /// Bytes in freed blocks waiting for events.
        pending: usize,
        /// Mapped bytes.
        mapped: usize,
    },
    /// A count kept by the bookkeeping (pieces in use, gaps listed, cached handles) disagrees with
    /// what the structures it counts hold.
    Count {
        /// What is counted.
        what: &'static str,
        /// The count kept.
        kept: usize,
        /// What the structures hold.
        found: usize,
    },
    /// A statistic differs from the sum over the state it counts.
    Stat {
        /// The statistic's name (PyTorch's).
        name: &'static str,
        /// Its current value.
        value: u64,
        /// The sum over the state.
        sum: u64,
    },
    /// The front cache's allowances do not fit below the peaks (Note \[Front allowance\] in
    /// `expandable/front/allowance.rs`): a user reads more of a block counter than its peak, or
    /// the shards may take back more without the lock than the room left below the peaks.
    FrontAllowance,
    /// The front cache's engagement does not match what it holds (Note \[Engage on
    /// contention\] in `expandable/front/engage.rs`): a disengaged cache holds a stashed block,
    /// a `slow_only` name or an allowance, or an engaged one does not name a live block that
    /// must be freed through the core.
    FrontEngagement {
        /// The block concerned, if one is.
        at: Option<DevAddr>,
    },
    /// A shard's front arena disagrees with the core (Note \[Front arena\] in
    /// `expandable/front/arena.rs`): its lent range is not a free range of its stream's index,
    /// or its free parts and carved blocks do not tile that range exactly.
    FrontArena {
        /// The lent range's start.
        at: DevAddr,
    },
    /// A pool's allocated bytes exceed its reserved bytes.
    AllocatedAboveReserved {
        /// The pool.
        pool: PoolKind,
        /// Allocated bytes.
        allocated: u64,
        /// Reserved bytes.
        reserved: u64,
    },
}

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use InvariantViolation as V;
        write!(f, "allocator invariant violated: ")?;
        match self {
            V::SegmentKey { key, start } => {
                write!(f, "segment filed under {key} starts at {start}")
            }
            V::ChunkPlacement { segment, at, len } => write!(
                f,
                "chunks lie apart inside their segment: chunk {at}+{len:#x} of segment {segment} overlaps another, leaves the segment or is not whole granules"
            ),
            V::MappedBytes {
                segment,
                recorded,
                chunks,
            } => write!(
                f,
                "mapped bytes = sum of chunks: segment {segment} records {recorded:#x}, its chunks sum to {chunks:#x}"
            ),
            V::Tiling { segment, at } => write!(
                f,
                "blocks tile their segment: the tiling of segment {segment} breaks at {at}"
            ),
            V::Unmerged { segment, at } => write!(
                f,
                "free neighbours are merged: in segment {segment}, the range at {at} touches a free range of the same kind before it"
            ),
            V::Unmapped { at, len } => {
                write!(f, "blocks and free ranges are mapped: {at}+{len:#x} is not")
            }
            V::NotIndexed { at, len } => write!(
                f,
                "every free range is in its best-fit index: {at}+{len:#x} is missing or misfiled"
            ),
            V::IndexCount { indexed, free } => write!(
                f,
                "the best-fit indexes hold exactly the free ranges: {indexed} entries for {free} free ranges"
            ),
            V::BlockRecord { at } => write!(
                f,
                "a block's record matches its segment: block {at} disagrees with its piece, stream, pool or the live map"
            ),
            V::BlockPlacement { at, len } => write!(
                f,
                "live blocks are aligned, inside a segment and hold their request: block {at}+{len:#x} is not"
            ),
            V::Overlap { first, second } => {
                write!(f, "blocks never overlap: block {second} lies inside block {first}")
            }
            V::Conservation {
                segment,
                free,
                live,
                pending,
                mapped,
            } => write!(
                f,
                "free + live + pending = mapped: segment {segment} has {free:#x} + {live:#x} + {pending:#x} != {mapped:#x}"
            ),
            V::Count { what, kept, found } => {
                write!(f, "{what}: {kept} counted, {found} found")
            }
            V::FrontEngagement { at: Some(at) } => write!(
                f,
                "front cache engagement: block {at} is stashed or named while disengaged, or not named as slow-only while engaged"
            ),
            V::FrontEngagement { at: None } => write!(
                f,
                "front cache engagement: a disengaged cache holds an allowance or an arena"
            ),
            V::FrontArena { at } => write!(
                f,
                "a front arena's lent range is a free range of its stream, tiled exactly by its free parts and carved blocks: the one at {at} is not"
            ),
            V::FrontAllowance => write!(
                f,
                "the front cache's allowances fit below the peaks: a user reads at most each peak, and the shards may take back no more than the room below them"
            ),
            V::Stat { name, value, sum } => write!(
                f,
                "statistics equal the sums of the state: {name} = {value}, the state sums to {sum}"
            ),
            V::AllocatedAboveReserved {
                pool,
                allocated,
                reserved,
            } => write!(
                f,
                "allocated <= reserved: {pool:?} pool has {allocated} allocated, {reserved} reserved"
            ),
        }
    }
}

impl std::error::Error for InvariantViolation {}

/// Checks that a statistic equals the sum over the state: both checkers end with a table of these.
pub(crate) fn stat_equals(
    name: &'static str,
    value: u64,
    sum: u64,
) -> Result<(), InvariantViolation> {
    if value == sum {
        Ok(())
    } else {
        Err(InvariantViolation::Stat { name, value, sum })
    }
}

/// Checks `allocated_bytes <= reserved_bytes` in each pool.
pub(crate) fn allocated_within_reserved(
    stats: &crate::stats::MemoryStats,
) -> Result<(), InvariantViolation> {
    for pool in [PoolKind::Small, PoolKind::Large] {
        let allocated = stats.allocated_bytes.pool(pool).current;
        let reserved = stats.reserved_bytes.pool(pool).current;
        if allocated > reserved {
            return Err(InvariantViolation::AllocatedAboveReserved {
                pool,
                allocated,
                reserved,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_invariant_and_the_place() {
        let v = InvariantViolation::Tiling {
            segment: DevAddr::new(0x20_0000),
            at: DevAddr::new(0x20_0400),
        };
        let msg = v.to_string();
        assert!(msg.contains("blocks tile their segment"), "{msg}");
        assert!(
            msg.contains("0x200000") && msg.contains("0x200400"),
            "{msg}"
        );
        let s = stat_equals("allocated_bytes", 1, 2)
            .unwrap_err()
            .to_string();
        assert!(
            s.contains("allocated_bytes = 1") && s.contains("sums to 2"),
            "{s}"
        );
    }
}
