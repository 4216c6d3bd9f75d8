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
//! other traces the wrong way (README, Results, "Reuse of the last free").

use crate::backend::Backend;
use crate::expandable::pieces::{Kind, PieceId};
use crate::expandable::state::State;

/// The latest free, while no allocation has run since: its index slot, its piece and range.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LastFree {
    slot: u32,
    piece: PieceId,
    at: u64,
    len: usize,
}

impl<B: Backend> State<B> {
    /// Records the free of the block that was `[at, at + len)` in `slot`, now free piece
    /// `merged`: remembered only if the free merged nothing (the piece is exactly the block).
    pub(crate) fn remember_free(&mut self, slot: u32, merged: PieceId, at: u64, len: usize) {
        let p = self.pieces.get(merged);
        self.last_free =
            (self.config.reuse_last_free && p.start == at && p.len == len).then_some(LastFree {
                slot,
                piece: merged,
                at,
                len,
            });
    }

    /// The free piece of the last free if the request (`slot`, `rounded`) is its exact size and
    /// the piece is still exactly that block; forgets the last free either way (Note [Last
    /// free]).
    pub(crate) fn take_last_free(&mut self, slot: Option<u32>, rounded: usize) -> Option<PieceId> {
        let last = self.last_free.take()?;
        if slot != Some(last.slot) || last.len != rounded {
            return None;
        }
        let p = self.pieces.get(last.piece);
        // Frees since would have replaced it; anything else that changed pieces (a release, an
        // unmap) is seen here: the piece must still be linked, free, and the same range.
        let linked = |id: PieceId, back: bool| {
            self.pieces.kind(id).is_none() || {
                let n = self.pieces.get(id);
                if back {
                    n.next == last.piece
                } else {
                    n.prev == last.piece
                }
            }
        };
        let same = p.kind == Kind::Free && p.start == last.at && p.len == last.len;
        (same && linked(p.prev, true) && linked(p.next, false)).then_some(last.piece)
    }
}
