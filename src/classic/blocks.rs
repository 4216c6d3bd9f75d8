//! PyTorch's `Block` and `BlockPool`: blocks of a segment form a doubly linked list by address;
//! free blocks sit in their pool ordered by (stream, size, address), which makes best fit one
//! ordered-set lookup (`BlockComparatorSize`).

use std::collections::BTreeSet;

use crate::backend::StreamId;
use crate::mechanism::stream_uses::StreamUses;
use crate::stats::PoolKind;

/// A block's name: its slot in the arena. Valid while the block lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BlockId(usize);

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
    pub(crate) stream_uses: StreamUses,
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
            stream_uses: StreamUses::default(),
            gc_count_base: 0,
        }
    }

    /// Its key in its pool when free.
    pub(crate) fn key(&self, id: BlockId) -> PoolKey {
        PoolKey {
            stream: self.stream,
            size: self.size,
            ptr: self.ptr,
            id,
        }
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
                self.slots[id.0] = Some(b);
                id
            }
            None => {
                self.slots.push(Some(b));
                BlockId(self.slots.len() - 1)
            }
        }
    }

    pub(crate) fn remove(&mut self, id: BlockId) -> Option<Block> {
        let b = self.slots.get_mut(id.0)?.take();
        if b.is_some() {
            self.vacant.push(id);
        }
        b
    }

    /// The block `id`. Ids come only from this arena and are dropped with their block, so a
    /// missing one is an internal bug: callers use [`Arena::get`] where that is possible.
    pub(crate) fn at(&self, id: BlockId) -> &Block {
        self.slots[id.0].as_ref().expect("live block id")
    }

    pub(crate) fn at_mut(&mut self, id: BlockId) -> &mut Block {
        self.slots[id.0].as_mut().expect("live block id")
    }

    pub(crate) fn get(&self, id: BlockId) -> Option<&Block> {
        self.slots.get(id.0).and_then(Option::as_ref)
    }

    /// Every live block.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref().map(|b| (BlockId(i), b)))
    }

    /// How many blocks live.
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - self.vacant.len()
    }
}

/// A free block's place in its pool, ordered as PyTorch's `BlockComparatorSize`: by stream,
/// then size, then address (the id never decides: two free blocks never share an address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PoolKey {
    pub(crate) stream: StreamId,
    pub(crate) size: usize,
    pub(crate) ptr: u64,
    pub(crate) id: BlockId,
}

impl PoolKey {
    /// The first key of `stream` at or above `size`: where a best-fit search starts.
    fn search(stream: StreamId, size: usize) -> Self {
        Self {
            stream,
            size,
            ptr: 0,
            id: BlockId(0),
        }
    }
}

/// The free blocks of one pool kind, all streams, in (stream, size, address) order: PyTorch's
/// `BlockPool`. Changed only through `insert` and `remove`, which check (in debug builds) that a
/// block goes in once and comes out once.
///
/// Beside it, the same keys of the blocks that are whole segments (unsplit), in the same order:
/// what `release_cached_blocks` and the garbage collector free, found without walking every free
/// block (issue 21: an out-of-memory storm no longer costs O(free blocks) per failure). A filed
/// block's split state cannot change while it is filed: blocks are split only after leaving the
/// pool, and merged only by a block being freed, which takes its neighbours out first.
#[derive(Default, Debug)]
pub(crate) struct Pool {
    blocks: BTreeSet<PoolKey>,
    /// The filed blocks that are whole segments, in pool order.
    unsplit: BTreeSet<PoolKey>,
    /// `get_free_blocks_call_count`: lookups so far (the garbage collector's clock).
    pub(crate) get_free_blocks_call_count: u64,
}

impl Pool {
    /// Files a free block; `whole` when it is a whole segment (not split).
    pub(crate) fn insert(&mut self, key: PoolKey, whole: bool) {
        let new = self.blocks.insert(key);
        debug_assert!(new, "{key:?} filed twice");
        if whole {
            self.unsplit.insert(key);
        }
    }

    /// Takes a free block out.
    pub(crate) fn remove(&mut self, key: &PoolKey) {
        let was = self.blocks.remove(key);
        debug_assert!(was, "{key:?} taken out but not filed");
        self.unsplit.remove(key);
    }

    /// The filed blocks that are whole segments, in pool order: O(log n) to start, O(1) a step.
    pub(crate) fn unsplit(&self) -> impl DoubleEndedIterator<Item = &PoolKey> {
        self.unsplit.iter()
    }

    /// Whether `key` is filed as a whole segment.
    pub(crate) fn is_filed_unsplit(&self, key: &PoolKey) -> bool {
        self.unsplit.contains(key)
    }

    /// How many filed blocks are whole segments.
    pub(crate) fn unsplit_len(&self) -> usize {
        self.unsplit.len()
    }

    /// Whether `key` is filed.
    pub(crate) fn contains(&self, key: &PoolKey) -> bool {
        self.blocks.contains(key)
    }

    /// How many free blocks are filed.
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Every filed block, in pool order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &PoolKey> {
        self.blocks.iter()
    }

    /// The blocks ordered below (`stream`, `size`): those of `stream` smaller than `size`,
    /// then other streams'; iterate in reverse for the largest first.
    pub(crate) fn below(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl DoubleEndedIterator<Item = &PoolKey> {
        self.blocks.range(..PoolKey::search(stream, size))
    }

    /// `lower_bound({stream, size})`: the smallest free block of `stream` holding `size`, lowest
    /// address on ties.
    pub(crate) fn lower_bound(&self, stream: StreamId, size: usize) -> Option<(usize, BlockId)> {
        let k = self.blocks.range(PoolKey::search(stream, size)..).next()?;
        (k.stream == stream).then_some((k.size, k.id))
    }
}
