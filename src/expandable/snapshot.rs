//! Drawing the state (`snapshot`) and giving everything back (`teardown`).

use crate::backend::Backend;
use crate::expandable::state::State;
use crate::snapshot::{BlockInfo, BlockState, SegmentInfo, Snapshot};
use crate::units::DevAddr;

impl<B: Backend> State<B> {
    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut segments = Vec::new();
        // Lent ends show as unmapped at home: their bytes are the rescue's (Note [Alias rescue]).
        let lent: Vec<(u64, usize)> = self
            .rescues
            .values()
            .chain(&self.dead_rescues)
            .flat_map(|r| r.lent.iter().map(|&(_, p)| self.pieces.get(p)))
            .map(|p| (p.start, p.len))
            .collect();
        for seg in self.segments.values() {
            let mut blocks = Vec::new();
            let mut lent_here = 0;
            for &(at, len) in lent
                .iter()
                .filter(|&&(at, _)| seg.start() <= at && at < seg.end())
            {
                lent_here += len;
                blocks.push(BlockInfo {
                    address: DevAddr::new(at),
                    size: len,
                    requested_size: 0,
                    state: BlockState::Unmapped,
                });
            }
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
                mapped_size: seg.mapped_bytes - lent_here,
                allocated_size: allocated,
                stream: seg.stream,
                pool: seg.pool,
                blocks,
            });
        }
        segments.extend(self.rescue_segments());
        Snapshot { segments }
    }

    /// Each rescue as a segment of its own: its aliased ends unmapped, its block (live, pending,
    /// or freed and waiting for its teardown) between them (Note [Alias rescue]).
    fn rescue_segments(&self) -> impl Iterator<Item = SegmentInfo> + '_ {
        let all = self.rescues.values().chain(&self.dead_rescues);
        all.map(|r| {
            let block = self.pieces.get(r.block);
            let at = block.start;
            let (state, requested) = match (
                self.live.get(&at),
                self.pending.iter().find(|p| p.addr == at),
            ) {
                (Some(b), _) if b.piece == r.block => (BlockState::ActiveAllocated, b.requested),
                (_, Some(p)) if p.block.piece == r.block => {
                    (BlockState::ActivePendingFree, p.block.requested)
                }
                _ => (BlockState::Inactive, 0),
            };
            let mut blocks = Vec::new();
            // A parked rescue's ends are free at home again (Note [Parked rescue]): only its own
            // bytes show as its block's.
            let owned: usize = r.owned.iter().map(|c| c.len).sum();
            let owned_at = match r.aliased.first() {
                Some(&tail) if at > r.va.start.get() => r.va.start.get() + tail as u64,
                _ => r.va.start.get(),
            };
            for id in self.pieces.tiling(r.tail) {
                let p = self.pieces.get(id);
                if id == r.block && r.parked {
                    let parts = [
                        (p.start, owned_at, BlockState::Unmapped),
                        (owned_at, owned_at + owned as u64, BlockState::Inactive),
                        (owned_at + owned as u64, p.end(), BlockState::Unmapped),
                    ];
                    for (from, to, state) in parts.into_iter().filter(|&(f, t, _)| f < t) {
                        blocks.push(BlockInfo {
                            address: DevAddr::new(from),
                            size: (to - from) as usize,
                            requested_size: 0,
                            state,
                        });
                    }
                    continue;
                }
                let (state, requested) = if id == r.block {
                    (state, requested)
                } else {
                    (BlockState::Unmapped, 0)
                };
                blocks.push(BlockInfo {
                    address: DevAddr::new(p.start),
                    size: p.len,
                    requested_size: requested,
                    state,
                });
            }
            let allocated = if state == BlockState::ActiveAllocated {
                block.len
            } else {
                0
            };
            SegmentInfo {
                address: r.va.start,
                total_size: r.va.len,
                mapped_size: if r.parked { owned } else { block.len },
                allocated_size: allocated,
                stream: r.stream,
                pool: crate::stats::PoolKind::Large,
                blocks,
            }
        })
    }

    /// Releases everything the allocator holds, ignoring errors (used by `Drop`).
    pub(crate) fn teardown(&mut self) {
        for p in std::mem::take(&mut self.pending) {
            for (_, e) in p.events {
                let _ = self.backend.release_event(e);
            }
        }
        self.deferred.abandon_all(&self.backend);
        self.abandon_rescues();
        for seg in std::mem::take(&mut self.segments).into_values() {
            // Parked mappings only unmap: their handles are released where they were remapped.
            for (&at, c) in &seg.parked {
                let _ = self.backend.unmap(DevAddr::new(at), c.len);
            }
            for (&at, c) in seg.chunks.iter().chain(&seg.stuck) {
                let _ = self.backend.unmap(DevAddr::new(at), c.len);
                let _ = self.backend.release(c.handle);
            }
            let _ = self.backend.free_reservation(seg.reservation());
        }
        while let Some((h, _)) = self.cache.take_largest() {
            let _ = self.backend.release(h);
        }
        while let Some((h, _)) = self.kept.take_largest() {
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
