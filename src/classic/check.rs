//! `check`: every invariant of the classic allocator, as equations over the whole state.
//!
//! * Each segment is tiled by its blocks: linked in address order from its start, no gap, no
//!   overlap, all of its stream and pool, multiples of 512 bytes, summing to its size.
//! * Each free block whose events have completed is filed in its pool's best-fit set under its
//!   (stream, size, address), and nothing else is; no two such blocks are neighbours (PyTorch
//!   merges them in `free_block`); the pool's index of whole free segments holds exactly the
//!   filed blocks that are not split (what `release_cached_blocks` frees).
//! * Each allocated block is in the pointer map under its address, and nothing else is; each
//!   block waiting for events is named by exactly `event_count` queued events.
//! * The statistics equal the sums: `allocation`, `active`, `segment`, `inactive_split` and
//!   their byte counts, `requested_bytes`, `reserved_bytes` (= `total_allocated_memory`), and
//!   the oversize counts.

use rustc_hash::FxHashMap;

use crate::backend::Backend;
use crate::classic::blocks::{Block, BlockId};
use crate::classic::device::DeviceSegment;
use crate::classic::state::State;
use crate::config::MIN_BLOCK_SIZE;
use crate::mechanism::violation::{
    allocated_within_reserved, stat_equals, InvariantViolation as V,
};
use crate::units::DevAddr;

/// What the walks of the segments add up, for the pool and statistics checks.
#[derive(Default)]
struct Sums {
    blocks: usize,
    /// Segment bytes.
    reserved: usize,
    allocated: (u64, usize),
    /// Freed blocks waiting for events: count, bytes, events they wait for.
    pending: (u64, usize, usize),
    requested: usize,
    /// Free blocks filed in a pool.
    cached: usize,
    /// Of those, the whole segments (unsplit).
    cached_whole: usize,
    /// Free blocks that split a segment: count, bytes.
    inactive_split: (u64, usize),
    oversize_allocations: u64,
    oversize_segments: u64,
}

/// What a block is, as the checks see it.
#[derive(PartialEq)]
enum Role {
    Allocated,
    /// Freed, waiting for other streams' events.
    Pending,
    /// Free and filed in its pool.
    Cached,
}

fn role(b: &Block) -> Role {
    if b.allocated {
        Role::Allocated
    } else if b.event_count > 0 {
        Role::Pending
    } else {
        Role::Cached
    }
}

impl<B: Backend> State<B> {
    /// Checks every invariant; returns the first violation.
    pub(crate) fn check(&self) -> Result<(), V> {
        let firsts = self.first_blocks();
        let mut sums = Sums::default();
        for (&base, seg) in &self.segments {
            let first = firsts.get(&base).copied();
            self.check_segment(base, seg, first, &mut sums)?;
        }
        if sums.blocks != self.blocks.len() {
            return Err(V::Count {
                what: "blocks in the arena, against the blocks tiling the segments",
                kept: self.blocks.len(),
                found: sums.blocks,
            });
        }
        self.check_pools(&sums)?;
        self.check_events(&sums)?;
        self.check_stats(&sums)
    }

    /// Walks one segment's blocks from its start (see the module docs).
    fn check_segment(
        &self,
        base: u64,
        seg: &DeviceSegment,
        first: Option<BlockId>,
        sums: &mut Sums,
    ) -> Result<(), V> {
        let segment = DevAddr::new(base);
        let (mut cursor, mut prev, mut prev_cached) = (base, None, false);
        let mut next = first;
        let Some(head) = first.and_then(|id| self.blocks.get(id)) else {
            return Err(V::Tiling {
                segment,
                at: segment,
            });
        };
        let (stream, pool) = (head.stream, head.pool);
        while let Some(id) = next {
            let Some(b) = self.blocks.get(id) else {
                let at = DevAddr::new(cursor);
                return Err(V::Tiling { segment, at });
            };
            let at = DevAddr::new(b.ptr);
            if b.ptr != cursor || b.prev != prev || sums.blocks > self.blocks.len() {
                let at = DevAddr::new(cursor);
                return Err(V::Tiling { segment, at });
            }
            let whole = b.size.is_multiple_of(MIN_BLOCK_SIZE) && b.ptr % MIN_BLOCK_SIZE as u64 == 0;
            if b.size == 0 || !whole {
                return Err(V::BlockPlacement { at, len: b.size });
            }
            if (b.stream, b.pool) != (stream, pool) {
                return Err(V::BlockRecord { at });
            }
            let cached = role(b) == Role::Cached;
            if cached && prev_cached {
                return Err(V::Unmerged { segment, at });
            }
            self.check_block(id, b, sums)?;
            sums.blocks += 1;
            (cursor, prev, prev_cached) = (b.ptr + b.size as u64, Some(id), cached);
            next = b.next;
        }
        let size = (cursor - base) as usize;
        let granularity = self.backend.granularity();
        if size > seg.mapped || seg.mapped - size >= granularity {
            return Err(V::MappedBytes {
                segment,
                recorded: seg.mapped,
                chunks: size,
            });
        }
        sums.reserved += size;
        sums.oversize_segments += self.is_oversize(size) as u64;
        Ok(())
    }

    fn is_oversize(&self, size: usize) -> bool {
        size >= self.conf.max_split_size.unwrap_or(usize::MAX)
    }

    /// One block's record: where it is filed for its role, and what it adds to the sums.
    fn check_block(&self, id: BlockId, b: &Block, sums: &mut Sums) -> Result<(), V> {
        let at = DevAddr::new(b.ptr);
        let pool = self.pool_of(b.pool);
        let filed = pool.contains(&b.key(id));
        // Filed among the whole segments exactly when cached and unsplit.
        let filed_whole = pool.is_filed_unsplit(&b.key(id));
        if filed_whole != (role(b) == Role::Cached && !b.is_split()) {
            return Err(V::NotIndexed { at, len: b.size });
        }
        let mapped = self.active.get(&b.ptr) == Some(&id);
        let role = role(b);
        if filed != (role == Role::Cached) {
            return Err(V::NotIndexed { at, len: b.size });
        }
        if mapped != (role == Role::Allocated)
            || (role != Role::Allocated && !b.stream_uses.is_empty())
        {
            return Err(V::BlockRecord { at });
        }
        match role {
            Role::Allocated => {
                sums.allocated.0 += 1;
                sums.allocated.1 += b.size;
                sums.requested += b.requested;
                sums.oversize_allocations += self.is_oversize(b.size) as u64;
            }
            Role::Pending => {
                sums.pending.0 += 1;
                sums.pending.1 += b.size;
                sums.pending.2 += b.event_count;
                sums.requested += b.requested;
            }
            Role::Cached => {
                sums.cached += 1;
                sums.cached_whole += usize::from(!b.is_split());
                if b.is_split() {
                    sums.inactive_split.0 += 1;
                    sums.inactive_split.1 += b.size;
                }
            }
        }
        Ok(())
    }

    /// The pools hold exactly the cached blocks (each was found filed by `check_block`).
    fn check_pools(&self, sums: &Sums) -> Result<(), V> {
        let indexed = self.small.len() + self.large.len();
        if indexed != sums.cached {
            return Err(V::IndexCount {
                indexed,
                free: sums.cached,
            });
        }
        let whole = self.small.unsplit_len() + self.large.unsplit_len();
        if whole != sums.cached_whole {
            return Err(V::Count {
                what: "whole free segments in the pools' unsplit index",
                kept: whole,
                found: sums.cached_whole,
            });
        }
        if self.active.len() as u64 != sums.allocated.0 {
            return Err(V::Count {
                what: "allocated blocks in the pointer map",
                kept: self.active.len(),
                found: sums.allocated.0 as usize,
            });
        }
        Ok(())
    }

    /// Each queued event names a block waiting for events, as many times as it waits.
    fn check_events(&self, sums: &Sums) -> Result<(), V> {
        let mut waits: FxHashMap<BlockId, usize> = FxHashMap::default();
        for &(_, id) in self.events.values().flatten() {
            *waits.entry(id).or_default() += 1;
        }
        for (&id, &n) in &waits {
            match self.blocks.get(id) {
                Some(b) if !b.allocated && b.event_count == n => {}
                Some(b) => {
                    return Err(V::BlockRecord {
                        at: DevAddr::new(b.ptr),
                    })
                }
                None => {
                    return Err(V::Count {
                        what: "queued events naming a block that no longer lives",
                        kept: n,
                        found: 0,
                    })
                }
            }
        }
        let queued: usize = waits.values().sum();
        if queued != sums.pending.2 {
            return Err(V::Count {
                what: "queued events, against the events blocks wait for",
                kept: queued,
                found: sums.pending.2,
            });
        }
        Ok(())
    }

    /// The statistics equal the sums.
    fn check_stats(&self, sums: &Sums) -> Result<(), V> {
        let s = &self.stats;
        let (allocated, pending) = (sums.allocated, sums.pending);
        stat_equals("allocation", s.allocation.all.current, allocated.0)?;
        stat_equals(
            "allocated_bytes",
            s.allocated_bytes.all.current,
            allocated.1 as u64,
        )?;
        stat_equals("active", s.active.all.current, allocated.0 + pending.0)?;
        let active_bytes = (allocated.1 + pending.1) as u64;
        stat_equals("active_bytes", s.active_bytes.all.current, active_bytes)?;
        stat_equals(
            "requested_bytes",
            s.requested_bytes.all.current,
            sums.requested as u64,
        )?;
        stat_equals("segment", s.segment.all.current, self.segments.len() as u64)?;
        stat_equals(
            "reserved_bytes",
            s.reserved_bytes.all.current,
            sums.reserved as u64,
        )?;
        let total = self.total_allocated_memory as u64;
        stat_equals("total_allocated_memory", total, sums.reserved as u64)?;
        let (split, split_bytes) = sums.inactive_split;
        stat_equals("inactive_split", s.inactive_split.all.current, split)?;
        let inactive_split_bytes = s.inactive_split_bytes.all.current;
        stat_equals(
            "inactive_split_bytes",
            inactive_split_bytes,
            split_bytes as u64,
        )?;
        let oversize = self.oversize_allocations;
        stat_equals("oversize_allocations", oversize, sums.oversize_allocations)?;
        stat_equals(
            "oversize_segments",
            self.oversize_segments,
            sums.oversize_segments,
        )?;
        allocated_within_reserved(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::StreamId;
    use crate::config::AllocConf;
    use crate::SimBackend;

    fn state_with_a_split_segment() -> State<SimBackend> {
        let mut s = State::new(SimBackend::new(), AllocConf::default()).unwrap();
        let a = s.malloc(3 << 20, StreamId::DEFAULT).unwrap();
        let _live = s.malloc(1 << 20 | 1, StreamId::DEFAULT).unwrap();
        s.free(a.ptr()).unwrap();
        s.check().unwrap();
        s
    }

    #[test]
    fn a_stat_out_of_step_is_named() {
        let mut s = state_with_a_split_segment();
        s.stats.inactive_split_bytes.all.current += 512;
        let v = s.check().unwrap_err();
        assert!(
            matches!(
                v,
                V::Stat {
                    name: "inactive_split_bytes",
                    ..
                }
            ),
            "{v}"
        );
    }

    #[test]
    fn a_free_block_missing_from_its_pool_is_found() {
        let mut s = state_with_a_split_segment();
        let key = *s.large.iter().next().expect("a cached block");
        s.large.remove(&key);
        let v = s.check().unwrap_err();
        assert_eq!(
            v,
            V::NotIndexed {
                at: DevAddr::new(key.ptr),
                len: key.size
            }
        );
    }

    #[test]
    fn a_whole_free_segment_missing_from_the_unsplit_index_is_found() {
        let mut s = State::new(SimBackend::new(), AllocConf::default()).unwrap();
        let a = s.malloc(3 << 20, StreamId::DEFAULT).unwrap();
        s.free(a.ptr()).unwrap();
        s.check().unwrap();
        // File it again as if it were split: `release_cached_blocks` would never free it.
        let key = *s.large.unsplit().next().expect("a whole free segment");
        s.large.remove(&key);
        s.large.insert(key, false);
        let v = s.check().unwrap_err();
        assert_eq!(
            v,
            V::NotIndexed {
                at: DevAddr::new(key.ptr),
                len: key.size
            }
        );
    }

    #[test]
    fn two_free_neighbours_left_unmerged_are_found() {
        let mut s = State::new(SimBackend::new(), AllocConf::default()).unwrap();
        let a = s.malloc(3 << 20, StreamId::DEFAULT).unwrap();
        let b = s.malloc(3 << 20, StreamId::DEFAULT).unwrap();
        let _live = s.malloc(3 << 20, StreamId::DEFAULT).unwrap();
        s.free(a.ptr()).unwrap();
        // Free `b` without merging: mark it free and file it, as a buggy `free_block` would.
        let id = s.active.remove(&b.ptr().get()).unwrap();
        s.blocks.at_mut(id).allocated = false;
        s.insert_into_blocks(id);
        let v = s.check().unwrap_err();
        assert!(matches!(v, V::Unmerged { at, .. } if at == b.ptr()), "{v}");
    }
}
