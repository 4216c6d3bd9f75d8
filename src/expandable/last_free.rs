//! Note [Last free]: which exact fit a request gets when the block freed just before it was
//! its size.
//!
//! Best fit takes the smallest free range that holds a request, the lowest address among equals
//! (PyTorch's order, for both of its allocators). A loop that frees a tensor and at once asks
//! for another of the same size (an optimizer step, a layer's activations replaced in place)
//! then gets whichever free range of that size lies lowest, not the one it just gave back, and
//! over iterations the layout drifts: a range freed late keeps moving down, the one it left
//! stays free beside other blocks, and a later request that needed two such ranges side by side
//! finds them apart. With `reuse_last_free`, the request right after a free (no allocation in
//! between) of its exact rounded size, on the same stream and pool, gets that block's range back
//! when the range is still exactly that block (the free did not merge it with free neighbours:
//! then it is one of the exact fits best fit chooses among, so nothing is split that best fit
//! would have kept). Only the choice among equal exact fits changes; no range is split and no
//! memory is mapped that best fit would not have.
//!
//! Measured (Sim, the 23 shared traces, 2026-11-25): `cs336-medium-ctx128-train` fits in
//! 6778 MiB instead of 6816 (classic 6772, pytorch-expandable 6824) with 1,024 driver calls
//! instead of 1,029; no other trace, generated several-streams workload or churn run changes.
//! Remembering more than the last free, or reusing a freed block whose range had merged, moved
//! other traces the wrong way (POLICY.md, "Reuse of the last free").

use crate::backend::Backend;
use crate::expandable::pieces::{Kind, PieceId};
use crate::expandable::state::State;

/// The latest free, while nothing has changed its piece since (no allocation: `allocate` takes
/// it; no unmap or growth: `free_to_gap` and `gap_to_free` forget it): its index slot and piece,
/// which is exactly the freed block's range.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LastFree {
    slot: u32,
    piece: PieceId,
}

impl<B: Backend> State<B> {
    /// Records the free of block piece `block` (`len` bytes) in `slot`, which became free piece
    /// `merged`: remembered only if the free merged nothing (the piece is still the block's).
    pub(crate) fn remember_free(&mut self, slot: u32, block: PieceId, merged: PieceId, len: usize) {
        let unmerged = merged == block && self.pieces.get(merged).len == len;
        self.last_free = (self.config.reuse_last_free && unmerged).then_some(LastFree {
            slot,
            piece: merged,
        });
    }

    /// The free piece of the last free if the request (`slot`, `rounded`) is its exact size;
    /// forgets the last free either way (Note [Last free]).
    pub(crate) fn take_last_free(&mut self, slot: Option<u32>, rounded: usize) -> Option<PieceId> {
        let last = self.last_free.take()?;
        let p = self.pieces.get(last.piece);
        debug_assert_eq!(
            p.kind,
            Kind::Free,
            "the last free's piece changed unnoticed"
        );
        (slot == Some(last.slot) && p.len == rounded).then_some(last.piece)
    }
}
