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
//!
//! Only near the device's end (`reuse_last_free_above`, 90 % of the limit held, mapped or
//! cached): with room to spare, the exact fit is PyTorch's, the lowest. Applied everywhere, the
//! rule moved layouts where nothing was short, and on generated programs at 80 GiB (no
//! pressure) that cost growths PyTorch's policy did not make: seeds 1–18, one to three driver
//! calls more than pytorch-expandable on 9 of 180 cases (`qlora` 2, 5, 10, 11, 13, 14,
//! `inference-server` 7, 9, `inference-server-4` 7) and 2–20 MiB more reserved on 5, none
//! with the rule off (it also saved 5 calls and 40 MiB summed over the 23 shared traces at 80
//! GiB: the fraction gives that back, ours then deciding as PyTorch's policy there). At the
//! minimum capacities the fraction changes little: the shared traces identical
//! (`cs336-medium-ctx128-train` keeps 6778 MiB at 0.5 to 0.95), seeds 1–18 servers +6 MiB
//! summed, 32 streams +4, programs −80 (above pytorch-expandable 4 → 3), synchronizations above
//! it 7 → 6 and 3 → 2 cases; held-out seeds 19–30 programs +158 MiB (none above), 32 streams −4
//! (above 5 → 6). POLICY.md, "Reuse of the last free".
//! Below the fraction, a freed block that is best fit's own choice (nothing of its length below
//! it: `SizeIndex::lowest_of_its_length`, no search) is still taken at once, so the hot pair
//! keeps its shortcut where the decision is the same: 47–50 instructions more a cached pair
//! than taking it unasked (callgrind, 100,000 pairs beside 1,000 live blocks: 512 B 1,098 →
//! 1,148, 20 MiB 968 → 1,015; 1 MiB, whose free merges, 1,119 → 1,118), where best fit's search
//! cost 1,209 and 1,072.

use crate::backend::Backend;
use crate::expandable::pieces::{Kind, PieceId};
use crate::expandable::size_index::FreeRange;
use crate::expandable::state::State;

/// The latest free, while nothing has changed its piece since (no allocation: `allocate` takes
/// it, and every carve, `take_front`, forgets it, also one that follows a free completed by the
/// allocation's own last resort; no unmap or growth: `free_to_gap` and `gap_to_free` forget it):
/// its index slot and piece, which is exactly the freed block's range.
/// `check` holds it to be a free range indexed in its slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LastFree {
    slot: u32,
    piece: PieceId,
}

impl LastFree {
    /// Its index slot and piece (for `check`).
    pub(crate) fn parts(self) -> (u32, PieceId) {
        (self.slot, self.piece)
    }
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

    /// The free piece of the last free if the request (`slot`, `rounded`) is its exact size and
    /// either best fit's own choice or the allocator near its limit (`reuse_last_free_above`);
    /// forgets the last free either way (Note [Last free]).
    pub(crate) fn take_last_free(&mut self, slot: Option<u32>, rounded: usize) -> Option<PieceId> {
        let last = self.last_free.take()?;
        let p = self.pieces.get(last.piece);
        debug_assert_eq!(
            p.kind,
            Kind::Free,
            "the last free's piece changed unnoticed"
        );
        if slot != Some(last.slot) || p.len != rounded {
            return None;
        }
        // Best fit's own choice, known without its search (the hot pair's case), or, near the
        // device's end (`reuse_last_free_above`), the block just freed whichever exact fit it is.
        let range = FreeRange::new(p.len, p.start, last.piece);
        let near_end =
            || self.in_use(0) as f64 >= self.config.reuse_last_free_above * self.limit as f64;
        (self.index.at(last.slot).lowest_of_its_length(range) || near_end()).then_some(last.piece)
    }
}
