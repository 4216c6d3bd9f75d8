//! PyTorch's `Block` and `BlockPool`: blocks of a segment form a doubly linked list by address;
//! free blocks sit in their pool ordered by (stream, size, address), which makes best fit one
//! ordered-set lookup (`BlockComparatorSize`).

use std::collections::BTreeSet;

use crate::backend::StreamId;
use crate::stats::PoolKind;

/// An index into the block arena.
pub(crate) type BlockId = usize;

/// A block: a whole segment, or a piece of a split one.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub(crate) ptr: u64,
    pub(crate) size: usize,
    /// The last request this block served (PyTorch keeps it after the free too).
    pub(crate) requested: usize,
    pub(crate) stream: StreamId,
    pub(crate) pool: PoolKind,
    pub(crate) allocated: bool,
    pub(crate) prev: Option<BlockId>,
    pub(crate) next: Option<BlockId>,
    /// Events still to complete before the block may be freed (`record_stream`).
    pub(crate) event_count: usize,
    /// Streams that used the block besides its own (`stream_uses`).
    pub(crate) stream_uses: Vec<StreamId>,
    /// The pool's `get_free_blocks_call_count` when the block was last freed (GC age).
    pub(crate) gc_count_base: u64,
}

impl Block {
    /// A free, unsplit block: a new segment, or a piece about to be linked into one.
    pub(crate) fn free(ptr: u64, size: usize, stream: StreamId, pool: PoolKind) -> Block {
        Block {
            ptr,
            size,
            requested: 0,
            stream,
            pool,
            allocated: false,
            prev: None,
            next: None,
            event_count: 0,
            stream_uses: Vec::new(),
            gc_count_base: 0,
        }
    }

    /// Its key in its pool when free.
    pub(crate) fn key(&self, id: BlockId) -> PoolKey {
        (self.stream, self.size, self.ptr, id)
    }

    /// `is_split()`: the block shares its segment with others.
    pub(crate) fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

/// The arena: ids stay valid while the block lives; freed slots are reused.
#[derive(Default, Debug)]
pub(crate) struct Arena {
    slots: Vec<Option<Block>>,
    vacant: Vec<BlockId>,
}

impl Arena {
    pub(crate) fn insert(&mut self, b: Block) -> BlockId {
        match self.vacant.pop() {
            Some(id) => {
                self.slots[id] = Some(b);
                id
            }
            None => {
                self.slots.push(Some(b));
                self.slots.len() - 1
            }
        }
    }

    pub(crate) fn remove(&mut self, id: BlockId) -> Option<Block> {
        let b = self.slots.get_mut(id)?.take();
        if b.is_some() {
            self.vacant.push(id);
        }
        b
    }

    /// The block `id`. Ids come only from this arena and are dropped with their block, so a
    /// missing one is an internal bug: callers use [`Arena::get`] where that is possible.
    pub(crate) fn at(&self, id: BlockId) -> &Block {
        self.slots[id].as_ref().expect("live block id")
    }

    pub(crate) fn at_mut(&mut self, id: BlockId) -> &mut Block {
        self.slots[id].as_mut().expect("live block id")
    }

    pub(crate) fn get(&self, id: BlockId) -> Option<&Block> {
        self.slots.get(id).and_then(Option::as_ref)
    }

    /// Every live block.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref().map(|b| (i, b)))
    }
}

/// A free block's place in its pool: (stream, size, address, id).
pub(crate) type PoolKey = (StreamId, usize, u64, BlockId);

/// The free blocks of one pool kind, all streams, in (stream, size, address) order.
#[derive(Default, Debug)]
pub(crate) struct Pool {
    pub(crate) blocks: BTreeSet<PoolKey>,
    /// `get_free_blocks_call_count`: lookups so far (the garbage collector's clock).
    pub(crate) get_free_blocks_call_count: u64,
}

impl Pool {
    /// `lower_bound({stream, size})`: the smallest free block of `stream` holding `size`, lowest
    /// address on ties.
    pub(crate) fn lower_bound(&self, stream: StreamId, size: usize) -> Option<(usize, BlockId)> {
        let &(s, len, _, id) = self.blocks.range((stream, size, 0, 0)..).next()?;
        (s == stream).then_some((len, id))
    }
}
