//! Starting from a recorded state: a segment with its live blocks placed as a traced program's
//! allocator had them, so a replay of a warm trace begins where the program's allocator was.

use crate::backend::{Backend, StreamId};
use crate::classic::blocks::{Block, BlockId};
use crate::classic::state::State;
use crate::config::MIN_BLOCK_SIZE;
use crate::error::AllocError;
use crate::stats::PoolKind;

/// A live block to place in a seeded segment ([`ClassicAllocator::seed_segment`]).
///
/// [`ClassicAllocator::seed_segment`]: crate::classic::ClassicAllocator::seed_segment
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeedBlock {
    /// Where the block starts, in bytes from the segment's start (a multiple of 512).
    pub offset: usize,
    /// The block's size (a multiple of 512, not 0).
    pub size: usize,
    /// The bytes the program asked for (at most `size`), as its allocation reports them.
    pub requested: usize,
}

impl SeedBlock {
    /// A block of `size` bytes at `offset` in the segment, of which `requested` were asked for.
    pub const fn new(offset: usize, size: usize, requested: usize) -> Self {
        Self {
            offset,
            size,
            requested,
        }
    }
}

impl<B: Backend> State<B> {
    /// Allocates a segment of `size` bytes (one device allocation) and marks `blocks` in it
    /// allocated; the gaps between them are free, cached blocks. Returns the allocations in the
    /// order given. Fails, changing nothing, if the blocks do not tile into the segment (sorted,
    /// disjoint, multiples of 512 bytes) or the device has no room.
    pub(crate) fn seed_segment(
        &mut self,
        size: usize,
        stream: StreamId,
        kind: PoolKind,
        blocks: &[SeedBlock],
    ) -> Result<Vec<crate::Allocation>, AllocError> {
        let mut cursor = 0usize;
        for &SeedBlock {
            offset,
            size: len,
            requested,
        } in blocks
        {
            let aligned =
                offset.is_multiple_of(MIN_BLOCK_SIZE) && len.is_multiple_of(MIN_BLOCK_SIZE);
            if !aligned || len == 0 || offset < cursor || requested > len || offset + len > size {
                return Err(AllocError::InvalidSize { size: len });
            }
            cursor = offset + len;
        }
        if size == 0 || !size.is_multiple_of(MIN_BLOCK_SIZE) {
            return Err(AllocError::InvalidSize { size });
        }
        let Some(first) = self.alloc_block_for_seed(kind, stream, size)? else {
            return Err(self.oom(size));
        };
        let base = self.blocks.at(first).ptr;
        // The pieces in address order: (offset, size, Some(requested) when live).
        let mut pieces: Vec<(usize, usize, Option<usize>)> = Vec::new();
        let mut at = 0;
        for &SeedBlock {
            offset,
            size: len,
            requested,
        } in blocks
        {
            if offset > at {
                pieces.push((at, offset - at, None));
            }
            pieces.push((offset, len, Some(requested)));
            at = offset + len;
        }
        if at < size {
            pieces.push((at, size - at, None));
        }
        let split = pieces.len() > 1;
        let mut ids: Vec<BlockId> = Vec::with_capacity(pieces.len());
        for (i, &(offset, len, _)) in pieces.iter().enumerate() {
            let id = if i == 0 {
                first
            } else {
                self.blocks
                    .insert(Block::free(base + offset as u64, len, stream, kind))
            };
            let b = self.blocks.at_mut(id);
            b.size = len;
            b.prev = ids.last().copied();
            if let Some(&p) = ids.last() {
                self.blocks.at_mut(p).next = Some(id);
            }
            ids.push(id);
        }
        let mut out = Vec::with_capacity(blocks.len());
        for (&id, &(_, len, requested)) in ids.iter().zip(&pieces) {
            match requested {
                Some(requested) => out.push(self.mark_allocated(id, requested)),
                None => {
                    self.insert_into_blocks(id);
                    if split {
                        self.stats.inactive_split.increase(kind, 1);
                        self.stats.inactive_split_bytes.increase(kind, len as u64);
                    }
                }
            }
        }
        Ok(out)
    }
}
