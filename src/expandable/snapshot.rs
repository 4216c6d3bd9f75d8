//! Drawing the state (`snapshot`) and giving everything back (`teardown`).

use crate::backend::Backend;
use crate::expandable::state::State;
use crate::snapshot::{BlockInfo, BlockState, SegmentInfo, Snapshot};
use crate::units::DevAddr;

impl<B: Backend> State<B> {
    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut segments = Vec::new();
        for seg in self.segments.values() {
            let mut blocks = Vec::new();
            let mut allocated = 0;
            let inside = |at: u64| seg.start() <= at && at < seg.end();
            for (&at, b) in self.live.iter().filter(|(&at, _)| inside(at)) {
                let size = self.size_of(b);
                allocated += size;
                blocks.push(BlockInfo {
                    address: DevAddr::new(at),
                    size,
                    requested_size: b.requested,
                    state: BlockState::ActiveAllocated,
                });
            }
            for p in self.pending.iter().filter(|p| inside(p.addr)) {
                blocks.push(BlockInfo {
                    address: DevAddr::new(p.addr),
                    size: self.size_of(&p.block),
                    requested_size: p.block.requested,
                    state: BlockState::ActivePendingFree,
                });
            }
            for (at, len, _) in self.free_pieces(seg) {
                blocks.push(BlockInfo {
                    address: DevAddr::new(at),
                    size: len,
                    requested_size: 0,
                    state: BlockState::Inactive,
                });
            }
            // Parked pages hold no memory of their own (Note [Parked pages]): shown unmapped.
            for (start, end) in seg.holes(&self.pieces, true) {
                blocks.push(BlockInfo {
                    address: DevAddr::new(start),
                    size: (end - start) as usize,
                    requested_size: 0,
                    state: BlockState::Unmapped,
                });
            }
            blocks.sort_by_key(|b| b.address);
            segments.push(SegmentInfo {
                address: seg.va.start,
                total_size: seg.va.len,
                mapped_size: seg.mapped_bytes,
                allocated_size: allocated,
                stream: seg.stream,
                pool: seg.pool,
                blocks,
            });
        }
        Snapshot { segments }
    }

    /// Releases everything the allocator holds, ignoring errors (used by `Drop`).
    pub(crate) fn teardown(&mut self) {
        for p in std::mem::take(&mut self.pending) {
            for (_, e) in p.events {
                let _ = self.backend.release_event(e);
            }
        }
        self.deferred.abandon_all(&self.backend);
        for seg in std::mem::take(&mut self.segments).into_values() {
            // Parked mappings only unmap: their handles are released where they were remapped.
            for (&at, c) in &seg.parked {
                let _ = self.backend.unmap(DevAddr::new(at), c.len);
            }
            for (&at, c) in seg.chunks.iter().chain(&seg.stuck) {
                let _ = self.backend.unmap(DevAddr::new(at), c.len);
                let _ = self.backend.release(c.handle);
            }
            let _ = self.backend.free_reservation(seg.va);
        }
        while let Some((h, _)) = self.cache.take_largest() {
            let _ = self.backend.release(h);
        }
        self.live.clear();
        self.last_free = None;
        self.parked_handles.clear();
        self.index.clear();
        self.segments_by_slot.clear();
        self.pieces.clear();
    }
}
